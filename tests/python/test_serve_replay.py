"""`fmoe simulate --batch trace`: a served run replayed decision for decision.

`fmoe serve --trace-out` records each token's batched pass (/tokens/served_iteration).
The simulator rebuilds the passes from it, in the engine's order (runtime/serve/
serve_engine.c: per pass the decode tokens, then the prompt chunks, each in admission
order = /requests/id; a request starts for the policy just before its first rows and ends
right after its last, those of one pass in admission order), and must then make the very
decisions the live server made: `fmoe compare-logs live sim --late-is-hit` exits 0.

What is timing-dependent is held fixed as in test_offload_live.py: the server waits for
every transfer where completions become visible (--sync-transfers), the simulator's link
takes no time (zero.json), and hit versus late hit is one outcome (--late-is-hit).

The run must really batch (some pass holds rows of two requests, prompts longer than the
64-token budget share passes with decode tokens), and a wrong replay of the same trace
(the simulator's own scheduler, or one request at a time) must differ, so the test can
fail.

With another budget (--batch-tokens 16 and 256) the served passes must follow the rule
exactly (checked here from the trace alone: decode tokens, then prompt chunks oldest
admitted first, each min(prompt left, budget left)), the trace must say the budget
(prefill_chunk), `simulate --batch B` must schedule with it, and the replay of the passes
must again make the live decisions.
"""
import concurrent.futures
import json

import numpy as np
import pytest

h5py = pytest.importorskip("h5py")
import hdf5plugin  # noqa: F401,E402  (registers the zstd filter with h5py)

from conftest import REPO, run_fmoe  # noqa: E402
from serve_util import Server  # noqa: E402
from test_offload_live import ZERO_LINK  # noqa: E402

TINY = REPO / "datasets" / "fmoe-tiny"
LINES = (REPO / "datasets" / "samples" / "prompts_100.txt").read_text().splitlines()
CACHE = 16  # of 6 x 8 = 48 routed experts


def prompts():
    """8 prompts of different lengths: four short, four of several lines (> 64 tokens,
    so they run in chunks beside other requests' decode tokens)."""
    short = LINES[:4]
    long = [" ".join(LINES[4 + 9 * i:4 + 9 * i + 7 + 2 * i]) for i in range(4)]
    return [p for pair in zip(short, long) for p in pair]


run = run_fmoe  # conftest's


@pytest.fixture(scope="module")
def work(tmp_path_factory, fmoe_bin):
    d = tmp_path_factory.mktemp("replay")
    (d / "zero.json").write_text(json.dumps(ZERO_LINK))
    # a store for the fmoe policy, from an all-resident recording of other prompts
    other = d / "other.txt"
    other.write_text("\n".join(LINES[40:70]) + "\n")
    run(fmoe_bin, "record", "--model", TINY, "--dataset", other, "--max-new-tokens", 16,
        "--temperature", 0, "--probs-f32", "-o", d / "store-src.h5", "--quiet")
    run(fmoe_bin, "build-store", "--trace", d / "store-src.h5", "-o", d / "store.h5",
        "--prefetch-distance", 1, "--quiet")
    return d


def policy_args(work, policy):
    store = ["--store", work / "store.h5"] if policy == "fmoe" else []
    return ["--policy", policy, "--cache-experts", CACHE, "--prefetch-distance", 1, *store]


def serve(work, policy, batch_tokens=None):
    """Serves the 8 prompts concurrently; (trace, live decision log)."""
    tag = policy if batch_tokens is None else f"{policy}-bt{batch_tokens}"
    trace, live = work / f"{tag}.h5", work / f"{tag}-live.jsonl"
    budget = [] if batch_tokens is None else ["--batch-tokens", batch_tokens]
    # default float16 gate probabilities: the live policy is handed them as the trace stores
    # them (it once needed --probs-f32, or fmoe's match scores shifted in the replay)
    s = Server(work, "--parallel", 4, *budget, *policy_args(work, policy), "--sync-transfers",
               "--sync-predictions", "--decision-log", live, "--trace-out", trace)
    lengths = [16, 24, 18, 20, 22, 17, 24, 19]
    try:
        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            res = list(ex.map(lambda pm: s.complete(pm[0], max_tokens=pm[1], ignore_eos=True),
                              zip(prompts(), lengths)))
    finally:
        rc, err = s.stop()
    assert rc == 0, err
    assert [r["usage"]["completion_tokens"] for r in res] == lengths
    return trace, live


def simulate(fmoe_bin, work, trace, policy, log, batch, *extra):
    return run(fmoe_bin, "simulate", "--trace", trace, "--batch", batch, *extra,
               *policy_args(work, policy), "--profile", work / "zero.json",
               "--decision-log", log, "--quiet", "--json")


def compare(fmoe_bin, a, b):
    p = run(fmoe_bin, "compare-logs", a, b, "--late-is-hit", "--json", check=False)
    assert p.returncode in (0, 1), p.stderr
    return p.returncode, json.loads(p.stdout)


def check_batched(trace):
    """Some pass holds rows of several requests, and prompts ran in several chunks."""
    with h5py.File(trace) as f:
        assert int(f.attrs["served"]) == 1
        off = f["requests/token_offset"][:]
        pt = f["requests/prompt_tokens"][:]
        ids = f["requests/id"][:]
        assert sorted(ids.tolist()) == list(range(8))
        it = f["tokens/served_iteration"][:]
    owners = {}
    for r in range(len(pt)):
        for p in np.unique(it[off[r]:off[r + 1]]):
            owners.setdefault(int(p), set()).add(r)
    assert max(len(v) for v in owners.values()) >= 2, "no pass ran two requests"
    assert (pt > 64).any()
    # a long prompt's chunk in the same pass as another request's decode token
    mixed = False
    for r in np.flatnonzero(pt > 64):
        for p in np.unique(it[off[r]:off[r] + pt[r]]):
            mixed |= len(owners[int(p)]) >= 2
    assert mixed


@pytest.mark.parametrize("policy", ["lru", "mixtral-offload", "fmoe"])
def test_served_run_replays_decision_for_decision(work, fmoe_bin, policy):
    trace, live = serve(work, policy)
    check_batched(trace)
    check_budget_rule(trace, 64)  # the default --batch-tokens
    sim = work / f"{policy}-sim.jsonl"
    out = json.loads(simulate(fmoe_bin, work, trace, policy, sim, "trace").stdout)
    assert out["batch_source"] == "trace" and out["batch"] >= 2
    rc, res = compare(fmoe_bin, live, sim)
    assert rc == 0 and res["identical"] is True, res
    accesses = sum(1 for x in live.read_text().splitlines() if '"access"' in x)
    assert accesses > 300
    # a replay that batches otherwise makes other decisions: the test can fail
    for wrong in ("1", "4"):
        bad = work / f"{policy}-sim-batch{wrong}.jsonl"
        simulate(fmoe_bin, work, trace, policy, bad, wrong)
        rc, res = compare(fmoe_bin, live, bad)
        assert rc == 1 and res["identical"] is False, wrong


def check_budget_rule(trace, budget):
    """The served passes follow serve_engine.c's rule with `budget` tokens, re-derived from
    the trace: per pass, one decode token of every running request past its prompt, then
    prompt chunks of the admitted requests still prefilling, in admission order (= id),
    each min(prompt left, budget left). Requests of a lower id than one already started
    were admitted (FIFO) and so count even before their first rows. @return the passes'
    token counts."""
    with h5py.File(trace) as f:
        assert int(f.attrs["prefill_chunk"]) == budget
        off = f["requests/token_offset"][:]
        pt = f["requests/prompt_tokens"][:]
        ids = f["requests/id"][:]
        it = f["tokens/served_iteration"][:]
    R = len(pt)
    by_id = sorted(range(R), key=lambda r: ids[r])
    rows = {r: it[off[r]:off[r + 1]] for r in range(R)}
    first = {r: int(rows[r][0]) for r in range(R)}
    last = {r: int(rows[r][-1]) for r in range(R)}
    sizes = []
    for p in sorted({int(x) for x in it}):
        # rows each request ran in p, and its rows before p
        n = {r: int((rows[r] == p).sum()) for r in range(R)}
        fed = {r: int((rows[r] < p).sum()) for r in range(R)}
        started = max(ids[r] for r in range(R) if first[r] <= p)
        running = [r for r in by_id if ids[r] <= started and last[r] >= p]
        left = budget
        for r in running:  # decode tokens first
            if fed[r] >= pt[r]:
                assert n[r] == 1, (p, int(ids[r]))
                left -= 1
        assert left >= 0
        for r in running:  # then prompt chunks, oldest admitted first
            if fed[r] < pt[r]:
                want = min(int(pt[r]) - fed[r], left)
                assert n[r] == want, (p, int(ids[r]), n[r], want)
                left -= want
        assert sum(n.values()) == budget - left
        sizes.append(budget - left)
    return sizes


@pytest.mark.parametrize("batch_tokens", [16, 256])
def test_served_run_with_another_budget_replays_decision_for_decision(work, fmoe_bin,
                                                                      batch_tokens):
    policy = "lru"
    trace, live = serve(work, policy, batch_tokens)
    sizes = check_budget_rule(trace, batch_tokens)
    assert max(sizes) == batch_tokens if batch_tokens == 16 else max(sizes) > 64
    # the simulator's own scheduler takes the budget from the trace
    out = json.loads(simulate(fmoe_bin, work, trace, policy, work / "own.jsonl", "4").stdout)
    assert out["batch_tokens"] == batch_tokens
    # more sequences than the trace's budget holds: refused, naming the way out
    p = run(fmoe_bin, "simulate", "--trace", trace, "--batch", batch_tokens + 1,
            "--cache-experts", CACHE, "--quiet", check=False)
    assert p.returncode == 2 and "give --batch-tokens" in p.stderr, p.stderr
    sim = work / f"{policy}-bt{batch_tokens}-sim.jsonl"
    out = json.loads(simulate(fmoe_bin, work, trace, policy, sim, "trace").stdout)
    assert out["batch_source"] == "trace" and out["batch"] >= 2
    rc, res = compare(fmoe_bin, live, sim)
    assert rc == 0 and res["identical"] is True, res


def test_batch_trace_needs_a_served_trace(work, fmoe_bin):
    p = run(fmoe_bin, "simulate", "--trace", work / "store-src.h5", "--batch", "trace",
            "--cache-experts", CACHE, "--quiet", check=False)
    assert p.returncode == 1
    assert len(p.stderr.strip().splitlines()) == 1 and "--batch trace" in p.stderr
    p = run(fmoe_bin, "simulate", "--trace", work / "store-src.h5", "--batch", "tracex",
            "--cache-experts", CACHE, "--quiet", check=False)
    assert p.returncode == 2 and "--batch" in p.stderr


@pytest.mark.parametrize("args,what", [
    (["--parallel", "8", "--batch-tokens", "4"], "--parallel 8 exceeds --batch-tokens 4"),
    (["--parallel", "65"], "--parallel 65 exceeds --batch-tokens 64"),  # the default budget
    (["--batch-tokens", "0"], "--batch-tokens"),
    (["--batch-tokens", "8193"], "--batch-tokens"),
])
def test_serve_batch_tokens_usage_errors(tmp_path, fmoe_bin, args, what):
    """Refused before listening: one line, exit 2, no trace started."""
    trace = tmp_path / "t.h5"
    p = run(fmoe_bin, "serve", "--port", 0, *args, "--trace-out", trace, check=False)
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1 and what in p.stderr, p.stderr
    assert list(tmp_path.iterdir()) == []
