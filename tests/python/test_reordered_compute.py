"""ProMoE's reordered compute ("ProMoE: Fast MoE-based LLM Serving using Proactive Caching",
§5.3), live: the promoe policy asks the executors to resolve and compute a layer's experts
with the resident ones first, then those in flight, then the rest (lib/slots.c fmoe_slots_compute_order; the simulator
does the same, and test_promoe_live.py holds the two decision for decision).

Checked here on a live fmoe-tiny recording, from the files alone:
- the decision log's accesses of each layer come hits first, misses last, and in some
  layers that is not the order of first appearance (the reordering happened);
- the trace's measured outcomes (/timing/access_outcome) stay in replay order (first
  appearance per layer), matching the log's outcome for each (iteration, layer, expert);
- the forward pass, computing in the new order, computes what the all-resident run does.
"""
import json
import pathlib

import numpy as np
import pytest

h5py = pytest.importorskip("h5py")
import hdf5plugin  # noqa: F401,E402
from conftest import run_fmoe  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
TINY = REPO / "datasets" / "fmoe-tiny"
PROMPTS = REPO / "datasets" / "samples" / "prompts_100.txt"
OUTCOME = {"miss": 0, "hit": 1, "late": 2, "host": 3}


@pytest.fixture(scope="module")
def run(tmp_path_factory, fmoe_bin):
    d = tmp_path_factory.mktemp("reorder")
    lines = PROMPTS.read_text().splitlines()
    (d / "train.txt").write_text("\n".join(lines[:30]) + "\n")
    (d / "live.txt").write_text("\n".join(lines[60:68]) + "\n")
    run_fmoe(fmoe_bin, "record", "--model", TINY, "--dataset", d / "train.txt",
             "--max-new-tokens", 16, "--temperature", 0, "--hidden", "-o", d / "train.h5",
             "--quiet")
    run_fmoe(fmoe_bin, "train-predictor", "--kind", "promoe", "--trace", d / "train.h5",
             "--stride", 1, "--seed", 1, "-o", d / "p.h5", "--quiet")
    run_fmoe(fmoe_bin, "record", "--model", TINY, "--dataset", d / "live.txt",
             "--max-new-tokens", 10, "--temperature", 0, "-o", d / "resident.h5", "--quiet")
    run_fmoe(fmoe_bin, "record", "--model", TINY, "--dataset", d / "live.txt",
             "--max-new-tokens", 10, "--temperature", 0, "--hidden", "--policy", "promoe",
             "--predictor", d / "p.h5", "--cache-experts", 16, "--sync-transfers",
             "--sync-predictions", "--decision-log", d / "live.jsonl", "-o", d / "live.h5",
             "--quiet")
    log = [json.loads(x) for x in (d / "live.jsonl").read_text().splitlines()[1:]]
    return d, [r for r in log if r["event"] == "access"]


def replay_order(trace):
    """[(iteration, layer, expert)] in replay order: per iteration (a prompt chunk of 64,
    or one decode token), per layer, the distinct experts in order of first appearance."""
    with h5py.File(trace, "r") as f:
        experts = f["tokens/experts"][:]           # [T, L, K]
        phase = f["tokens/phase"][:]
        offs = f["requests/token_offset"][:]
        chunk = int(f.attrs["prefill_chunk"])
    out, it = [], 0
    for r in range(len(offs) - 1):
        t0, t1 = int(offs[r]), int(offs[r + 1])
        prompt = int((phase[t0:t1] == 0).sum())
        groups = [(a, min(a + chunk, t0 + prompt)) for a in range(t0, t0 + prompt, chunk)]
        groups += [(t, t + 1) for t in range(t0 + prompt, t1)]
        for a, b in groups:
            for layer in range(experts.shape[1]):
                seen = []
                for e in experts[a:b, layer, :].reshape(-1):
                    if int(e) not in seen:
                        seen.append(int(e))
                out += [(it, layer, e) for e in seen]
            it += 1
    return out


def test_accesses_go_resident_first(run):
    _, acc = run
    groups = {}
    for r in acc:
        groups.setdefault((r["iteration"], r["layer"]), []).append(r["result"])
    assert len(groups) > 100
    for key, results in groups.items():
        found = [x != "miss" for x in results]
        assert found == sorted(found, reverse=True), (key, results)  # no hit after a miss


def test_outcomes_stay_in_replay_order_and_the_computation_is_unchanged(run):
    d, acc = run
    order = replay_order(d / "live.h5")
    result = {(r["iteration"], r["layer"], r["expert"]): r["result"] for r in acc}
    assert len(result) == len(acc) == len(order)
    with h5py.File(d / "live.h5", "r") as f:
        outcome = f["timing/access_outcome"][:]
    want = np.array([OUTCOME[result[k]] for k in order], dtype=outcome.dtype)
    assert (outcome == want).all()
    # the log's order differs from first appearance in some layers: reordering happened
    log_keys = [(r["iteration"], r["layer"], r["expert"]) for r in acc]
    assert log_keys != order and sorted(log_keys) == sorted(order)
    with h5py.File(d / "live.h5", "r") as f, h5py.File(d / "resident.h5", "r") as r:
        assert (f["tokens/token_id"][:] == r["tokens/token_id"][:]).all()
        assert (f["tokens/experts"][:] == r["tokens/experts"][:]).all()
