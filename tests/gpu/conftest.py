"""Fixtures for the end-to-end GPU checks (test_gpu_e2e.py).

The tests run the built `fmoe` and tests/model/forward_driver with `--backend cuda` (the
"device" side) and `--backend cpu`, and compare what they produce. FMOE_BUILD_DIR names
the meson build (default <repo>/build).

FMOE_GPU_TEST_BACKEND=cpu makes the device side run `--backend cpu` instead: every
comparison is then trivially identical, and what is checked is the plumbing (flags, files,
parsing) on a machine without a GPU. Both sides always name their backend (`--backend`
defaults to auto, which is cuda where there is a device); a tool without the option is a
failure on the cuda side, and on the cpu side runs without it (before the option existed
the CPU was the only backend).

Without a CUDA device every test skips, saying why (`fmoe --version`'s cuda line). When
torch sees a device that fmoe cannot use (built without CUDA, module not loadable) the
tests fail instead: on a GPU machine that is the finding, not a reason to skip.

The tiny checkpoints come from tests/python/make_tiny_models.py, their float32 references
from the transformers fixtures in tests/fixtures/transformers/: no torch and no network.
"""
import functools
import json
import os
import pathlib
import re
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.append(str(REPO / "tests" / "python"))
import make_tiny_models as tiny  # noqa: E402

TINY = REPO / "datasets" / "fmoe-tiny"
PROMPTS = REPO / "datasets" / "samples" / "prompts_100.txt"

DEVICE = os.environ.get("FMOE_GPU_TEST_BACKEND", "cuda")


def pytest_configure(config):
    # Skip reasons matter here (no device, no torch, a flag missing): show them under -q.
    rc = getattr(config.option, "reportchars", "") or ""
    if "s" not in rc and "a" not in rc and "A" not in rc:
        config.option.reportchars = rc + "s"


def build_dir():
    return pathlib.Path(os.environ.get("FMOE_BUILD_DIR", REPO / "build")).resolve()


def _torch_device_name():
    """The name of the GPU torch sees, or None (torch missing, or no device)."""
    try:
        import torch
    except ImportError:
        return None
    try:
        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # a driver torch cannot use counts as none
        return None


def cuda_line(fmoe_bin):
    """`fmoe --version`'s "cuda: ..." line, without the prefix."""
    p = subprocess.run([str(fmoe_bin), "--version"], capture_output=True, text=True, timeout=60)
    for line in p.stdout.splitlines():
        if line.startswith("cuda:"):
            return line[len("cuda:"):].strip()
    return f"(no cuda line in fmoe --version: {p.stdout.strip()!r} {p.stderr.strip()!r})"


def device_count(line):
    m = re.search(r"(\d+) devices?\b", line)
    return int(m.group(1)) if m else 0


@pytest.fixture(scope="session")
def fmoe_bin():
    if DEVICE not in ("cuda", "cpu"):
        pytest.fail(f"FMOE_GPU_TEST_BACKEND={DEVICE!r}: cuda or cpu")
    exe = build_dir() / "cmd" / "fmoe"
    if not exe.exists():
        gpu = _torch_device_name() if DEVICE == "cuda" else None
        if DEVICE == "cuda" and gpu is None:
            pytest.skip(f"no CUDA device here (torch sees none) and no fmoe at {exe}")
        pytest.fail(f"{exe} not built: set FMOE_BUILD_DIR")
    return exe


@pytest.fixture(scope="session")
def device(fmoe_bin):
    """The device side's backend name; skips (once, cached) when it is cuda and there is no
    device."""
    if DEVICE == "cpu":
        return "cpu"
    line = cuda_line(fmoe_bin)
    if device_count(line) > 0:
        # One short run first: a device the backend cannot use (a driver older than the
        # runtime, a module that does not load) fails every test here at once, saying why.
        p = subprocess.run([str(fmoe_bin), "generate", "--backend", "cuda", "--model",
                            str(TINY), "--prompt", "x", "--max-new-tokens", "1", "--json"],
                           capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            pytest.fail(f"fmoe sees a device ('cuda: {line}') but `fmoe generate --backend "
                        f"cuda` fails: {p.stderr.strip()[-2000:]}")
        return "cuda"
    gpu = _torch_device_name()
    if gpu:
        pytest.fail(f"torch sees a CUDA device ({gpu}) but fmoe cannot use it: "
                    f"fmoe --version says 'cuda: {line}'")
    pytest.skip(f"no CUDA device: fmoe --version says 'cuda: {line}' "
                f"(FMOE_GPU_TEST_BACKEND=cpu runs the plumbing with the CPU backend)")


@pytest.fixture(autouse=True)
def _needs_device(device):
    """Every test of this folder needs the device side (or the cpu stand-in)."""


@pytest.fixture(scope="session")
def driver_bin(fmoe_bin):
    exe = build_dir() / "tests" / "model" / "forward_driver"
    if not exe.exists():
        pytest.fail(f"{exe} not built")
    return exe


@pytest.fixture(scope="session")
def plugin_dir(fmoe_bin):
    """Folder of fmoe's libh5zstd.so (FMOE_PLUGIN_DIR, else the build's trace/)."""
    return pathlib.Path(os.environ.get("FMOE_PLUGIN_DIR", build_dir() / "trace")).resolve()


# Every command here takes seconds (tiny models); a hang must cost the device run one
# minute, not ten.
COMMAND_TIMEOUT_S = 60


def run(exe, *args, check=True, timeout=COMMAND_TIMEOUT_S, env=None):
    cmd = [str(exe), *map(str, args)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{' '.join(cmd)} did not finish in {timeout} s (killed)") from None
    if check and p.returncode != 0:
        raise AssertionError(f"{pathlib.Path(str(exe)).name} {' '.join(map(str, args))} "
                             f"exited {p.returncode}:\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}")
    return p


@functools.lru_cache(maxsize=None)
def _supports_backend(exe, tool):
    if tool == "driver":
        # The driver parses every option before it loads the model: an unknown option is
        # exit 2 "unknown option", a known one reaches the missing directory.
        p = subprocess.run([exe, "/nonexistent-fmoe-model", "--tokens", "1", "--backend", "cpu"],
                           capture_output=True, text=True, timeout=60)
        return "unknown option" not in p.stderr
    p = subprocess.run([exe, tool, "--help"], capture_output=True, text=True, timeout=60)
    return "--backend" in p.stdout + p.stderr


@pytest.fixture(scope="session")
def backend_args(fmoe_bin, driver_bin):
    """backend_args(tool, kind): ["--backend", kind], tool an fmoe command or "driver". The
    cpu side omits the flag while the tool lacks it (the CPU is the default); the cuda side
    fails then."""
    def get(tool, kind):
        exe = str(driver_bin if tool == "driver" else fmoe_bin)
        if _supports_backend(exe, tool):
            return ["--backend", kind]
        if kind == "cpu":
            return []
        pytest.fail(f"{'forward_driver' if tool == 'driver' else 'fmoe ' + tool} has no "
                    f"--backend option: the CUDA backend cannot be chosen")
    return get


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """tiny_models(name) -> directory with the checkpoint and reference.npz, made once (the
    references are fixtures: no torch is needed on the device machine)."""
    return tiny.maker(tmp_path_factory.mktemp("tiny-models"))


def checkpoint_dtype(name):
    """Weight dtype of a tiny checkpoint ("float32", "bfloat16", "float16")."""
    return tiny.HF_MODELS[name][2] if name in tiny.HF_MODELS else "float32"


@pytest.fixture(scope="session")
def driver_runs(driver_bin, backend_args, tmp_path_factory):
    """driver_runs(model_dir, tokens, generate, backend) -> dict(logits [n][V] float32,
    experts [T][L][K], probs [T][L][J], generated [G]), cached per arguments."""
    root = tmp_path_factory.mktemp("driver")
    cache = {}

    def get(model_dir, tokens, generate, backend):
        key = (str(model_dir), tuple(int(t) for t in tokens), int(generate), backend)
        if key not in cache:
            out = root / f"run{len(cache)}"
            out.mkdir()
            run(driver_bin, model_dir, "--tokens", ",".join(map(str, key[1])), "--generate",
                generate, "--logits", out / "logits.f32", "--routes", out / "routes.json",
                *backend_args("driver", backend))
            routes = json.loads((out / "routes.json").read_text())
            logits = np.fromfile(out / "logits.f32", dtype="<f4").reshape(len(key[1]), -1)
            cache[key] = {"logits": logits,
                          "experts": np.asarray(routes["experts"], dtype=np.int64),
                          "probs": np.asarray(routes["probs"], dtype=np.float64),
                          "generated": np.asarray(routes["generated"], dtype=np.int64)}
        return cache[key]
    return get


@pytest.fixture(scope="session")
def tokenize(fmoe_bin):
    @functools.lru_cache(maxsize=None)
    def ids(text, model=str(TINY)):
        p = run(fmoe_bin, "tokenize", "--tokenizer", model, "--text", text, "--json")
        return tuple(json.loads(p.stdout)["ids"])
    return ids


def prompt_lines():
    return PROMPTS.read_text().splitlines()


def h5_open(path, plugin_dir):
    """h5py.File for a trace; zstd through hdf5plugin when installed, else fmoe's own plugin
    (H5PLprepend of the build's trace/ folder). Skips when h5py is missing."""
    h5py = pytest.importorskip("h5py")
    try:
        import hdf5plugin  # noqa: F401
    except ImportError:
        if (plugin_dir / "libh5zstd.so").exists() and \
                str(plugin_dir).encode() not in [h5py.h5pl.get(i) for i in range(h5py.h5pl.size())]:
            h5py.h5pl.prepend(str(plugin_dir).encode())
    return h5py.File(path, "r")


def read_safetensors(path):
    """{name: float32 array} of a safetensors file (F32, BF16 or F16), numpy only."""
    raw = pathlib.Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        buf = raw[base + a:base + b]
        if info["dtype"] == "BF16":
            v = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif info["dtype"] == "F16":
            v = np.frombuffer(buf, dtype="<f2").astype(np.float32)
        elif info["dtype"] == "F32":
            v = np.frombuffer(buf, dtype="<f4").copy()
        else:
            raise ValueError(f"{path}: {name} has dtype {info['dtype']}")
        out[name] = v.reshape(info["shape"])
    return out


def make_f32_copy(src, dst):
    """fmoe-tiny with its weights widened to float32 (exact: every bf16 is an f32): the CUDA
    backend then multiplies with cuBLAS SGEMM and its gate probabilities agree with the
    CPU's to float32 rounding, so both route the same and decide the same."""
    dst.mkdir(parents=True, exist_ok=True)
    tensors = read_safetensors(src / "model.safetensors")
    tiny.save_safetensors(dst / "model.safetensors",
                          {k: (v.astype(np.float32), "F32") for k, v in tensors.items()})
    cfg = json.loads((src / "config.json").read_text())
    for key in ("dtype", "torch_dtype"):
        if key in cfg:
            cfg[key] = "float32"
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (src / f).exists():
            shutil.copy(src / f, dst / f)
    return dst
