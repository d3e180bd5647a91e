"""`fmoe quantize --type MIX` (runtime/model/quantize_mix.c) and `--experts-type`, checked
against an independent reading of llama.cpp's rules, and the files they write in the
forward pass (docs/quantization.md):

- for every tensor of each file, the type gguf-py reads equals what llama-quantize's
  llama_tensor_get_type (src/llama-quant.cpp) chooses for that name, written out again
  below in Python from reading that source (llama_choice), for the tensors fmoe's
  families have, with its fallback for rows that are not whole blocks; on a 16-layer
  DeepSeek-MoE with 256-wide rows (use_more_bits, the n/8 and n/16 layer rules), a GQA
  variant (n_head / n_kv_head = 4: Q2_K's attn_v), and the tiny 8-expert models (the
  Mixtral rules: attn_v/attn_k in Q8_0, attn_output in Q5_K; narrow rows: fallbacks);
- --experts-type changes the routed experts' tensors (*_exps) and nothing else;
- the mixes of fmoe-tiny (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_0 and BF16 in one file) run to
  the logits of their own gguf-py dequantisation, and with 8-bit activations within a
  stated fraction of the logits' spread;
- a NaN or infinite scale in a Q2_K, Q3_K or IQ4_XS block, and a truncated file: one line.
"""
import json
import pathlib

import numpy as np
import pytest

import make_tiny_models as tiny
from conftest import run_fmoe
from test_gguf_model import TINY, dequantised_copy, drive, one_line  # noqa: F401
from test_gguf_q32_model import nan_expert_scales, truncated

import gguf  # noqa: E402  (tests/python/requirements.txt)

Q = gguf.GGMLQuantizationType

MIXES = ["q2_k", "q3_k_s", "q3_k_m", "q3_k_l", "q4_k_s", "q4_k_m", "q5_k_s", "q5_k_m"]
BASE = {"q2_k": "Q2_K", "q3_k_s": "Q3_K", "q3_k_m": "Q3_K", "q3_k_l": "Q3_K",
        "q4_k_s": "Q4_K", "q4_k_m": "Q4_K", "q5_k_s": "Q5_K", "q5_k_m": "Q5_K"}
# llama-quantize's fallback for rows that are not whole blocks of the chosen type
FALLBACK = {"Q2_K": "IQ4_NL", "Q3_K": "IQ4_NL", "IQ4_XS": "IQ4_NL", "Q4_K": "Q5_0",
            "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


def use_more_bits(i, n):
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def llama_choice(mix, name, cols, hp):
    """The type llama-quantize gives tensor `name` (rows of `cols`) in `mix`, before the
    fallback. hp: n_layer, n_head, n_kv, n_expert, has_output."""
    t = BASE[mix]
    layer = int(name.split(".")[1]) if name.startswith("blk.") else 0
    n = hp["n_layer"]
    if name == "output.weight" or (not hp["has_output"] and name == "token_embd.weight"):
        return "Q8_0" if cols % 256 else "Q6_K"
    if name == "token_embd.weight":
        return t
    if "attn_v.weight" in name:
        i = layer  # llama.cpp's i_attention_wv: one attn_v per layer, in layer order
        if mix == "q2_k":
            t = "Q4_K" if hp["n_head"] // hp["n_kv"] >= 4 else "Q3_K"
        elif mix == "q3_k_m":
            t = "Q5_K" if i < 2 else "Q4_K"
        elif mix == "q3_k_l":
            t = "Q5_K"
        elif mix in ("q4_k_m", "q5_k_m") and use_more_bits(i, n):
            t = "Q6_K"
        elif mix == "q4_k_s" and i < 4:
            t = "Q5_K"
        if hp["n_expert"] == 8:
            t = "Q8_0"
        return t
    if "attn_k.weight" in name:
        return "Q8_0" if hp["n_expert"] == 8 else t
    if "ffn_down" in name:
        if mix == "q2_k":
            return "Q3_K"
        if mix == "q3_k_m":
            return "Q5_K" if layer < n // 16 else "Q4_K"
        if mix == "q3_k_l":
            return "Q5_K"
        if mix in ("q4_k_m", "q5_k_m"):
            return "Q6_K" if use_more_bits(layer, n) else t
        if mix == "q4_k_s" and layer < n // 8:
            return "Q5_K"
        return t
    if "attn_output.weight" in name:
        if hp["n_expert"] == 8:
            return "Q5_K" if mix in ("q2_k", "q3_k_s", "q3_k_m", "q4_k_s", "q4_k_m") else t
        return {"q2_k": "Q3_K", "q3_k_m": "Q4_K", "q3_k_l": "Q5_K"}.get(mix, t)
    return t


def with_fallback(t, cols, dtype):
    block = gguf.GGML_QUANT_SIZES[Q[t]][0]
    if cols % block == 0:
        return t
    f = FALLBACK.get(t)
    return f if f and cols % gguf.GGML_QUANT_SIZES[Q[f]][0] == 0 else dtype


def hparams(model_dir):
    cfg = json.loads((pathlib.Path(model_dir) / "config.json").read_text())
    ck_names = set()
    for f in pathlib.Path(model_dir).glob("*.safetensors"):
        raw = f.read_bytes()
        n = int.from_bytes(raw[:8], "little")
        ck_names |= set(json.loads(raw[8:8 + n]))
    return {"n_layer": cfg["num_hidden_layers"], "n_head": cfg["num_attention_heads"],
            "n_kv": cfg.get("num_key_value_heads", cfg["num_attention_heads"]),
            "n_expert": cfg.get("num_local_experts") or cfg.get("num_experts")
            or cfg.get("n_routed_experts"),
            "has_output": "lm_head.weight" in ck_names}


def expected_types(path, model_dir, mix, dtype, experts=None):
    """name -> (what the file holds, what llama-quantize's rules say)."""
    hp = hparams(model_dir)
    out = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        shape = [int(x) for x in t.shape]
        cols = shape[0]
        if len(shape) == 1 or "_norm" in t.name or "ffn_gate_inp" in t.name or t.name.endswith(".bias"):
            want = "F32"  # norms, biases, routers: never quantized (routers: as fmoe loads them)
        elif experts and "_exps." in t.name:
            want = with_fallback(experts, cols, dtype)
        else:
            want = with_fallback(llama_choice(mix, t.name, cols, hp), cols, dtype)
        out[t.name] = (t.tensor_type.name, want)
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny.maker(tmp_path_factory.mktemp("tiny-models"))


def deepseek_dir(root, name, layers, kv_heads=4):
    """A DeepSeek-MoE V1 checkpoint whose rows are 256 values (whole K-quant blocks), in
    F16; kv_heads < 4 shrinks k_proj and v_proj (GQA)."""
    cfg = dict(tiny.DEEPSEEK_CONFIG, hidden_size=256, intermediate_size=256,
               moe_intermediate_size=256, num_hidden_layers=layers, n_routed_experts=2,
               num_experts_per_tok=1, n_shared_experts=1, num_attention_heads=4,
               num_key_value_heads=kv_heads, torch_dtype="float16")
    d = root / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    t = tiny.deepseek_weights(cfg, seed=7)
    for k in list(t):
        if k.endswith(("k_proj.weight", "v_proj.weight")):
            t[k] = t[k][: 64 * kv_heads]
    tiny.save_safetensors(str(d / "model.safetensors"),
                          {k: (v.astype(np.float16), "F16") for k, v in t.items()})
    return d


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix-models")
    return {"deep16": deepseek_dir(root, "deep16", 16), "gqa4": deepseek_dir(root, "gqa4", 2, 1)}


def quantize(fmoe_bin, src, out, *args):
    return run_fmoe(fmoe_bin, "quantize", *args, src, "-o", out, "--quiet")


def assert_types(types):
    bad = {n: v for n, v in types.items() if v[0] != v[1]}
    assert not bad, f"{len(bad)} tensors differ (file, llama.cpp): {sorted(bad.items())[:8]}"


@pytest.mark.parametrize("mix", MIXES)
def test_mix_types_are_llama_quantizes_deep16(fmoe_bin, deep, tmp_path, mix):
    out = tmp_path / "m.gguf"
    p = quantize(fmoe_bin, deep["deep16"], out, "--type", mix)
    types = expected_types(out, deep["deep16"], mix, "F16")
    assert_types(types)
    held = {v[0] for v in types.values()}
    assert BASE[mix] in held and "F16" not in held  # every row is whole blocks here
    if mix in ("q4_k_m", "q5_k_m"):  # use_more_bits: layers 0, 1, 4, 7, 10, 13, 14, 15
        assert types["blk.4.ffn_down_exps.weight"][0] == "Q6_K"
        assert types["blk.5.ffn_down_exps.weight"][0] == BASE[mix]
        assert types["blk.1.attn_v.weight"][0] == "Q6_K"
    assert f"{out}: deepseek," in p.stdout


def test_q2_k_attn_v_with_gqa(fmoe_bin, deep, tmp_path):
    out = tmp_path / "m.gguf"
    quantize(fmoe_bin, deep["gqa4"], out, "--type", "q2_k")
    types = expected_types(out, deep["gqa4"], "q2_k", "F16")
    assert_types(types)
    assert types["blk.0.attn_v.weight"][0] == "Q4_K"


@pytest.mark.parametrize("mix", ["q2_k", "q3_k_m", "q4_k_m", "q5_k_m"])
@pytest.mark.parametrize("name", ["mixtral", "qwen2_moe", "olmoe", "deepseek"])
def test_mix_types_are_llama_quantizes_tiny(fmoe_bin, models, tmp_path, mix, name):
    """Rows of 32..96 values (no whole 256-value blocks: llama.cpp's fallbacks), 8 experts
    in all but DeepSeek's (attn_v and attn_k in Q8_0, attn_output in Q5_K)."""
    out = tmp_path / "m.gguf"
    quantize(fmoe_bin, models(name), out, "--type", mix)
    assert_types(expected_types(out, models(name), mix, "F32"))


def test_mix_types_of_fmoe_tiny(fmoe_bin, tmp_path):
    """fmoe-tiny: tied embeddings (token_embd takes the head's Q6_K), 8 experts, expert
    down projections 176 wide (no block fits: the checkpoint's BF16)."""
    for mix in ("q2_k", "q3_k_m", "q4_k_m"):
        out = tmp_path / f"{mix}.gguf"
        quantize(fmoe_bin, TINY, out, "--type", mix)
        types = expected_types(out, TINY, mix, "BF16")
        assert_types(types)
        assert types["token_embd.weight"][0] == "Q6_K"
        assert types["blk.0.attn_v.weight"][0] == "Q8_0"


@pytest.mark.parametrize("mix,experts", [("q4_k_m", "q2_k"), ("q4_k_m", "iq4_xs"),
                                         ("q3_k_m", "q8_0"), ("q2_k", "q4_k")])
def test_experts_type_changes_only_experts(fmoe_bin, deep, tmp_path, mix, experts):
    src = deep["deep16"]
    plain, split = tmp_path / "plain.gguf", tmp_path / "split.gguf"
    quantize(fmoe_bin, src, plain, "--type", mix)
    p = quantize(fmoe_bin, src, split, "--type", mix, "--experts-type", experts)
    a = {t.name: t for t in gguf.GGUFReader(str(plain)).tensors}
    b = {t.name: t for t in gguf.GGUFReader(str(split)).tensors}
    assert set(a) == set(b)
    for name in a:
        if "_exps." in name:
            assert b[name].tensor_type.name == experts.upper(), name
        else:
            assert b[name].tensor_type == a[name].tensor_type, name
            assert np.array_equal(np.asarray(a[name].data), np.asarray(b[name].data)), name
    assert_types(expected_types(split, src, mix, "F16", experts.upper()))
    assert f"experts {experts.upper()}" in p.stdout


# ---- the forward pass ---------------------------------------------------------------

# 8-bit activations (Q8_K blocks for the K-quants) against the f32 dequantised model, in
# units of the logits' standard deviation over the vocabulary (test_gguf_q32_model.py's
# measure), over the tokens whose routes agree. Each input moves by at most half a step of
# its 256-value block (1/254 of its largest magnitude), which can flip a near-tie top-2
# expert choice: on fmoe-tiny's 16 tokens one token's route differs for q4_k_m, q4_k,
# q3_k_m and q2_k (q4_k_m's flip moves RMS to 4.8% and the worst logit to 66% of the
# spread: a different expert, not a wrong kernel). Over the other tokens these mixes
# measure 0.75-0.92% RMS and 3.7-5.5% at the worst logit; the bounds leave about 3x. A
# wrong code, scale or min moves logits by the order of their spread on every token.
Q8ACT_RMS, Q8ACT_MAX, Q8ACT_FLIPS = 0.03, 0.2, 2


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory, fmoe_bin):
    d = tmp_path_factory.mktemp("mix-files")
    cache = {}

    def get(*args):
        if args not in cache:
            out = d / ("-".join(args).replace("--", "") + ".gguf")
            quantize(fmoe_bin, TINY, out, *args)
            cache[args] = out
        return cache[args]
    return get


@pytest.mark.parametrize("args,holds", [
    (("--type", "q4_k_m"), {"Q4_K", "Q5_K", "Q6_K", "Q8_0"}),
    (("--type", "q3_k_m"), {"Q3_K", "Q5_K", "Q6_K", "Q8_0"}),  # ffn_down: 176 wide, BF16
    (("--type", "q2_k"), {"Q2_K", "Q5_K", "Q6_K", "Q8_0"}),
    (("--type", "q4_k_m", "--experts-type", "q3_k"), {"Q3_K", "Q4_K"}),
    (("--type", "iq4_xs"), {"IQ4_XS"}),
])
def test_mix_model_equals_its_dequantisation(tiny_files, driver, tmp_path, args, holds):
    src = tiny_files(*args)
    kinds = dequantised_copy(src, tmp_path / "deq.gguf")
    assert holds <= set(kinds), kinds
    V = json.loads((TINY / "config.json").read_text())["vocab_size"]
    tokens = [int(x) for x in np.random.default_rng(9).integers(3, V, 16)]
    f32, rf = drive(driver, tmp_path / "deq.gguf", tokens, 12, tmp_path, "f32")
    q, rq = drive(driver, src, tokens, 12, tmp_path, "q")
    diff = float(np.abs(q - f32).max())
    print(f"{args} vs its f32 dequantisation: max |logit diff| {diff:.3g}")
    assert diff <= 1e-3
    assert rq["generated"] == rf["generated"] and rq["experts"] == rf["experts"]
    f32, rf = drive(driver, tmp_path / "deq.gguf", tokens, 0, tmp_path, "f32p")
    q8, r8 = drive(driver, src, tokens, 0, tmp_path, "q8", "--activations", "q8")
    n = len(tokens)
    same = np.array([a == b for a, b in zip(rf["experts"], r8["experts"])])
    assert len(same) == n and (~same).sum() <= Q8ACT_FLIPS
    ref, q8 = f32.reshape(-1, V)[:n][same], q8.reshape(-1, V)[:n][same]
    dd = np.abs(q8 - ref)
    rms, worst = float(np.sqrt((dd ** 2).mean()) / ref.std()), float(dd.max() / ref.std())
    print(f"  activations q8 ({same.sum()} tokens routed alike): |diff| / std: RMS {rms:.4f}, "
          f"max {worst:.4f}")
    assert 0 < rms < Q8ACT_RMS and worst < Q8ACT_MAX


# ---- bad input ----------------------------------------------------------------------

def corrupt(src, dst, tensor, at, value):
    r = gguf.GGUFReader(str(src))
    t = next(t for t in r.tensors if t.name == tensor)
    data = bytearray(pathlib.Path(src).read_bytes())
    off = int(t.data_offset) + at
    data[off:off + 2] = np.array([value], dtype=np.float16).tobytes()
    pathlib.Path(dst).write_bytes(bytes(data))
    return t.tensor_type.name


# where each type's f16 d (and Q2_K's dmin) is in its block
@pytest.mark.parametrize("args,qtype,at,value", [
    (("--type", "q2_k"), "Q2_K", 80, np.nan), (("--type", "q2_k"), "Q2_K", 82, np.inf),
    (("--type", "q3_k_m"), "Q3_K", 108, -np.inf), (("--type", "iq4_xs"), "IQ4_XS", 0, np.nan)])
def test_bad_block_scale_is_one_line(fmoe_bin, tiny_files, tmp_path, args, qtype, at, value):
    bad = tmp_path / "bad.gguf"
    assert corrupt(tiny_files(*args), bad, "blk.1.attn_q.weight", at, value) == qtype
    p = run_fmoe(fmoe_bin, "generate", "--model", bad, "--prompt", "hi",
                 "--max-new-tokens", 2, check=False)
    line = one_line(p, 1)
    assert "non-finite" in line and "bad.gguf" in line, line


def test_bad_expert_block_scale_is_one_line(fmoe_bin, tiny_files, tmp_path):
    """Experts are not scanned at load; a NaN d in every expert's first Q3_K block of a
    layer reaches the routed output, where the forward pass's finite check stops it."""
    # Q3_K's f16 d is the block's last 2 bytes (108 of 110)
    bad = nan_expert_scales(tiny_files("--type", "q4_k_m", "--experts-type", "q3_k"), tmp_path,
                            "Q3_K", 108)
    p = run_fmoe(fmoe_bin, "generate", "--model", bad, "--prompt", "hi",
                 "--max-new-tokens", 2, check=False)
    assert "not finite" in one_line(p, 1)


def test_truncated_q2_k_file_is_one_line(fmoe_bin, tiny_files, tmp_path):
    bad = truncated(tiny_files("--type", "q2_k"), tmp_path)
    p = run_fmoe(fmoe_bin, "generate", "--model", bad, "--prompt", "hi", check=False)
    assert "cut.gguf" in one_line(p, 1)


def test_cuda_takes_q3_k(driver, tiny_files, tmp_path):
    """The CUDA backend has Q3_K kernels (runtime/cuda/cuda_quant.cu; tests/gpu checks them
    on a device): a q3_k_m file runs there where there is a device, and elsewhere fails in
    one line for want of one, not of its type."""
    p = drive(driver, tiny_files("--type", "q3_k_m"), [1, 2, 3], 0, tmp_path, "cuda",
              "--session-backend", "cuda", check=False)
    if p.returncode == 0:
        return
    line = one_line(p, 1)
    assert "CUDA backend unavailable" in line and "Q3_K" not in line, line
