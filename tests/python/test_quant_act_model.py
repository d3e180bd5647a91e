"""The CPU forward pass with 8-bit inputs for quantized weights (`--activations q8`:
fmoe/quant_act.h through runtime/cpu/quant_matvec.c, docs/quantization.md), on fmoe-tiny
quantized by `fmoe quantize`, against the same file run with f32 inputs (the library's
default and the commands' `--activations f32`, which test_gguf_model.py pins to the file's
f32 dequantisation):

- the option really switches the path: the logits move, by more than rounding;
- they move by a bounded part of the logits' spread, and the top-1 token stays the same
  at (nearly) every position: quantising an input moves each value by at most half an
  8-bit step of its block, which through 6 layers measured 0.6-3.0% RMS of the spread and
  3-46% at the worst logit over four token draws of Q8_0 and Q4_K (the worst where a
  routed expert flipped; 0.7-0.8% and 4-9% for the draw used here), with top-1 agreement
  0.96-1.0 (bounds: 4%, 60%, 0.9); a wrong scale, sum or sign moves the logits by the
  order of the spread itself;
- the result does not depend on the thread count: each output is one row's dot on one
  thread, and the integer dots give an input the same bits whatever else is in its pass;
- the commands: `fmoe generate --activations q8` moves a Q8_0 model's logits within the
  same bounds and leaves a bf16 checkpoint's bits alone (its weights never take the block
  kernels); a value other than auto, f32 or q8 is a one-line usage error (exit 2) of
  every command that has the option; q8 on the CUDA backend is refused, not ignored;
  `record` and `serve --trace-out` write the choice as the trace's `activations` attribute
  (read back with h5py), which a reader may find absent but not wrong; `calibrate` times
  the 8-bit path when asked and says so in its profile;
- the commands' default, auto, is q8 on the cpu backend (llama.cpp's inputs, and speed):
  a Q8_0 file's logits are bit for bit explicit q8's and a bf16 checkpoint's explicit
  f32's, and everything that reports the setting says the resolved value, never "auto";
  on the cuda backend auto is f32, without a word.
"""
import json
import subprocess

import numpy as np
import pytest

from conftest import REPO, run_fmoe

TINY = REPO / "datasets" / "fmoe-tiny"
PROMPTS = REPO / "datasets" / "samples" / "prompts_100.txt"
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
    p = subprocess.run([str(exe), str(model), "--tokens", ",".join(map(str, tokens)),
                        "--logits", str(logits), "--activations", "q8" if act8 else "f32",
                        *map(str, extra)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return np.fromfile(logits, dtype="<f4").reshape(len(tokens), -1)


def moved(f32, a8):
    """|a8 - f32| as parts of f32's spread: RMS and worst; and the top-1 agreement."""
    d = np.abs(a8 - f32)
    spread = f32.std()
    top1 = float((a8.argmax(axis=-1) == f32.argmax(axis=-1)).mean())
    return float(np.sqrt((d ** 2).mean()) / spread), float(d.max() / spread), top1


@pytest.mark.parametrize("qtype", ["q8_0", "q4_k"])
def test_8bit_inputs_close_to_f32_inputs(build_dir, files, tmp_path, qtype):
    tokens = [int(x) for x in np.random.default_rng(11).integers(3, 4096, 24)]
    f32 = run(build_dir, files[qtype], tokens, tmp_path, "f32", False)
    a8 = run(build_dir, files[qtype], tokens, tmp_path, "a8", True)
    rms, worst, top1 = moved(f32, a8)
    print(f"\n{qtype}: 8-bit vs f32 inputs, |diff| / std: RMS {rms:.4f}, max {worst:.4f}; "
          f"top-1 agreement {top1:.3f}")
    assert float(np.abs(a8 - f32).max()) > 1e-3  # the option switched the path (f32 rounding is ~1e-5)
    assert rms < RMS_TOL and worst < MAX_TOL
    assert top1 >= 0.9


def test_8bit_inputs_same_bits_any_threads(build_dir, files, tmp_path):
    tokens = [int(x) for x in np.random.default_rng(12).integers(3, 4096, 12)]
    one = run(build_dir, files["q4_k"], tokens, tmp_path, "t1", True, "--threads", 1)
    two = run(build_dir, files["q4_k"], tokens, tmp_path, "t2", True, "--threads", 2)
    assert np.array_equal(one, two)


def generate(fmoe_bin, model, tmp_path, act, resolved=None):
    """Greedy `fmoe generate --json --dump-logits` with --activations act (None: the
    default), which --json must report as `resolved` (default: act): (ids, logits)."""
    npy = tmp_path / f"gen-{model.stem}-{act}.npy"
    p = run_fmoe(fmoe_bin, "generate", "--model", model, "--prompt",
                 "Once upon a time", "--max-new-tokens", "8", "--ignore-eos",
                 "--temperature", "0", "--threads", "2", "--backend", "cpu", "--json",
                 *(["--activations", act] if act else []), "--dump-logits", npy)
    doc = json.loads(p.stdout)
    assert doc["activations"] == (resolved or act)
    return doc["generated_ids"], np.load(npy)


def test_generate_activations_q8_moves_quantized_weights_only(fmoe_bin, files, tmp_path):
    """The option through the command to the backend. This prompt measured 0.3-0.6% RMS and
    1-2% worst per row (no expert flipped; "The quick brown fox jumps over" flipped one at
    its fourth token: 6% and 30% on that row), under the bounds of the module's draw."""
    ids32, f32 = generate(fmoe_bin, files["q8_0"], tmp_path, "f32")
    ids8, a8 = generate(fmoe_bin, files["q8_0"], tmp_path, "q8")
    # row i was drawn after the tokens generated before it: comparable while those agree
    same = next((i for i, (a, b) in enumerate(zip(ids32, ids8)) if a != b), len(ids32))
    rows = min(same + 1, len(f32))
    rms, worst, _ = moved(f32[:rows], a8[:rows])
    print(f"\nq8_0 through generate, {rows} rows: RMS {rms:.4f}, max {worst:.4f}")
    assert float(np.abs(a8[:rows] - f32[:rows]).max()) > 1e-3  # the option reached the backend
    assert rms < RMS_TOL and worst < MAX_TOL
    # bf16 weights take their own kernels: the same bits, whatever the option says
    ids_b32, b32 = generate(fmoe_bin, TINY, tmp_path, "f32")
    ids_b8, b8 = generate(fmoe_bin, TINY, tmp_path, "q8")
    assert ids_b32 == ids_b8
    assert b32.tobytes() == b8.tobytes()


def test_generate_says_q8_on_its_backend_line(fmoe_bin, files):
    for act in (["--activations", "q8"], []):  # explicit, and auto resolved on the cpu
        p = run_fmoe(fmoe_bin, "generate", "--model", files["q8_0"], "--prompt", "Hi",
                     "--max-new-tokens", "2", "--threads", "1", "--backend", "cpu", *act)
        assert "fmoe generate: backend cpu, activations q8" in p.stderr.splitlines(), act
    p = run_fmoe(fmoe_bin, "generate", "--model", files["q8_0"], "--prompt", "Hi",
                 "--max-new-tokens", "2", "--threads", "1", "--backend", "cpu",
                 "--activations", "f32")
    assert "fmoe generate: backend cpu" in p.stderr.splitlines()


def test_default_is_q8_on_the_cpu(fmoe_bin, files, tmp_path):
    """auto, the default, is explicit q8 on a quantized file, bit for bit, and explicit f32
    on a bf16 checkpoint (whose weights never take the block kernels), bit for bit."""
    ids_auto, auto = generate(fmoe_bin, files["q8_0"], tmp_path, None, "q8")
    ids_q8, q8 = generate(fmoe_bin, files["q8_0"], tmp_path, "q8")
    assert ids_auto == ids_q8
    assert auto.tobytes() == q8.tobytes()
    _, f32 = generate(fmoe_bin, files["q8_0"], tmp_path, "f32")
    assert float(np.abs(auto - f32).max()) > 1e-3  # the default is not the f32 path
    ids_b, b_auto = generate(fmoe_bin, TINY, tmp_path, None, "q8")
    ids_b32, b32 = generate(fmoe_bin, TINY, tmp_path, "f32")
    assert ids_b == ids_b32
    assert b_auto.tobytes() == b32.tobytes()


def test_help_shows_the_default(fmoe_bin):
    for cmd in ARGS:
        lines = run_fmoe(fmoe_bin, cmd, "--help").stdout.splitlines()
        i = next(k for k, ln in enumerate(lines) if ln.lstrip().startswith("--activations"))
        j = next((k for k in range(i + 1, len(lines)) if lines[k].lstrip().startswith("-")),
                 len(lines))
        row = " ".join(" ".join(lines[i:j]).split())  # the option's row, unwrapped
        assert row.startswith("--activations auto|f32|q8"), (cmd, row[:80])
        assert "auto: q8 on the cpu backend, f32 on cuda" in row, (cmd, row)
        assert row.endswith("(default auto)"), (cmd, row)


ARGS = {
    "generate": ["--prompt", "Hello", "--max-new-tokens", "2", "--threads", "1"],
    "record": ["--dataset", PROMPTS, "--max-requests", "1", "--max-new-tokens", "1",
               "--threads", "1", "-o", "r.h5"],
    "serve": ["--port", "0"],
    "calibrate": ["--quick", "-o", "profile.json"],
}


@pytest.mark.parametrize("cmd", list(ARGS))
def test_bad_activations_value_is_a_usage_error(fmoe_bin, tmp_path, cmd):
    p = run_fmoe(fmoe_bin, cmd, *ARGS[cmd], "--activations", "q4", check=False, cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and "--activations must be auto, f32 or q8, got 'q4'" in lines[0], lines
    assert list(tmp_path.iterdir()) == []  # nothing written, not even a partial


def test_q8_on_cuda_is_refused(build_dir, fmoe_bin, files, have_cuda_device, tmp_path):
    # the session itself refuses (checked before it looks for CUDA, so on any machine)
    exe = build_dir / "tests" / "model" / "forward_driver"
    p = subprocess.run([str(exe), str(files["q8_0"]), "--tokens", "1,2,3", "--session-backend",
                        "cuda", "--activations", "q8"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 1
    assert "activations q8 is the CPU backend's" in p.stderr, p.stderr
    if have_cuda_device:  # the commands, before loading anything: a usage error
        for cmd in ARGS:
            p = run_fmoe(fmoe_bin, cmd, *ARGS[cmd], "--backend", "cuda", "--activations",
                         "q8", check=False, cwd=tmp_path)
            assert p.returncode == 2, (cmd, p.stderr)
            assert p.stderr.count("\n") == 1 and "--activations q8 needs --backend cpu" in p.stderr


def test_auto_on_cuda_is_f32(fmoe_bin, files, have_cuda_device):
    if not have_cuda_device:
        pytest.skip("no CUDA device")
    p = run_fmoe(fmoe_bin, "generate", "--model", files["q8_0"], "--prompt", "Hi",
                 "--max-new-tokens", "2", "--threads", "1", "--backend", "cuda", "--json")
    assert json.loads(p.stdout)["activations"] == "f32"
    assert "activations" not in p.stderr, p.stderr  # the backend line says nothing of it


def test_record_writes_the_activations_attribute(fmoe_bin, files, tmp_path):
    h5py = pytest.importorskip("h5py")  # root attributes: no filter needed
    got = {}
    for act in ("f32", "q8"):
        out = tmp_path / f"{act}.h5"
        p = run_fmoe(fmoe_bin, "record", "--model", files["q8_0"], "--dataset", PROMPTS,
                     "--max-requests", "2", "--max-new-tokens", "3", "--threads", "1",
                     "--backend", "cpu", "--activations", act, "-o", out)
        with h5py.File(out, "r") as f:
            v = f.attrs["activations"]
            got[act] = v.decode() if isinstance(v, bytes) else v
        assert got[act] == act
        assert json.loads(run_fmoe(fmoe_bin, "inspect", out, "--json").stdout)["activations"] == act
    # the default (auto) as it resolved on the cpu, on a quantized and a bf16 model: written,
    # so a trace never leaves it to be guessed, and never as "auto"
    for model in (files["q8_0"], TINY):
        out = tmp_path / "default.h5"
        out.unlink(missing_ok=True)
        run_fmoe(fmoe_bin, "record", "--model", model, "--dataset", PROMPTS, "--max-requests",
                 "1", "--max-new-tokens", "1", "--threads", "1", "--backend", "cpu", "-q",
                 "-o", out)
        with h5py.File(out, "r") as f:
            v = f.attrs["activations"]
            assert (v.decode() if isinstance(v, bytes) else v) == "q8", model
    # absent (a trace written before the attribute): read as not known
    with h5py.File(out, "r+") as f:
        del f.attrs["activations"]
    doc = json.loads(run_fmoe(fmoe_bin, "inspect", out, "--json").stdout)
    assert "activations" not in doc and doc["num_layers"] > 0
    # present with another value: refused in one line naming it
    with h5py.File(out, "r+") as f:
        f.attrs["activations"] = "q4"
    p = run_fmoe(fmoe_bin, "inspect", out, check=False)
    assert p.returncode == 1 and p.stderr.count("\n") == 1
    assert "activations" in p.stderr and "q4" in p.stderr, p.stderr


def test_calibrate_times_the_8bit_path_when_asked(fmoe_bin, files, tmp_path):
    prof = {}
    for act in ("f32", "q8"):
        p = run_fmoe(fmoe_bin, "calibrate", "--quick", "--quiet", "--backend", "cpu",
                     "--file-dir", tmp_path, "--model-config", files["q8_0"],
                     "--activations", act)
        prof[act] = json.loads(p.stdout)["calibration"]
        assert prof[act]["activations"] == act
    p = run_fmoe(fmoe_bin, "calibrate", "--quick", "--quiet", "--backend", "cpu",
                 "--file-dir", tmp_path, "--model-config", files["q8_0"])
    assert json.loads(p.stdout)["calibration"]["activations"] == "q8"  # auto, resolved
    assert prof["f32"]["compute"]["expert_cpu"]["what"] == "expert (fmoe cpu q8_0)"
    assert prof["q8"]["compute"]["expert_cpu"]["what"] == \
        "expert (fmoe cpu q8_0, activations q8)"


def test_serve_trace_out_records_the_activations(files, tmp_path):
    h5py = pytest.importorskip("h5py")
    from serve_util import Server

    trace = tmp_path / "served.h5"
    s = Server(tmp_path, "--model", files["q8_0"], "--parallel", 1, "--threads", 1,
               "--backend", "cpu", "--activations", "q8", "--trace-out", trace)
    try:
        s.complete("Once upon a time", max_tokens=3)
    finally:
        rc, err = s.stop()
    assert rc == 0, err
    with h5py.File(trace, "r") as f:
        v = f.attrs["activations"]
        assert (v.decode() if isinstance(v, bytes) else v) == "q8"
        assert f["requests/id"].shape[0] == 1
