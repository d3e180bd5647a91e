"""Cross-check of fmoe's CPU forward pass against transformers (and, for DeepSeek-MoE V1,
which exists only as remote code, a numpy transcription of the authors' modeling code).

make_tiny_models.py writes tiny random checkpoints in each family's transformers layout
(save_pretrained, safetensors) and the reference logits, router top-k and greedy
continuation; tests/model/forward_driver runs them through fmoe. The bar: max |logit
difference| <= 1e-3 in float32 (far below what a wrong formula gives, above what summation
order gives), identical top-k experts at every MoE layer for every token, identical greedy
continuations of 32 tokens. The *_swa checkpoints have sliding windows shorter than the
prompt, so prefill, chunked prefill and the cached token-by-token decode all drop keys,
and a window off by one token fails.

The transformers references are fixtures (tests/fixtures/transformers/): the quick tier
reads them without torch; the full tier (FMOE_TEST_TIER=full, torch + transformers from
tests/python/requirements-torch.txt) recomputes them and checks the fixtures still agree.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import make_tiny_models as tiny  # noqa: E402
from conftest import FULL_TIER  # noqa: E402

TOL = 1e-3


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    return tiny.maker(tmp_path_factory.mktemp("tiny-models"))


def run_driver(driver, model_dir, ref, tmp_path, *extra):
    logits_path, routes_path = tmp_path / "logits.f32", tmp_path / "routes.json"
    tokens = ",".join(str(int(t)) for t in ref["tokens"])
    p = subprocess.run([str(driver), str(model_dir), "--tokens", tokens, "--generate",
                        str(len(ref["generated"])), "--logits", str(logits_path), "--routes",
                        str(routes_path), *map(str, extra)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    n, V = ref["logits"].shape
    logits = np.fromfile(logits_path, dtype="<f4").reshape(n, V)
    routes = json.loads(routes_path.read_text())
    return logits, routes


def check(model_dir, ref, logits, routes, name):
    diff = float(np.abs(logits - ref["logits"]).max())
    print(f"{name}: max |logit diff| {diff:.3g}")
    assert diff <= TOL, f"{name}: max |logit diff| {diff} > {TOL}"
    ours = np.asarray(routes["experts"])
    theirs = ref["experts"]
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    # Same experts, and in the same (descending) order.
    bad = np.argwhere((ours != theirs).any(-1))
    assert len(bad) == 0, f"{name}: top-k differs at (token, layer) {bad[:5].tolist()}"
    assert routes["generated"] == ref["generated"].tolist(), \
        f"{name}: greedy continuation differs:\n ours   {routes['generated']}\n theirs {ref['generated'].tolist()}"


@pytest.mark.parametrize("name", tiny.ALL + tiny.MLA + tiny.PHIMOE + tiny.GPT_OSS + tiny.LLAMA4)
def test_forward_matches_reference(name, models, driver, tmp_path):
    d = models(name)
    ref = dict(np.load(d / "reference.npz"))
    logits, routes = run_driver(driver, d, ref, tmp_path)
    check(d, ref, logits, routes, name)


@pytest.mark.parametrize("mode", [("--stepwise",), ("--batch", "5"), ("--threads", "1")])
@pytest.mark.parametrize("name", ["qwen2_moe", "mixtral_swa", "qwen2_moe_swa", "qwen3_moe_swa",
                                  "deepseek_v2_lite", "deepseek_v3_yarn", "phimoe", "gpt_oss",
                                  "gpt_oss_mxfp4", "llama4"])
def test_cache_and_chunking_agree(name, mode, models, driver, tmp_path):
    """Token-by-token prompts, chunked prefill and one thread give the same answers. With
    a sliding window shorter than the prompt, --stepwise compares the logits of the cached
    decode path at every prompt position with transformers' prefill, and chunks of 5 start
    inside the window of the chunk before."""
    d = models(name)
    ref = dict(np.load(d / "reference.npz"))
    logits, routes = run_driver(driver, d, ref, tmp_path, *mode)
    check(d, ref, logits, routes, f"{name} {' '.join(mode)}")


def with_config(src, dst, **changes):
    """A copy of the checkpoint directory SRC at DST with config.json keys changed (None
    deletes the key)."""
    os.makedirs(dst)
    for f in os.listdir(src):
        os.symlink(src / f, dst / f)
    cfg = json.loads((src / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (dst / "config.json").unlink()
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("name,window", [("mixtral_swa", 5), ("qwen2_moe_swa", 4),
                                         ("qwen3_moe_swa", 6)])
def test_window_is_exercised_to_the_token(name, window, models, driver, tmp_path):
    """The sliding-window references pin the window exactly: with the window one token
    wider, the logits of the first `window` positions (which see the whole prefix either
    way) still match and those from position `window` on do not (transformers' mask keeps
    key j for query i iff i - window < j <= i), so an off-by-one fails
    test_forward_matches_reference."""
    d = models(name)
    ref = dict(np.load(d / "reference.npz"))
    wide = with_config(d, tmp_path / "wide", sliding_window=window + 1)
    logits, _ = run_driver(driver, wide, ref, tmp_path)
    diff = np.abs(logits - ref["logits"]).max(-1)
    assert (diff[:window] <= TOL).all(), f"{name}: {diff.tolist()}"
    assert (diff[window:] > 100 * TOL).all(), f"{name}: {diff.tolist()}"


def test_qwen2_moe_default_sliding_layers(models, driver, tmp_path):
    """Without layer_types, Qwen2-MoE slides on the even layers below max_window_layers
    (configuration_qwen2_moe.py): with max_window_layers 2 that is layer 0 alone, and
    fmoe must then run exactly as with that list written out. The full tier asks
    transformers' Qwen2MoeConfig for the list."""
    d = models("qwen2_moe_swa")
    ref = dict(np.load(d / "reference.npz"))
    layers = ["sliding_attention", "full_attention", "full_attention"]
    if FULL_TIER:
        import transformers
        cfg = json.loads((d / "config.json").read_text())
        cfg.pop("layer_types")
        assert transformers.Qwen2MoeConfig(**dict(cfg, max_window_layers=2)).layer_types == layers
    rule = with_config(d, tmp_path / "rule", layer_types=None, max_window_layers=2)
    listed = with_config(d, tmp_path / "listed", layer_types=layers)
    l_rule, r_rule = run_driver(driver, rule, ref, tmp_path)
    l_listed, r_listed = run_driver(driver, listed, ref, tmp_path)
    assert np.array_equal(l_rule, l_listed) and r_rule == r_listed
    # ...and that is not the checkpoint's own list (full, sliding, sliding).
    assert float(np.abs(l_rule - ref["logits"]).max()) > 100 * TOL


def test_speculative_gates(models, driver, tmp_path):
    """speculative[t][l][s] is the router of layer l+s applied to layer l's gate input;
    at s = 0 it would be probs itself, so the last layer's rows are zero and the rest are
    distributions."""
    d = models("deepseek")
    ref = dict(np.load(d / "reference.npz"))
    _, routes = run_driver(driver, d, ref, tmp_path, "--speculative", "2")
    spec = np.asarray(routes["speculative"])  # [T, L, S, J]
    T, L, S, J = spec.shape
    assert (L, S) == (3, 2)
    assert np.allclose(spec[:, L - 1], 0)
    assert np.allclose(spec[:, 0, :, :].sum(-1), 1, atol=1e-5)
    assert np.allclose(spec[:, 1, 1], 0) and np.allclose(spec[:, 1, 0].sum(-1), 1, atol=1e-5)


def test_bad_model_dirs(driver, tmp_path):
    """A missing tensor and an unsupported family are one-line errors."""
    d = tmp_path / "broken"
    t = tiny.deepseek_weights(tiny.DEEPSEEK_CONFIG)
    del t["model.layers.2.mlp.experts.5.up_proj.weight"]
    os.makedirs(d)
    (d / "config.json").write_text(json.dumps(tiny.DEEPSEEK_CONFIG))
    tiny.save_safetensors(d / "model.safetensors", {k: (v, "F32") for k, v in t.items()})
    p = subprocess.run([str(driver), str(d), "--tokens", "1,2"], capture_output=True, text=True)
    assert p.returncode == 1
    assert "missing tensor model.layers.2.mlp.experts.5.up_proj.weight" in p.stderr
    assert p.stderr.count("\n") == 1

    cfg = dict(tiny.DEEPSEEK_CONFIG, model_type="jamba")
    (d / "config.json").write_text(json.dumps(cfg))
    p = subprocess.run([str(driver), str(d), "--tokens", "1,2"], capture_output=True, text=True)
    assert p.returncode == 1 and "jamba" in p.stderr and p.stderr.count("\n") == 1, p.stderr


def test_fused_expert_layout(models, driver, tmp_path):
    """Experts stored as transformers >= 5 keeps them in memory (mlp.experts.gate_up_proj
    [J, 2I, h] and mlp.experts.down_proj [J, h, I]) give the same answers."""
    ref_dir = models("deepseek")
    ref = dict(np.load(ref_dir / "reference.npz"))
    cfg = tiny.DEEPSEEK_CONFIG
    t = tiny.deepseek_weights(cfg)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}.mlp.experts."
        if p + "0.gate_proj.weight" not in t:
            continue
        J = cfg["n_routed_experts"]
        t[p + "gate_up_proj"] = np.stack([np.concatenate(
            [t.pop(p + f"{e}.gate_proj.weight"), t.pop(p + f"{e}.up_proj.weight")]) for e in range(J)])
        t[p + "down_proj"] = np.stack([t.pop(p + f"{e}.down_proj.weight") for e in range(J)])
    d = tmp_path / "fused"
    os.makedirs(d)
    (d / "config.json").write_text(json.dumps(cfg))
    tiny.save_safetensors(d / "model.safetensors", {k: (v, "F32") for k, v in t.items()})
    logits, routes = run_driver(driver, d, ref, tmp_path)
    check(d, ref, logits, routes, "deepseek (fused experts)")


@pytest.mark.parametrize("name,changes", [
    # YaRN: without it, and with the softmax scale's mscale² left out (mscale_all_dim 0),
    # and with the cos/sin factor at 1 (mscale = mscale_all_dim)
    ("deepseek_v3_yarn", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
    ("deepseek_v3_yarn", {"rope_parameters": {
        "rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
        "original_max_position_embeddings": 8, "mscale": 1.0, "mscale_all_dim": 0}}),
    ("deepseek_v3_yarn", {"rope_parameters": {
        "rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
        "original_max_position_embeddings": 8, "mscale": 0.8, "mscale_all_dim": 0.8}}),
    # the rope dims as halves rather than adjacent pairs
    ("deepseek_v3", {"rope_interleave": False}),
])
def test_mla_settings_are_exercised(name, changes, models, driver, tmp_path):
    """Each of these settings moves the logits of the MLA references far past the
    tolerance, so test_forward_matches_reference pins it: a YaRN scale, mscale or rope
    layout computed wrongly fails there."""
    d = models(name)
    ref = dict(np.load(d / "reference.npz"))
    logits, _ = run_driver(driver, with_config(d, tmp_path / "changed", **changes), ref,
                           tmp_path)
    assert float(np.abs(logits - ref["logits"]).max()) > 100 * TOL, changes


@pytest.mark.parametrize("name,changes", [
    ("deepseek_v2", {"topk_method": "greedy"}),  # group-limited: two of four groups
    ("deepseek_v3", {"topk_group": 4}),          # noaux_tc: every group kept
])
def test_grouped_routing_is_exercised(name, changes, models, driver, tmp_path):
    """Without the group limit some token picks other experts, so the references' top-k
    (read from transformers' gates) pins the grouping."""
    d = models(name)
    ref = dict(np.load(d / "reference.npz"))
    _, routes = run_driver(driver, with_config(d, tmp_path / "changed", **changes), ref,
                           tmp_path)
    ours = np.asarray(routes["experts"])
    assert (ours != ref["experts"]).any(), changes


def test_mla_not_refused_by_cuda(models, driver):
    """DeepSeek-V2/V3 (multi-head latent attention, grouped routing): the CUDA backend has every
    op of the family now (compiled, not yet run on a GPU: docs/gpu.md), so a session there is
    no longer refused for the family: with a device it runs, without one it fails in one line
    for want of the backend, nothing else."""
    d = models("deepseek_v2_lite")
    p = subprocess.run([str(driver), str(d), "--tokens", "1,2", "--session-backend", "cuda"],
                       capture_output=True, text=True, timeout=120)
    if p.returncode == 0:  # a device: the CUDA backend ran it (tests/gpu compares the result)
        return
    assert p.returncode == 1, p.stderr
    assert p.stderr.count("\n") == 1, p.stderr
    assert "CUDA backend unavailable" in p.stderr, p.stderr


def test_phimoe_not_refused_by_cuda(models, driver):
    """Phi-3.5-MoE (LayerNorm with bias, sparsemixer): the CUDA backend has every op of the family
    now (compiled, not yet run on a GPU: docs/gpu.md), so a session there is no longer refused
    for the family: with a device it runs, without one it fails in one line for want of the
    backend, nothing else."""
    d = models("phimoe")
    p = subprocess.run([str(driver), str(d), "--tokens", "1,2", "--session-backend", "cuda"],
                       capture_output=True, text=True, timeout=120)
    if p.returncode == 0:  # a device: the CUDA backend ran it (tests/gpu compares the result)
        return
    assert p.returncode == 1, p.stderr
    assert p.stderr.count("\n") == 1, p.stderr
    assert "CUDA backend unavailable" in p.stderr, p.stderr


@pytest.mark.parametrize("jitter", [0.01, 10.0])
def test_phimoe_threshold_is_exercised(jitter, models, driver, tmp_path):
    """The phimoe reference (router_jitter_noise 0.3) pins sparsemixer's threshold: with
    another jitter the first layer's chosen experts (the top 2 of the logits) stay the same
    and the logits move far past the tolerance, so a threshold that masked too much or too
    little fails test_forward_matches_reference."""
    d = models("phimoe")
    ref = dict(np.load(d / "reference.npz"))
    other = with_config(d, tmp_path / "other", router_jitter_noise=jitter)
    logits, routes = run_driver(driver, other, ref, tmp_path)
    n = len(ref["tokens"])  # the first layer's choices on the prompt: same inputs
    assert np.array_equal(np.asarray(routes["experts"])[:n, 0], ref["experts"][:n, 0])
    assert np.abs(logits - ref["logits"]).max() > 100 * TOL


@pytest.mark.parametrize("side", ["long", "short"])
def test_phimoe_longrope(side, models, driver, tmp_path):
    """longrope: prefill in chunks of 5 below the switch matches; with the
    mscales swapped the logits move far past the tolerance; on the _long model a
    token-by-token prompt crosses original_max_position_embeddings with positions cached
    below it, which transformers answers by recomputing the cache and fmoe refuses in one
    line."""
    name = f"phimoe_longrope_{side}"
    d = models(name)
    ref = dict(np.load(d / "reference.npz"))
    if side == "short":  # on _long, chunks of 5 are calls that cross the switch
        logits, routes = run_driver(driver, d, ref, tmp_path, "--batch", "5")
        check(d, ref, logits, routes, f"{name} --batch 5")
    cfg = json.loads((d / "config.json").read_text())
    rp = dict(cfg["rope_parameters"], short_mscale=cfg["rope_parameters"]["long_mscale"],
              long_mscale=cfg["rope_parameters"]["short_mscale"])
    swapped = with_config(d, tmp_path / "swapped", rope_parameters=rp)
    logits, _ = run_driver(driver, swapped, ref, tmp_path)
    assert np.abs(logits - ref["logits"]).max() > 100 * TOL
    if side == "long":
        toks = ",".join(map(str, ref["tokens"].tolist()))
        p = subprocess.run([str(driver), str(d), "--tokens", toks, "--stepwise"],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 1, p.stderr
        assert p.stderr.count("\n") == 1 and "original_max_position_embeddings" in p.stderr, \
            p.stderr


@pytest.mark.parametrize("tensor,what", [
    # kv_b_proj[0][3] is head 0's key row 0, column 3: row 3 of its split k_b [H][r][dn]
    ("model.layers.1.self_attn.kv_b_proj.weight", "layer 1 kv_b projection's keys (k_b)"),
    ("model.layers.2.self_attn.q_a_proj.weight", "layer 2 q_a projection"),
    ("model.layers.1.mlp.gate.e_score_correction_bias", "layer 1 router bias"),
])
def test_mla_weights_checked_finite_at_load(tensor, what, models, driver, tmp_path):
    """The MLA projections and V3's router bias are resident weights: a NaN in one is
    refused at load, naming it, like the other families' attention weights."""
    from test_quantize import read_checkpoint
    src = models("deepseek_v3")
    ck = read_checkpoint(src)
    a, dt = ck[tensor]
    a = a.copy()
    a.reshape(-1)[3] = np.nan
    ck[tensor] = (a, dt)
    d = tmp_path / "nan"
    d.mkdir()
    (d / "config.json").write_text((src / "config.json").read_text())
    tiny.save_safetensors(d / "model.safetensors", ck)
    p = subprocess.run([str(driver), str(d), "--tokens", "1,2"], capture_output=True, text=True)
    assert p.returncode == 1, p.stderr
    assert f"{what} holds a non-finite weight" in p.stderr, p.stderr


def test_score_correction_bias_is_exercised(models, driver, tmp_path):
    """V3's e_score_correction_bias changes which experts the prompt's tokens pick (zeroed,
    they pick others), so the references' top-k pins that the bias selects."""
    from test_quantize import read_checkpoint
    src = models("deepseek_v3")
    ref = dict(np.load(src / "reference.npz"))
    ck = read_checkpoint(src)
    for k, (a, dt) in list(ck.items()):
        if k.endswith("e_score_correction_bias"):
            ck[k] = (np.zeros_like(a), dt)
    d = tmp_path / "nobias"
    d.mkdir()
    (d / "config.json").write_text((src / "config.json").read_text())
    tiny.save_safetensors(d / "model.safetensors", ck)
    _, routes = run_driver(driver, d, ref, tmp_path)
    n = len(ref["tokens"])
    assert (np.asarray(routes["experts"])[:n] != ref["experts"][:n]).any()


def test_gpt_oss_not_refused_by_cuda(models, driver):
    """gpt-oss (attention sinks, clamped SwiGLU, MXFP4 experts): the CUDA backend has every op of
    the family now (compiled, not yet run on a GPU: docs/gpu.md), so a session there is no
    longer refused for the family: with a device it runs, without one it fails in one line for
    want of the backend, nothing else."""
    d = models("gpt_oss")
    p = subprocess.run([str(driver), str(d), "--tokens", "1,2", "--session-backend", "cuda"],
                       capture_output=True, text=True, timeout=120)
    if p.returncode == 0:  # a device: the CUDA backend ran it (tests/gpu compares the result)
        return
    assert p.returncode == 1, p.stderr
    assert p.stderr.count("\n") == 1, p.stderr
    assert "CUDA backend unavailable" in p.stderr, p.stderr


@pytest.mark.parametrize("change", ["limit", "window", "yarn", "sinks"])
def test_gpt_oss_features_are_exercised(change, models, driver, tmp_path):
    """Each gpt-oss detail moves the logits far past the tolerance when changed, so the
    reference pins it: the clamp (swiglu_limit 1.5 -> 7), the window (4 -> 5: the first 4
    positions see their whole prefix either way and still match), YaRN's factor (4 -> 2)
    and the sinks (set to -1e4: no sink)."""
    d = models("gpt_oss")
    ref = dict(np.load(d / "reference.npz"))
    if change == "sinks":
        other = tmp_path / "nosink"
        os.makedirs(other)
        for f in os.listdir(d):
            if f != "model.safetensors":
                os.symlink(d / f, other / f)
        path = d / "model.safetensors"
        header = tiny._read_safetensors_header(path)
        header.pop("__metadata__", None)
        start = 8 + int.from_bytes(path.read_bytes()[:8], "little")
        raw = path.read_bytes()
        tensors = {}
        for k, v in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            a, b = v["data_offsets"]
            x = np.frombuffer(raw[start + a:start + b], dtype="<f4").reshape(v["shape"])
            tensors[k] = (np.full_like(x, -1e4) if k.endswith("sinks") else x, "F32")
        tiny.save_safetensors(other / "model.safetensors", tensors)
    else:
        cfg = json.loads((d / "config.json").read_text())
        rope = dict(cfg["rope_parameters"], factor=2.0)
        changes = {"limit": {"swiglu_limit": 7.0}, "window": {"sliding_window": 5},
                   "yarn": {"rope_parameters": rope}}[change]
        other = with_config(d, tmp_path / "other", **changes)
    logits, _ = run_driver(driver, other, ref, tmp_path)
    diff = np.abs(logits - ref["logits"]).max(-1)
    if change == "window":
        assert (diff[:4] <= TOL).all(), diff.tolist()
        assert (diff[4:] > 100 * TOL).all(), diff.tolist()
    else:
        assert diff.max() > 100 * TOL, diff.tolist()


def test_gpt_oss_mxfp4_with_8bit_activations(models, driver, tmp_path):
    """The MXFP4 experts against inputs quantised to 8 bits (Q8_0 blocks, the CPU's default
    for quantized weights): the logits stay within a few percent of the f32-input run that
    matches transformers (test_forward_matches_reference), and move (the q8 kernel ran)."""
    d = models("gpt_oss_mxfp4")
    ref = dict(np.load(d / "reference.npz"))
    logits, _ = run_driver(driver, d, ref, tmp_path, "--activations", "q8")
    dd = np.abs(logits - ref["logits"])
    rms, worst = float(np.sqrt((dd ** 2).mean()) / ref["logits"].std()), \
        float(dd.max() / ref["logits"].std())
    print(f"gpt_oss_mxfp4 activations q8: |diff| / std: RMS {rms:.4f}, max {worst:.4f}")
    assert 0 < rms < 0.05 and worst < 0.3, (rms, worst)
