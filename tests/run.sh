#!/usr/bin/env bash
# The quick test tier, from a clean clone: installs the Debian packages (tests/install-deps.sh)
# and the Python test packages into .venv (no torch: the transformers cross-checks read their
# references from tests/fixtures/transformers/), builds fmoe once (build/), and runs every
# meson suite and the Python cross-checks against that build. docs/TESTING.md says what each
# tier checks and how long it takes; tests/run-all.sh is the full tier CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"

bash tests/install-deps.sh
bash tests/python/setup-venv.sh

jobs=$(nproc)
# The CUDA module only where a device can run it (nvidia-smi lists one): elsewhere its tests
# skip, and compiling it is a minute of nvcc on two cores for nothing. The full tier (CI's,
# tests/run-all.sh) compiles it wherever the toolkit is installed.
cuda=disabled
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 && cuda=auto
[ -f build/build.ninja ] || meson setup build -Dcuda=$cuda
meson compile -C build -j "$jobs"
# the C suites (unit, fuzz replays; gpu skips without a device), then the Python
# cross-checks with their transformers references read from the fixtures
meson test -C build --print-errorlogs --num-processes "$jobs" --no-suite python
FMOE_TEST_TIER=quick meson test -C build --suite python --print-errorlogs
