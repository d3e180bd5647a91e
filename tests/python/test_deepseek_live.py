"""DeepSeek-V2/V3 (multi-head latent attention, grouped routing) through the commands:
`fmoe generate`, `fmoe record` and live offloading, on tiny checkpoints of
make_tiny_models.py widened to fmoe-tiny's 4096-token vocabulary so that they run through
its tokenizer (their logits are checked against transformers in test_forward.py).

- generate and record run, and record's trace holds what the routing hooks saw: the
  chosen experts, and the unbiased gate scores (V3: sigmoids, not a distribution);
- live offloading with a cache of fewer experts than a layer has computes exactly what
  the all-resident run computes (the same routing and tokens in the trace), and its
  decisions equal the simulator's on the trace it recorded (test_offload_live.py's
  identity, here for the new family).
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

h5py = pytest.importorskip("h5py")
import hdf5plugin  # noqa: F401,E402

REPO = pathlib.Path(__file__).resolve().parents[2]
TINY = REPO / "datasets" / "fmoe-tiny"
PROMPTS = REPO / "datasets" / "samples" / "prompts_100.txt"
ZERO_LINK = {
    "format": "fmoe-hardware", "version": 1, "name": "zero-link",
    "source": "test: transfers take no time (the simulated side of --sync-transfers)",
    "link": {"alpha_s": 0.0, "beta_bytes_per_s": 1e30},
    "compute": {"attention_s": {"base": 1e-4, "per_token": 1e-6, "per_token_context": 0.0},
                "expert_s": {"base": 1e-5, "per_token": 1e-6}},
}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("deepseek-live")
    for name in ("deepseek_v2", "deepseek_v3"):
        tiny.write_hf_checkpoint_with_vocab(name, d / name, 4096)
    (d / "prompts.txt").write_text("\n".join(PROMPTS.read_text().splitlines()[:6]) + "\n")
    (d / "zero.json").write_text(json.dumps(ZERO_LINK))
    return d


def record(fmoe_bin, work, name, out, *extra):
    run_fmoe(fmoe_bin, "record", "--model", work / name, "--tokenizer", TINY, "--dataset",
             work / "prompts.txt", "--max-new-tokens", 8, "--temperature", 0, "--ignore-eos",
             "--backend", "cpu", "-o", out, "--quiet", *extra)
    with h5py.File(out) as f:
        return {k: f[k][:] for k in ("tokens/experts", "tokens/probs", "tokens/token_id")}


@pytest.mark.parametrize("name", ["deepseek_v2", "deepseek_v3"])
def test_generate_runs(work, fmoe_bin, name):
    p = run_fmoe(fmoe_bin, "generate", "--model", work / name, "--tokenizer", TINY,
                 "--prompt", "The dictionary type", "--max-new-tokens", 6, "--temperature", 0,
                 "--ignore-eos", "--backend", "cpu")
    q = run_fmoe(fmoe_bin, "generate", "--model", work / name, "--tokenizer", TINY,
                 "--prompt", "The dictionary type", "--max-new-tokens", 6, "--temperature", 0,
                 "--ignore-eos", "--backend", "cpu", "--threads", 1)
    assert p.stdout == q.stdout and p.stdout.strip()


@pytest.mark.parametrize("name", ["deepseek_v2", "deepseek_v3"])
def test_record_trace(work, fmoe_bin, name, tmp_path):
    t = record(fmoe_bin, work, name, tmp_path / "t.h5")
    ex, probs = t["tokens/experts"].astype(np.int64), t["tokens/probs"].astype(np.float32)
    assert ex.shape[1:] == (2, 2) and probs.shape[1:] == (2, 8)  # 2 MoE layers, top-2 of 8
    assert (np.sort(ex, -1)[..., 0] != np.sort(ex, -1)[..., 1]).all()
    if name == "deepseek_v3":
        # sigmoid scores, not a distribution; the choice ran on them plus the bias, in
        # groups, so it need not be their top-2
        assert ((probs > 0) & (probs < 1)).all()
        assert np.abs(probs.sum(-1) - 1).max() > 0.5
    else:
        np.testing.assert_allclose(probs.sum(-1), 1, atol=1e-2)
        # group_limited_greedy, one group of four: both experts in one group of two
        assert (ex[..., 0] // 2 == ex[..., 1] // 2).all()


@pytest.mark.parametrize("policy", ["lru", "least-stale"])
def test_live_offloading_is_exact_and_matches_the_simulator(work, fmoe_bin, policy, tmp_path):
    resident = record(fmoe_bin, work, "deepseek_v3", tmp_path / "resident.h5")
    live_log, sim_log = tmp_path / "live.jsonl", tmp_path / "sim.jsonl"
    trace = tmp_path / "live.h5"
    live = record(fmoe_bin, work, "deepseek_v3", trace, "--policy", policy,
                  "--cache-experts", 5, "--prefetch-distance", 1, "--sync-transfers",
                  "--sync-predictions", "--decision-log", live_log)
    for k in resident:
        assert np.array_equal(resident[k], live[k]), k
    run_fmoe(fmoe_bin, "simulate", "--trace", trace, "--policy", policy, "--cache-experts", 5,
             "--prefetch-distance", 1, "--profile", work / "zero.json", "--decision-log",
             sim_log, "--quiet")
    p = run_fmoe(fmoe_bin, "compare-logs", live_log, sim_log, "--late-is-hit", "--json")
    assert json.loads(p.stdout)["identical"] is True
    misses = sum('"miss"' in line for line in live_log.read_text().splitlines())
    assert misses > 0
