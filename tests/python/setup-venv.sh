#!/usr/bin/env bash
# Makes the project-local virtualenv .venv with the Python test packages
# (tests/python/requirements.txt); with --torch also torch and transformers
# (requirements-torch.txt), which only the full tier needs: it recomputes the transformers
# references that the quick tier reads from tests/fixtures/transformers/. PyPI's torch
# brings its CUDA libraries (there is no CPU-only torch on PyPI): about 45-70 s and 5.8 GB
# on a 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
torch=0
[ "${1:-}" = "--torch" ] && torch=1
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import h5py, hdf5plugin, numpy, pytest, tokenizers, sentencepiece, openai, prometheus_client, gguf, jsonschema' 2>/dev/null; then
  /usr/bin/python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check -r tests/python/requirements.txt
fi
if [ $torch = 1 ] && ! .venv/bin/python -c 'import torch, transformers, safetensors' 2>/dev/null; then
  .venv/bin/pip install -q --disable-pip-version-check --no-cache-dir \
    -r tests/python/requirements.txt -r tests/python/requirements-torch.txt
fi
