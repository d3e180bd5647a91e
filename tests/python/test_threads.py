"""The CPU backend's results do not depend on its thread count, nor on whether a MoE layer's
experts run fused (runtime/cpu/cpu_experts.c: two pool jobs per layer) or one by one.

Quantized GGUF files of the tiny DeepSeek-V2 (MLA, a shared expert) and gpt-oss (expert
biases, clamped SwiGLU, MXFP4 experts) checkpoints run through the forward driver with
FMOE_CPU_MIN_WORK=0, so that even these small products are split over the pool's
threads, at 1, 2 and 3 threads, with 8-bit and with f32 activations; a run with
FMOE_CPU_UNFUSED=1 takes the per-expert loop (the path the live executors take, which
test_forward.py and test_quantize_families.py check against transformers). Every run's
logits must equal that one's bit for bit, and so must the experts, weights and tokens.
The 4-token prompt goes in one pass: four rows, the most the fused path takes with f32
inputs, so an expert chosen by every token widens its rows (the f32 path's 4-input kernel).
The 12-token prompt is a prefill pass of 12 rows, which with 8-bit inputs the fused path
takes too (q, k and v in one job as well), and with f32 inputs the loop at every count.
"""
import json
import os
import subprocess

import numpy as np
import pytest

import make_tiny_models as tiny
from conftest import run_fmoe

PROMPTS = {"decode": "11,12,13,14", "prefill": "11,12,13,14,15,16,17,18,19,20,21,22"}
# (checkpoint, quantize arguments): Q8_0 everywhere (hidden 64: whole 32-value blocks),
# gpt-oss's experts in MXFP4
MODELS = {"deepseek_v2": ("deepseek_v2", ["--type", "q8_0"]),
          "gpt_oss": ("gpt_oss", ["--type", "q8_0", "--experts-type", "mxfp4"])}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny.maker(tmp_path_factory.mktemp("tiny-threads"))


def run(driver, model, tmp_path, tag, threads, activations, tokens, fused=True):
    env = dict(os.environ, FMOE_CPU_MIN_WORK="0")
    env.pop("FMOE_CPU_UNFUSED", None)
    if not fused:
        env["FMOE_CPU_UNFUSED"] = "1"
    logits, routes = tmp_path / f"{tag}.f32", tmp_path / f"{tag}.json"
    p = subprocess.run([str(driver), str(model), "--tokens", tokens, "--generate", "3",
                        "--batch", str(tokens.count(",") + 1), "--threads", str(threads),
                        "--activations",
                        activations, "--logits", str(logits), "--routes", str(routes)],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    return np.fromfile(logits, dtype="<f4"), json.loads(routes.read_text())


@pytest.mark.parametrize("prompt", sorted(PROMPTS))
@pytest.mark.parametrize("activations", ["q8", "f32"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_same_bits_at_any_thread_count_fused_or_not(name, activations, prompt, models, driver,
                                                    fmoe_bin, tmp_path):
    src, args = MODELS[name]
    gguf = tmp_path / f"{name}.gguf"
    run_fmoe(fmoe_bin, "quantize", *args, models(src), "-o", gguf, "--quiet")
    tokens = PROMPTS[prompt]
    want_logits, want_routes = run(driver, gguf, tmp_path, "loop", 1, activations, tokens,
                                   fused=False)
    assert np.isfinite(want_logits).all() and want_logits.size > 0
    for threads in (1, 2, 3):
        logits, routes = run(driver, gguf, tmp_path, f"t{threads}", threads, activations,
                             tokens)
        diff = np.abs(logits - want_logits).max()
        assert np.array_equal(logits, want_logits), f"{threads} threads: max |diff| {diff}"
        for k in ("prompt", "generated", "experts", "weights"):
            assert routes[k] == want_routes[k], (threads, k)
