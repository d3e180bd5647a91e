"""GGUF architecture gpt-oss (as llama.cpp's converter writes it) in the forward pass:
lib/gguf_config.c's translation of the gpt-oss.* keys into a config, lib/gguf_names.c's
post-attention norm, and runtime/model/family_gptoss.c's sinks, biased router and
stacked experts with biases, read in place (F32, or MXFP4 blocks).

The tiny gpt_oss checkpoints of make_tiny_models.py (f32 experts, and MXFP4 experts in
OpenAI's layout) are written here as GGUF files by gguf-py's own writer, with its key and
tensor names (gguf.TENSOR_NAMES, the tensor map for gpt-oss) and llama.cpp's shapes:
gate and up split from the fused, interleaved gate_up_proj, every expert matrix
output-major, MXFP4 blocks in ggml's order (scale byte, then values l and l+16 in byte l).
There is no fmoe.hf_config key, so the config is rebuilt from the metadata alone. GGUF
has no swiglu_limit key (llama.cpp fixes it at 7), so the directory compared with runs
with swiglu_limit 7 too; then logits, experts and greedy tokens must be identical.
"""
import json
import pathlib
import struct
import subprocess

import numpy as np
import pytest

import make_tiny_models as tiny
from forward_driver import drive
from test_gguf_deepseek2 import with_config

import gguf  # noqa: E402  (tests/python/requirements.txt)

T = gguf.MODEL_TENSOR


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny.maker(tmp_path_factory.mktemp("tiny-models"))


def read_raw(d):
    """Every tensor of d/model.safetensors as numpy (F32 as float32, U8 as uint8)."""
    raw = (pathlib.Path(d) / "model.safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        dt = {"F32": np.float32, "U8": np.uint8}[info["dtype"]]
        out[name] = np.frombuffer(raw[8 + n + a:8 + n + b], dt).reshape(info["shape"])
    return out


def ggml_mxfp4(blocks, scales):
    """OpenAI's blocks [..., G, 16] (value 2k in the low nibble of byte k) and scales
    [..., G] as ggml MXFP4 bytes [..., G·17]: the scale, then value l (l < 16) in the low
    nibble of byte l and value l + 16 in its high nibble."""
    idx = np.stack([blocks & 0xF, blocks >> 4], -1).reshape(*blocks.shape[:-1], 32)
    qs = idx[..., :16] | (idx[..., 16:] << 4)
    out = np.concatenate([scales[..., None], qs], -1).astype(np.uint8)
    return out.reshape(*out.shape[:-2], -1)


def write_gpt_oss(model_dir, out):
    cfg = json.loads((pathlib.Path(model_dir) / "config.json").read_text())
    ck = read_raw(model_dir)
    L, J = cfg["num_hidden_layers"], cfg["num_local_experts"]
    rp = cfg["rope_parameters"]
    w = gguf.GGUFWriter(str(out), "gpt-oss")
    w.add_block_count(L)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_expert_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_freq_base(rp["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(J)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_sliding_window(cfg["sliding_window"])
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(rp["factor"])
    w.add_rope_scaling_orig_ctx_len(rp["original_max_position_embeddings"])
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GPT_OSS, L)

    def name(t, i, suffix):
        return gguf.TENSOR_NAMES[t].format(bid=i) + suffix

    def add(n, a, raw=None):
        w.add_tensor(n, np.ascontiguousarray(a), raw_dtype=raw)

    for hf, x in ck.items():
        if ".mlp.experts." in hf:
            continue
        if hf.endswith(".sinks"):  # the converter's modify_tensors: sinks gain ".weight"
            hf += ".weight"
        gg = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        assert gg, hf
        add(gg, x)
    for i in range(L):
        p = f"model.layers.{i}.mlp.experts."
        gb = ck[p + "gate_up_proj_bias"]
        add(name(T.FFN_GATE_EXP, i, ".bias"), gb[:, ::2])
        add(name(T.FFN_UP_EXP, i, ".bias"), gb[:, 1::2])
        add(name(T.FFN_DOWN_EXP, i, ".bias"), ck[p + "down_proj_bias"])
        if p + "gate_up_proj_blocks" in ck:
            gu = ggml_mxfp4(ck[p + "gate_up_proj_blocks"], ck[p + "gate_up_proj_scales"])
            dn = ggml_mxfp4(ck[p + "down_proj_blocks"], ck[p + "down_proj_scales"])
            mx = gguf.GGMLQuantizationType.MXFP4
            add(name(T.FFN_GATE_EXP, i, ".weight"), gu[:, ::2], mx)
            add(name(T.FFN_UP_EXP, i, ".weight"), gu[:, 1::2], mx)
            add(name(T.FFN_DOWN_EXP, i, ".weight"), dn, mx)
        else:  # [J, h, 2I] input-major: transposed to [J, 2I, h], then split
            gu = np.swapaxes(ck[p + "gate_up_proj"], 1, 2)
            add(name(T.FFN_GATE_EXP, i, ".weight"), gu[:, ::2])
            add(name(T.FFN_UP_EXP, i, ".weight"), gu[:, 1::2])
            add(name(T.FFN_DOWN_EXP, i, ".weight"), np.swapaxes(ck[p + "down_proj"], 1, 2))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


@pytest.mark.parametrize("name", tiny.GPT_OSS)
def test_gpt_oss_gguf_runs_exactly_as_the_checkpoint(name, models, driver, tmp_path):
    d = models(name)
    ref = dict(np.load(d / "reference.npz"))
    f = write_gpt_oss(d, tmp_path / "m.gguf")
    base = with_config(d, tmp_path / "limit7", swiglu_limit=7.0)
    l1, r1 = drive(driver, base, ref, tmp_path, "dir")
    l2, r2 = drive(driver, f, ref, tmp_path, "gguf")
    assert np.array_equal(l1, l2), f"{name}: max |diff| {np.abs(l1 - l2).max()}"
    assert r1 == r2
    # and the limit mattered: the reference (limit 1.5) differs from both
    assert np.abs(l1.reshape(ref["logits"].shape) - ref["logits"]).max() > 0.1


def test_mxfp4_gguf_is_not_refused_by_cuda(models, driver, tmp_path):
    """MXFP4 has CUDA kernels now (runtime/cuda/cuda_quant.cu; compiled, not yet run on a
    GPU: docs/gpu.md): a gpt-oss GGUF with MXFP4 experts on the CUDA backend runs where there
    is a device, and elsewhere fails in one line for want of one, not of its type."""
    f = write_gpt_oss(models("gpt_oss_mxfp4"), tmp_path / "m.gguf")
    p = subprocess.run([str(driver), str(f), "--tokens", "1,2", "--session-backend", "cuda"],
                       capture_output=True, text=True, timeout=120)
    if p.returncode == 0:  # a device: the CUDA backend ran it (tests/gpu compares the result)
        return
    assert p.returncode == 1, p.stderr
    assert p.stderr.count("\n") == 1, p.stderr
    assert "CUDA backend unavailable" in p.stderr and "MXFP4" not in p.stderr, p.stderr
