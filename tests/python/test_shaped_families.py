"""tests/bench/make_shaped_gguf.py's DeepSeek-V2-Lite and gpt-oss-20b shapes.

The small variants are written into a temporary folder and checked against tables written
here from the published configs (config.json of deepseek-ai/DeepSeek-V2-Lite and
openai/gpt-oss-20b) and llama.cpp's rules, not from the generator's output:

- gguf-py's GGUFReader: keys and values (what llama.cpp's converter writes for each
  architecture: conversion/deepseek.py DeepseekV2Model, conversion/gpt_oss.py GptOssModel),
  every tensor's name, extents and type (src/llama-quant.cpp's Q4_K_M choice, with its
  fallback for rows that are not whole 256-blocks: Q4_K -> Q5_0, Q6_K -> Q8_0, an output
  matrix Q8_0 outright; gpt-oss's experts MXFP4 as the converter keeps them);
- the full-size plans (too big to write here) against the same table, and their parameter
  counts against the published totals (15.7 B and 20.9 B);
- MXFP4 and Q5_0 blocks dequantised by gguf.quants: finite, of the scale 1/sqrt(fan_in);
- gpt-oss's vocabulary against HF tokenizers reading the fixture's tokenizer.json;
- fmoe: `fmoe generate` of each small file gives finite logits (so activations stay
  finite through every layer), and `fmoe record` routes below uniform, near the
  generator's estimate;
- with FMOE_LLAMA_CPP=DIR (a llama.cpp build; skipped otherwise): llama-completion runs
  both files, and `llama-quantize --dry-run --allow-requantize ... Q4_K_M` would change no
  tensor but gpt-oss's MXFP4 experts.
"""
import importlib.util
import json
import math
import os
import pathlib
import re
import struct
import subprocess
import sys

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

REPO = pathlib.Path(__file__).resolve().parents[2]
GEN = REPO / "tests" / "bench" / "make_shaped_gguf.py"
TOKENIZERS = REPO / "tests" / "fixtures" / "tokenizers"
PROMPTS = REPO / "datasets" / "samples" / "prompts_100.txt"
T = gguf.GGMLQuantizationType

# config.json of the two checkpoints (names as there), and the small variants' widths
FULL = {
    "deepseek-v2-lite": dict(arch="deepseek2", num_hidden_layers=27, hidden_size=2048,
                             num_attention_heads=16, intermediate_size=10944,
                             moe_intermediate_size=1408, n_routed_experts=64,
                             num_experts_per_tok=6, n_shared_experts=2,
                             first_k_dense_replace=1, kv_lora_rank=512, qk_nope_head_dim=128,
                             qk_rope_head_dim=64, v_head_dim=128, vocab_size=102400,
                             max_position_embeddings=163840, rope_theta=10000.0,
                             rms_norm_eps=1e-6, factor=40.0, original=4096,
                             mscale_all_dim=0.707, params=15.7e9),
    "gpt-oss-20b": dict(arch="gpt-oss", num_hidden_layers=24, hidden_size=2880,
                        num_attention_heads=64, num_key_value_heads=8, head_dim=64,
                        intermediate_size=2880, num_local_experts=32, num_experts_per_tok=4,
                        vocab_size=201088, max_position_embeddings=131072,
                        rope_theta=150000.0, rms_norm_eps=1e-5, sliding_window=128,
                        factor=32.0, original=4096, params=20.9e9),
}
SMALL = {
    "deepseek-v2-lite": dict(hidden_size=256, num_attention_heads=4, intermediate_size=448,
                             moe_intermediate_size=128, kv_lora_rank=128,
                             qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64),
    "gpt-oss-20b": dict(num_hidden_layers=8, hidden_size=576, num_attention_heads=8,
                        num_key_value_heads=2, intermediate_size=576),
}

# use_more_bits(i, n) of llama-quant.cpp worked out by hand: i < n/8, i >= 7n/8, or
# (i - n/8) % 3 == 2 (integer division)
MORE_BITS = {8: {0, 3, 6, 7},
             24: {0, 1, 2, 5, 8, 11, 14, 17, 20, 21, 22, 23},
             27: {0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26}}


def config(shape, small):
    c = dict(FULL[shape])
    if small:
        c.update(SMALL[shape])
    return c


def expected_tensors(c):
    """name -> extents (innermost first), llama.cpp's load_arch_tensors for the arch."""
    h, L, V = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    out = {"token_embd.weight": (h, V), "output.weight": (h, V), "output_norm.weight": (h,)}
    for i in range(L):
        p = f"blk.{i}."
        if c["arch"] == "deepseek2":
            nh, kvl, rope = c["num_attention_heads"], c["kv_lora_rank"], c["qk_rope_head_dim"]
            nope, vd, ff = c["qk_nope_head_dim"], c["v_head_dim"], c["moe_intermediate_size"]
            out.update({p + "attn_norm.weight": (h,), p + "ffn_norm.weight": (h,),
                        p + "attn_q.weight": (h, nh * (nope + rope)),
                        p + "attn_kv_a_mqa.weight": (h, kvl + rope),
                        p + "attn_kv_a_norm.weight": (kvl,),
                        p + "attn_k_b.weight": (nope, kvl, nh),
                        p + "attn_v_b.weight": (kvl, vd, nh),
                        p + "attn_output.weight": (nh * vd, h)})
            if i < c["first_k_dense_replace"]:
                f = c["intermediate_size"]
                out.update({p + "ffn_gate.weight": (h, f), p + "ffn_up.weight": (h, f),
                            p + "ffn_down.weight": (f, h)})
            else:
                E, sh = c["n_routed_experts"], ff * c["n_shared_experts"]
                out.update({p + "ffn_gate_inp.weight": (h, E),
                            p + "ffn_gate_exps.weight": (h, ff, E),
                            p + "ffn_up_exps.weight": (h, ff, E),
                            p + "ffn_down_exps.weight": (ff, h, E),
                            p + "ffn_gate_shexp.weight": (h, sh),
                            p + "ffn_up_shexp.weight": (h, sh),
                            p + "ffn_down_shexp.weight": (sh, h)})
        else:
            q = c["num_attention_heads"] * c["head_dim"]
            kv = c["num_key_value_heads"] * c["head_dim"]
            E, ff = c["num_local_experts"], c["intermediate_size"]
            out.update({p + "attn_norm.weight": (h,), p + "post_attention_norm.weight": (h,),
                        p + "attn_q.weight": (h, q), p + "attn_q.bias": (q,),
                        p + "attn_k.weight": (h, kv), p + "attn_k.bias": (kv,),
                        p + "attn_v.weight": (h, kv), p + "attn_v.bias": (kv,),
                        p + "attn_output.weight": (q, h), p + "attn_output.bias": (h,),
                        p + "attn_sinks.weight": (c["num_attention_heads"],),
                        p + "ffn_gate_inp.weight": (h, E), p + "ffn_gate_inp.bias": (E,),
                        p + "ffn_gate_exps.weight": (h, ff, E), p + "ffn_gate_exps.bias": (ff, E),
                        p + "ffn_up_exps.weight": (h, ff, E), p + "ffn_up_exps.bias": (ff, E),
                        p + "ffn_down_exps.weight": (ff, h, E), p + "ffn_down_exps.bias": (h, E)})
    return out


def expected_type(name, ne, c):
    """llama-quantize Q4_K_M's type for one tensor (gpt-oss experts: MXFP4, kept)."""
    if len(ne) == 1 or name.endswith(".bias") or "ffn_gate_inp" in name:
        return T.F32
    if c["arch"] == "gpt-oss" and "_exps." in name:
        return T.MXFP4
    if name == "output.weight":
        return T.Q6_K if ne[0] % 256 == 0 else T.Q8_0
    t = T.Q4_K
    if name.startswith("blk."):
        kind = name.split(".")[2]
        more = int(name.split(".")[1]) in MORE_BITS[c["num_hidden_layers"]]
        if more and (kind == "attn_v" or kind.startswith("ffn_down")):
            t = T.Q6_K
    if ne[0] % 256:
        t = {T.Q4_K: T.Q5_0, T.Q6_K: T.Q8_0}[t]
    return t


class Tensor:
    def __init__(self, name, shape, tensor_type, data):
        self.name, self.shape, self.tensor_type, self.data = name, shape, tensor_type, data


class Reader:
    """A minimal GGUF v3 reader (the GGUF format as gguf-py documents it): gguf-py's
    GGUFReader takes about 25 s over gpt-oss's 200,000 tokens and 450,000 merges, too slow
    for the quick tier. Keys -> Python values; tensors with their data as numpy views."""
    SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
               10: "<Q", 11: "<q", 12: "<d"}

    def __init__(self, path):
        buf = np.memmap(path, dtype=np.uint8, mode="r")
        mv = memoryview(buf)
        self.pos = 0

        def unpack(fmt):
            v = struct.unpack_from(fmt, mv, self.pos)[0]
            self.pos += struct.calcsize(fmt)
            return v

        def string():
            n = unpack("<Q")
            v = bytes(mv[self.pos:self.pos + n]).decode("utf-8")
            self.pos += n
            return v

        def value(vt):
            if vt == 8:
                return string()
            if vt == 9:
                sub, n = unpack("<I"), unpack("<Q")
                if sub in self.SCALARS and sub != 7:
                    dt = np.dtype(self.SCALARS[sub])
                    a = np.frombuffer(mv, dt, n, self.pos)
                    self.pos += n * dt.itemsize
                    return a.tolist()
                return [value(sub) for _ in range(n)]
            return unpack(self.SCALARS[vt])

        assert bytes(mv[:4]) == b"GGUF" and struct.unpack_from("<I", mv, 4)[0] == 3
        self.pos = 8
        n_tensors, n_kv = unpack("<Q"), unpack("<Q")
        self.fields, self.types = {}, {}
        for _ in range(n_kv):
            k = string()
            self.types[k] = unpack("<I")
            self.fields[k] = value(self.types[k])
        infos = []
        for _ in range(n_tensors):
            name = string()
            ne = tuple(unpack("<Q") for _ in range(unpack("<I")))
            infos.append((name, ne, T(unpack("<I")), unpack("<Q")))
        align = self.fields.get("general.alignment", 32)
        base = -(-self.pos // align) * align
        self.tensors = []
        for name, ne, t, off in infos:
            block, size = gguf.GGML_QUANT_SIZES[t]
            nbytes = math.prod(ne) // block * size
            raw = buf[base + off:base + off + nbytes]
            data = raw.view(np.float32) if t == T.F32 else raw.reshape(-1, ne[0] // block * size)
            self.tensors.append(Tensor(name, ne, t, data))


def generate(out, *args):
    p = subprocess.run([sys.executable, str(GEN), *map(str, args), "-o", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return p


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    d = tmp_path_factory.mktemp("families")
    out = {}
    for shape in FULL:
        f = d / f"{shape}.gguf"
        rep = d / f"{shape}.json"
        generate(f, "--shape", shape, "--small", "--seed", "3", "--quiet", "--report", rep)
        out[shape] = (f, Reader(f), json.loads(rep.read_text()))
    return out


def fields(r):
    return r.fields


@pytest.mark.parametrize("shape", sorted(FULL))
def test_keys(made, shape):
    path, r, _ = made[shape]
    f = fields(r)
    c = config(shape, True)
    a = c["arch"]
    assert f["general.architecture"] == a and f["general.file_type"] == 15
    want = {"block_count": c["num_hidden_layers"], "embedding_length": c["hidden_size"],
            "context_length": c["max_position_embeddings"],
            "feed_forward_length": c["intermediate_size"],
            "attention.head_count": c["num_attention_heads"],
            "expert_used_count": c["num_experts_per_tok"],
            "rope.freq_base": c["rope_theta"],
            "attention.layer_norm_rms_epsilon": c["rms_norm_eps"],
            "rope.scaling.type": "yarn", "rope.scaling.factor": c["factor"],
            "rope.scaling.original_context_length": c["original"],
            # both configs' rope_scaling: beta_fast 32, beta_slow 1
            "rope.scaling.yarn_beta_fast": 32.0, "rope.scaling.yarn_beta_slow": 1.0}
    if a == "deepseek2":
        kvl, rope = c["kv_lora_rank"], c["qk_rope_head_dim"]
        want.update({"attention.head_count_kv": 1,  # MLA written as MQA
                     "expert_count": c["n_routed_experts"],
                     "leading_dense_block_count": c["first_k_dense_replace"],
                     "attention.kv_lora_rank": kvl, "attention.key_length": kvl + rope,
                     "attention.value_length": kvl,
                     "attention.key_length_mla": c["qk_nope_head_dim"] + rope,
                     "attention.value_length_mla": c["v_head_dim"],
                     "expert_feed_forward_length": c["moe_intermediate_size"],
                     "expert_shared_count": c["n_shared_experts"],
                     "rope.dimension_count": rope, "vocab_size": c["vocab_size"],
                     # n_group 1, topk_group 1, scoring_func softmax (1)
                     "expert_group_count": 1, "expert_group_used_count": 1,
                     "expert_gating_func": 1,
                     "rope.scaling.yarn_log_multiplier": 0.1 * c["mscale_all_dim"]})
        assert f"{a}.attention.q_lora_rank" not in f  # V2-Lite has none
        assert f["tokenizer.ggml.pre"] == "deepseek-llm"
        assert (f["tokenizer.ggml.bos_token_id"], f["tokenizer.ggml.eos_token_id"]) == \
            (100000, 100001)
    else:
        want.update({"attention.head_count_kv": c["num_key_value_heads"],
                     "expert_count": c["num_local_experts"],
                     "attention.key_length": c["head_dim"],
                     "attention.value_length": c["head_dim"],
                     "attention.sliding_window": c["sliding_window"],
                     "expert_feed_forward_length": c["intermediate_size"]})
        assert f["tokenizer.ggml.pre"] == "gpt-4o"
    for k, v in want.items():
        got = f[f"{a}.{k}"]
        # the converter's writers: add_uint32 for counts and lengths, add_float32, strings
        assert r.types[f"{a}.{k}"] == {int: 4, float: 6, str: 8}[type(v)], k
        assert got == (pytest.approx(v, rel=1e-6) if isinstance(v, float) else v), k
    assert len(f["tokenizer.ggml.tokens"]) == c["vocab_size"]
    assert "fmoe.file.tokenizer.json" in f
    assert path.stat().st_size < 400e6


@pytest.mark.parametrize("shape", sorted(FULL))
def test_tensors_and_types(made, shape):
    _, r, _ = made[shape]
    c = config(shape, True)
    want = expected_tensors(c)
    got = {t.name: t for t in r.tensors}
    assert set(got) == set(want)
    for name, ne in want.items():
        assert tuple(int(x) for x in got[name].shape) == ne, name
        assert got[name].tensor_type == expected_type(name, ne, c), name
    order = [(-1 if not n.startswith("blk.") else int(n.split(".")[1]), n)
             for n in (t.name for t in r.tensors)]
    assert order == sorted(order)


def load_generator():
    spec = importlib.util.spec_from_file_location("make_shaped_gguf", GEN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("shape", sorted(FULL))
def test_full_plan(shape):
    g = load_generator()
    c = config(shape, False)
    plan = g.plan(g.model_config(shape, False, None), "q4_k_m")
    got = {n: (tuple(ne), t) for n, ne, t, _ in plan}
    assert got == {n: (ne, expected_type(n, ne, c)) for n, ne in expected_tensors(c).items()}
    params = sum(math.prod(ne) for _n, ne, _t, _l in plan)
    assert params == pytest.approx(c["params"], rel=0.02)


def test_blocks_dequantise_finite_and_scaled(made):
    for shape in FULL:
        _, r, _ = made[shape]
        for t in r.tensors:
            if t.tensor_type == T.F32 or t.name == "token_embd.weight":
                assert np.isfinite(np.asarray(t.data)).all() or t.tensor_type != T.F32
                continue
            raw = np.asarray(t.data)
            rows = raw.reshape(-1, raw.shape[-1])[:64]
            w = gguf.quants.dequantize(rows, t.tensor_type)
            assert np.isfinite(w).all(), t.name
            std = float(w.std())
            fan_in = int(t.shape[0])
            # output projections are scaled down with depth (at most ~10x for 27 layers)
            assert 0.03 / math.sqrt(fan_in) < std < 2 / math.sqrt(fan_in), (t.name, std)


def test_gpt_oss_vocabulary(made):
    tok = pytest.importorskip("tokenizers")
    text = subprocess.run(["zstd", "-dc", str(TOKENIZERS / "gpt-oss" / "tokenizer.json.zst")],
                          check=True, capture_output=True).stdout.decode()
    vocab = tok.Tokenizer.from_str(text).get_vocab(with_added_tokens=True)
    f = fields(made["gpt-oss-20b"][1])
    tokens = f["tokenizer.ggml.tokens"]
    for t, i in vocab.items():
        assert tokens[i] == t
    assert tokens[f["tokenizer.ggml.eos_token_id"]] == "<|return|>"
    assert tokens[f["tokenizer.ggml.bos_token_id"]] == "<|startoftext|>"


@pytest.mark.parametrize("shape", sorted(FULL))
def test_fmoe_runs_it(made, fmoe, tmp_path, shape):
    path, r, rep = made[shape]
    logits = tmp_path / "logits.npy"
    p = fmoe("generate", "--model", path, "--prompt", "Hello world", "--max-new-tokens", 6,
             "--ignore-eos", "--json", "--dump-logits", logits)
    out = json.loads(p.stdout)
    assert len(out["generated_ids"]) == 6
    # the prompt as HF tokenizers encodes it with the embedded tokenizer.json (DeepSeek's
    # starts with its BOS, 100000, as llama.cpp's add_bos_token does)
    tok = pytest.importorskip("tokenizers")
    hf = tok.Tokenizer.from_str(r.fields["fmoe.file.tokenizer.json"])
    assert out["prompt_ids"] == hf.encode("Hello world").ids
    if shape == "deepseek-v2-lite":
        assert out["prompt_ids"][0] == 100000
    a = np.load(logits)
    assert a.shape == (6, FULL[shape]["vocab_size"]) and np.isfinite(a).all()
    assert (a.std(axis=1) > 0.1).all() and (a.std(axis=1) < 100).all()

    # the routes of a short recording: skewed (below uniform), near the generator's estimate
    h5py = pytest.importorskip("h5py")
    import hdf5plugin  # noqa: F401
    trace = tmp_path / "t.h5"
    fmoe("record", "--model", path, "--dataset", PROMPTS, "--max-requests", 4,
         "--max-new-tokens", 8, "-o", trace)
    with h5py.File(trace, "r") as f:
        ex = f["/tokens/experts"][:]
        n = int(f.attrs["num_experts"])
    h = []
    for layer in range(ex.shape[1]):
        p = np.bincount(ex[:, layer, :].ravel(), minlength=n) / ex[:, layer, :].size
        p = p[p > 0]
        h.append(float(-(p * np.log2(p)).sum()))
    est = [e for e in rep["estimated_entropy"] if e is not None]
    assert len(h) == len(est)  # DeepSeek's dense first layer has no routes
    uniform = math.log2(n)
    assert np.mean(h) < uniform - 0.3, h
    assert abs(np.mean(h) - np.mean(est)) < 0.1 * uniform, (h, est)


def llama_bins():
    d = os.environ.get("FMOE_LLAMA_CPP")
    if not d:
        pytest.skip("FMOE_LLAMA_CPP (a llama.cpp tree or its bin folder) not set")
    for b in (pathlib.Path(d) / "build" / "bin", pathlib.Path(d) / "bin", pathlib.Path(d)):
        if (b / "llama-completion").is_file():
            return b
    pytest.fail(f"FMOE_LLAMA_CPP={d}: no llama-completion there")


@pytest.mark.parametrize("shape", sorted(FULL))
def test_llama_cpp_runs_and_requantizes_it_the_same(made, tmp_path, shape):
    bins = llama_bins()
    path, _, _ = made[shape]
    p = subprocess.run([str(a) for a in (bins / "llama-completion", "-m", path, "-n", 4, "-p",
                                         "hi", "-no-cnv", "-t", 2, "--temp", 0)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert re.search(r"eval time =.*/\s*\d+ runs", p.stderr)
    p = subprocess.run([bins / "llama-quantize", "--dry-run", "--allow-requantize", path,
                        tmp_path / "x.gguf", "Q4_K_M"], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    changed = re.findall(r"\]\s+(\S+)\s+- \[.*MiB \((\w+)\)", p.stdout + p.stderr)
    assert all(shape == "gpt-oss-20b" and "_exps.weight" in n for n, _t in changed), changed
    if shape == "gpt-oss-20b":  # the lines are parsed: the MXFP4 experts are listed
        assert {t for _n, t in changed} == {"q5_0", "q8_0"}, changed
