#!/usr/bin/env bash
# The full test tier (what CI runs), from a clean clone: the quick tier's checks plus
#   - the C suites under ASan + UBSan (build-asan/), the CUDA backend compiled with nvcc
#     -Werror when the toolkit is present;
#   - the Python cross-checks with FMOE_TEST_TIER=full: torch + transformers are installed
#     and every transformers reference is recomputed and checked against its fixture in
#     tests/fixtures/transformers/ (tests/python/hf_reference.py);
#   - the whole Python suite once more against the ASan + UBSan binary, LeakSanitizer
#     included.
# Two builds because h5py cannot load an ASan-instrumented HDF5 plugin: the Python checks
# of build/ run first. docs/TESTING.md lists the tiers and their times.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"

bash tests/install-deps.sh
bash tests/python/setup-venv.sh --torch

jobs=$(nproc)
# Where the toolkit is installed (CI's machines), the CUDA module must build: -Dcuda=enabled
# makes a toolkit meson cannot use a configure error instead of a silently CPU-only build.
cuda=auto
command -v nvcc >/dev/null && cuda=enabled
[ -f build-asan/build.ninja ] || meson setup build-asan -Dcuda=$cuda -Db_sanitize=address,undefined -Db_lundef=false
meson compile -C build-asan -j "$jobs"
meson test -C build-asan --print-errorlogs --num-processes "$jobs" --timeout-multiplier 5 \
  --no-suite python

[ -f build/build.ninja ] || meson setup build -Dcuda=$cuda
meson configure build -Dcuda=$cuda # a build/ the quick tier made without it gets it back
meson compile -C build -j "$jobs"

# Two Python passes, run at the same time: each is one pytest process that keeps about one
# of CI's two cores busy (waiting on the fmoe processes it starts), so side by side they take
# less than the sum (from a fresh clone at cb7ff70: 12.7 and 15.1 minutes side by side,
# against 6.5 and 11.3 one after the other at the stop before). Each writes its own log
# (build/, build-asan/), printed when both are done; the run fails if either failed. Tests
# use free ports (--port 0) and their own pytest temporary folders, so the passes share
# nothing but the read-only fixtures.
#
# 1. The Python cross-checks against build/, transformers references recomputed.
FMOE_TEST_TIER=full meson test -C build --suite python --print-errorlogs --timeout-multiplier 3 \
  > build/python-full.log 2>&1 &
full_pid=$!

# 2. The whole Python suite once more against the ASan+UBSan binary, LeakSanitizer included:
# a leak or an overflow on any command's success or error path fails the run. h5py in the
# test process loads the plain build's HDF5 filter plugin (FMOE_PLUGIN_DIR; an ASan plugin
# cannot load into an uninstrumented Python). An ASan binary cannot run under RLIMIT_AS, so
# the hostile-input tests' 4 GiB address-space cap becomes ASan's own allocation ceiling,
# returning NULL as glibc does (tests/python/memory_limit.py). Left out: the memory-flatness
# test (ASan's quarantine grows RSS by design). The references are read from the fixtures
# here (quick tier): pass 1 checks them against transformers. Also left out, the modules
# whose subject is the benchmarks' Python tooling (the shaped-GGUF generator and the bench
# harnesses: pass 1 runs them, and under ASan they spend a minute generating files).
FMOE_TEST_TIER=quick FMOE_BUILD_DIR=build-asan FMOE_PLUGIN_DIR=build/trace \
  ASAN_OPTIONS=allocator_may_return_null=1:max_allocation_size_mb=4096:detect_leaks=1 \
  .venv/bin/python -m pytest -q -p no:cacheprovider -k "not sustained" --durations=20 \
  --ignore=tests/python/test_make_shaped_gguf.py --ignore=tests/python/test_shaped_families.py \
  --ignore=tests/python/test_bench_family_decode.py --ignore=tests/python/test_bigger_than_ram.py \
  tests/python > build-asan/python-asan.log 2>&1 &
asan_pid=$!

full_rc=0 asan_rc=0
wait "$full_pid" || full_rc=$?
wait "$asan_pid" || asan_rc=$?
echo "=== Python cross-checks against build/ (exit $full_rc)"
cat build/python-full.log
echo "=== Python suite against build-asan/ (exit $asan_rc)"
cat build-asan/python-asan.log
if [ "$full_rc" != 0 ] || [ "$asan_rc" != 0 ]; then exit 1; fi

# With FMOE_GPU_REHEARSAL=1 (and the toolkit installed), the GPU device check's rehearsal
# (tests/gpu/README.md): the carried release build packed as for a device, then every stage
# up to the device with the CPU backend standing in; exit 77 (no device) is its success
# here. Not in CI's run: its third build takes the tier from 25 to about 29.5 minutes of
# CI's 30; it runs before every device session instead (docs/TESTING.md).
if [ "${FMOE_GPU_REHEARSAL:-0}" = 1 ] && command -v nvcc >/dev/null; then
  bash tests/gpu/bundle.sh && { bash tests/gpu/device-check.sh || [ $? = 77 ]; }
fi
