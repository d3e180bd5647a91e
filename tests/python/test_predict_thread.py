"""Predictions on their own thread beside inference, live: fMoE's matcher (the fMoE paper,
"fMoE: Fine-Grained Expert Offloading for Large Mixture-of-Experts Serving", §4.3) and
ProMoE's predictor ("ProMoE: Fast MoE-based LLM Serving using Proactive Caching", §4.4).

The live default (without `--sync-predictions`) publishes each gate's rows (fmoe) or gate
inputs (promoe) to the policy's thread and goes on; the thread's finished predictions come
back as prefetches at the next event. What is checked here, on the bundled fmoe-tiny, for
both policies:
- the predictions do come back: the run issues prefetches, and computes what the
  all-resident run computes (the same experts routed at every layer of every token);
- no layer waits for them: with every prediction slowed to 100 ms
  (FMOE_FAULT_PREDICT_DELAY_MS, fault injection), the run takes a small fraction of the
  time the predictions would take in line, its plans come too late and are dropped (far
  fewer prefetches), and it still computes the same thing;
- fmoe's store-updating mode, where iteration end waits for the iteration's last search
  before the store changes, runs with a slowed thread and writes a grown store.
The decision-for-decision identity with the simulator runs them inline
(test_offload_live.py, test_promoe_live.py).
"""
import json
import os
import pathlib
import time

import pytest

h5py = pytest.importorskip("h5py")
import hdf5plugin  # noqa: F401,E402
from conftest import run_fmoe  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
TINY = REPO / "datasets" / "fmoe-tiny"
PROMPTS = REPO / "datasets" / "samples" / "prompts_100.txt"
DELAY_MS = 100


@pytest.fixture(scope="module")
def work(tmp_path_factory, fmoe_bin):
    d = tmp_path_factory.mktemp("predict")
    lines = PROMPTS.read_text().splitlines()
    (d / "prompts.txt").write_text("\n".join(lines[:12]) + "\n")
    (d / "other.txt").write_text("\n".join(lines[40:80]) + "\n")
    run_fmoe(fmoe_bin, "record", "--model", TINY, "--dataset", d / "other.txt",
             "--max-new-tokens", 16, "--temperature", 0, "--hidden", "-o", d / "other.h5",
             "--quiet")
    run_fmoe(fmoe_bin, "build-store", "--trace", d / "other.h5", "-o", d / "store.h5",
             "--quiet")
    run_fmoe(fmoe_bin, "train-predictor", "--kind", "promoe", "--trace", d / "other.h5",
             "--stride", 1, "--seed", 3, "-o", d / "p.h5", "--quiet")
    # the all-resident run: what every offloaded run must compute
    run_fmoe(fmoe_bin, "record", "--model", TINY, "--dataset", d / "prompts.txt",
             "--max-new-tokens", 12, "--temperature", 0, "-o", d / "resident.h5", "--quiet")
    return d


def policy_args(work, policy):
    if policy == "fmoe":
        return ["--policy", "fmoe", "--store", work / "store.h5"]
    return ["--policy", "promoe", "--predictor", work / "p.h5", "--hidden"]


def record(fmoe_bin, work, name, *extra, delay_ms=0):
    env = dict(os.environ)
    if delay_ms:
        env["FMOE_FAULT_PREDICT_DELAY_MS"] = str(delay_ms)
    trace, log = work / f"{name}.h5", work / f"{name}.jsonl"
    t0 = time.monotonic()
    run_fmoe(fmoe_bin, "record", "--model", TINY, "--dataset", work / "prompts.txt",
             "--max-new-tokens", 12, "--temperature", 0, "--cache-experts", 12, *extra,
             "--decision-log", log, "-o", trace, "--quiet", env=env)
    wall = time.monotonic() - t0
    events = [json.loads(x)["event"] for x in log.read_text().splitlines()[1:]]
    return trace, wall, events.count("prefetch")


def same_computation(trace, work):
    with h5py.File(trace, "r") as f, h5py.File(work / "resident.h5", "r") as r:
        assert (f["tokens/token_id"][:] == r["tokens/token_id"][:]).all()
        assert (f["tokens/experts"][:] == r["tokens/experts"][:]).all()


def predictions_in_line(trace):
    """How many predictions an inline run makes for this trace: at least one per layer
    but the last, per iteration (fmoe's searches; promoe at stride 1 predicts layer l + 1
    at gate l)."""
    with h5py.File(trace, "r") as f:
        return len(f["timing/iteration_s"]) * (int(f.attrs["num_layers"]) - 1)


@pytest.mark.parametrize("policy", ["fmoe", "promoe"])
def test_thread_predictions_come_back_as_prefetches(fmoe_bin, work, policy):
    args = policy_args(work, policy)
    trace, _, prefetches = record(fmoe_bin, work, f"{policy}-thread", *args)
    _, _, inline = record(fmoe_bin, work, f"{policy}-inline", *args, "--sync-predictions")
    assert prefetches > 0 and inline > 0
    same_computation(trace, work)


@pytest.mark.parametrize("policy", ["fmoe", "promoe"])
def test_a_slow_predictor_never_slows_a_layer(fmoe_bin, work, policy):
    args = policy_args(work, policy)
    _, _, fast = record(fmoe_bin, work, f"{policy}-fast", *args)
    trace, wall, slow = record(fmoe_bin, work, f"{policy}-slow", *args, delay_ms=DELAY_MS)
    in_line = predictions_in_line(trace) * DELAY_MS / 1e3
    assert in_line > 30  # the predictions would take this long at the gates
    assert wall < in_line / 5, (wall, in_line)
    # a prediction finishes after its iteration: its plan is dropped, not issued late
    assert slow < fast / 4, (slow, fast)
    same_computation(trace, work)


def test_store_update_waits_only_at_iteration_end(fmoe_bin, work):
    out = work / "updated.h5"
    trace, wall, _ = record(fmoe_bin, work, "update", *policy_args(work, "fmoe"),
                            "--store-mode", "offline-update", "--store-out", out, delay_ms=5)
    # iteration end waits for the last search (5 ms), never for more than what is queued
    with h5py.File(trace, "r") as f:
        iterations = len(f["timing/iteration_s"])
        layers = int(f.attrs["num_layers"])
    assert wall < iterations * layers * 0.005 + 30
    with h5py.File(work / "store.h5", "r") as a, h5py.File(out, "r") as b:
        ma, mb = a["maps"][:], b["maps"][:]
        n = min(len(ma), len(mb))
        assert len(mb) > len(ma) or (ma[:n] != mb[:n]).any()
    same_computation(trace, work)


def test_sync_predictions_needs_an_offloaded_run(fmoe_bin, work):
    p = run_fmoe(fmoe_bin, "record", "--model", TINY, "--dataset", work / "prompts.txt",
                 "--sync-predictions", "-o", work / "never.h5", check=False)
    assert p.returncode == 2 and "--sync-predictions" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert not (work / "never.h5").exists()


def test_the_simulator_models_the_predictors_time(fmoe_bin, work):
    """A profile's predictor.promoe_s delays promoe's prefetches in `fmoe simulate`, as the
    thread delays them live: with 50 ms a pass every prediction of a fast decode comes late,
    so fewer accesses hit; a malformed entry is refused in one line."""
    trace, _, _ = record(fmoe_bin, work, "promoe-sim", *policy_args(work, "promoe"),
                         "--sync-predictions")
    prof = {"format": "fmoe-hardware", "version": 1, "name": "t", "source": "test",
            "link": {"alpha_s": 1e-5, "beta_bytes_per_s": 1e9},
            "compute": {"attention_s": {"base": 1e-4, "per_token": 1e-6,
                                        "per_token_context": 0.0},
                        "expert_s": {"base": 1e-4, "per_token": 1e-6}}}
    rates = []
    for name, extra in (("free", {}), ("slow", {"predictor": {"promoe_s": 0.05}})):
        (work / f"{name}.json").write_text(json.dumps({**prof, **extra}))
        out = run_fmoe(fmoe_bin, "simulate", "--trace", trace, "--policy", "promoe",
                       "--predictor", work / "p.h5", "--cache-experts", 12, "--profile",
                       work / f"{name}.json", "--json", "--quiet").stdout
        rates.append(json.loads(out)["results"][0]["hit_rate"])
    assert rates[1] < rates[0] - 0.05, rates
    (work / "bad.json").write_text(json.dumps({**prof, "predictor": {"promoe_s": -1}}))
    p = run_fmoe(fmoe_bin, "simulate", "--trace", trace, "--policy", "promoe", "--predictor",
                 work / "p.h5", "--cache-experts", 12, "--profile", work / "bad.json",
                 check=False)
    assert p.returncode != 0 and "promoe_s" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
