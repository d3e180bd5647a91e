"""`fmoe demo` part 2: the whole pipeline on the bundled model fmoe-tiny, ending live.

The demo records the first prompts of datasets/samples/prompts_100.txt, builds a store,
records the held-out prompts, simulates them with five policies, picks the best by
simulated decode TPOT and serves the held-out prompts again through the serve engine
(in-process, parallel 1) with it and with lru. What must hold whatever the machine:

- the live run feeds the recorded iterations in the recorded order, so its expert
  accesses (hits + late hits + misses) equal the accesses the held-out trace implies,
  recomputed here from the trace with h5py: per iteration (a prefill chunk of
  prefill_chunk tokens, or one decode token) and layer, the distinct experts chosen;
- simulate replays the same iterations, so its accesses are the same number;
- lru neither prefetches nor depends on when a copy finishes (every load is a demand
  load the forward waits for), so its live hits equal its simulated hits;
- the best policy's simulated TPOT is the least of the table (ties: higher hit rate).
Hit rates of prefetching policies may differ live (copies in flight), so only their
range is checked.
"""
import json

import numpy as np
import pytest

from conftest import REPO

POLICIES = ["lru", "lfu", "mixtral-offload", "moe-infinity", "fmoe"]
QUICK = {"train": 24, "heldout": 8, "new_tokens": 16}


@pytest.fixture(scope="module")
def demo(fmoe, tmp_path_factory):
    d = tmp_path_factory.mktemp("demo-json")
    p = fmoe("demo", "-o", d, "--json", "--quick")
    return d, json.loads(p.stdout), p.stderr


@pytest.fixture(scope="module")
def demo_text(fmoe, tmp_path_factory):
    d = tmp_path_factory.mktemp("demo-text")
    p = fmoe("demo", "-o", d, "--quick")
    return d, p.stdout, p.stderr


def trace_accesses(path):
    """Expert accesses of a trace replayed one request at a time (docs/design.md §7.1)."""
    import h5py
    import hdf5plugin  # noqa: F401  (registers the ecosystem's zstd filter)

    with h5py.File(path, "r") as f:
        chunk = int(f.attrs["prefill_chunk"])
        off = f["requests/token_offset"][:]
        pt = f["requests/prompt_tokens"][:]
        experts = f["tokens/experts"][:]
    total = 0
    for r in range(len(off) - 1):
        tok = experts[off[r]:off[r + 1]]
        its = [tok[c:min(c + chunk, pt[r])] for c in range(0, int(pt[r]), chunk)]
        its += [tok[t:t + 1] for t in range(int(pt[r]), len(tok))]
        for it in its:
            for l in range(tok.shape[1]):
                total += len(np.unique(it[:, l, :]))
    return total


def test_json_keeps_inspect_keys_and_adds_the_pipeline(demo):
    d, report, stderr = demo
    # part 1's keys (fmoe inspect of the FLAME-MoE sample) are still the top level
    assert report["num_layers"] == 8 and report["num_experts"] == 64
    assert report["requests"] == 8 and "predictability" in report
    t = report["fmoe_tiny"]
    assert t["train_prompts"] == QUICK["train"] and t["heldout_prompts"] == QUICK["heldout"]
    assert t["max_new_tokens"] == QUICK["new_tokens"]
    assert t["total_experts"] == 6 * 8
    assert t["cache_experts"] == round(0.25 * t["total_experts"])
    # progress on stderr
    assert "fmoe demo: serving the" in stderr


def test_files_exist_and_hold_the_split(demo):
    import h5py
    import hdf5plugin  # noqa: F401

    d, report, _ = demo
    files = report["fmoe_tiny"]["files"]
    for key in ("train_prompts", "heldout_prompts", "trace", "store", "heldout_trace",
                "simulate_json"):
        assert (d / files[key].split("/")[-1]).exists(), key
    assert not list(d.glob("*.partial"))

    prompts = [l for l in (REPO / "datasets/samples/prompts_100.txt").read_text().splitlines()
               if l.strip()]
    train = [json.loads(l)["prompt"] for l in open(files["train_prompts"])]
    held = [json.loads(l)["prompt"] for l in open(files["heldout_prompts"])]
    assert train == prompts[:QUICK["train"]]
    assert held == prompts[-QUICK["heldout"]:]

    for key, n in (("trace", QUICK["train"]), ("heldout_trace", QUICK["heldout"])):
        with h5py.File(files[key], "r") as f:
            assert f.attrs["format"] == "fmoe-trace"
            assert f["requests/id"].shape[0] == n
            assert (f["requests/output_tokens"][:] == QUICK["new_tokens"]).all()
            assert int(f.attrs["speculative_depth"]) == 1
    with h5py.File(files["store"], "r") as f:
        assert f.attrs["format"] == "fmoe-store"
        assert int(f.attrs["requests_used"]) == QUICK["train"]
    sim = json.load(open(files["simulate_json"]))
    assert [r["policy"] for r in sim["results"]] and \
        sorted(r["policy"] for r in sim["results"]) == sorted(POLICIES)


def test_best_policy_has_the_least_simulated_tpot(demo):
    _, report, _ = demo
    t = report["fmoe_tiny"]
    table = {r["policy"]: r for r in t["simulated"]}
    assert sorted(table) == sorted(POLICIES)
    # the table is simulate --json's figures
    sim = {r["policy"]: r for r in json.load(open(t["files"]["simulate_json"]))["results"]}
    for p, r in table.items():
        assert r["tpot_s"] == pytest.approx(sim[p]["tpot_s"]["mean"], rel=1e-12)
        assert r["hit_rate"] == pytest.approx(sim[p]["hit_rate"], rel=1e-12)
    best = table[t["best_policy"]]
    least = min(r["tpot_s"] for r in table.values())
    assert best["tpot_s"] == least
    tied = [r for r in table.values() if r["tpot_s"] == least]
    assert best["hit_rate"] == max(r["hit_rate"] for r in tied)


def test_live_runs_have_the_recorded_accesses(demo):
    _, report, _ = demo
    t = report["fmoe_tiny"]
    live = {r["policy"]: r for r in t["live"]}
    assert t["best_policy"] in live and "lru" in live
    expected = trace_accesses(t["files"]["heldout_trace"])
    assert t["simulated_accesses"] == expected
    table = {r["policy"]: r for r in t["simulated"]}
    for p, r in live.items():
        assert r["requests"] == QUICK["heldout"]
        assert r["hits"] + r["late_hits"] + r["misses"] == r["accesses"] == expected, p
        assert r["simulated_accesses"] == table[p]["accesses"] == expected, p
        assert 0 <= r["hit_rate"] <= 1 and r["hit_rate"] == pytest.approx(r["hits"] / expected)
        assert r["simulated_hit_rate"] == table[p]["hit_rate"]
        # max_tokens = recorded decode tokens + 1: every request decoded as recorded
        assert r["decode_tokens"] == QUICK["heldout"] * QUICK["new_tokens"]
        assert r["decode_ms_per_token"] > 0


def test_live_lru_hits_equal_simulated(demo):
    # no prefetch, demand loads only: residency does not depend on the copies' timing
    _, report, _ = demo
    t = report["fmoe_tiny"]
    lru_live = next(r for r in t["live"] if r["policy"] == "lru")
    lru_sim = next(r for r in t["simulated"] if r["policy"] == "lru")
    assert lru_live["hits"] == lru_sim["hits"]
    assert lru_live["misses"] == lru_sim["misses"]


def test_text_output_shows_every_step(demo_text):
    d, out, _ = demo_text
    for cmd in ("record", "build-store", "simulate"):
        assert f"\n$ fmoe {cmd} " in out, cmd
    table = out[out.index("$ fmoe simulate --trace " + str(d / "fmoe-tiny-heldout.h5")):]
    lines = table.splitlines()
    for p in POLICIES:
        assert any(l.startswith(p + " ") for l in lines), p
    best = next(l for l in lines if l.endswith("<- best")).split()[0]
    assert f"best by simulated decode TPOT: {best}" in out
    live = out[out.index("\nlive: "):]
    assert any(l.startswith(best + " ") for l in live.splitlines())
    assert any(l.startswith("lru ") for l in live.splitlines())
    assert "fmoe calibrate" in live
    by_hand = out[out.index("the same by hand:"):].splitlines()[1:6]
    assert [l.split()[1] for l in by_hand] == ["record", "build-store", "record", "simulate",
                                              "serve"]
    assert f"--policy {best}" in by_hand[4]


def test_failure_is_one_line_and_no_json(fmoe, tmp_path):
    import os

    env = dict(os.environ, FMOE_BUNDLED_MODEL=str(tmp_path / "nowhere"))
    p = fmoe("demo", "-o", tmp_path / "out", "--json", "--quick", "-q", check=False, env=env)
    assert p.returncode == 1
    assert p.stdout == ""
    assert len(p.stderr.strip().splitlines()) == 1 and "fmoe-tiny" in p.stderr
    assert not list((tmp_path / "out").glob("*.partial"))
