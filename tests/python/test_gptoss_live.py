"""gpt-oss (attention sinks, sliding windows, biased router and experts, clamped SwiGLU)
through the commands: `fmoe generate`, `fmoe record` and live offloading, on make_tiny_models.py's tiny gpt_oss
checkpoint widened to fmoe-tiny's 4096-token vocabulary so that it runs through its
tokenizer (its logits are checked against transformers in test_forward.py).

- generate and record run, and record's trace holds what the routing hooks saw: the
  chosen experts (the top 2 of the router's biased logits, in order) and the softmax over
  all of them (gpt-oss weighs the chosen by a softmax over their logits alone: the same
  weights);
- live offloading with a cache of fewer experts than a layer has computes exactly what
  the all-resident run computes, and its decisions equal the simulator's on its trace;
  also with the experts in MXFP4 (OpenAI's published layout, repacked as ggml blocks at
  load: 17 bytes per 32 values move, not widened floats);
- the file tier is refused (the experts are rebuilt at load, no file holds them).
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
from test_gguf_gptoss import write_gpt_oss  # noqa: E402

h5py = pytest.importorskip("h5py")
import hdf5plugin  # noqa: F401,E402


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("gptoss-live")
    tiny.write_hf_checkpoint_with_vocab("gpt_oss", d / "gpt_oss", 4096)
    tiny.write_gpt_oss_mxfp4(d / "gpt_oss_mxfp4", 4096)
    write_gpt_oss(d / "gpt_oss_mxfp4", d / "gpt_oss_mxfp4.gguf")
    (d / "prompts.txt").write_text("\n".join(PROMPTS.read_text().splitlines()[:6]) + "\n")
    (d / "zero.json").write_text(json.dumps(ZERO_LINK))
    return d


# What an executor moves per expert: gate, up and down, h x I values each (the biases stay
# resident), as float32 or as MXFP4 blocks of 32 values in 17 bytes; the live/simulated
# agreement below depends on it.
H, I = 64, 64
EXPERT_BYTES = {"gpt_oss": 3 * H * I * 4, "gpt_oss_mxfp4": 3 * H * I // 32 * 17,
                "gpt_oss_mxfp4.gguf": 3 * H * I // 32 * 17}


def record(fmoe_bin, work, out, *extra, model="gpt_oss"):
    run_fmoe(fmoe_bin, "record", "--model", work / model, "--tokenizer", TINY, "--dataset",
             work / "prompts.txt", "--max-new-tokens", 8, "--temperature", 0, "--ignore-eos",
             "--backend", "cpu", "-o", out, "--quiet", *extra)
    with h5py.File(out) as f:
        assert int(f.attrs["expert_bytes"]) == EXPERT_BYTES[model]
        return {k: f[k][:] for k in ("tokens/experts", "tokens/probs", "tokens/token_id")}


def test_generate_runs(work, fmoe_bin):
    args = ["generate", "--model", work / "gpt_oss", "--tokenizer", TINY, "--prompt",
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


@pytest.mark.parametrize("model", ["gpt_oss", "gpt_oss_mxfp4"])
@pytest.mark.parametrize("policy", ["lru", "least-stale"])
def test_live_offloading_is_exact_and_matches_the_simulator(work, fmoe_bin, policy, model,
                                                             tmp_path):
    resident = record(fmoe_bin, work, tmp_path / "resident.h5", model=model)
    live_log, sim_log = tmp_path / "live.jsonl", tmp_path / "sim.jsonl"
    trace = tmp_path / "live.h5"
    live = record(fmoe_bin, work, trace, "--policy", policy, "--cache-experts", 5,
                  "--prefetch-distance", 1, "--sync-transfers", "--sync-predictions",
                  "--decision-log", live_log, model=model)
    for k in resident:
        assert np.array_equal(resident[k], live[k]), k
    run_fmoe(fmoe_bin, "simulate", "--trace", trace, "--policy", policy, "--cache-experts", 5,
             "--prefetch-distance", 1, "--profile", work / "zero.json", "--decision-log",
             sim_log, "--quiet")
    p = run_fmoe(fmoe_bin, "compare-logs", live_log, sim_log, "--late-is-hit", "--json")
    assert json.loads(p.stdout)["identical"] is True
    misses = sum('"miss"' in line for line in live_log.read_text().splitlines())
    assert misses > 0


def test_file_tier_refused(work, fmoe_bin, tmp_path):
    """The experts are transposed copies made at load (no file range holds them as used):
    the file tier is refused in one line, not read from the wrong bytes."""
    p = run_fmoe(fmoe_bin, "record", "--model", work / "gpt_oss", "--tokenizer", TINY,
                 "--dataset", work / "prompts.txt", "--max-new-tokens", 2, "--backend", "cpu",
                 "-o", tmp_path / "t.h5", "--quiet", "--policy", "lru", "--cache-experts", 5,
                 "--tier", "file", check=False)
    assert p.returncode == 1 and p.stderr.count("\n") == 1, p.stderr
    assert "--tier host" in p.stderr, p.stderr


@pytest.mark.parametrize("tier", ["host", "file"])
def test_gguf_mxfp4_experts_offloaded_from_their_file(work, fmoe_bin, tier, tmp_path):
    """A GGUF file's MXFP4 experts are slices of its stacked tensors, read in place: the
    file tier reads their 17-byte blocks from the file itself, and the live run equals
    the resident one and the simulator's decisions."""
    m = "gpt_oss_mxfp4.gguf"
    resident = record(fmoe_bin, work, tmp_path / "resident.h5", model=m)
    live_log, sim_log, trace = tmp_path / "live.jsonl", tmp_path / "sim.jsonl", tmp_path / "l.h5"
    live = record(fmoe_bin, work, trace, "--policy", "lru", "--cache-experts", 5, "--tier",
                  tier, "--sync-transfers", "--decision-log", live_log, model=m)
    for k in resident:
        assert np.array_equal(resident[k], live[k]), k
    run_fmoe(fmoe_bin, "simulate", "--trace", trace, "--policy", "lru", "--cache-experts", 5,
             "--profile", work / "zero.json", "--decision-log", sim_log, "--quiet")
    p = run_fmoe(fmoe_bin, "compare-logs", live_log, sim_log, "--late-is-hit", "--json")
    assert json.loads(p.stdout)["identical"] is True
