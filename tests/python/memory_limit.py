"""An address-space limit for a child fmoe, or none for an ASan build.

The hostile-input tests run fmoe under RLIMIT_AS so that a regression that allocates
terabytes fails the test instead of the machine. An ASan binary cannot start under such a
limit (it reserves terabytes of shadow memory); tests/run-all.sh runs those tests against
it with ASAN_OPTIONS max_allocation_size_mb (the same ceiling, enforced by ASan's
allocator) and allocator_may_return_null (NULL, as glibc's malloc returns) instead.
"""
import functools
import os
import pathlib
import resource
import subprocess

REPO = pathlib.Path(__file__).resolve().parents[2]


@functools.lru_cache(maxsize=None)
def asan_build():
    exe = pathlib.Path(os.environ.get("FMOE_BUILD_DIR", REPO / "build")) / "cmd" / "fmoe"
    try:
        out = subprocess.run(["ldd", str(exe)], capture_output=True, text=True).stdout
    except OSError:
        return False
    return "libasan" in out


def limit_address_space(nbytes):
    """A preexec_fn that caps the child's address space at nbytes (nothing under ASan)."""
    asan = asan_build()  # decided here, not in the forked child

    def preexec():
        if not asan:
            resource.setrlimit(resource.RLIMIT_AS, (nbytes, nbytes))
    return preexec


# Runs argv[3:] capped at argv[1] bytes of address space (0: no cap) and writes the child's
# peak RSS in KiB to argv[2]. The child is this small process's child, not pytest's: Linux
# carries the forking process's RSS into a child's ru_maxrss at exec, so a child forked
# from pytest (hundreds of MiB once torch or h5py is loaded) reports pytest's size.
_PEAK_RSS_HELPER = """
import resource, subprocess, sys
if int(sys.argv[1]):
    resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]),) * 2)
rc = subprocess.run(sys.argv[3:]).returncode
with open(sys.argv[2], "w") as f:
    f.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.exit(rc if rc >= 0 else 128 - rc)
"""


def run_peak_rss(args, nbytes, timeout=60):
    """Runs args under an nbytes address-space cap (none under ASan), as limit_address_space;
    returns (CompletedProcess with text stdout and stderr, the child's peak RSS in bytes)."""
    import sys
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        peak = pathlib.Path(d) / "peak"
        p = subprocess.run([sys.executable, "-c", _PEAK_RSS_HELPER,
                            str(0 if asan_build() else nbytes), str(peak), *map(str, args)],
                           capture_output=True, text=True, timeout=timeout)
        return p, int(peak.read_text()) * 1024
