"""fMoE's matcher on its own thread beside inference, live (issue 10; papers/fmoe.txt §4.3).

The live default (`--matcher thread`) publishes each gate's rows to the matcher thread and
goes on; the thread's finished searches come back as prefetches at the next event. What is
checked here, on the bundled fmoe-tiny:
- the matches do come back: the run issues prefetches, and computes what the all-resident
  run computes (the same experts routed at every layer of every token);
- no layer waits for the matcher: with every search slowed to 100 ms
  (FMOE_FAULT_MATCH_DELAY_MS, fault injection), the run takes a small fraction of the
  time the searches would take in line, its plans come too late and are dropped (far
  fewer prefetches), and it still computes the same thing;
- the store-updating mode, where iteration end waits for the iteration's last search
  before the store changes, runs with a slowed thread and writes a grown store.
The decision-for-decision identity with the simulator runs the matcher inline
(test_offload_live.py).
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
    d = tmp_path_factory.mktemp("matcher")
    lines = PROMPTS.read_text().splitlines()
    (d / "prompts.txt").write_text("\n".join(lines[:12]) + "\n")
    (d / "other.txt").write_text("\n".join(lines[40:80]) + "\n")
    run_fmoe(fmoe_bin, "record", "--model", TINY, "--dataset", d / "other.txt",
             "--max-new-tokens", 16, "--temperature", 0, "-o", d / "store-src.h5", "--quiet")
    run_fmoe(fmoe_bin, "build-store", "--trace", d / "store-src.h5", "-o", d / "store.h5",
             "--quiet")
    # the all-resident run: what every offloaded run must compute
    run_fmoe(fmoe_bin, "record", "--model", TINY, "--dataset", d / "prompts.txt",
             "--max-new-tokens", 12, "--temperature", 0, "-o", d / "resident.h5", "--quiet")
    return d


def record(fmoe_bin, work, name, *extra, delay_ms=0):
    env = dict(os.environ)
    if delay_ms:
        env["FMOE_FAULT_MATCH_DELAY_MS"] = str(delay_ms)
    trace, log = work / f"{name}.h5", work / f"{name}.jsonl"
    t0 = time.monotonic()
    run_fmoe(fmoe_bin, "record", "--model", TINY, "--dataset", work / "prompts.txt",
             "--max-new-tokens", 12, "--temperature", 0, "--policy", "fmoe",
             "--cache-experts", 12, "--store", work / "store.h5", *extra,
             "--decision-log", log, "-o", trace, "--quiet", env=env)
    wall = time.monotonic() - t0
    events = [json.loads(x)["event"] for x in log.read_text().splitlines()[1:]]
    return trace, wall, events.count("prefetch")


def routing(trace):
    with h5py.File(trace, "r") as f:
        return f["tokens/token_id"][:], f["tokens/experts"][:]


def searches(trace):
    """How many trajectory searches an inline matcher makes for this trace: one after
    each layer but the last, per iteration (prefill chunks of 64 and decode tokens)."""
    with h5py.File(trace, "r") as f:
        layers = int(f.attrs["num_layers"])
        return len(f["timing/iteration_s"]) * (layers - 1)


def test_thread_matches_come_back_as_prefetches(fmoe_bin, work):
    trace, _, prefetches = record(fmoe_bin, work, "thread")
    _, _, inline = record(fmoe_bin, work, "inline", "--matcher", "inline")
    assert prefetches > 0 and inline > 0
    ids, experts = routing(trace)
    rids, rexperts = routing(work / "resident.h5")
    assert (ids == rids).all() and (experts == rexperts).all()


def test_a_slow_matcher_never_slows_a_layer(fmoe_bin, work):
    _, _, fast = record(fmoe_bin, work, "fast")
    trace, wall, slow = record(fmoe_bin, work, "slow", delay_ms=DELAY_MS)
    in_line = searches(trace) * DELAY_MS / 1e3
    assert in_line > 30  # the searches would take this long at the gates
    assert wall < in_line / 5, (wall, in_line)
    # a search finishes after its iteration: its plan is dropped, not issued late
    assert slow < fast / 4, (slow, fast)
    ids, experts = routing(trace)
    rids, rexperts = routing(work / "resident.h5")
    assert (ids == rids).all() and (experts == rexperts).all()


def test_store_update_waits_only_at_iteration_end(fmoe_bin, work):
    out = work / "updated.h5"
    trace, wall, _ = record(fmoe_bin, work, "update", "--store-mode", "offline-update",
                            "--store-out", out, delay_ms=5)
    # iteration end waits for the last search (5 ms) and never more than what is queued
    with h5py.File(trace, "r") as f:
        iterations = len(f["timing/iteration_s"])
        layers = int(f.attrs["num_layers"])
    assert wall < iterations * layers * 0.005 + 30
    with h5py.File(work / "store.h5", "r") as a, h5py.File(out, "r") as b:
        ma, mb = a["maps"][:], b["maps"][:]
        n = min(len(ma), len(mb))
        assert len(mb) > len(ma) or (ma[:n] != mb[:n]).any()
    ids, experts = routing(trace)
    rids, rexperts = routing(work / "resident.h5")
    assert (ids == rids).all() and (experts == rexperts).all()


def test_matcher_option_is_checked(fmoe_bin, work):
    p = run_fmoe(fmoe_bin, "record", "--model", TINY, "--dataset", work / "prompts.txt",
                 "--policy", "fmoe", "--cache-experts", 12, "--store", work / "store.h5",
                 "--matcher", "sometimes", "-o", work / "never.h5", check=False)
    assert p.returncode == 2 and "--matcher" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert not (work / "never.h5").exists()
