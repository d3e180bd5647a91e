"""Shared fixtures for fmoe's Python cross-check tests.

The tests run the built `fmoe` binary and check its files with independent readers
(h5py, hdf5plugin, h5dump). FMOE_BUILD_DIR names the meson build directory (default:
<repo>/build). A few tests replay real routing logs and datasets that the repository does
not ship (they are large and under other licences): they read the folder named by
FMOE_REAL_DATA and skip, saying so, when it is not set (docs/TESTING.md lists what they
look for there).
"""
import os
import pathlib
import re
import shutil
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]

# The test tier (docs/TESTING.md): "quick" (tests/run.sh, the default) or "full"
# (tests/run-all.sh). A few long cross-checks run some of their cases in the full tier
# only; those cases are marked with FULL_TIER_ONLY and say so when skipped.
FULL_TIER = os.environ.get("FMOE_TEST_TIER", "quick") == "full"
FULL_TIER_ONLY = pytest.mark.skipif(not FULL_TIER, reason="full tier only (FMOE_TEST_TIER=full)")


def _build_dir():
    return pathlib.Path(os.environ.get("FMOE_BUILD_DIR", REPO / "build")).resolve()


@pytest.fixture(scope="session")
def build_dir():
    d = _build_dir()
    if not (d / "build.ninja").exists():
        pytest.fail(f"no meson build at {d}: set FMOE_BUILD_DIR")
    return d


@pytest.fixture(scope="session")
def fmoe_bin(build_dir):
    exe = build_dir / "cmd" / "fmoe"
    if not exe.exists():
        pytest.fail(f"{exe} not built")
    return exe


@pytest.fixture(scope="session")
def plugin_dir(build_dir):
    """Folder holding our libh5zstd.so, for HDF5_PLUGIN_PATH: FMOE_PLUGIN_DIR when set (the
    tests run against the ASan binary point it at the plain build's plugin, which h5py can
    load), else the build's own."""
    d = pathlib.Path(os.environ.get("FMOE_PLUGIN_DIR", build_dir / "trace")).resolve()
    if not (d / "libh5zstd.so").exists():
        pytest.fail(f"{d}/libh5zstd.so not built")
    return d


@pytest.fixture(scope="session")
def fixtures_dir():
    return REPO / "tests" / "fixtures"


@pytest.fixture(scope="session")
def real_data():
    """The folder of real routing logs and datasets named by FMOE_REAL_DATA."""
    v = os.environ.get("FMOE_REAL_DATA")
    if not v:
        pytest.skip("FMOE_REAL_DATA is not set (a folder of real traces; see docs/TESTING.md)")
    d = pathlib.Path(v)
    if not d.is_dir():
        pytest.fail(f"FMOE_REAL_DATA={v} is not a folder")
    return d


def run_fmoe(fmoe_bin, *args, check=True, env=None, cwd=None):
    """Runs fmoe; returns CompletedProcess with text stdout/stderr."""
    p = subprocess.run([str(fmoe_bin), *map(str, args)], capture_output=True, text=True,
                       env=env, cwd=cwd, timeout=600)
    if check and p.returncode != 0:
        raise AssertionError(f"fmoe {' '.join(map(str, args))} exited {p.returncode}:\n"
                             f"{p.stdout}\n{p.stderr}")
    return p


@pytest.fixture(scope="session")
def fmoe(fmoe_bin):
    def call(*args, **kw):
        return run_fmoe(fmoe_bin, *args, **kw)
    return call


def have_h5dump():
    return shutil.which("h5dump") is not None


def cuda_devices(fmoe_bin):
    """CUDA devices the fmoe binary sees: the count in the `cuda:` line of `fmoe --version`
    ("CUDA runtime 13.0, 1 device (NVIDIA H100)"); 0 when it was built without CUDA or its
    module does not load here. FMOE_TEST_CUDA_DEVICES overrides what --version says."""
    forced = os.environ.get("FMOE_TEST_CUDA_DEVICES")
    if forced:
        return int(forced)
    out = run_fmoe(fmoe_bin, "--version").stdout
    line = next((l for l in out.splitlines() if l.startswith("cuda:")), "")
    m = re.search(r"(\d+) devices?\b", line)
    return int(m.group(1)) if m else 0


@pytest.fixture(scope="session")
def have_cuda_device(fmoe_bin):
    """True where `--backend cuda` can run (and `--backend auto` chooses it)."""
    return cuda_devices(fmoe_bin) > 0


@pytest.fixture(scope="session")
def driver(build_dir):
    """tests/model/forward_driver, built (the forward pass over given tokens: logits and
    routes to files)."""
    exe = build_dir / "tests" / "model" / "forward_driver"
    if not exe.exists():
        pytest.fail(f"{exe} not built")
    return exe
