/*
 * fmoe/tokenizer.h - BPE tokenizers from HuggingFace tokenizer.json, and chat templates.
 *
 *     fmoe_tokenizer *tok;
 *     if (fmoe_tokenizer_load("models/Mixtral-8x7B", &tok) < 0) fail(fmoe_error_detail());
 *     int32_t *ids; size_t n;
 *     fmoe_tokenizer_encode_alloc(tok, "Hello world", 11, 1, &ids, &n);   // [1, 22557, 1526]
 *     char *text; size_t len;
 *     fmoe_tokenizer_decode(tok, ids, n, 1, &text, &len);                  // "Hello world"
 *     free(text); free(ids); fmoe_tokenizer_free(tok);
 *
 * What is supported: the BPE model (merges as "a b" strings or [a, b] pairs; byte_fallback;
 * unk_token with fuse_unk; ignore_merges) with the pieces the byte-level families (GPT-2
 * style: Qwen2/Qwen3, gpt-oss/o200k, OLMoE, DeepSeek, Llama-3) and the SentencePiece-style
 * families (Mistral/Mixtral, Llama-2: `▁` metaspace + byte fallback) use:
 *   normalizers      NFC, NFD, Prepend, Replace (string or regex), Strip, Sequence
 *   pre-tokenizers   Split (regex through PCRE2 or literal; all five behaviours, invert),
 *                    ByteLevel (add_prefix_space, use_regex), Metaspace (prepend_scheme
 *                    always/first/never, split), Digits, Sequence
 *   post-processors  TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing,
 *                    Sequence
 *   decoders         ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence
 *   added tokens     matched before the model, leftmost-longest, with single_word, lstrip,
 *                    rstrip and normalized as the file says
 * Anything else (WordPiece/Unigram models, NFKC, Whitespace pre-tokenizer, ...) fails to
 * load with FMOE_EUNSUPPORTED and a detail naming the file, the field and the type.
 *
 * The ids are those of HuggingFace `tokenizers` (tests/python/test_tokenizer.py checks them
 * on the real Mixtral, Qwen3 and gpt-oss files), including its quirks: added-token ids are
 * assigned as tokenizers assigns them on load, a normalized added token's string is its
 * normalized content ("▁[INST]"), NFC uses Unicode 9.0 data as tokenizers does. Regexes
 * run through PCRE2 in UTF + UCP mode; `\s`, `\S`, `\w` and `\W` in a pattern are
 * rewritten to the classes Oniguruma (the engine of `tokenizers`) gives them. Known
 * difference: PCRE2 10.42 knows Unicode 14, so letters and digits assigned since (Unicode
 * 15/16 scripts) split differently in pre-tokenizer regexes. runtime/tokenizer/README.md
 * has the details.
 *
 * Invalid UTF-8 in the input (HuggingFace cannot receive it) is handled as follows: each
 * maximal invalid byte sequence becomes a piece of its own that skips normalisation and
 * pre-tokenisation. Byte-level models encode its bytes through the byte alphabet (so the
 * concatenated token_to_piece() bytes give back the input exactly); other models use
 * byte-fallback tokens <0xXX> (or the unk token when the model has no byte fallback).
 *
 * Thread safety: a loaded tokenizer is immutable. Every function taking a
 * `const fmoe_tokenizer *` may be called from several threads at once; load and free
 * must not race with other calls on the same object.
 */
#ifndef FMOE_TOKENIZER_H
#define FMOE_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct fmoe_tokenizer fmoe_tokenizer;

/*
 * Loads a tokenizer. `path` is a tokenizer.json file or a directory holding one. From the
 * same directory, tokenizer_config.json (bos/eos tokens, chat_template) and
 * chat_template.jinja are read when present; both are optional. `path` may also be a GGUF
 * file that fmoe quantize wrote: the three are its embedded fmoe.file.* keys
 * (fmoe_gguf_get_file); a GGUF file without tokenizer.json is FMOE_ENOTFOUND.
 * @return 0 and *out (free with fmoe_tokenizer_free), or FMOE_EIO (unreadable file),
 *   FMOE_EFORMAT (malformed JSON or field: the detail names file and field),
 *   FMOE_EUNSUPPORTED (a model/normalizer/pre-tokenizer/... type fmoe does not implement),
 *   FMOE_ENOMEM.
 */
int fmoe_tokenizer_load(const char *path, fmoe_tokenizer **out);

/* Frees a tokenizer; NULL is a no-op. */
void fmoe_tokenizer_free(fmoe_tokenizer *tok);

/*
 * Encodes `len` bytes of `text` (UTF-8, need not be NUL-terminated; invalid sequences are
 * handled as described above). With `add_special` the post-processor's special tokens are
 * added (e.g. BOS for Mixtral; nothing for Qwen3); special-token text in the input is
 * always recognised (like HuggingFace `encode`).
 * Writes up to `cap` ids to `ids` (which may be NULL when cap is 0).
 * @return the number of tokens of the whole encoding (> cap means ids holds only the first
 *   cap: call again with a larger buffer), or a negative FMOE_E* code (FMOE_ENOMEM,
 *   FMOE_EINTERNAL when PCRE2 fails).
 */
int64_t fmoe_tokenizer_encode(const fmoe_tokenizer *tok, const char *text, size_t len,
                              int add_special, int32_t *ids, size_t cap);

/* Like fmoe_tokenizer_encode, into a malloc'd array *ids of *n ids (free with free()).
 * @return 0 or a negative FMOE_E* code (then *ids is NULL). */
int fmoe_tokenizer_encode_alloc(const fmoe_tokenizer *tok, const char *text, size_t len,
                                int add_special, int32_t **ids, size_t *n);

/*
 * Decodes ids to text through the tokenizer.json decoder, as HuggingFace `decode` does:
 * the result is valid UTF-8 (incomplete byte sequences become U+FFFD). With `skip_special`
 * the special added tokens (BOS, EOS, <|im_start|>, ...) are left out. Ids outside the
 * vocabulary are skipped. decode(encode(s)) == s for tokenizers without a normalizer that
 * changes s (Qwen3's NFC changes only non-NFC text).
 * @return 0 and *text (malloc'd, NUL-terminated, *len bytes without the NUL), or
 *   FMOE_ENOMEM.
 */
int fmoe_tokenizer_decode(const fmoe_tokenizer *tok, const int32_t *ids, size_t n,
                          int skip_special, char **text, size_t *len);

/* For streaming decoded text: the length of text[0..n) without trailing U+FFFD (EF BF BD)
 * characters, which decode writes for a UTF-8 sequence still incomplete (its next bytes
 * may come with the next token). Decoding the whole output after each token and printing
 * up to this length prints exactly decode(ids) in the end (transformers' TextStreamer). */
size_t fmoe_text_stable_prefix(const char *text, size_t n);

/*
 * The bytes one token contributes to the text, for streaming output: byte-level tokens
 * mapped back to bytes, `▁` as a space, <0xXX> as the byte (added tokens go through the
 * same mapping, as in decode: "<|im_start|>" stays itself).
 * A piece may be part of a UTF-8 sequence; the decoder's stripping of the first leading
 * space (SentencePiece-style) is not applied. *piece is owned by the tokenizer and not
 * NUL-terminated.
 * @return 0, or FMOE_ERANGE for an id outside the vocabulary.
 */
int fmoe_tokenizer_token_to_piece(const fmoe_tokenizer *tok, int32_t id, const char **piece,
                                  size_t *len);

/* @return the token's string as tokenizer.json spells it ("Ġworld", "▁Hello", "<s>"), or
 *   NULL for an id outside the vocabulary. Owned by the tokenizer. */
const char *fmoe_tokenizer_id_to_token(const fmoe_tokenizer *tok, int32_t id);

/* @return the id of a token string (vocabulary or added token), or -1. */
int32_t fmoe_tokenizer_token_to_id(const fmoe_tokenizer *tok, const char *token);

/* @return 1 when id is a special added token (skipped by decode with skip_special). */
int fmoe_tokenizer_is_special(const fmoe_tokenizer *tok, int32_t id);

/* @return the number of ids: the largest vocabulary or added-token id + 1. */
int32_t fmoe_tokenizer_vocab_size(const fmoe_tokenizer *tok);

/* BOS and EOS ids, -1 when the tokenizer has none. Taken from tokenizer_config.json
 * (bos_token, eos_token) when present; otherwise BOS is the special token the
 * post-processor puts before the text, and EOS the first of </s>, <|endoftext|>,
 * <|end_of_text|>, <|im_end|> that is an added token (else in the vocabulary). A model's
 * generation_config.json may list more stop tokens; that is the model loader's business. */
int32_t fmoe_tokenizer_bos_id(const fmoe_tokenizer *tok);
int32_t fmoe_tokenizer_eos_id(const fmoe_tokenizer *tok);

/* ---------------------------------------------------------------------------------------
 * Chat templates.
 *
 * A model's chat template is rendered as written: the Jinja text of tokenizer_config.json
 * "chat_template" (a string, or a list of named templates: "default", and "tool_use" when
 * the request has tools), chat_template.jinja, or a GGUF file's tokenizer.chat_template,
 * run by fmoe's Jinja interpreter with the variables transformers' apply_chat_template
 * gives: messages, tools (None without), documents (None), add_generation_prompt,
 * bos_token / eos_token, and the caller's extra keyword arguments (chat_template_kwargs,
 * e.g. {"enable_thinking": false}). The output is the bytes transformers would produce.
 *
 * The fixed renderers are what fmoe had before: C code for four families, producing what
 * their templates produce for plain text messages. They are used when named, when the model
 * has no template text (the family is then guessed from its added tokens), and as the
 * fallback when the interpreter refuses the model's template (a construct it does not
 * implement), with a one-line warning through fmoe_log saying why:
 *
 *   mixtral  `[INST]` (Mistral/Mixtral v0.1):  <s>[INST] {user} [/INST]{assistant}</s>...
 *            roles must alternate user/assistant; a leading system message is put before
 *            the first user message followed by a blank line.
 *   chatml   `<|im_start|>` (Qwen1.5/Qwen2): <|im_start|>{role}\n{content}<|im_end|>\n;
 *            with the template's default system message when it has one.
 *   qwen3    ChatML with Qwen3's thinking rules (earlier turns' <think> dropped, `tool`
 *            messages as <tool_response> blocks, disable_thinking: an empty think block).
 *   olmoe    `<|user|>`/`<|assistant|>` (OLMoE/Tulu).
 * ------------------------------------------------------------------------------------ */

typedef struct fmoe_chat_message {
    const char *role;        /* "system", "user", "assistant", "tool", ... */
    const char *content;     /* UTF-8, NUL-terminated; NULL: the template sees None */
    const char *fields_json; /* NULL, or a JSON object of more fields the template sees on
                                the message (tool_calls, name, tool_call_id,
                                reasoning_content, ...); a "content" here replaces
                                `content` (e.g. a list of parts). The fixed renderers
                                ignore it. */
} fmoe_chat_message;

typedef struct fmoe_chat_options {
    const char *template_name; /* NULL: the model's template as written (a fixed renderer
                                  only as the fallback); "jinja": as written, never a
                                  fallback; else a fixed renderer, one of
                                  fmoe_chat_template_names() */
    int add_generation_prompt; /* 1: end with the assistant's turn opening */
    int disable_thinking;      /* enable_thinking=false (a template variable; qwen3's fixed
                                  renderer writes the empty think block) */
    const char *tools_json;    /* NULL, or a JSON array of tool definitions: `tools` */
    const char *kwargs_json;   /* NULL, or a JSON object of extra template variables
                                  (chat_template_kwargs); they win over the others */
} fmoe_chat_options;

/* @return a NULL-terminated list of the names a caller may give: the fixed renderers
 *   ("mixtral", "chatml", "qwen3", "olmoe") and "jinja". */
const char *const *fmoe_chat_template_names(void);

/* @return the template family detected at load ("mixtral", "chatml", "qwen3", "olmoe"),
 *   the fixed renderer that is the fallback, or NULL when none was recognised. */
const char *fmoe_tokenizer_chat_template(const fmoe_tokenizer *tok);

/* @return the Jinja text a render uses (with_tools: the "tool_use" one of a list of named
 *   templates, when there is one), owned by tok; NULL when the model has none. The server
 *   reads the tool-call markup and the <think> tags a model's output will hold from it. */
const char *fmoe_tokenizer_chat_template_text(const fmoe_tokenizer *tok, int with_tools);

/*
 * Renders messages to prompt text (to be encoded with add_special = 0: the text carries
 * its own BOS where the template writes one). `opt` may be NULL (the model's template, no
 * generation prompt).
 * @return 0 and *text (malloc'd, NUL-terminated, *len bytes), or FMOE_ENOTFOUND (no
 *   template and no family recognised, none named), FMOE_EINVAL (the template raised an
 *   error, e.g. roles that must alternate; a failed operation; bad fields_json, tools_json
 *   or kwargs_json; an unknown name), FMOE_EUNSUPPORTED / FMOE_EFORMAT (the interpreter
 *   refused the template and there is no fallback), FMOE_ERANGE (the template went past a
 *   limit: steps, nesting, output size), FMOE_ENOMEM. Errors are one line naming the
 *   template line.
 */
int fmoe_tokenizer_apply_chat_template(const fmoe_tokenizer *tok, const fmoe_chat_message *msgs,
                                       size_t n, const fmoe_chat_options *opt, char **text,
                                       size_t *len);

#endif
