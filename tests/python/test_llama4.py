"""Llama 4 (llama4_text, and llama4 with its text model under text_config) on the CPU
backend against transformers' Llama4ForCausalLM: the tiny checkpoint "llama4" of
make_tiny_models.py (MoE on layers 1 and 3, top-1 sigmoid routing onto the expert input
plus a shared expert, chunked attention in chunks of 8 on the rotary layers 0-2 with the
QK L2 norm, layer 3 NoPE with query temperature tuning, llama3 rope scaling). Its
prefill, chunked prefill and token-by-token decode are test_forward.py's
(test_forward_matches_reference, test_cache_and_chunking_agree); here: each feature is
shown to matter (a config without it moves the logits far past the tolerance), the
multimodal checkpoint's layout, and that the CUDA backend no longer refuses it.

Two features have no config switch, and were checked by hand on this reference (the
tolerance is 1e-3; fmoe's maximum difference is 1e-5): applying the router weight to the
expert's output instead of its input (config.c scale_expert_input = 0) moves the logits
by 0.13 to 0.55 and changes experts and continuation; skipping the reordering of the
q/k rows from Llama 4's adjacent rotary pairs to the halves the backends rotate
(family_llama4.c) moves them by up to 5.2.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import make_tiny_models as tiny  # noqa: E402
from test_forward import TOL, check, run_driver, with_config  # noqa: E402


@pytest.fixture(scope="session")
def llama4(tmp_path_factory):
    d = tiny.maker(tmp_path_factory.mktemp("tiny-llama4"))("llama4")
    return d, dict(np.load(d / "reference.npz"))


def test_config_is_the_tiny_one(llama4):
    """The features below are there to be switched off: transformers wrote this config
    (the layout fixture), with chunks of 8 over a 44-position run, layer 3 NoPE."""
    d, _ = llama4
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["model_type"] == "llama4_text"
    assert cfg["attention_chunk_size"] == 8 and cfg["no_rope_layers"] == [1, 1, 1, 0]
    assert cfg["moe_layers"] == [1, 3] and cfg["use_qk_norm"] is True
    assert cfg["layer_types"] == ["chunked_attention"] * 3 + ["full_attention"]


# (config change, the first prompt position whose logits must move)
FEATURES = [
    # chunked attention: positions 0-7 are in the first chunk either way
    ({"attention_chunk_size": None}, 8),
    # temperature tuning: floor((pos + 1) / 4) is 0 below position 3
    ({"attn_temperature_tuning": False}, 3),
    ({"use_qk_norm": False}, 0),
    # NoPE: every layer rotary (and chunked) instead
    ({"no_rope_layers": [1, 1, 1, 1], "layer_types": ["chunked_attention"] * 4}, 1),
    # llama3 rope scaling: the low frequencies move from the first positions on
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}, 1),
]


@pytest.mark.parametrize("change,first", FEATURES,
                         ids=["chunking", "temperature", "qk_norm", "nope", "llama3_rope"])
def test_each_feature_is_exercised(change, first, llama4, driver, tmp_path):
    d, ref = llama4
    other = with_config(d, tmp_path / "other", **{k: v for k, v in change.items() if v is not None})
    if None in change.values():  # a key set to null (with_config deletes on None)
        cfg = json.loads((other / "config.json").read_text())
        cfg.update(change)
        (other / "config.json").write_text(json.dumps(cfg))
    logits, _ = run_driver(driver, other, ref, tmp_path)
    diff = np.abs(logits - ref["logits"]).max(-1)
    assert (diff[:first] <= TOL).all(), diff.tolist()
    assert diff[first:].max() > 100 * TOL, diff.tolist()


def test_multimodal_checkpoint(llama4, driver, tmp_path):
    """model_type llama4 (Llama4ForConditionalGeneration's config): the text model's keys
    under text_config, its tensors under language_model., a vision tower that is never
    read. The same answers as the text checkpoint."""
    d, ref = llama4
    mm = tmp_path / "mm"
    mm.mkdir()
    text = json.loads((d / "config.json").read_text())
    (mm / "config.json").write_text(json.dumps({
        "model_type": "llama4", "architectures": ["Llama4ForConditionalGeneration"],
        "text_config": text, "vision_config": {"model_type": "llama4_vision_model",
                                               "hidden_size": 8}}))
    from test_quantize import read_checkpoint
    ck = read_checkpoint(d)
    tensors = {"language_model." + k: v for k, v in ck.items()}
    tensors["vision_model.patch_embedding.linear.weight"] = (
        np.zeros((8, 4), np.float32), "F32")
    tiny.save_safetensors(mm / "model.safetensors", tensors)
    logits, routes = run_driver(driver, mm, ref, tmp_path)
    check(mm, ref, logits, routes, "llama4 multimodal")


def test_not_refused_by_cuda(llama4, driver):
    """Llama 4 (chunked and temperature-tuned attention, scaled expert inputs): the CUDA
    backend has every op of the family now (compiled, not yet run on a GPU: docs/gpu.md), so
    a session there is no longer refused for the family: with a device it runs, without one
    it fails in one line for want of the backend, nothing else."""
    d, _ = llama4
    p = subprocess.run([str(driver), str(d), "--tokens", "1,2", "--session-backend", "cuda"],
                       capture_output=True, text=True, timeout=120)
    if p.returncode == 0:  # a device: the CUDA backend ran it (tests/gpu compares the result)
        return
    assert p.returncode == 1, p.stderr
    assert p.stderr.count("\n") == 1, p.stderr
    assert "CUDA backend unavailable" in p.stderr, p.stderr
