"""`fmoe simulate --batch B`: continuous batching as `fmoe serve --parallel B` runs it.

The schedule is re-derived here from its description, independently of the C code: FIFO
admission while fewer than B run; each iteration holds every running request's next decode
token (oldest admitted first, as fmoe serve orders them), then prompt chunks of the prefilling requests, oldest admitted first,
within the iteration's token budget (64, or --batch-tokens); a request leaves after its last row. Per layer, each distinct expert of
the iteration's concatenated rows is one access (docs/design.md §7.1). Hit counts of the
policies without prefetch must equal the Python reference replay of that sequence.
"""
import json
import random

import pytest

from reference_cache import hits
from test_simulate_reference import write_trace

BUDGET = 64  # tokens of one batched iteration (fmoe serve's default --batch-tokens)


def batched_sequence(requests, B, budget=BUDGET):
    """requests: [(prompt_tokens, experts[T][L][K])] -> the batched access sequence."""
    R = len(requests)
    queue = list(range(R))
    slots = [None] * B
    done = [0] * R  # rows run
    rank = {}
    seq = []
    while queue or any(s is not None for s in slots):
        while queue and sum(s is not None for s in slots) < B:
            q = queue.pop(0)
            rank[q] = len(rank)
            if len(requests[q][1]):
                slots[slots.index(None)] = q
        running = [q for q in slots if q is not None]
        items = [(q, 1) for q in sorted(running, key=rank.get) if done[q] >= requests[q][0]]
        left = budget - len(items)
        for q in sorted((q for q in running if done[q] < requests[q][0]), key=rank.get):
            if left <= 0:
                break
            n = min(requests[q][0] - done[q], left)
            items.append((q, n))
            left -= n
        rows = [requests[q][1][t] for q, n in items for t in range(done[q], done[q] + n)]
        for l in range(len(rows[0])):
            seen = []
            for row in rows:
                for j in row[l]:
                    if (l, int(j)) not in seen:
                        seen.append((l, int(j)))
            seq.extend(seen)
        for q, n in items:
            done[q] += n
        for b, q in enumerate(slots):
            if q is not None and done[q] == len(requests[q][1]):
                slots[b] = None
    return seq


def make_requests(rng, R, L, J, K, long_prompts=True):
    hot = [rng.sample(range(J), max(K, J // 3)) for _ in range(L)]
    reqs = []
    for _ in range(R):
        P = rng.choice([0, 1, 5, 20, 50, 90]) if long_prompts else rng.randint(1, 6)
        D = rng.randint(0, 12)
        if P + D == 0:
            D = 1
        ex = [[rng.sample(hot[l] if rng.random() < 0.7 else list(range(J)), K)
               for l in range(L)] for _ in range(P + D)]
        reqs.append((P, ex))
    return reqs


def run(fmoe, *args):
    p = fmoe("simulate", *map(str, args), "--json", "--quiet")
    return json.loads(p.stdout)


def test_batch_1_is_the_default(fmoe, tmp_path):
    rng = random.Random(1)
    reqs = make_requests(rng, 6, 2, 8, 2)
    trace = tmp_path / "t.h5"
    write_trace(trace, reqs, 2, 8, 2)
    args = ("--trace", trace, "--policy", "lru,belady,oracle", "--cache-experts", "3,6")
    assert run(fmoe, *args, "--batch", 1) == run(fmoe, *args)
    four = run(fmoe, *args, "--batch", 4)
    assert four["batch"] == 4 and all(r["batch"] == 4 for r in four["results"])
    table = fmoe("simulate", *map(str, args), "--batch", "4", "--quiet").stdout
    assert "batch 4 (continuous batching" in table


@pytest.mark.parametrize("seed,B,budget", [(2, 2, None), (3, 3, None), (4, 8, None),
                                           (5, 3, 7), (3, 3, 16), (4, 8, 256)])
def test_batched_accesses_and_hits_match_reference(fmoe, tmp_path, seed, B, budget):
    rng = random.Random(seed)
    L, J, K = rng.randint(1, 3), rng.randint(6, 16), rng.randint(1, 3)
    reqs = make_requests(rng, rng.randint(4, 10), L, J, K)
    trace = tmp_path / "t.h5"
    write_trace(trace, reqs, L, J, K)
    seq = batched_sequence(reqs, B, budget or BUDGET)
    if budget:  # another budget, another schedule: the option is not ignored
        assert seq != batched_sequence(reqs, B)
    caches = sorted({1, K + 1, L * J // 2})
    out = run(fmoe, "--trace", trace, "--policy", "lru,lfu,belady", "--cache-experts",
              ",".join(map(str, caches)), "--batch", B,
              *(["--batch-tokens", budget] if budget else []))
    assert out["batch_tokens"] == (budget or BUDGET)
    assert out["accesses"] == len(seq)
    for r in out["results"]:
        assert r["accesses"] == len(seq)
        assert r["hits"] == hits(seq, r["cache_experts"], r["policy"]), r["policy"]
        assert r["hits"] + r["misses"] == r["accesses"]


def test_batching_pays_when_loads_dominate(fmoe, tmp_path):
    rng = random.Random(6)
    L, J, K = 2, 8, 2
    reqs = make_requests(rng, 8, L, J, K, long_prompts=False)
    trace = tmp_path / "t.h5"
    write_trace(trace, reqs, L, J, K)
    prof = tmp_path / "p.json"  # compute is cheap next to a 1 MiB load (~1.1 ms)
    prof.write_text(json.dumps({
        "format": "fmoe-hardware", "version": 1, "name": "slow-link",
        "link": {"alpha_s": 1e-4, "beta_bytes_per_s": 1e9},
        "compute": {"attention_s": {"base": 1e-5, "per_token": 1e-7},
                    "expert_s": {"base": 1e-5, "per_token": 1e-7}}}))
    args = ("--trace", trace, "--cache-experts", 4, "--profile", prof)
    one = run(fmoe, *args)["results"][0]
    four = run(fmoe, *args, "--batch", 4)["results"][0]
    tokens = sum(len(e) for _, e in reqs)
    assert four["total_s"] < one["total_s"]
    assert tokens / four["total_s"] > tokens / one["total_s"]
    assert four["bytes_loaded"] < one["bytes_loaded"]
    # all requests wait from t = 0: the later ones queue for a slot
    assert four["queue_s"]["p99"] > 0


@pytest.mark.parametrize("value", ["0", "-2"])
def test_batch_below_1_is_a_usage_error(fmoe, tmp_path, value):
    rng = random.Random(7)
    reqs = make_requests(rng, 2, 1, 4, 1)
    trace = tmp_path / "t.h5"
    write_trace(trace, reqs, 1, 4, 1)
    p = fmoe("simulate", "--trace", trace, "--cache-experts", "2", "--batch", value,
             check=False)
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1 and "--batch" in p.stderr


@pytest.mark.parametrize("args,what", [
    (["--batch", "4", "--batch-tokens", "3"], "exceeds --batch-tokens"),
    (["--batch-tokens", "16"], "--batch-tokens is for --batch"),
    (["--batch", "trace", "--batch-tokens", "16"], "--batch-tokens is for --batch"),
    (["--batch", "2", "--batch-tokens", "0"], "--batch-tokens"),
])
def test_batch_tokens_usage_errors(fmoe, tmp_path, args, what):
    rng = random.Random(8)
    reqs = make_requests(rng, 2, 1, 4, 1)
    trace = tmp_path / "t.h5"
    write_trace(trace, reqs, 1, 4, 1)
    p = fmoe("simulate", "--trace", trace, "--cache-experts", "2", *args, check=False)
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1 and what in p.stderr
