"""tests/bench/make_shaped_gguf.py: real-shape GGUF files with random weights.

The generator's small variants (8 layers, narrow) are written into a temporary folder and
checked with independent readers:

- gguf-py's GGUFReader: the key set and each key's type and value, every tensor's name,
  extents and ggml type against a table written here from llama.cpp's Q4_K_M rules
  (src/llama-quant.cpp, llama_tensor_get_type: output Q6_K; ffn_down and attn_v Q6_K on
  the "more bits" layers; with exactly 8 experts attn_v and attn_k Q8_0 and attn_output
  Q5_K; norms and routers F32), not from the generator's output; the same table is checked
  against the generator's plan for the full Mixtral-8x7B and Qwen3-30B-A3B shapes, which
  are too big to write here;
- the blocks: every block's f16 scales finite, and dequantised matrices (gguf.quants) of
  the scale 1/sqrt(fan_in);
- the tokenizer keys against `sentencepiece` (Mixtral's tokenizer.model) and HF
  `tokenizers` (Qwen3's tokenizer.json), vocab padded to vocab_size;
- fmoe itself: `fmoe generate` (every expert resident) gives finite logits, and `fmoe
  record` of a few prompts gives routes whose per-layer expert-frequency entropy (h5py) is
  clearly below uniform for the skewed variant, and near the generator's own estimate;
- the command line: bad arguments are one line and exit 2 with nothing written; a run
  stopped by SIGTERM leaves either the whole file or nothing.
"""
import importlib.util
import json
import math
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import run_fmoe

gguf = pytest.importorskip("gguf")
h5py = pytest.importorskip("h5py")
import hdf5plugin  # noqa: F401,E402

REPO = pathlib.Path(__file__).resolve().parents[2]
GEN = REPO / "tests" / "bench" / "make_shaped_gguf.py"
TOKENIZERS = REPO / "tests" / "fixtures" / "tokenizers"
PROMPTS = REPO / "datasets" / "samples" / "prompts_100.txt"
T = gguf.GGMLQuantizationType

# The published configs (config.json of the two checkpoints).
FULL = {
    "mixtral-8x7b": dict(arch="llama", layers=32, hidden=4096, heads=32, kv_heads=8,
                         head_dim=128, ff=14336, expert_ff=14336, experts=8, top_k=2,
                         vocab=32000, ctx=32768, theta=1e6, eps=1e-5),
    "qwen3-30b-a3b": dict(arch="qwen3moe", layers=48, hidden=2048, heads=32, kv_heads=4,
                          head_dim=128, ff=6144, expert_ff=768, experts=128, top_k=8,
                          vocab=151936, ctx=40960, theta=1e6, eps=1e-6),
}

# Layers whose ffn_down (and, below 8 experts... i.e. not Mixtral, attn_v) llama-quantize's
# Q4_K_M gives Q6_K, worked out by hand from use_more_bits(i, n): i < n/8, i >= 7n/8, or
# (i - n/8) % 3 == 2, integer division.
MORE_BITS = {
    8: {0, 3, 6, 7},
    32: {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31},
    48: {0, 1, 2, 3, 4, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35, 38, 41,
         42, 43, 44, 45, 46, 47},
}


def expected_type(name, n_layers, n_experts, mix):
    """The ggml type llama-quantize writes for one tensor of these models."""
    if name.endswith("_norm.weight") or name.endswith("ffn_gate_inp.weight"):
        return T.F32
    if mix == "q4_k":
        return T.Q4_K
    if name == "output.weight":
        return T.Q6_K
    if name == "token_embd.weight":
        return T.Q4_K
    layer = int(name.split(".")[1])
    more = layer in MORE_BITS[n_layers]
    kind = name.split(".")[2]
    if n_experts == 8 and kind in ("attn_k", "attn_v"):
        return T.Q8_0
    if n_experts == 8 and kind == "attn_output":
        return T.Q5_K
    if kind in ("attn_v", "ffn_down_exps"):
        return T.Q6_K if more else T.Q4_K
    return T.Q4_K


def expected_tensors(c):
    """name -> extents (innermost first), from the config alone."""
    h, q, kv = c["hidden"], c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"]
    out = {"token_embd.weight": (h, c["vocab"]), "output.weight": (h, c["vocab"]),
           "output_norm.weight": (h,)}
    for i in range(c["layers"]):
        p = f"blk.{i}."
        out.update({p + "attn_norm.weight": (h,), p + "ffn_norm.weight": (h,),
                    p + "attn_q.weight": (h, q), p + "attn_k.weight": (h, kv),
                    p + "attn_v.weight": (h, kv), p + "attn_output.weight": (q, h),
                    p + "ffn_gate_inp.weight": (h, c["experts"]),
                    p + "ffn_gate_exps.weight": (h, c["expert_ff"], c["experts"]),
                    p + "ffn_up_exps.weight": (h, c["expert_ff"], c["experts"]),
                    p + "ffn_down_exps.weight": (c["expert_ff"], h, c["experts"])})
        if c["arch"] == "qwen3moe":
            out.update({p + "attn_q_norm.weight": (c["head_dim"],),
                        p + "attn_k_norm.weight": (c["head_dim"],)})
    return out


def generate(out, *args, check=True):
    p = subprocess.run([sys.executable, str(GEN), *map(str, args), "-o", str(out)],
                       capture_output=True, text=True, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"make_shaped_gguf.py {args} exited {p.returncode}:\n{p.stderr}")
    return p


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The small files: Mixtral skewed, Qwen3 default routing, Mixtral --type q4_k with
    2 layers and only llama.cpp's keys."""
    d = tmp_path_factory.mktemp("shaped")
    out = {}
    for key, shape, extra in [("mixtral", "mixtral-8x7b", ["--skew"]),
                              ("qwen3", "qwen3-30b-a3b", []),
                              ("mixtral-q4k", "mixtral-8x7b",
                               ["--type", "q4_k", "--layers", "2", "--llama-keys-only"])]:
        f = d / f"{key}.gguf"
        rep = d / f"{key}.json"
        generate(f, "--shape", shape, "--small", "--seed", "7", "--report", rep, *extra)
        out[key] = (f, json.loads(rep.read_text()))
    return out


@pytest.fixture(scope="module")
def reader(made):
    """GGUFReader of each file, read once (Qwen3's 300,000 vocab and merge strings take
    gguf-py about 10 s)."""
    cache = {}

    def get(key):
        if key not in cache:
            cache[key] = gguf.GGUFReader(str(made[key][0]))
        return cache[key]
    return get


def load_generator():
    spec = importlib.util.spec_from_file_location("make_shaped_gguf", GEN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def kv(reader):
    return {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def value(field):
    return field.contents()


def small_config(reader, shape):
    """The small file's own geometry, from its keys."""
    a = FULL[shape]["arch"]
    f = kv(reader)
    c = dict(FULL[shape])
    c.update(layers=value(f[f"{a}.block_count"]), hidden=value(f[f"{a}.embedding_length"]),
             heads=value(f[f"{a}.attention.head_count"]),
             kv_heads=value(f[f"{a}.attention.head_count_kv"]),
             ff=value(f[f"{a}.feed_forward_length"]))
    if a == "qwen3moe":
        c["expert_ff"] = value(f[f"{a}.expert_feed_forward_length"])
        c["head_dim"] = value(f[f"{a}.attention.key_length"])
    else:
        c["expert_ff"] = c["ff"]
        c["head_dim"] = c["hidden"] // c["heads"]
    return c


MIXTRAL_KEYS = {"general.architecture", "general.type", "general.name", "general.size_label",
                "general.quantization_version", "general.file_type",
                "llama.block_count", "llama.context_length", "llama.embedding_length",
                "llama.feed_forward_length", "llama.attention.head_count",
                "llama.attention.head_count_kv", "llama.rope.freq_base",
                "llama.attention.layer_norm_rms_epsilon", "llama.expert_count",
                "llama.expert_used_count", "llama.vocab_size", "llama.rope.dimension_count",
                "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
                "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
                "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.add_bos_token",
                "tokenizer.ggml.add_eos_token", "tokenizer.chat_template"}
QWEN3_KEYS = {"general.architecture", "general.type", "general.name", "general.size_label",
              "general.quantization_version", "general.file_type",
              "qwen3moe.block_count", "qwen3moe.context_length", "qwen3moe.embedding_length",
              "qwen3moe.feed_forward_length", "qwen3moe.attention.head_count",
              "qwen3moe.attention.head_count_kv", "qwen3moe.rope.freq_base",
              "qwen3moe.attention.layer_norm_rms_epsilon", "qwen3moe.expert_count",
              "qwen3moe.expert_used_count", "qwen3moe.attention.key_length",
              "qwen3moe.attention.value_length", "qwen3moe.expert_feed_forward_length",
              "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
              "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
              "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id",
              "tokenizer.ggml.bos_token_id", "tokenizer.ggml.add_bos_token",
              "tokenizer.ggml.add_eos_token"}


@pytest.mark.parametrize("key,shape", [("mixtral", "mixtral-8x7b"), ("qwen3", "qwen3-30b-a3b"),
                                       ("mixtral-q4k", "mixtral-8x7b")])
def test_keys_tensors_and_types(made, reader, key, shape):
    path, rep = made[key]
    r = reader(key)
    f = kv(r)
    full = FULL[shape]
    a = full["arch"]
    want = set(MIXTRAL_KEYS if a == "llama" else QWEN3_KEYS)
    if key != "mixtral-q4k":  # fmoe's copies of the tokenizer files, unless --llama-keys-only
        want |= {"fmoe.file.tokenizer.json"}
        if a == "llama":
            want |= {"fmoe.file.tokenizer_config.json"}
    assert set(f) == want
    assert value(f["general.architecture"]) == a
    mix = "q4_k" if key == "mixtral-q4k" else "q4_k_m"
    assert value(f["general.file_type"]) == (14 if mix == "q4_k" else 15)
    assert value(f["general.quantization_version"]) == 2
    U32, F32 = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32
    for k in want:
        if k.startswith(a + "."):
            assert f[k].types == [F32 if k.endswith(("freq_base", "epsilon")) else U32], k
    # what the small variant keeps of the real model
    assert value(f[f"{a}.context_length"]) == full["ctx"]
    assert value(f[f"{a}.expert_count"]) == full["experts"]
    assert value(f[f"{a}.expert_used_count"]) == full["top_k"]
    assert value(f[f"{a}.rope.freq_base"]) == pytest.approx(full["theta"])
    assert value(f[f"{a}.attention.layer_norm_rms_epsilon"]) == pytest.approx(full["eps"])
    c = small_config(r, shape)
    assert c["layers"] == (2 if key == "mixtral-q4k" else 8)
    assert c["hidden"] % 256 == 0 and c["expert_ff"] % 256 == 0
    assert c["hidden"] < full["hidden"] and c["expert_ff"] <= full["expert_ff"]
    assert c["head_dim"] == full["head_dim"]
    if a == "llama":
        assert value(f["llama.vocab_size"]) == full["vocab"]
        assert value(f["llama.rope.dimension_count"]) == full["head_dim"]
    else:
        assert value(f["qwen3moe.attention.value_length"]) == full["head_dim"]

    tensors = {t.name: t for t in r.tensors}
    extents = expected_tensors(c)
    assert set(tensors) == set(extents)
    for name, ne in extents.items():
        t = tensors[name]
        assert tuple(int(x) for x in t.shape) == ne, name
        assert t.tensor_type == expected_type(name, c["layers"], c["experts"], mix), name
    # tensors in llama-quantize's order: non-layer tensors, then by layer, names sorted
    order = [t.name for t in r.tensors]
    layer = [(-1 if not n.startswith("blk.") else int(n.split(".")[1]), n) for n in order]
    assert layer == sorted(layer)
    # a few hundred MB at most
    assert path.stat().st_size < 300e6


@pytest.mark.parametrize("shape", sorted(FULL))
@pytest.mark.parametrize("mix", ["q4_k_m", "q4_k"])
def test_full_shapes_plan(shape, mix):
    """The full-size files are too big to write here: the generator's plan for them (the
    tensors it would write, with extents and types) against the same table."""
    g = load_generator()
    c = FULL[shape]
    plan = g.plan(g.model_config(shape, False, None), mix)
    got = {name: (tuple(ne), t) for name, ne, t, _layer in plan}
    want = {n: (ne, expected_type(n, c["layers"], c["experts"], mix))
            for n, ne in expected_tensors(c).items()}
    assert got == want
    size = sum(g.nbytes_of(ne, t) for _n, ne, t, _l in plan)
    # the published Q4_K_M files of these models: Mixtral-8x7B 28.4 GB (26.5 GiB),
    # Qwen3-30B-A3B 18.6 GB (17.3 GiB)
    if mix == "q4_k_m":
        assert size == pytest.approx({"mixtral-8x7b": 28.4e9, "qwen3-30b-a3b": 18.6e9}[shape],
                                     rel=0.02)


def test_blocks_finite_and_scaled(reader):
    for key in ("mixtral", "qwen3"):
        r = reader(key)
        for t in r.tensors:
            raw = np.asarray(t.data)
            if t.tensor_type == T.F32:
                assert np.isfinite(raw).all(), t.name
                if t.name.endswith("_norm.weight"):
                    assert abs(float(raw.mean()) - 1) < 0.05, t.name
                continue
            size = gguf.GGML_QUANT_SIZES[t.tensor_type][1]
            blocks = raw.reshape(-1, size)
            # the f16 fields: Q8_0 d at 0; Q4_K/Q5_K d, dmin at 0; Q6_K d at 208
            at = {T.Q8_0: [0], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208]}[t.tensor_type]
            for o in at:
                h = np.ascontiguousarray(blocks[:, o:o + 2]).view("<f2")
                assert np.isfinite(h).all() and (h >= 0).all(), t.name
            if t.name == "token_embd.weight":
                continue
            rows = raw.reshape(-1, raw.shape[-1])[:64]
            w = gguf.quants.dequantize(rows, t.tensor_type)
            fan_in = int(t.shape[0])
            std = float(w.std())
            assert np.isfinite(w).all(), t.name
            assert 0.1 / math.sqrt(fan_in) < std < 2 / math.sqrt(fan_in), (t.name, std)


def test_tokenizer_keys(reader):
    # Mixtral: the SentencePiece vocabulary, as sentencepiece reads tokenizer.model
    spm = pytest.importorskip("sentencepiece")
    sp = spm.SentencePieceProcessor(model_file=str(TOKENIZERS / "mixtral-8x7b-instruct" /
                                                  "tokenizer.model"))
    f = kv(reader("mixtral"))
    tokens = value(f["tokenizer.ggml.tokens"])
    scores = value(f["tokenizer.ggml.scores"])
    types = value(f["tokenizer.ggml.token_type"])
    assert value(f["tokenizer.ggml.model"]) == "llama"
    assert len(tokens) == len(scores) == len(types) == 32000 == sp.vocab_size()
    assert tokens == [sp.id_to_piece(i) for i in range(32000)]
    # the three added tokens are control tokens (tokenizer_config.json marks them
    # special), the 256 byte tokens BYTE, the rest NORMAL with the model's scores
    assert types[:3] == [3, 3, 3] and set(types[3:259]) == {6} and set(types[259:]) == {1}
    assert scores[:3] == [-1000.0] * 3
    assert np.allclose(scores[3:], [sp.get_score(i) for i in range(3, 32000)])
    assert (value(f["tokenizer.ggml.bos_token_id"]), value(f["tokenizer.ggml.eos_token_id"]),
            value(f["tokenizer.ggml.unknown_token_id"])) == (1, 2, 0)
    assert value(f["tokenizer.ggml.add_bos_token"]) is True
    assert "[INST]" in value(f["tokenizer.chat_template"])

    # Qwen3: byte-level BPE, as HF tokenizers reads tokenizer.json, padded to 151936
    tok = pytest.importorskip("tokenizers")
    text = subprocess.run(["zstd", "-dc", str(TOKENIZERS / "qwen3" / "tokenizer.json.zst")],
                          check=True, capture_output=True).stdout.decode()
    hf = tok.Tokenizer.from_str(text)
    f = kv(reader("qwen3"))
    tokens = value(f["tokenizer.ggml.tokens"])
    types = value(f["tokenizer.ggml.token_type"])
    assert value(f["tokenizer.ggml.model"]) == "gpt2"
    assert value(f["tokenizer.ggml.pre"]) == "qwen2"
    assert len(tokens) == len(types) == 151936 == len(set(tokens))
    vocab = hf.get_vocab(with_added_tokens=True)
    assert len(vocab) == 151669
    for t, i in vocab.items():
        assert tokens[i] == t
    assert all(tokens[i] == f"[PAD{i}]" and types[i] == 5 for i in range(151669, 151936))
    assert set(types[:151643]) == {1}
    assert types[vocab["<|im_end|>"]] == 3 and types[vocab["<think>"]] == 4
    merges = value(f["tokenizer.ggml.merges"])
    assert len(merges) == len(json.loads(text)["model"]["merges"])
    assert merges[0] == "Ġ Ġ"
    assert (value(f["tokenizer.ggml.eos_token_id"]), value(f["tokenizer.ggml.bos_token_id"]),
            value(f["tokenizer.ggml.padding_token_id"])) == (151645, 151643, 151643)
    # what fmoe reads: the same tokenizer.json, embedded
    assert value(f["fmoe.file.tokenizer.json"]) == text


def expert_entropy(trace):
    with h5py.File(trace, "r") as f:
        ex = f["/tokens/experts"][:]
        n = int(f.attrs["num_experts"])
    out = []
    for layer in range(ex.shape[1]):
        p = np.bincount(ex[:, layer, :].ravel(), minlength=n) / ex[:, layer, :].size
        p = p[p > 0]
        out.append(float(-(p * np.log2(p)).sum()))
    return out


@pytest.mark.parametrize("key", ["mixtral", "qwen3"])
def test_fmoe_runs_it(made, fmoe, tmp_path, key):
    path, rep = made[key]
    # resident generation, the file's own tokenizer: finite logits of plausible spread
    logits = tmp_path / "logits.npy"
    p = fmoe("generate", "--model", path, "--prompt", "Hello world", "--max-new-tokens", 8,
             "--ignore-eos", "--json", "--dump-logits", logits)
    out = json.loads(p.stdout)
    assert len(out["generated_ids"]) == 8
    a = np.load(logits)
    assert a.shape == (8, rep["config"]["vocab"])
    assert np.isfinite(a).all()
    assert (a.std(axis=1) > 0.1).all() and (a.std(axis=1) < 100).all()

    # the routes of a recording: below uniform, the skewed file far below
    trace = tmp_path / "t.h5"
    fmoe("record", "--model", path, "--dataset", PROMPTS, "--max-requests", 8,
         "--max-new-tokens", 16, "-o", trace)
    h = expert_entropy(trace)
    uniform = math.log2(rep["config"]["n_expert"])
    assert len(h) == 8
    if rep["skew"] > 1:  # strongly skewed
        assert max(h) < 0.8 * uniform and np.mean(h) < 0.75 * uniform, h
    else:                # mildly
        assert uniform - 1.5 < np.mean(h) < uniform - 0.4, h
    # the generator's estimate is near what the model does
    assert abs(np.mean(h) - np.mean(rep["estimated_entropy"])) < 0.1 * uniform, \
        (h, rep["estimated_entropy"])


def test_llama_keys_only_needs_a_tokenizer(made, fmoe_bin, tmp_path):
    path, _ = made["mixtral-q4k"]
    p = run_fmoe(fmoe_bin, "generate", "--model", path, "--prompt", "Hi",
                 "--max-new-tokens", 2, check=False)
    assert p.returncode == 2 and "--tokenizer" in p.stderr
    p = run_fmoe(fmoe_bin, "generate", "--model", path, "--tokenizer",
                 TOKENIZERS / "mixtral-8x7b-instruct", "--prompt", "Hi", "--max-new-tokens", 2,
                 "--ignore-eos", "--json")
    assert len(json.loads(p.stdout)["generated_ids"]) == 2


@pytest.mark.parametrize("args,what", [
    ([], "--shape"),
    (["--shape", "mixtral-8x22b"], "invalid choice"),
    (["--shape", "qwen3-30b-a3b", "--type", "q8_0"], "invalid choice"),
    (["--shape", "qwen3-30b-a3b", "--skew", "-1"], "--skew"),
    (["--shape", "qwen3-30b-a3b", "--seed", "x"], "--seed"),
    (["--shape", "qwen3-30b-a3b", "--layers", "0"], "--layers"),
])
def test_bad_arguments(tmp_path, args, what):
    out = tmp_path / "x.gguf"
    p = generate(out, *args, check=False)
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and what in p.stderr, p.stderr
    assert list(tmp_path.iterdir()) == []


def test_bad_output(tmp_path):
    for out, what in [(tmp_path / "no" / "x.gguf", "does not exist"), (tmp_path, "is a folder")]:
        p = generate(out, "--shape", "qwen3-30b-a3b", check=False)
        assert p.returncode == 2 and p.stderr.count("\n") == 1 and what in p.stderr, p.stderr
        assert list(tmp_path.iterdir()) == []


def test_help():
    p = subprocess.run([sys.executable, str(GEN), "--help"], capture_output=True, text=True)
    assert p.returncode == 0 and "--shape" in p.stdout and "--skew" in p.stdout


def test_stopped_run_leaves_all_or_nothing(tmp_path):
    out = tmp_path / "m.gguf"
    partial = tmp_path / "m.gguf.partial"
    p = subprocess.Popen([sys.executable, str(GEN), "--shape", "mixtral-8x7b", "--small",
                          "--quiet", "-o", str(out)], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not partial.exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=120)
    assert not partial.exists()
    if out.exists():  # it had finished: the whole file
        r = gguf.GGUFReader(str(out))
        end = max(int(t.data_offset) + int(t.n_bytes) for t in r.tensors)
        assert out.stat().st_size >= end
    else:
        assert p.returncode != 0, p.stderr.read()
