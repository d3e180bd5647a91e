"""`--backend cpu|cuda|auto` of generate, record, serve and calibrate (cmd/backend_cli.c).

The value is resolved once, before anything is loaded: an unknown name is a usage error
(exit 2, one line naming it), cuda where it cannot run a failure (exit 1, one line saying
why: no device, built without CUDA, module not found), never a silent fall back to the
CPU. A command that runs says in one line on stderr where it computes ("fmoe generate:
backend cpu, activations q8": the default --activations, auto, is q8 on the cpu and f32,
unsaid, on cuda; "fmoe record: backend cuda (NVIDIA H100 80GB HBM3)") unless its --json or
--quiet keeps stderr clean; record writes it to the trace's recorded_on ("cpu",
"cuda:<device>").

The same tests hold on a machine with a CUDA device: there the "cuda unavailable" checks
are skipped, auto is expected to choose cuda, and cuda is expected to run
(conftest.cuda_devices reads `fmoe --version`; FMOE_TEST_CUDA_DEVICES overrides it).
"""
import json
import pathlib
import re
import signal
import subprocess
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
TINY = REPO / "datasets" / "fmoe-tiny"
PROMPTS = REPO / "datasets" / "samples" / "prompts_100.txt"
COMMANDS = ["generate", "record", "serve", "calibrate"]

# a valid command line of each command, but for --backend
ARGS = {
    "generate": ["--model", TINY, "--prompt", "Hello", "--max-new-tokens", "3", "--threads",
                 "1"],
    "record": ["--model", TINY, "--dataset", PROMPTS, "--max-requests", "2",
               "--max-new-tokens", "2", "--threads", "1", "-o", "r.h5"],
    "serve": ["--model", TINY, "--port", "0"],
    "calibrate": ["--quick", "-o", "profile.json"],
}

# what a line refusing cuda says, in the loader's words (runtime/cuda/cuda_loader.c)
UNAVAILABLE = re.compile(r"no CUDA device|without CUDA|not found|cannot open|not loadable|"
                         r"unavailable")


def run(fmoe_bin, *args, cwd=None, timeout=300):
    return subprocess.run([str(fmoe_bin), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def backend_lines(stderr, cmd):
    return [l for l in stderr.splitlines() if l.startswith(f"fmoe {cmd}: backend ")]


def expected_line(cmd, kind):
    """The backend line of a run on `kind` with the default --activations: exactly
    "fmoe CMD: backend cpu, activations q8"; on cuda the device's name follows in
    parentheses, and nothing of the activations (auto is f32 there)."""
    return (re.compile(rf"fmoe {cmd}: backend cuda( \(.+\))?$") if kind == "cuda"
            else re.compile(rf"fmoe {cmd}: backend cpu, activations q8$"))


@pytest.mark.parametrize("cmd", COMMANDS)
def test_help_lists_backend(fmoe, cmd):
    out = fmoe(cmd, "--help").stdout
    assert "--backend cpu|cuda|auto" in out and "(default auto)" in out, out


@pytest.mark.parametrize("cmd", COMMANDS)
def test_unknown_backend_is_a_usage_error(fmoe_bin, tmp_path, cmd):
    p = run(fmoe_bin, cmd, *ARGS[cmd], "--backend", "bogus", cwd=tmp_path)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert p.stdout == "" and len(lines) == 1, p.stderr
    assert "--backend" in lines[0] and "'bogus'" in lines[0], lines[0]
    assert "cpu, cuda or auto" in lines[0], lines[0]
    assert list(tmp_path.iterdir()) == []  # nothing written, nothing loaded


@pytest.mark.parametrize("cmd", COMMANDS)
def test_cuda_unavailable_is_one_line(fmoe_bin, tmp_path, have_cuda_device, cmd):
    if have_cuda_device:
        pytest.skip("a CUDA device is present: --backend cuda runs here")
    p = run(fmoe_bin, cmd, *ARGS[cmd], "--backend", "cuda", cwd=tmp_path)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert p.stdout == "" and len(lines) == 1, p.stderr
    assert lines[0].startswith(f"fmoe {cmd}: --backend cuda: "), lines[0]
    assert UNAVAILABLE.search(lines[0]), lines[0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("backend", ["cpu", "auto", "cuda"])
def test_generate_says_its_backend(fmoe_bin, have_cuda_device, backend):
    if backend == "cuda" and not have_cuda_device:
        pytest.skip("no CUDA device")
    p = run(fmoe_bin, "generate", *ARGS["generate"], "--backend", backend)
    assert p.returncode == 0, p.stderr
    kind = "cuda" if backend == "cuda" or (backend == "auto" and have_cuda_device) else "cpu"
    lines = backend_lines(p.stderr, "generate")
    assert len(lines) == 1 and expected_line("generate", kind).match(lines[0]), p.stderr
    assert p.stderr.splitlines()[0] == lines[0]  # said before the figures
    assert p.stdout.strip(), "no text generated"


def test_generate_default_is_auto(fmoe_bin, have_cuda_device):
    p = run(fmoe_bin, "generate", *ARGS["generate"])
    assert p.returncode == 0, p.stderr
    lines = backend_lines(p.stderr, "generate")
    kind = "cuda" if have_cuda_device else "cpu"
    assert len(lines) == 1 and expected_line("generate", kind).match(lines[0]), p.stderr


def test_generate_json_keeps_stderr_clean(fmoe_bin):
    p = run(fmoe_bin, "generate", *ARGS["generate"], "--backend", "cpu", "--json")
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""
    doc = json.loads(p.stdout)
    assert doc["backend"] == "cpu" and "device" not in doc


def test_generate_cpu_matches_the_default_cpu_run(fmoe_bin, have_cuda_device):
    """--backend cpu is the session's default backend: the same ids as a run without the
    option on a machine without a device."""
    if have_cuda_device:
        pytest.skip("auto chooses cuda here")
    a = json.loads(run(fmoe_bin, "generate", *ARGS["generate"], "--json").stdout)
    b = json.loads(run(fmoe_bin, "generate", *ARGS["generate"], "--json", "--backend",
                       "cpu").stdout)
    assert a["generated_ids"] == b["generated_ids"]


def test_generate_offloaded_on_cpu(fmoe_bin):
    """The executor's slots follow the session's backend (fmoe_offload_options.backend)."""
    p = run(fmoe_bin, "generate", *ARGS["generate"], "--backend", "cpu", "--cache-experts",
            "12")
    assert p.returncode == 0, p.stderr
    assert backend_lines(p.stderr, "generate") == ["fmoe generate: backend cpu, activations q8"]
    assert "offload 12 slots" in p.stderr


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_record_writes_recorded_on(fmoe_bin, tmp_path, have_cuda_device, backend):
    h5py = pytest.importorskip("h5py")  # root attributes: no filter needed
    if backend == "cuda" and not have_cuda_device:
        pytest.skip("no CUDA device")
    p = run(fmoe_bin, "record", *ARGS["record"], "--backend", backend, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    lines = backend_lines(p.stderr, "record")
    assert len(lines) == 1 and expected_line("record", backend).match(lines[0]), p.stderr
    with h5py.File(tmp_path / "r.h5", "r") as f:
        on = f.attrs["recorded_on"]
        on = on.decode() if isinstance(on, bytes) else on
    if backend == "cpu":
        assert on == "cpu"
    else:
        m = re.match(r"fmoe record: backend cuda \((.+)\)$", lines[0])
        assert on == (f"cuda:{m.group(1)}" if m else "cuda"), (on, lines[0])


def test_record_quiet_says_nothing(fmoe_bin, tmp_path):
    p = run(fmoe_bin, "record", *ARGS["record"], "--backend", "cpu", "--quiet", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""


def test_serve_says_and_lists_its_backend(fmoe_bin, tmp_path):
    port_file = tmp_path / "port"
    proc = subprocess.Popen([str(fmoe_bin), "serve", "--model", str(TINY), "--port", "0",
                             "--port-file", str(port_file), "--backend", "cpu", "--threads",
                             "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        import http.client
        deadline = time.monotonic() + 60
        models = None
        while time.monotonic() < deadline and models is None:
            assert proc.poll() is None, proc.stderr.read()
            if port_file.exists() and port_file.read_text().strip():
                c = http.client.HTTPConnection("127.0.0.1", int(port_file.read_text()),
                                               timeout=10)
                try:
                    c.request("GET", "/health")
                    if c.getresponse().status == 200:
                        c.close()
                        c = http.client.HTTPConnection("127.0.0.1",
                                                       int(port_file.read_text()), timeout=10)
                        c.request("GET", "/v1/models")
                        r = c.getresponse()
                        assert r.status == 200
                        models = json.loads(r.read())
                except (ConnectionError, OSError):
                    pass
                finally:
                    c.close()
            time.sleep(0.05)
        assert models is not None, "fmoe serve did not become ready"
        assert models["data"][0]["backend"] == "cpu"
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
    err = proc.stderr.read()
    assert rc == 0, err
    assert backend_lines(err, "serve") == ["fmoe serve: backend cpu, activations q8"], err


def test_calibrate_cpu_profile(fmoe_bin, tmp_path):
    """cpu: no GPU measured, the CPU's figures are the profile's compute, file->RAM its
    link (what a machine without a device gets, as before --backend)."""
    p = run(fmoe_bin, "calibrate", *ARGS["calibrate"], "--backend", "cpu", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert backend_lines(p.stderr, "calibrate") == ["fmoe calibrate: backend cpu, activations q8"]
    prof = json.loads((tmp_path / "profile.json").read_text())
    cal = prof["calibration"]
    assert cal["backend"] == "cpu" and cal["link_used"] == "file"
    assert "h2d" not in cal["links"] and "expert_gpu" not in cal["compute"]
    assert "fmoe cpu kernels" in prof["source"]


def test_calibrate_cuda_profile(fmoe_bin, tmp_path, have_cuda_device):
    if not have_cuda_device:
        pytest.skip("no CUDA device")
    p = run(fmoe_bin, "calibrate", *ARGS["calibrate"], "--backend", "cuda", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    lines = backend_lines(p.stderr, "calibrate")
    assert len(lines) == 1 and expected_line("calibrate", "cuda").match(lines[0]), p.stderr
    cal = json.loads((tmp_path / "profile.json").read_text())["calibration"]
    assert cal["backend"] == "cuda" and cal["link_used"] == "h2d"
    assert "expert_gpu" in cal["compute"] and "h2d" in cal["links"]


def test_calibrate_quiet_says_nothing(fmoe_bin, tmp_path):
    p = run(fmoe_bin, "calibrate", *ARGS["calibrate"], "--backend", "cpu", "--quiet",
            cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""


def test_calibrate_h2d_link_needs_cuda_backend(fmoe_bin, tmp_path):
    p = run(fmoe_bin, "calibrate", *ARGS["calibrate"], "--backend", "cpu", "--link", "h2d",
            cwd=tmp_path)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and p.stdout == "", p.stderr
    assert "--link h2d" in lines[0] and "--backend cpu" in lines[0]


def test_forward_driver_backend(build_dir, tmp_path, have_cuda_device):
    exe = build_dir / "tests" / "model" / "forward_driver"
    if not exe.exists():
        pytest.fail(f"{exe} not built")
    base = [str(exe), str(TINY), "--tokens", "1,2,3,4"]
    p = subprocess.run(base + ["--backend", "bogus"], capture_output=True, text=True)
    assert p.returncode == 2 and "bogus" in p.stderr, p.stderr
    if not have_cuda_device:
        p = subprocess.run(base + ["--backend", "cuda"], capture_output=True, text=True)
        assert p.returncode == 2 and UNAVAILABLE.search(p.stderr), p.stderr
    a, b = tmp_path / "a.f32", tmp_path / "b.f32"
    subprocess.run(base + ["--logits", str(a)], check=True)
    subprocess.run(base + ["--logits", str(b), "--backend", "cpu"], check=True)
    assert a.read_bytes() == b.read_bytes()
