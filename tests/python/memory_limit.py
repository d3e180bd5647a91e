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
