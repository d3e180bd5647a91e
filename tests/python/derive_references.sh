#!/usr/bin/env bash
# Recomputes the transformers references under tests/fixtures/transformers/ (the tiny
# checkpoints' layouts and outputs, fmoe-tiny's greedy continuations and router outputs)
# with the torch and transformers pinned in tests/python/requirements-torch.txt, and
# writes them over the stored ones. Run it after changing a cross-check's inputs or the
# pinned versions, then review `git diff --stat tests/fixtures` and commit the fixtures.
#
#     bash tests/python/derive_references.sh [BUILD_DIR]     # default: build
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
bash tests/python/setup-venv.sh --torch
FMOE_BUILD_DIR="$build" FMOE_TEST_TIER=full FMOE_REGENERATE_REFERENCES=1 \
  .venv/bin/python -m pytest -q -p no:cacheprovider \
  tests/python/test_forward.py tests/python/test_generate_record.py tests/python/test_glm4_moe.py tests/python/test_fp8_weights.py \
  -k "reference or transformers"
