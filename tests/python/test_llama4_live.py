"""Llama 4 (top-1 sigmoid routing onto the expert input, a shared expert, MoE on every
other layer) through the commands: `fmoe generate`, `fmoe record`, `fmoe build-store` and
live offloading with every policy, on make_tiny_models.py's tiny llama4 checkpoint widened
to fmoe-tiny's 4096-token vocabulary so that it runs through its tokenizer (its logits are
checked against transformers in test_forward.py and test_llama4.py).

- generate runs, the same with one thread;
- record's trace holds what the routing hooks saw: one expert per token and MoE layer
  (layers 1 and 3 of 4), the largest of the gate probabilities, which are the router's
  sigmoids (Llama4Router: each in (0, 1), not a distribution);
- with a cache of 3 of the 16 routed experts, every policy's live run computes exactly
  what the all-resident run computes, and its decisions equal the simulator's on its
  trace (the fmoe policy with a store built from another recording).
"""
import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import make_tiny_models as tiny  # noqa: E402
from conftest import run_fmoe  # noqa: E402
from test_deepseek_live import PROMPTS, TINY, ZERO_LINK  # noqa: E402
from test_offload_live import POLICIES  # noqa: E402

h5py = pytest.importorskip("h5py")
import hdf5plugin  # noqa: F401,E402

# What an executor moves per expert: gate, up and down, h x I float32 values each.
H, I = 64, 32
EXPERT_BYTES = 3 * H * I * 4


@pytest.fixture(scope="module")
def work(tmp_path_factory, fmoe_bin):
    d = tmp_path_factory.mktemp("llama4-live")
    tiny.write_hf_checkpoint_with_vocab("llama4", d / "llama4", 4096)
    lines = PROMPTS.read_text().splitlines()
    (d / "prompts.txt").write_text("\n".join(lines[:6]) + "\n")
    (d / "other.txt").write_text("\n".join(lines[40:50]) + "\n")
    (d / "zero.json").write_text(json.dumps(ZERO_LINK))
    # a store for the fmoe policy, from an all-resident recording of other prompts
    record(fmoe_bin, d, d / "store-src.h5", dataset=d / "other.txt")
    run_fmoe(fmoe_bin, "build-store", "--trace", d / "store-src.h5", "-o", d / "store.h5",
             "--prefetch-distance", 1, "--quiet")
    return d


def record(fmoe_bin, work, out, *extra, dataset=None):
    run_fmoe(fmoe_bin, "record", "--model", work / "llama4", "--tokenizer", TINY, "--dataset",
             dataset or work / "prompts.txt", "--max-new-tokens", 8, "--temperature", 0,
             "--ignore-eos", "--backend", "cpu", "-o", out, "--quiet", *extra)
    with h5py.File(out) as f:
        assert int(f.attrs["expert_bytes"]) == EXPERT_BYTES
        return {k: f[k][:] for k in ("tokens/experts", "tokens/probs", "tokens/token_id")}


def test_generate_runs(work, fmoe_bin):
    args = ["generate", "--model", work / "llama4", "--tokenizer", TINY, "--prompt",
            "The dictionary type", "--max-new-tokens", 6, "--temperature", 0, "--ignore-eos",
            "--backend", "cpu"]
    p = run_fmoe(fmoe_bin, *args)
    q = run_fmoe(fmoe_bin, *args, "--threads", 1)
    assert p.stdout == q.stdout and p.stdout.strip()


def test_record_trace(work, fmoe_bin, tmp_path):
    t = record(fmoe_bin, work, tmp_path / "t.h5")
    ex, probs = t["tokens/experts"].astype(np.int64), t["tokens/probs"].astype(np.float32)
    assert ex.shape[1:] == (2, 1) and probs.shape[1:] == (2, 8)  # 2 MoE layers, top-1 of 8
    assert ((probs > 0) & (probs < 1)).all()
    assert (np.abs(probs.sum(-1) - 1) > 0.1).any()  # sigmoids, not a softmax
    # the chosen one has the largest probability (the trace rounds them to float16, so two
    # may tie)
    chosen = np.take_along_axis(probs, ex, -1)[..., 0]
    assert np.array_equal(chosen, probs.max(-1))
    assert len(np.unique(ex)) > 4  # the routing is spread, so a cache of 3 misses


@pytest.fixture(scope="module")
def resident(work, fmoe_bin, tmp_path_factory):
    return record(fmoe_bin, work, tmp_path_factory.mktemp("llama4-res") / "resident.h5")


@pytest.mark.parametrize("policy", POLICIES)
def test_live_offloading_is_exact_and_matches_the_simulator(work, resident, fmoe_bin, policy,
                                                             tmp_path):
    store = ["--store", work / "store.h5"] if policy == "fmoe" else []
    spec = ["--speculative", 1] if policy == "mixtral-offload" else []
    live_log, sim_log, trace = tmp_path / "live.jsonl", tmp_path / "sim.jsonl", tmp_path / "l.h5"
    live = record(fmoe_bin, work, trace, *spec, "--policy", policy, "--cache-experts", 3,
                  "--prefetch-distance", 1, *store, "--sync-transfers", "--sync-predictions",
                  "--decision-log", live_log)
    for k in resident:
        assert np.array_equal(resident[k], live[k]), k
    run_fmoe(fmoe_bin, "simulate", "--trace", trace, "--policy", policy, "--cache-experts", 3,
             "--prefetch-distance", 1, *store, "--profile", work / "zero.json",
             "--decision-log", sim_log, "--quiet")
    p = run_fmoe(fmoe_bin, "compare-logs", live_log, sim_log, "--late-is-hit", "--json")
    assert json.loads(p.stdout)["identical"] is True
    misses = sum('"miss"' in line for line in live_log.read_text().splitlines())
    assert misses > 0


def test_file_tier_refused(work, fmoe_bin, tmp_path):
    """The experts are transposed copies of the fused input-major tensors made at load (no
    file range holds them as used): the file tier is refused in one line."""
    p = run_fmoe(fmoe_bin, "record", "--model", work / "llama4", "--tokenizer", TINY,
                 "--dataset", work / "prompts.txt", "--max-new-tokens", 2, "--backend", "cpu",
                 "-o", tmp_path / "t.h5", "--quiet", "--policy", "lru", "--cache-experts", 3,
                 "--tier", "file", check=False)
    assert p.returncode == 1 and p.stderr.count("\n") == 1, p.stderr
    assert "--tier host" in p.stderr, p.stderr
