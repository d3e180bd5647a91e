"""GGUF architecture llama4 (as llama.cpp's converter writes it) in the forward pass:
lib/gguf_config.c's translation of the llama4.* keys into a llama4_text config,
lib/gguf_names.c's feed_forward names and q/k rows, runtime/model/family_llama4.c's
rope_freqs.

The tiny llama4 checkpoint of make_tiny_models.py is written here as a GGUF file by
gguf-py's own writer, with its key and tensor names (gguf.TENSOR_NAMES, the tensor map for
MODEL_ARCH.LLAMA4) and what conversion/llama.py's Llama4Model does to the tensors: q/k
rows kept as the checkpoint has them (undo_permute False), the fused input-major
gate_up_proj transposed and split into gate and up, down_proj transposed, and the llama3
rope scaling written as the rope_freqs tensor of per-frequency divisors
(LlamaModel.generate_extra_tensors). There is no fmoe.hf_config key, so the config is
rebuilt from the metadata alone. GGUF has no key for the chunk size, the NoPE interval
or the query temperature (llama.cpp fixes them at 8192, 4, floor_scale 8192 and
attn_scale 0.1), so the directory compared with runs with those values; then logits,
experts and greedy tokens must agree.
"""
import json
import math
import pathlib

import numpy as np
import pytest

import make_tiny_models as tiny
from forward_driver import drive
from test_gguf_deepseek2 import with_config
from test_quantize import read_checkpoint

import gguf  # noqa: E402  (tests/python/requirements.txt)

T = gguf.MODEL_TENSOR
LLAMA_CPP_FIXED = {"attention_chunk_size": 8192, "floor_scale": 8192, "attn_scale": 0.1}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny.maker(tmp_path_factory.mktemp("tiny-models"))


def rope_factors(cfg):
    """conversion/llama.py LlamaModel.generate_extra_tensors, in numpy float32."""
    rp = cfg["rope_parameters"]
    dim = cfg["head_dim"]
    freqs = 1.0 / (np.float32(rp["rope_theta"]) ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, lo, hi = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
    old = rp["original_max_position_embeddings"]
    out = []
    for f in freqs.astype(np.float64):
        wl = 2 * math.pi / f
        if wl < old / hi:
            out.append(1.0)
        elif wl > old / lo:
            out.append(factor)
        else:
            s = (old / wl - lo) / (hi - lo)
            out.append(1 / ((1 - s) / factor + s))
    return np.asarray(out, np.float32)


def write_llama4(model_dir, out, with_rope_freqs=True):
    cfg = json.loads((pathlib.Path(model_dir) / "config.json").read_text())
    ck = {k: v[0] for k, v in read_checkpoint(model_dir).items()}
    L = cfg["num_hidden_layers"]
    w = gguf.GGUFWriter(str(out), "llama4")
    w.add_block_count(L)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size_mlp"])
    w.add_expert_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_dimension_count(cfg["head_dim"])
    w.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(cfg["num_local_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_interleave_moe_layer_step(cfg["interleave_moe_layer_step"])
    w.add_vocab_size(cfg["vocab_size"])
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA4, L)

    def add(n, a):
        w.add_tensor(n, np.ascontiguousarray(a, dtype=np.float32))

    for hf, x in ck.items():
        if ".experts." in hf:
            continue
        gg = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        assert gg, hf
        add(gg, x)
    for i in cfg["moe_layers"]:
        p = f"model.layers.{i}.feed_forward.experts."
        gu = np.swapaxes(ck[p + "gate_up_proj"], 1, 2)  # [J, 2I, h]
        I = gu.shape[1] // 2
        add(gguf.TENSOR_NAMES[T.FFN_GATE_EXP].format(bid=i) + ".weight", gu[:, :I])
        add(gguf.TENSOR_NAMES[T.FFN_UP_EXP].format(bid=i) + ".weight", gu[:, I:])
        add(gguf.TENSOR_NAMES[T.FFN_DOWN_EXP].format(bid=i) + ".weight",
            np.swapaxes(ck[p + "down_proj"], 1, 2))
    if with_rope_freqs:
        add(gguf.TENSOR_NAMES[T.ROPE_FREQS] + ".weight", rope_factors(cfg))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def test_llama4_gguf_runs_as_the_checkpoint(models, driver, tmp_path):
    d = models("llama4")
    ref = dict(np.load(d / "reference.npz"))
    f = write_llama4(d, tmp_path / "m.gguf")
    base = with_config(d, tmp_path / "fixed", **LLAMA_CPP_FIXED)
    l1, r1 = drive(driver, base, ref, tmp_path, "dir")
    l2, r2 = drive(driver, f, ref, tmp_path, "gguf")
    # the same up to the rope: rope_freqs divides float32 frequencies by float32 factors,
    # the directory's llama3 scaling computes them in double
    assert np.abs(l1 - l2).max() < 1e-4, f"max |diff| {np.abs(l1 - l2).max()}"
    assert r1 == r2
    # and what llama.cpp fixes mattered: the reference (chunks of 8, floor_scale 4,
    # attn_scale 0.5) differs from both
    assert np.abs(l1.reshape(ref["logits"].shape) - ref["logits"]).max() > 0.1


def test_llama4_gguf_rope_freqs_matter(models, driver, tmp_path):
    d = models("llama4")
    ref = dict(np.load(d / "reference.npz"))
    f = write_llama4(d, tmp_path / "m.gguf", with_rope_freqs=False)
    base = with_config(d, tmp_path / "fixed", **LLAMA_CPP_FIXED)
    l1, _ = drive(driver, base, ref, tmp_path, "dir")
    l2, _ = drive(driver, f, ref, tmp_path, "gguf")
    assert np.abs(l1 - l2).max() > 0.01
