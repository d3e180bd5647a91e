"""The CPU forward pass with 8-bit inputs for quantized weights (FMOE_Q8_ACTIVATIONS=1:
fmoe/quant_act.h through runtime/cpu/quant_matvec.c, docs/quantization.md), on fmoe-tiny
quantized by `fmoe quantize`, against the same file run with f32 inputs (the default, which
test_gguf_model.py pins to the file's f32 dequantisation):

- the variable really switches the path: the logits move, by more than rounding;
- they move by a bounded part of the logits' spread, and the top-1 token stays the same
  at (nearly) every position: quantising an input moves each value by at most half an
  8-bit step of its block, which through 6 layers measured 0.6-3.0% RMS of the spread and
  3-46% at the worst logit over four token draws of Q8_0 and Q4_K (the worst where a
  routed expert flipped; 0.7-0.8% and 4-9% for the draw used here), with top-1 agreement
  0.96-1.0 (bounds: 4%, 60%, 0.9); a wrong scale, sum or sign moves the logits by the
  order of the spread itself;
- the result does not depend on the thread count: each output is one row's dot on one
  thread, and the integer dots give an input the same bits whatever else is in its pass.
"""
import os
import subprocess

import numpy as np
import pytest

from conftest import REPO, run_fmoe

TINY = REPO / "datasets" / "fmoe-tiny"
RMS_TOL = 0.04
MAX_TOL = 0.60


@pytest.fixture(scope="module")
def files(fmoe_bin, tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-quant")
    out = {}
    for qtype in ("q8_0", "q4_k"):
        out[qtype] = d / f"tiny-{qtype}.gguf"
        run_fmoe(fmoe_bin, "quantize", "--type", qtype, TINY, "-o", out[qtype], "--quiet")
    return out


def run(build_dir, model, tokens, tmp_path, tag, act8, *extra):
    exe = build_dir / "tests" / "model" / "forward_driver"
    logits = tmp_path / f"{tag}.f32"
    env = dict(os.environ)
    env.pop("FMOE_Q8_ACTIVATIONS", None)
    if act8:
        env["FMOE_Q8_ACTIVATIONS"] = "1"
    p = subprocess.run([str(exe), str(model), "--tokens", ",".join(map(str, tokens)),
                        "--logits", str(logits), *map(str, extra)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    return np.fromfile(logits, dtype="<f4").reshape(len(tokens), -1)


@pytest.mark.parametrize("qtype", ["q8_0", "q4_k"])
def test_8bit_inputs_close_to_f32_inputs(build_dir, files, tmp_path, qtype):
    tokens = [int(x) for x in np.random.default_rng(11).integers(3, 4096, 24)]
    f32 = run(build_dir, files[qtype], tokens, tmp_path, "f32", False)
    a8 = run(build_dir, files[qtype], tokens, tmp_path, "a8", True)
    d = np.abs(a8 - f32)
    spread = f32.std()
    rms, worst = float(np.sqrt((d ** 2).mean()) / spread), float(d.max() / spread)
    top1 = float((a8.argmax(axis=1) == f32.argmax(axis=1)).mean())
    print(f"\n{qtype}: 8-bit vs f32 inputs, |diff| / std: RMS {rms:.4f}, max {worst:.4f}; "
          f"top-1 agreement {top1:.3f}")
    assert float(d.max()) > 1e-3  # the variable switched the path (f32 rounding is ~1e-5)
    assert rms < RMS_TOL and worst < MAX_TOL
    assert top1 >= 0.9


def test_8bit_inputs_same_bits_any_threads(build_dir, files, tmp_path):
    tokens = [int(x) for x in np.random.default_rng(12).integers(3, 4096, 12)]
    one = run(build_dir, files["q4_k"], tokens, tmp_path, "t1", True, "--threads", 1)
    two = run(build_dir, files["q4_k"], tokens, tmp_path, "t2", True, "--threads", 2)
    assert np.array_equal(one, two)
