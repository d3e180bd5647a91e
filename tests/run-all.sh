#!/usr/bin/env bash
# The whole test suite, from a clean clone: installs dependencies, builds fmoe twice
# (build-asan: ASan+UBSan for the C unit tests; build: the normal build that the Python
# cross-checks drive, since h5py cannot load an ASan-instrumented HDF5 plugin), runs the
# meson suites, then the Python cross-checks against independent readers (h5py,
# hdf5plugin, h5dump).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"

bash tests/install-deps.sh

# Python packages for the cross-checks, in a project-local virtualenv.
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import h5py, hdf5plugin, numpy, pytest, tokenizers, sentencepiece, openai, prometheus_client' 2>/dev/null; then
  /usr/bin/python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check -r tests/python/requirements.txt
fi
# torch + transformers for the forward-pass cross-checks against HF's own modeling code.
# PyPI's torch brings its CUDA libraries (there is no CPU-only torch on PyPI):
# about 45-70 s and 5.8 GB on the 2-core CI machine.
if ! .venv/bin/python -c 'import torch, transformers, safetensors, tokenizers, sentencepiece' 2>/dev/null; then
  .venv/bin/pip install -q --disable-pip-version-check --no-cache-dir \
    -r tests/python/requirements.txt -r tests/python/requirements-torch.txt
fi

jobs=$(nproc)
[ -f build-asan/build.ninja ] || meson setup build-asan -Db_sanitize=address,undefined -Db_lundef=false
meson compile -C build-asan -j "$jobs"
meson test -C build-asan --print-errorlogs --num-processes "$jobs" --timeout-multiplier 5 \
  --no-suite python

[ -f build/build.ninja ] || meson setup build
meson compile -C build -j "$jobs"

# the Python cross-checks: the meson suite "python" (pytest against this build)
meson test -C build --suite python --print-errorlogs

# The whole Python suite once more against the ASan+UBSan binary, LeakSanitizer included:
# a leak or an overflow on any command's success or error path fails the run. h5py in the
# test process loads the plain build's HDF5 filter plugin (FMOE_PLUGIN_DIR; an ASan plugin
# cannot load into an uninstrumented Python). An ASan binary cannot run under RLIMIT_AS, so
# the hostile-input tests' 4 GiB address-space cap becomes ASan's own allocation ceiling,
# returning NULL as glibc does (tests/python/memory_limit.py). Left out: the memory-flatness
# test (ASan's quarantine grows RSS by design).
FMOE_BUILD_DIR=build-asan FMOE_PLUGIN_DIR=build/trace \
  ASAN_OPTIONS=allocator_may_return_null=1:max_allocation_size_mb=4096:detect_leaks=1 \
  .venv/bin/python -m pytest -q -p no:cacheprovider -k "not sustained" tests/python
