"""GLM-4.5 (glm4_moe) through the commands: `fmoe generate`, `fmoe record` and live
offloading, on the tiny checkpoints of make_tiny_models.py widened to fmoe-tiny's
4096-token vocabulary so that they run through its tokenizer (their logits are checked
against transformers in test_glm4_moe.py).

- generate runs, the same with one thread as with all;
- record's trace holds what the routing hooks saw: two distinct experts of eight per MoE
  layer, and the unbiased sigmoid scores (not a distribution; the choice ran on them plus
  the selection bias, within the two best of four groups);
- live offloading with a cache of fewer experts than a layer has computes exactly what the
  all-resident run computes (the same routing and tokens in the trace), and its decisions
  equal the simulator's on the trace it recorded (test_offload_live.py's identity, here
  for the new family).
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

h5py = pytest.importorskip("h5py")
import hdf5plugin  # noqa: F401,E402


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("glm4-moe-live")
    for name in tiny.GLM4_MOE_PLAIN:
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


@pytest.mark.parametrize("name", tiny.GLM4_MOE_PLAIN)
def test_generate_runs(work, fmoe_bin, name):
    args = ["generate", "--model", work / name, "--tokenizer", TINY, "--prompt",
            "The dictionary type", "--max-new-tokens", 6, "--temperature", 0, "--ignore-eos",
            "--backend", "cpu"]
    p = run_fmoe(fmoe_bin, *args)
    q = run_fmoe(fmoe_bin, *args, "--threads", 1)
    assert p.stdout == q.stdout and p.stdout.strip()


@pytest.mark.parametrize("name", tiny.GLM4_MOE_PLAIN)
def test_record_trace(work, fmoe_bin, name, tmp_path):
    t = record(fmoe_bin, work, name, tmp_path / "t.h5")
    ex, probs = t["tokens/experts"].astype(np.int64), t["tokens/probs"].astype(np.float32)
    assert ex.shape[1:] == (2, 2) and probs.shape[1:] == (2, 8)  # 2 MoE layers, top-2 of 8
    assert (ex[..., 0] != ex[..., 1]).all()
    assert ((probs > 0) & (probs < 1)).all()
    assert np.abs(probs.sum(-1) - 1).max() > 0.5
    # Glm4MoeTopkRouter redone in numpy from the recorded scores and the checkpoint's
    # e_score_correction_bias: groups of two ranked by the sum of their two best, two of
    # four kept, the top-2 of the biased scores within them. The experts recorded are
    # those, so the scores recorded are the ones the routing ran on.
    from test_quantize import read_checkpoint
    ck = read_checkpoint(work / name)
    cfg = json.loads((work / name / "config.json").read_text())
    first = cfg["first_k_dense_replace"]
    differs_from_plain = 0
    for l in range(ex.shape[1]):
        bias = ck[f"model.layers.{first + l}.mlp.gate.e_score_correction_bias"][0]
        choice = probs[:, l] + bias
        group = np.sort(choice.reshape(-1, 4, 2), -1)[..., -2:].sum(-1)
        kept = np.argsort(-group, -1, kind="stable")[:, :2]
        mask = np.full_like(choice, -np.inf)
        for g in range(2):
            rows = np.arange(len(choice))
            for j in range(2):
                mask[rows, kept[:, g] * 2 + j] = 0
        want = np.sort(np.argsort(-(choice + mask), -1, kind="stable")[:, :2], -1)
        np.testing.assert_array_equal(np.sort(ex[:, l], -1), want)
        plain = np.sort(np.argsort(-probs[:, l], -1, kind="stable")[:, :2], -1)
        differs_from_plain += int((plain != want).any(-1).sum())
    assert differs_from_plain > 0  # the bias and groups changed some token's experts


@pytest.mark.parametrize("policy", ["lru", "least-stale"])
def test_live_offloading_is_exact_and_matches_the_simulator(work, fmoe_bin, policy, tmp_path):
    name = "glm4_moe_qk_norm"
    resident = record(fmoe_bin, work, name, tmp_path / "resident.h5")
    live_log, sim_log = tmp_path / "live.jsonl", tmp_path / "sim.jsonl"
    trace = tmp_path / "live.h5"
    live = record(fmoe_bin, work, name, trace, "--policy", policy, "--cache-experts", 5,
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
