/*
 * fmoe/json_constraint.h - structured output: a JSON schema (or "any JSON object") compiled
 * to a byte automaton, and a per-step mask over the vocabulary that admits only the tokens
 * whose bytes keep the output a prefix of a document the schema accepts.
 *
 *     fmoe_json_schema *schema;                     // once per request (or per process)
 *     if (fmoe_json_schema_compile(text, len, &schema) < 0) fail(fmoe_error_detail());
 *     fmoe_json_vocab *vocab;                       // once per tokenizer, shared
 *     fmoe_json_vocab_init(tok, end_ids, num_end, &vocab);
 *     fmoe_json_matcher *m;                         // once per sequence
 *     fmoe_json_matcher_init(schema, vocab, &m);
 *     for (;;) {
 *         if (fmoe_json_matcher_mask(m, allowed) == 0) break;   // nothing can follow
 *         ... set logits[i] = -inf where !allowed[i]; sample tok ...
 *         if (fmoe_json_matcher_is_end(m, tok)) break;          // the document is done
 *         fmoe_json_matcher_accept(m, tok);
 *     }
 *     fmoe_json_matcher_free(m); fmoe_json_vocab_free(vocab); fmoe_json_schema_free(schema);
 *
 * What a schema may say (anything else is refused, naming the keyword and its JSON path):
 *   type          object, array, string, number, integer, boolean, null, or an array of
 *                 them (["string", "null"]: as anyOf)
 *   object        properties, required, additionalProperties false (absent or true with
 *                 properties counts as false: only the listed properties are written, in
 *                 the schema's order, optional ones may be left out); no properties and
 *                 no additionalProperties false: any object
 *   array         items, minItems, maxItems
 *   enum, const   any JSON values (at most 64), matched as their compact JSON text
 *   anyOf         branches that a document tells apart by its first byte (string vs
 *                 number vs object vs array vs true/false vs null; number with integer is
 *                 refused); several object branches only as a tagged union: each begins
 *                 with the same required property whose value is a string const of its
 *                 own, and the rest follows the branch that value names
 *   oneOf         as anyOf, under the same condition (such branches never both match)
 *   allOf         of one schema (annotations and definitions beside it)
 *   minimum, maximum, exclusiveMinimum, exclusiveMaximum
 *                 on integers (numbers as bounds): a digit is taken only when some
 *                 integer that starts so is in range; on "number" refused
 *   minLength, maxLength
 *                 on strings, in code points; such a string is written without \u
 *                 escapes
 *   pattern       on strings, a subset of regular expressions (json_regex.c): literals,
 *                 ., [classes], \d \w \s (\D \W \S), escaped punctuation, ? * + {m}
 *                 {m,} {m,n}, groups and |, ^ and $ at the ends (whole matches are
 *                 written either way); at most 63 character positions once repetitions
 *                 are expanded; such a string is written unescaped, in printable ASCII
 *                 but '"' and '\'; not together with minLength/maxLength
 *   $ref          "#/$defs/NAME" or "#/definitions/NAME" of the root, expanded in place;
 *                 only annotations beside it; a schema that refers to itself is refused
 *   annotations   title, description, $schema, $id, $comment, default, examples,
 *                 deprecated, readOnly, writeOnly: ignored
 * Refused: recursion and other $ref forms, patterns outside the subset, format, bounds on numbers, lengths
 * or bounds without a type, multipleOf, oneOf of overlapping branches, allOf of several,
 * not, patternProperties, prefixItems, uniqueItems, if/then/else, ... .
 *
 * What is generated: no whitespace before the document or after it; at most
 * FMOE_JSON_MAX_WS whitespace bytes in a row between tokens of the document (so that
 * the model cannot loop on spaces); numbers of at most 15 integer digits, 15 fraction
 * digits and 2 exponent digits; strings of well-formed UTF-8 with the JSON escapes;
 * "any JSON" (json_object and unconstrained values) nested at most FMOE_JSON_MAX_NEST
 * deep. The end ids are admitted exactly when the document is complete, and then they
 * are the only tokens admitted unless a number could still go on.
 *
 * Cost (docs/serving.md "Structured output"): the vocabulary's token bytes are put in a
 * trie once per tokenizer; a mask walks the trie depth first, running the automaton one
 * byte per trie edge, and skips a whole subtree at the first byte the automaton refuses.
 *
 * Thread safety: a compiled schema and a vocabulary are immutable (a schema's reference
 * count is atomic); a matcher belongs to one thread at a time.
 */
#ifndef FMOE_JSON_CONSTRAINT_H
#define FMOE_JSON_CONSTRAINT_H

#include <stddef.h>
#include <stdint.h>

#include "fmoe/tokenizer.h"

#define FMOE_JSON_MAX_WS 4     /* whitespace bytes in a row */
#define FMOE_JSON_MAX_NEST 12  /* nesting of "any JSON" values */

typedef struct fmoe_json_schema fmoe_json_schema;
typedef struct fmoe_json_vocab fmoe_json_vocab;
typedef struct fmoe_json_matcher fmoe_json_matcher;

/* Compiles a JSON schema (text[0..len), UTF-8 JSON). @return 0 and *out (one reference;
 * fmoe_json_schema_free drops it), FMOE_EINVAL (not JSON, or a keyword with a wrong
 * value), FMOE_EUNSUPPORTED (a keyword this module does not do); the detail is one line
 * naming the keyword and its JSON path ("'format' at $.properties.date is not
 * supported"). FMOE_ENOMEM. */
int fmoe_json_schema_compile(const char *text, size_t len, fmoe_json_schema **out);

/* The schema of OpenAI's {"type": "json_object"}: any JSON object. @return 0 and *out,
 * or FMOE_ENOMEM. */
int fmoe_json_schema_any_object(fmoe_json_schema **out);

/* Another reference to s (atomic): a request's schema shared by the jobs of its n
 * choices. @return s. */
fmoe_json_schema *fmoe_json_schema_retain(fmoe_json_schema *s);

/* Drops one reference; the last frees. NULL is a no-op. */
void fmoe_json_schema_free(fmoe_json_schema *s);

/* The trie of the tokenizer's token bytes (fmoe_tokenizer_token_to_piece). end_ids
 * [num_end]: the ids that end a document (EOS and the generation config's stop ids);
 * special tokens other than these, and tokens with no bytes, are never admitted.
 * @return 0 and *out, FMOE_EINVAL, FMOE_ENOMEM. */
int fmoe_json_vocab_init(const fmoe_tokenizer *tok, const int32_t *end_ids, int32_t num_end,
                         fmoe_json_vocab **out);

/* NULL is a no-op. */
void fmoe_json_vocab_free(fmoe_json_vocab *v);

/* @return the vocabulary size V the masks cover. */
int32_t fmoe_json_vocab_size(const fmoe_json_vocab *v);

/* A matcher at the start of a document. schema and vocab are borrowed and must outlive
 * it. Allocates all its working memory here. @return 0 and *out, FMOE_ENOMEM. */
int fmoe_json_matcher_init(const fmoe_json_schema *schema, const fmoe_json_vocab *vocab,
                           fmoe_json_matcher **out);

/* NULL is a no-op. */
void fmoe_json_matcher_free(fmoe_json_matcher *m);

/* allowed[V] := 1 for each token that may come next, else 0. Allocates nothing.
 * @return the number of tokens allowed (0 only for a schema the vocabulary cannot
 *   spell: the caller ends the sequence). */
int32_t fmoe_json_matcher_mask(fmoe_json_matcher *m, uint8_t *allowed);

/* @return 1 when id is one of the vocabulary's end ids. */
int fmoe_json_matcher_is_end(const fmoe_json_matcher *m, int32_t id);

/* Advances over token id's bytes. @return 0, or FMOE_EINVAL when the mask would not have
 * allowed it (the matcher is then unchanged). */
int fmoe_json_matcher_accept(fmoe_json_matcher *m, int32_t id);

/* Advances over raw bytes (for tests and for checking a text). @return 0, or
 * FMOE_EINVAL at the first byte that no document of the schema has there (the matcher
 * is then unchanged). */
int fmoe_json_matcher_feed(fmoe_json_matcher *m, const char *bytes, size_t n);

/* @return 1 when the bytes so far are a whole document of the schema. */
int fmoe_json_matcher_is_complete(const fmoe_json_matcher *m);

#endif
