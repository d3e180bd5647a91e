"""Phi-3.5-MoE (LayerNorm with biases, sparsemixer routing) through the commands:
`fmoe generate`, `fmoe record` and live offloading, on make_tiny_models.py's tiny phimoe
checkpoint widened to fmoe-tiny's 4096-token vocabulary so that it runs through its
tokenizer (its logits are checked against transformers in test_forward.py).

- generate and record run, and record's trace holds what the routing hooks saw: the
  chosen experts (the top 2 of the router's softmax, in order: sparsemixer chooses on the
  logits and masks only the weights) and the plain softmax over the router logits;
- live offloading with a cache of fewer experts than a layer has computes exactly what
  the all-resident run computes, and its decisions equal the simulator's on its trace.
"""
import json
import os
import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import make_tiny_models as tiny  # noqa: E402
from conftest import run_fmoe  # noqa: E402
from test_deepseek_live import PROMPTS, TINY, ZERO_LINK  # noqa: E402

h5py = pytest.importorskip("h5py")
import hdf5plugin  # noqa: F401,E402


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("phimoe-live")
    tiny.write_hf_checkpoint_with_vocab("phimoe", d / "phimoe", 4096)
    (d / "prompts.txt").write_text("\n".join(PROMPTS.read_text().splitlines()[:6]) + "\n")
    (d / "zero.json").write_text(json.dumps(ZERO_LINK))
    return d


def record(fmoe_bin, work, out, *extra):
    run_fmoe(fmoe_bin, "record", "--model", work / "phimoe", "--tokenizer", TINY, "--dataset",
             work / "prompts.txt", "--max-new-tokens", 8, "--temperature", 0, "--ignore-eos",
             "--backend", "cpu", "-o", out, "--quiet", *extra)
    with h5py.File(out) as f:
        return {k: f[k][:] for k in ("tokens/experts", "tokens/probs", "tokens/token_id")}


def test_generate_runs(work, fmoe_bin):
    args = ["generate", "--model", work / "phimoe", "--tokenizer", TINY, "--prompt",
            "The dictionary type", "--max-new-tokens", 6, "--temperature", 0, "--ignore-eos",
            "--backend", "cpu"]
    p = run_fmoe(fmoe_bin, *args)
    q = run_fmoe(fmoe_bin, *args, "--threads", 1)
    assert p.stdout == q.stdout and p.stdout.strip()


def test_record_trace(work, fmoe_bin, tmp_path):
    t = record(fmoe_bin, work, tmp_path / "t.h5")
    ex, probs = t["tokens/experts"].astype(np.int64), t["tokens/probs"].astype(np.float32)
    assert ex.shape[1:] == (3, 2) and probs.shape[1:] == (3, 8)  # 3 MoE layers, top-2 of 8
    np.testing.assert_allclose(probs.sum(-1), 1, atol=1e-3)  # the softmax, recorded as is
    top2 = np.argsort(-probs, -1, kind="stable")[..., :2]
    assert np.array_equal(ex, top2)


@pytest.mark.parametrize("policy", ["lru", "least-stale"])
def test_live_offloading_is_exact_and_matches_the_simulator(work, fmoe_bin, policy, tmp_path):
    resident = record(fmoe_bin, work, tmp_path / "resident.h5")
    live_log, sim_log = tmp_path / "live.jsonl", tmp_path / "sim.jsonl"
    trace = tmp_path / "live.h5"
    live = record(fmoe_bin, work, trace, "--policy", policy, "--cache-experts", 5,
                  "--prefetch-distance", 1, "--sync-transfers", "--sync-predictions",
                  "--decision-log", live_log)
    for k in resident:
        assert np.array_equal(resident[k], live[k]), k
    run_fmoe(fmoe_bin, "simulate", "--trace", trace, "--policy", policy, "--cache-experts", 5,
             "--prefetch-distance", 1, "--profile", work / "zero.json", "--decision-log",
             sim_log, "--quiet")
    p = run_fmoe(fmoe_bin, "compare-logs", live_log, sim_log, "--late-is-hit", "--json")
    assert json.loads(p.stdout)["identical"] is True
    misses = sum('"miss"' in line for line in live_log.read_text().splitlines())
    assert misses > 0
