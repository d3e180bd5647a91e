"""GLM-4.5 (transformers' glm4_moe) on fmoe's CPU forward pass, against transformers.

Three tiny random checkpoints written by transformers' own Glm4MoeForCausalLM
(make_tiny_models.py): glm4_moe (GLM-4.5-Air's attention, without q/k norms),
glm4_moe_qk_norm (GLM-4.5's, with them) and glm4_moe_yarn (YaRN over the rotated part).
All have q/k/v biases, partial rotary 0.5 (16 of 32 dims per head), DeepSeek-V3's biased
sigmoid router over 4 groups of 2 (2 kept), a shared expert and one dense first layer.
The bar is test_forward.py's: max |logit difference| <= 1e-3 in float32, the same top-k
experts at every MoE layer for every token (read from transformers' gates), the same
32-token greedy continuation, for a prefill, a prefill in chunks of 5 and a token-by-token
prompt. Then each GLM setting is shown to matter (changed, the logits or routes leave the
reference), the multi-token-prediction layer a real checkpoint carries is shown to be
skipped, and the CUDA backend no longer refuses the family (its kernels: docs/gpu.md).
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


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny.maker(tmp_path_factory.mktemp("tiny-glm4-moe"))


def reference(models, name):
    d = models(name)
    return d, dict(np.load(d / "reference.npz"))


@pytest.mark.parametrize("mode", [(), ("--stepwise",), ("--batch", "5")])
@pytest.mark.parametrize("name", tiny.GLM4_MOE)
def test_forward_matches_transformers(name, mode, models, driver, tmp_path):
    d, ref = reference(models, name)
    logits, routes = run_driver(driver, d, ref, tmp_path, *mode)
    check(d, ref, logits, routes, f"{name} {' '.join(mode)}")


@pytest.mark.parametrize("name,changes", [
    # the whole head rotated instead of its first half
    ("glm4_moe", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                      "partial_rotary_factor": 1.0}}),
    # YaRN left out
    ("glm4_moe_yarn", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                           "partial_rotary_factor": 0.5}}),
    # the q/k/v biases left out
    ("glm4_moe", {"attention_bias": False}),
    # the per-head q/k norms left out
    ("glm4_moe_qk_norm", {"use_qk_norm": False}),
    ("glm4_moe", {"routed_scaling_factor": 1.0}),
    ("glm4_moe", {"norm_topk_prob": False}),
])
def test_settings_move_the_logits(name, changes, models, driver, tmp_path):
    """Each setting moves the logits far past the tolerance, so the reference pins it."""
    d, ref = reference(models, name)
    logits, _ = run_driver(driver, with_config(d, tmp_path / "changed", **changes), ref,
                           tmp_path)
    assert float(np.abs(logits - ref["logits"]).max()) > 100 * TOL, changes


def test_group_limit_and_selection_bias_move_the_routes(models, driver, tmp_path):
    """With every group kept, or with e_score_correction_bias zeroed, some prompt token
    picks other experts: the reference's top-k pins the grouping and the bias."""
    from test_quantize import read_checkpoint
    d, ref = reference(models, "glm4_moe")
    n = len(ref["tokens"])
    _, routes = run_driver(driver, with_config(d, tmp_path / "groups", topk_group=4), ref,
                           tmp_path)
    assert (np.asarray(routes["experts"])[:n] != ref["experts"][:n]).any()
    ck = read_checkpoint(d)
    for k, (a, dt) in list(ck.items()):
        if k.endswith("e_score_correction_bias"):
            ck[k] = (np.zeros_like(a), dt)
    nb = tmp_path / "nobias"
    nb.mkdir()
    (nb / "config.json").write_text((d / "config.json").read_text())
    tiny.save_safetensors(nb / "model.safetensors", ck)
    _, routes = run_driver(driver, nb, ref, tmp_path)
    assert (np.asarray(routes["experts"])[:n] != ref["experts"][:n]).any()


def test_mtp_layer_is_skipped(models, driver, tmp_path):
    """Published GLM-4.5 checkpoints carry num_nextn_predict_layers multi-token-prediction
    layers after the last decoder layer (model.layers.L.*, with eh_proj, enorm, hnorm and
    shared_head tensors), which transformers ignores at load. A checkpoint with such a
    layer added (random weights) runs exactly as the reference."""
    from test_quantize import read_checkpoint
    d, ref = reference(models, "glm4_moe")
    ck = read_checkpoint(d)
    L = json.loads((d / "config.json").read_text())["num_hidden_layers"]
    rng = np.random.default_rng(0)
    for k, (a, dt) in list(ck.items()):
        if k.startswith("model.layers.1."):  # a MoE layer's tensors, renamed
            ck[k.replace("model.layers.1.", f"model.layers.{L}.")] = (
                rng.standard_normal(a.shape).astype(a.dtype), dt)
    h = ck["model.norm.weight"][0].shape[0]
    for name, shape in (("eh_proj.weight", (h, 2 * h)), ("enorm.weight", (h,)),
                        ("hnorm.weight", (h,)), ("shared_head.norm.weight", (h,))):
        ck[f"model.layers.{L}.{name}"] = (rng.standard_normal(shape).astype(np.float32), "F32")
    m = tmp_path / "mtp"
    m.mkdir()
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_nextn_predict_layers"] = 1
    (m / "config.json").write_text(json.dumps(cfg))
    tiny.save_safetensors(m / "model.safetensors", ck)
    logits, routes = run_driver(driver, m, ref, tmp_path)
    check(m, ref, logits, routes, "glm4_moe with an MTP layer")


def test_not_refused_by_cuda(models, driver):
    """GLM-4.5 (partial rotary embedding, biased sigmoid routing): the CUDA backend has every op
    of the family now (compiled, not yet run on a GPU: docs/gpu.md), so a session there is no
    longer refused for the family: with a device it runs, without one it fails in one line for
    want of the backend, nothing else."""
    d = models("glm4_moe")
    p = subprocess.run([str(driver), str(d), "--tokens", "1,2", "--session-backend", "cuda"],
                       capture_output=True, text=True, timeout=120)
    if p.returncode == 0:  # a device: the CUDA backend ran it (tests/gpu compares the result)
        return
    assert p.returncode == 1, p.stderr
    assert p.stderr.count("\n") == 1, p.stderr
    assert "CUDA backend unavailable" in p.stderr, p.stderr


@pytest.mark.parametrize("prf", [0.3, 0.0, 1.5])
def test_bad_partial_rotary_factor(prf, models, driver, tmp_path):
    """A factor giving no whole, even number of rotated dims in [2, head_dim] (32 · 0.3 =
    9.6 -> 9) is refused in one line naming the key."""
    d = models("glm4_moe")
    bad = with_config(d, tmp_path / "bad", rope_parameters={
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": prf})
    p = subprocess.run([str(driver), str(bad), "--tokens", "1,2"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 1, p.stderr
    assert p.stderr.count("\n") == 1, p.stderr
    assert "rope_parameters.partial_rotary_factor" in p.stderr, p.stderr


def test_partial_rotary_refused_for_other_families(models, driver, tmp_path):
    """Only glm4_moe rotates part of a head: another family's checkpoint asking for it is
    refused in one line naming the key and the family, not run with the whole head."""
    d = models("qwen3_moe")
    bad = with_config(d, tmp_path / "bad", partial_rotary_factor=0.5)
    p = subprocess.run([str(driver), str(bad), "--tokens", "1,2"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 1, p.stderr
    assert p.stderr.count("\n") == 1, p.stderr
    assert "partial_rotary_factor = 0.5" in p.stderr and "qwen3_moe" in p.stderr, p.stderr
