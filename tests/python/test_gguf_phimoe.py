"""GGUF architecture phimoe (Phi-3.5-MoE as llama.cpp's converter writes it) in the forward
pass: lib/gguf_names.c's LayerNorm biases (attn_norm.bias, ffn_norm.bias,
output_norm.bias) and output.bias, lib/gguf_config.c's translation of the phimoe.* keys
into a phimoe config (attention and lm_head biases from the tensors present, longrope from
the rope_factors_long/short tensors and rope.scaling.attn_factor).

The tiny Phi-3.5-MoE checkpoints of make_tiny_models.py are written here as F32 GGUF by
gguf-py's own writer with the names of gguf-py's MODEL_TENSORS[PHIMOE] and the keys
llama.cpp's conversion/phi.py (PhiMoeModel over Phi3MiniModel) writes, without fmoe's
hf_config key; they must run to exactly the logits, experts and tokens of the HF
directory. GGUF has no key for router_jitter_noise (the sparsemixer's threshold), so the
checkpoint run beside the file has the published 0.01 (phimoe_jitter), and for longrope
the directory's config gets the file's one attention factor as both mscales (llama.cpp's
reading: the file carries no other).
"""
import json
import math
import shutil
import subprocess

import numpy as np
import pytest

from forward_driver import drive

import make_tiny_models as tiny
from test_quantize import read_checkpoint

import gguf  # noqa: E402  (tests/python/requirements.txt)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny.maker(tmp_path_factory.mktemp("tiny-phimoe-gguf"))


def rope_params(cfg):
    return cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}


def write_phimoe(model_dir, out):
    cfg = json.loads((model_dir / "config.json").read_text())
    ck = {k: v[0] for k, v in read_checkpoint(model_dir).items()}
    L, J, h = cfg["num_hidden_layers"], cfg["num_local_experts"], cfg["hidden_size"]
    H = cfg["num_attention_heads"]
    rp = rope_params(cfg)
    names = {t: gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.PHIMOE]}
    T = gguf.MODEL_TENSOR
    w = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.PHIMOE])
    # Phi3MiniModel.set_gguf_parameters, then PhiMoeModel's expert counts
    omp = rp.get("original_max_position_embeddings", cfg.get("original_max_position_embeddings",
                                                             cfg["max_position_embeddings"]))
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_rope_scaling_orig_ctx_len(omp)
    w.add_embedding_length(h)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_block_count(L)
    w.add_head_count(H)
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_dimension_count(h // H)
    w.add_rope_freq_base(rp.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    w.add_sliding_window(cfg.get("sliding_window") or 0)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_count(J)
    attn_factor = None
    if rp.get("long_factor"):
        scale = cfg["max_position_embeddings"] / omp
        attn_factor = math.sqrt(1 + math.log(scale) / math.log(omp)) if scale > 1 else 1.0
        w.add_rope_scaling_attn_factors(attn_factor)

    def add(name, a):
        w.add_tensor(name, np.ascontiguousarray(a, np.float32))

    def blk(t, i, suffix="weight"):
        return names[t].format(bid=i) + "." + suffix

    add(names[T.TOKEN_EMBD] + ".weight", ck["model.embed_tokens.weight"])
    add(names[T.OUTPUT_NORM] + ".weight", ck["model.norm.weight"])
    add(names[T.OUTPUT_NORM] + ".bias", ck["model.norm.bias"])
    add(names[T.OUTPUT] + ".weight", ck["lm_head.weight"])
    if "lm_head.bias" in ck:
        add(names[T.OUTPUT] + ".bias", ck["lm_head.bias"])
    if attn_factor is not None:
        add(names[T.ROPE_FACTORS_LONG] + ".weight", np.array(rp["long_factor"]))
        add(names[T.ROPE_FACTORS_SHORT] + ".weight", np.array(rp["short_factor"]))
    for i in range(L):
        p = f"model.layers.{i}."
        for suffix in ("weight", "bias"):
            add(blk(T.ATTN_NORM, i, suffix), ck[p + "input_layernorm." + suffix])
            add(blk(T.FFN_NORM, i, suffix), ck[p + "post_attention_layernorm." + suffix])
        for t, hf in ((T.ATTN_Q, "q"), (T.ATTN_K, "k"), (T.ATTN_V, "v"), (T.ATTN_OUT, "o")):
            add(blk(t, i), ck[p + f"self_attn.{hf}_proj.weight"])
            if p + f"self_attn.{hf}_proj.bias" in ck:
                add(blk(t, i, "bias"), ck[p + f"self_attn.{hf}_proj.bias"])
        moe = "block_sparse_moe" if p + "block_sparse_moe.gate.weight" in ck else "mlp"
        add(blk(T.FFN_GATE_INP, i), ck[p + f"{moe}.gate.weight"])
        for t, hf in ((T.FFN_GATE_EXP, "w1"), (T.FFN_DOWN_EXP, "w2"), (T.FFN_UP_EXP, "w3")):
            add(blk(t, i), np.stack([ck[p + f"{moe}.experts.{e}.{hf}.weight"] for e in range(J)]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return attn_factor


def test_phimoe_gguf_runs_exactly_as_the_checkpoint(models, driver, tmp_path):
    d = models("phimoe_jitter")
    ref = dict(np.load(d / "reference.npz"))
    write_phimoe(d, tmp_path / "m.gguf")
    l1, r1 = drive(driver, d, ref, tmp_path, "dir")
    l2, r2 = drive(driver, tmp_path / "m.gguf", ref, tmp_path, "gguf")
    assert np.array_equal(l1, l2), f"max |diff| {np.abs(l1 - l2).max()}"
    assert r1 == r2
    assert r2["generated"] == ref["generated"].tolist()


@pytest.mark.parametrize("side", ["long", "short"])
def test_phimoe_gguf_longrope(side, models, driver, tmp_path):
    """longrope from the file's factor tensors and attention factor: the directory with the
    same reading (both mscales the file's factor, jitter 0.01) runs identically."""
    src = models(f"phimoe_longrope_{side}")
    ref = dict(np.load(src / "reference.npz"))
    d = tmp_path / "dir"
    shutil.copytree(src, d)
    cfg = json.loads((d / "config.json").read_text())
    af = write_phimoe(d, tmp_path / "m.gguf")
    assert af is not None and af > 1
    rp = cfg["rope_parameters"]
    rp["short_mscale"] = rp["long_mscale"] = af
    cfg["router_jitter_noise"] = 0.01
    (d / "config.json").write_text(json.dumps(cfg))
    l1, r1 = drive(driver, d, ref, tmp_path, "dir")
    l2, r2 = drive(driver, tmp_path / "m.gguf", ref, tmp_path, "gguf")
    assert np.array_equal(l1, l2), f"max |diff| {np.abs(l1 - l2).max()}"
    assert r1 == r2


def test_phimoe_gguf_geometry(models, tmp_path, fmoe_bin):
    d = models("phimoe_jitter")
    write_phimoe(d, tmp_path / "m.gguf")
    p = subprocess.run([str(fmoe_bin), "inspect", str(tmp_path / "m.gguf"), "--json"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    m = json.loads(p.stdout)["model"]
    cfg = json.loads((d / "config.json").read_text())
    assert (m["model_type"], m["layers"], m["experts"], m["top_k"], m["hidden_size"]) == (
        "phimoe", cfg["num_hidden_layers"], cfg["num_local_experts"],
        cfg["num_experts_per_tok"], cfg["hidden_size"])
    assert m["config"] == "built from GGUF metadata"


def test_phimoe_gguf_half_longrope_refused(models, driver, tmp_path):
    """A file with one of the two factor tensors is refused in one line naming them."""
    d = models("phimoe_longrope_short")
    f = tmp_path / "m.gguf"
    write_phimoe(d, f)
    r = gguf.GGUFReader(str(f))
    raw = bytearray(f.read_bytes())
    at = raw.find(b"rope_factors_short.weight")
    assert at > 0 and r is not None
    raw[at:at + 6] = b"ROPE_f"
    f.write_bytes(bytes(raw))
    p = subprocess.run([str(driver), str(f), "--tokens", "1,2"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 1, p.stderr
    assert p.stderr.count("\n") == 1, p.stderr
    assert "rope_factors_long.weight, rope_factors_short.weight" in p.stderr, p.stderr
