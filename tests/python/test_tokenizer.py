"""Cross-checks fmoe's tokenizer (runtime/tokenizer, driven through `fmoe tokenize --batch`)
against independent implementations: HuggingFace `tokenizers` for every tokenizer.json, and
`sentencepiece` on Mixtral's tokenizer.model.

Tokenizers tested (tests/fixtures/tokenizers/, see its README): Mixtral-8x7B (SentencePiece
BPE, byte fallback, Prepend/Replace normalizer), Qwen3 (byte-level, NFC, Split regex) and
gpt-oss (byte-level o200k, ignore_merges). Qwen3's and gpt-oss's tokenizer.json are stored
zstd-compressed and unpacked with the `zstd` CLI into a temporary folder. On top of the real
files, variants built from them exercise configurations they do not use (ByteLevel with
add_prefix_space and its own regex, Metaspace pre-tokenizer and decoder, lstrip/rstrip and
single_word added tokens, TemplateProcessing with EOS).

Strings: a fixed list (ASCII, accents, CJK, RTL, emoji with ZWJ sequences, whitespace runs,
numbers, code, special-token text) plus a seeded random corpus of a few thousand strings
built from the same ingredients.
"""
import json
import os
import pathlib
import random
import shutil
import subprocess
import unicodedata

import pytest

tokenizers = pytest.importorskip("tokenizers")

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "tokenizers"
N_RANDOM = int(os.environ.get("FMOE_TOKENIZER_RANDOM", "3000"))

# ---------------------------------------------------------------------------------------
# corpus
# ---------------------------------------------------------------------------------------

FIXED = [
    "", " ", "  ", "   ", "\t", "\n", "\n\n", " \n ", "\r\n", "\r\n\r\n", "\t\t  \n",
    "Hello world", "Hello, world!", " leading space", "trailing space ", "  two leading",
    "multiple   spaces   here", "tabs\tand\ttabs", "line1\nline2\r\nline3\n", "a\n\n\nb",
    "The quick brown fox jumps over the lazy dog.",
    "I'm you're they've we'll he'd she's it'S THEY'RE DON'T", "'s 't 're", "rock 'n' roll",
    "1234567890", "3.14159", "1,000,000", "2024-01-01T12:00:00Z", "0x1F 0b1010 1e-9",
    "١٢٣٤ ٥٦٧", "①②③ ⅫⅣ", "½ ¾ ²³", "12345678901234567890123",
    "héllo wörld", "naïve café résumé Ångström", "e\u0301 a\u0308 o\u0302\u0323",
    "\u212b \u2126 \u1e0b\u0323", "ﬁ ﬂ Ǆ ǅ", "Straße ß ẞ",
    "中文测试：你好，世界！", "日本語のテキスト、カタカナ、ひらがな。", "한국어 텍스트 입니다",
    "Привет, мир! Ёлка", "Ελληνικά γράμματα", "שלום עולם", "مرحبا بالعالم", "हिन्दी भाषा",
    "ภาษาไทย", "ქართული", "Tiếng Việt có dấu",
    "😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵🇺🇸", "a😀b", "❤️ ✨ 🔥", "1️⃣ #️⃣", "🧑🏿‍🚀 🫠",
    "def f(x):\n    return x ** 2\n", "int main(void) { return 0; }\n",
    "for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}", "<html><body>hi</body></html>",
    '{"key": [1, 2, 3], "x": null}', "SELECT * FROM t WHERE a = 'b';", "x => x * 2 // ok",
    "a_b_c __init__ self.foo_bar", "#include <stdio.h>", "$ ls -la | grep .c",
    "https://example.com/path?q=1&r=2#frag", "user@example.com",
    "<s>", "</s>", "<unk>", "<s>hello</s>", "hello<s>", "<s><s>", " <s> ", "<0x41>",
    "<|endoftext|>", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<think>reason</think>answer", "<|startoftext|>x<|return|>", "<|im_start|><|im_end|>",
    "[INST] hi [/INST]", "text<|im_end|>more", "<|endoftext|><|endoftext|>",
    "\u00a0nbsp", "\u3000ideographic", "a\u2028b", "a\u0085b", "a\u180eb", "\u200bzwsp",
    "\ufeffbom", "a\u200db", "soft\u00adhyphen", "\x01\x02\x1f\x7f",
    "a" * 1000, " " * 500, "ab" * 300 + "\n" * 50, "1" * 100, "😀" * 50, "\n" * 40,
]

SPECIAL_TEXT = ["<s>", "</s>", "<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>",
                "<think>", "</think>", "<|startoftext|>", "<|return|>", "[INST]", "<0x0A>"]

RANGES = [(0x20, 0x7E), (0xA0, 0xFF), (0x100, 0x24F), (0x300, 0x36F), (0x370, 0x3FF),
          (0x400, 0x4FF), (0x590, 0x5FF), (0x600, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F),
          (0x1100, 0x11FF), (0x1E00, 0x1EFF), (0x2000, 0x206F), (0x2070, 0x209F),
          (0x20A0, 0x20CF), (0x2100, 0x214F), (0x2190, 0x22FF), (0x2460, 0x24FF),
          (0x3000, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xFF00, 0xFFEF),
          (0x1F300, 0x1F5FF), (0x1F600, 0x1F64F), (0x1F900, 0x1F9FF), (0x1D400, 0x1D7FF)]

WORDS = ["the", "of", "and", "to", "in", "is", "you", "that", "it", "he", "was", "for",
         "on", "are", "as", "with", "his", "they", "I", "at", "be", "this", "have", "from",
         "token", "tokenizer", "Mixture", "experts", "GPU", "CUDA", "fMoE", "offloading",
         "don't", "it's", "we're", "I'LL", "naïve", "über", "日本", "число", "λόγος"]


def _random_string(rng):
    parts = []
    for _ in range(rng.randint(1, 12)):
        kind = rng.randrange(10)
        if kind == 0:
            parts.append(rng.choice([" ", "  ", "\t", "\n", "\r\n", " \n", "\u00a0", "\u3000",
                                     "   ", "\n\n", " \t "]) * rng.randint(1, 3))
        elif kind == 1:
            parts.append("".join(rng.choice("0123456789") for _ in range(rng.randint(1, 9))))
        elif kind == 2:
            lo, hi = rng.choice(RANGES)
            parts.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 6))))
        elif kind == 3:
            parts.append(rng.choice(SPECIAL_TEXT))
        elif kind == 4:
            parts.append("".join(rng.choice("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
                                 for _ in range(rng.randint(1, 4))))
        elif kind == 5:
            parts.append(rng.choice(["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL",
                                     "'ſ"]))
        elif kind == 6:
            parts.append(rng.choice(["👨‍👩‍👧", "🏳️‍🌈", "👍🏻", "🇫🇷", "✌️", "🤷‍♀️", "é", "e\u0301",
                                     "ñ", "n\u0303", "각", "\u1100\u1161\u11a8"]))
        else:
            w = rng.choice(WORDS)
            if rng.random() < 0.2:
                w = w.upper()
            parts.append((" " if rng.random() < 0.7 else "") + w)
    return "".join(parts)


def corpus():
    rng = random.Random(20240611)
    return FIXED + [_random_string(rng) for _ in range(N_RANDOM)]


# ---------------------------------------------------------------------------------------
# fixtures
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tok_dirs(tmp_path_factory):
    """name -> folder holding tokenizer.json (decompressed where stored as .zst)."""
    out = {}
    base = tmp_path_factory.mktemp("tokenizers")
    for d in sorted(p for p in FIXTURES.iterdir() if p.is_dir()):
        if (d / "tokenizer.json").exists():
            out[d.name] = d
            continue
        zst = d / "tokenizer.json.zst"
        if not zst.exists():
            continue
        if shutil.which("zstd") is None:
            continue  # reported by test_fixtures_present
        dst = base / d.name
        dst.mkdir()
        subprocess.run(["zstd", "-q", "-d", str(zst), "-o", str(dst / "tokenizer.json")],
                       check=True)
        for extra in d.iterdir():
            if extra.name != "tokenizer.json.zst":
                shutil.copy(extra, dst / extra.name)
        out[d.name] = dst
    return out


def fmoe_batch(fmoe_bin, tok_path, items, *flags):
    """Runs `fmoe tokenize --batch` over items (str: encode, list: decode, bytes: encode raw)."""
    lines = []
    for it in items:
        if isinstance(it, bytes):
            lines.append(json.dumps({"hex": it.hex()}))
        else:
            lines.append(json.dumps(it))
    p = subprocess.run([str(fmoe_bin), "tokenize", "--tokenizer", str(tok_path), "--batch", "-",
                        *flags], input="\n".join(lines) + "\n", capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr
    out = [json.loads(line) for line in p.stdout.split("\n") if line]
    assert len(out) == len(items)
    return out


def hf_tokenizer(path):
    return tokenizers.Tokenizer.from_file(str(path))


def compare_ids(name, texts, ours, theirs, limit=5):
    bad = [(t, o, h) for t, o, h in zip(texts, ours, theirs) if o != h]
    msg = "\n".join(f"  {t!r}\n    fmoe {o}\n    hf   {h}" for t, o, h in bad[:limit])
    assert not bad, f"{name}: {len(bad)} of {len(texts)} strings differ:\n{msg}"


# ---------------------------------------------------------------------------------------
# the real tokenizers
# ---------------------------------------------------------------------------------------

REAL = ["mixtral-8x7b-instruct", "qwen3", "gpt-oss"]


def test_fixtures_present(tok_dirs):
    missing = [n for n in REAL if n not in tok_dirs]
    assert not missing, f"tokenizer fixtures missing (or no zstd CLI): {missing}"


def _tok(tok_dirs, name):
    if name not in tok_dirs:
        pytest.skip(f"{name} fixture not available")
    return tok_dirs[name]


@pytest.mark.parametrize("name", REAL)
@pytest.mark.parametrize("add_special", [False, True])
def test_encode_matches_hf(fmoe_bin, tok_dirs, name, add_special):
    d = _tok(tok_dirs, name)
    texts = corpus()
    hf = hf_tokenizer(d / "tokenizer.json")
    theirs = [e.ids for e in hf.encode_batch(texts, add_special_tokens=add_special)]
    flags = [] if add_special else ["--no-special"]
    ours = [r["ids"] for r in fmoe_batch(fmoe_bin, d, texts, *flags)]
    compare_ids(f"{name} add_special={add_special}", texts, ours, theirs)


@pytest.mark.parametrize("name", REAL)
@pytest.mark.parametrize("skip_special", [False, True])
def test_decode_matches_hf(fmoe_bin, tok_dirs, name, skip_special):
    d = _tok(tok_dirs, name)
    texts = corpus()
    hf = hf_tokenizer(d / "tokenizer.json")
    ids = [e.ids for e in hf.encode_batch(texts, add_special_tokens=True)]
    # also byte sequences cut in the middle of characters (invalid UTF-8 when decoded)
    ids += [x[: len(x) // 2 + 1] for x in ids if len(x) > 2][:500]
    theirs = hf.decode_batch(ids, skip_special_tokens=skip_special)
    flags = ["--skip-special"] if skip_special else []
    ours = [r["text"] for r in fmoe_batch(fmoe_bin, d, ids, *flags)]
    compare_ids(f"{name} decode skip_special={skip_special}", ids, ours, theirs)


@pytest.mark.parametrize("name", REAL)
def test_decode_random_ids_matches_hf(fmoe_bin, tok_dirs, name):
    """Arbitrary id sequences (byte tokens in any order, special tokens, NUL bytes)."""
    d = _tok(tok_dirs, name)
    hf = hf_tokenizer(d / "tokenizer.json")
    vocab = hf.get_vocab_size()
    rng = random.Random(11)
    seqs = []
    for _ in range(2000):
        n = rng.randint(0, 20)
        pick = rng.choice([lambda: rng.randrange(vocab), lambda: rng.randrange(300),
                           lambda: vocab - 1 - rng.randrange(30)])
        seqs.append([pick() for _ in range(n)])
    for skip in (False, True):
        theirs = hf.decode_batch(seqs, skip_special_tokens=skip)
        ours = [r["text"] for r in fmoe_batch(fmoe_bin, d, seqs,
                                              *(["--skip-special"] if skip else []))]
        compare_ids(f"{name} random ids skip_special={skip}", seqs, ours, theirs)


@pytest.mark.parametrize("name", REAL)
def test_round_trip(fmoe_bin, tok_dirs, name):
    """decode(encode(s)) == s, for strings without special-token text (their ids decode to
    themselves, but Mixtral's normalizer adds a space after them) and up to NFC for Qwen3."""
    d = _tok(tok_dirs, name)
    texts = [t for t in corpus() if not any(s in t for s in SPECIAL_TEXT)]
    ids = [r["ids"] for r in fmoe_batch(fmoe_bin, d, texts, "--no-special")]
    back = [r["text"] for r in fmoe_batch(fmoe_bin, d, ids)]
    expect = [unicodedata.normalize("NFC", t) if name == "qwen3" else t for t in texts]
    compare_ids(f"{name} round trip", texts, back, expect)


def test_nfc_every_mark_and_decomposition(fmoe_bin, tok_dirs):
    """Qwen3's NFC on every code point with a combining class or a decomposition (Python's
    Unicode data), behind a mark of class 232 and after a base letter: our tables must be
    those of tokenizers (Unicode 9.0), neither older nor newer."""
    d = _tok(tok_dirs, "qwen3")
    hf = hf_tokenizer(d / "tokenizer.json")
    cps = [cp for cp in range(0xA0, 0x30000) if not 0xD800 <= cp <= 0xDFFF and
           (unicodedata.combining(chr(cp)) or unicodedata.decomposition(chr(cp)))]
    texts = ["a\u0315" + chr(cp) for cp in cps] + ["e" + chr(cp) + "\u0301" for cp in cps]
    theirs = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
    ours = [r["ids"] for r in fmoe_batch(fmoe_bin, d, texts, "--no-special")]
    compare_ids("qwen3 NFC", texts, ours, theirs)


def test_mixtral_matches_sentencepiece(fmoe_bin, tok_dirs):
    spm = pytest.importorskip("sentencepiece")
    d = _tok(tok_dirs, "mixtral-8x7b-instruct")
    sp = spm.SentencePieceProcessor(model_file=str(d / "tokenizer.model"))
    # sentencepiece does not parse special-token text, so leave those strings out
    texts = [t for t in corpus() if not any(s in t for s in ("<s>", "</s>", "<unk>"))]
    theirs = [[sp.bos_id()] + sp.encode(t) for t in texts]
    ours = [r["ids"] for r in fmoe_batch(fmoe_bin, d, texts)]
    compare_ids("mixtral vs sentencepiece", texts, ours, theirs)
    back = [r["text"] for r in fmoe_batch(fmoe_bin, d, theirs, "--skip-special")]
    compare_ids("mixtral decode vs sentencepiece", theirs, back,
                [sp.decode(x[1:]) for x in theirs])


@pytest.mark.parametrize("name", REAL)
def test_invalid_utf8_does_not_crash(fmoe_bin, tok_dirs, name):
    """Random bytes: encoded without error; byte-level tokenizers keep every byte."""
    d = _tok(tok_dirs, name)
    rng = random.Random(7)
    blobs = [bytes(rng.randrange(256) for _ in range(rng.randint(1, 64))) for _ in range(300)]
    blobs += [b"\xff", b"\xc3", b"a\xe2\x82b", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x00"]
    res = fmoe_batch(fmoe_bin, d, blobs, "--no-special")
    assert all(r["ids"] or not b for r, b in zip(res, blobs))


def test_chat_template_mixtral_matches_jinja(fmoe_bin, tok_dirs):
    """Mixtral-Instruct's own chat_template rendered by jinja2 == fmoe's renderer."""
    jinja2 = pytest.importorskip("jinja2")
    d = _tok(tok_dirs, "mixtral-8x7b-instruct")
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    env = jinja2.Environment()
    tmpl = env.from_string(cfg["chat_template"])
    for text in ["Hello", "What is 2+2?\nThink.", "  spaces  "]:
        want = tmpl.render(messages=[{"role": "user", "content": text}], bos_token="<s>",
                           eos_token="</s>", add_generation_prompt=True)
        p = subprocess.run([str(fmoe_bin), "tokenize", "--tokenizer", str(d), "--chat",
                            "--text", text, "--json"], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        got = json.loads(p.stdout)
        assert got["prompt"] == want
        hf = hf_tokenizer(d / "tokenizer.json")
        assert got["ids"] == hf.encode(want, add_special_tokens=False).ids


def test_info_and_cli(fmoe, tok_dirs):
    d = _tok(tok_dirs, "mixtral-8x7b-instruct")
    info = json.loads(fmoe("tokenize", "--tokenizer", d, "--info", "--json").stdout)
    assert info == {"vocab_size": 32000, "bos_id": 1, "eos_id": 2, "bos_token": "<s>",
                    "eos_token": "</s>", "chat_template": "mixtral"}
    out = fmoe("tokenize", "--tokenizer", d, "--text", "Hello world").stdout
    assert out.strip() == "[1, 22557, 1526]"
    out = fmoe("tokenize", "--tokenizer", d, "--decode", "1,22557,1526", "--skip-special").stdout
    assert out == "Hello world\n"
    p = fmoe("tokenize", "--tokenizer", d / "nope.json", "--text", "x", check=False)
    assert p.returncode == 1 and "nope.json" in p.stderr
    p = fmoe("tokenize", "--tokenizer", d, check=False)
    assert p.returncode == 2


BUNDLED = sorted(p.parent for p in (REPO / "datasets").glob("*/tokenizer.json"))


@pytest.mark.parametrize("d", BUNDLED, ids=[p.name for p in BUNDLED])
def test_bundled_tokenizer_matches_hf(fmoe_bin, d):
    """Tokenizers shipped with fmoe (datasets/<model>/, e.g. the default fmoe-tiny)."""
    texts = corpus()
    hf = hf_tokenizer(d / "tokenizer.json")
    for add_special in (False, True):
        theirs = [e.ids for e in hf.encode_batch(texts, add_special_tokens=add_special)]
        ours = [r["ids"] for r in fmoe_batch(fmoe_bin, d, texts,
                                             *([] if add_special else ["--no-special"]))]
        compare_ids(f"{d.name} add_special={add_special}", texts, ours, theirs)
    ids = [e.ids for e in hf.encode_batch(texts, add_special_tokens=True)]
    for skip in (False, True):
        theirs = hf.decode_batch(ids, skip_special_tokens=skip)
        ours = [r["text"] for r in fmoe_batch(fmoe_bin, d, ids,
                                              *(["--skip-special"] if skip else []))]
        compare_ids(f"{d.name} decode skip_special={skip}", ids, ours, theirs)


# ---------------------------------------------------------------------------------------
# variants: configurations the real files do not use, built from them
# ---------------------------------------------------------------------------------------


def _variant(tok_dirs, tmp_path, base, edit):
    src = _tok(tok_dirs, base) / "tokenizer.json"
    j = json.loads(src.read_text())
    edit(j)
    out = tmp_path / "tokenizer.json"
    out.write_text(json.dumps(j, ensure_ascii=False))
    return out


def _bytelevel_prefix(j):  # GPT-2/OLMoE style: ByteLevel with its own regex
    j["normalizer"] = None
    j["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                          "use_regex": True}


def _olmoe_style(j):  # GPT-NeoX/OLMoE style: NFC, ByteLevel with the GPT-2 regex, EOS after
    j["normalizer"] = {"type": "NFC"}
    j["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True}
    j["post_processor"] = {"type": "TemplateProcessing",
                           "single": [{"Sequence": {"id": "A", "type_id": 0}},
                                      {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}],
                           "pair": [], "special_tokens": {
                               "<|endoftext|>": {"id": "<|endoftext|>", "ids": [151643],
                                                 "tokens": ["<|endoftext|>"]}}}


def _bytelevel_noregex(j):
    j["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False,
                          "trim_offsets": True, "use_regex": False}
    j["model"]["ignore_merges"] = False


def _split_behaviors(j):
    j["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFD"}, {
        "type": "Replace", "pattern": {"Regex": "\\s{2,}"}, "content": " "}]}
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"String": "."}, "behavior": "MergedWithPrevious",
         "invert": False},
        {"type": "Split", "pattern": {"Regex": "\\d"}, "behavior": "MergedWithNext",
         "invert": False},
        {"type": "Split", "pattern": {"Regex": "[aeiou]+"}, "behavior": "Contiguous",
         "invert": False},
        {"type": "Split", "pattern": {"Regex": "\\s"}, "behavior": "Removed", "invert": False},
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
         "use_regex": False}]}


def _added_flags(j):
    j["added_tokens"] += [
        {"id": 151669, "content": "<tool>", "single_word": False, "lstrip": True,
         "rstrip": True, "normalized": False, "special": True},
        {"id": 151670, "content": "word", "single_word": True, "lstrip": False,
         "rstrip": False, "normalized": True, "special": False},
        {"id": 151671, "content": "é", "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": True, "special": False}]
    j["post_processor"] = {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}},
                                      {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {
                               "<|im_start|>": {"id": "<|im_start|>", "ids": [151644],
                                                "tokens": ["<|im_start|>"]},
                               "<|endoftext|>": {"id": "<|endoftext|>", "ids": [151643],
                                                 "tokens": ["<|endoftext|>"]}}}


def _metaspace(scheme, split):
    def edit(j):  # Llama/Mistral v3 style: Metaspace pre-tokenizer instead of the normalizer
        j["normalizer"] = None
        j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581",
                              "prepend_scheme": scheme, "split": split}
        j["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": scheme,
             "split": split}, {"type": "ByteFallback"}, {"type": "Fuse"}]}
    return edit


def _mixtral_added(j):
    j["added_tokens"].append({"id": 32000, "content": "[INST]", "single_word": False,
                              "lstrip": False, "rstrip": False, "normalized": True,
                              "special": True})
    j["added_tokens"].append({"id": 32001, "content": " end", "single_word": False,
                              "lstrip": False, "rstrip": True, "normalized": False,
                              "special": False})


VARIANTS = [
    ("qwen3", "bytelevel-prefix-regex", _bytelevel_prefix),
    ("qwen3", "olmoe-style", _olmoe_style),
    ("gpt-oss", "bytelevel-no-regex", _bytelevel_noregex),
    ("qwen3", "split-behaviors", _split_behaviors),
    ("qwen3", "added-token-flags", _added_flags),
    ("mixtral-8x7b-instruct", "metaspace-first", _metaspace("first", True)),
    ("mixtral-8x7b-instruct", "metaspace-always-nosplit", _metaspace("always", False)),
    ("mixtral-8x7b-instruct", "metaspace-never", _metaspace("never", True)),
    ("mixtral-8x7b-instruct", "normalized-added", _mixtral_added),
]


@pytest.mark.parametrize("base,vname,edit", VARIANTS, ids=[v[1] for v in VARIANTS])
def test_variant_matches_hf(fmoe_bin, tok_dirs, tmp_path, base, vname, edit):
    path = _variant(tok_dirs, tmp_path, base, edit)
    hf = hf_tokenizer(path)
    rng = random.Random(hash(vname) & 0xFFFF)
    texts = FIXED + [_random_string(rng) for _ in range(300)]
    texts += ["word words sword word.", "a <tool> b", "x  <tool>  y", "<tool>", "é e\u0301",
              "[INST] x [/INST]", "an end end  endless"]
    for add_special in (False, True):
        theirs = [e.ids for e in hf.encode_batch(texts, add_special_tokens=add_special)]
        ours = [r["ids"] for r in fmoe_batch(fmoe_bin, path, texts,
                                             *([] if add_special else ["--no-special"]))]
        compare_ids(f"{vname} add_special={add_special}", texts, ours, theirs)
    theirs = hf.decode_batch([hf.encode(t).ids for t in texts], skip_special_tokens=False)
    ours = [r["text"] for r in fmoe_batch(fmoe_bin, path, [hf.encode(t).ids for t in texts])]
    compare_ids(f"{vname} decode", texts, ours, theirs)
