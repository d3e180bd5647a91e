"""`fmoe simulate --gap-split` (docs/simulating.md#the-gap-to-belady-in-parts): each
policy's gap to belady at the same cache size, in accesses, split into parts that sum to it.

    gap      = belady's hits - the policy's hits
    late     = the policy's late hits (a prefetch in flight when the compute started)
    wrong    = misses of an expert whose last eviction made room for a prefetch that had not
               been used by the time of the miss
    eviction = gap - late - wrong (what a better eviction would have avoided; negative where
               prefetching saved more than it cost)

Two traces small enough to work out by hand, with mixtral-offload (it prefetches exactly
what the trace's speculative rows say) at N = 2 slots, one per layer (its per-layer share).
One request of decode tokens, L = 2 layers of J = 3 experts, top-1; every token uses
expert 0 in both layers, so belady misses only the two cold loads. `spec` is the layer-1
expert the speculative row at layer 0 predicts.

Trace A, transfers take no time, spec = 2, 1, 0, 0 over four tokens:
  t0  layer-0 gate: prefetch (1,2) into the free slot. (0,0) miss (cold). (1,0) miss
      (cold); its layer's slot holds (1,2), evicted by the demand load.
  t1  gate: prefetch (1,1), evicting (1,0) (layer 1's only expert). (0,0) hit. (1,0) miss:
      displaced by the prefetch of (1,1), unused so far -> a wrong prefetch's miss.
  t2, t3  spec (1,0) is cached: nothing issued; all four accesses hit.
  mixtral-offload: 5 hits, 3 misses, 0 late; belady: 6 hits (2 cold misses).
  gap 1 = eviction 0 + wrong 1 + late 0.
Trace B, every transfer takes 1 s (compute microseconds), spec = 0, 0 over two tokens:
  t0  gate: prefetch (1,0) queued; (0,0) misses and its demand load goes first (0-1 s), the
      prefetch follows (1-2 s); layer 1 starts at ~1 s with (1,0) in flight -> late.
  t1  both hit.
  mixtral-offload: 2 hits, 1 late, 1 miss; belady: 2 hits.
  gap 0 = eviction -1 + wrong 0 + late 1 (the prefetch turned a cold miss into a late hit).
Also: for a policy without prefetching the gap is all eviction and equals belady's hits
minus the policy's as the independent Python replay (reference_cache.py) counts them; the
flag refuses --decision-log (it adds belady beside the policy) and --sweep-out (the count
is not part of a sweep line).
"""
import json
import random

import numpy as np

from reference_cache import hits, sequence
from test_simulate_reference import random_requests, write_trace


def profile(path, alpha_s):
    path.write_text(json.dumps({
        "format": "fmoe-hardware", "version": 1, "name": "test", "source": "test",
        "link": {"alpha_s": alpha_s, "beta_bytes_per_s": 1e30},
        "compute": {"attention_s": {"base": 1e-4, "per_token": 1e-6, "per_token_context": 0.0},
                    "expert_s": {"base": 1e-5, "per_token": 1e-6}}}))
    return path


def spec_trace(path, spec):
    """One decode request, expert 0 at both layers every token; spec[t]: the layer-1 expert
    the speculative row of token t at layer 0 predicts."""
    T = len(spec)
    rows = np.zeros((T, 2, 1, 3), dtype=np.float32)
    for t, s in enumerate(spec):
        rows[t, 0, 0, s] = 1.0
        rows[t, 1, 0, 0] = 1.0
    write_trace(path, [(0, [[[0], [0]] for _ in range(T)])], 2, 3, 1, speculative=rows)
    return path


def split(fmoe, trace, prof, policy="mixtral-offload", cache=2):
    p = fmoe("simulate", "--trace", trace, "--policy", policy, "--cache-experts", cache,
             "--gap-split", "--profile", prof, "--json", "--quiet")
    res = {r["policy"]: r for r in json.loads(p.stdout)["results"]}
    assert "gap_split" not in res["belady"]
    return res[policy], res["belady"]


def test_trace_a_wrong_prefetch(fmoe, tmp_path):
    r, b = split(fmoe, spec_trace(tmp_path / "a.h5", [2, 1, 0, 0]),
                 profile(tmp_path / "zero.json", 0.0))
    assert (r["hits"], r["misses"], r["late_hits"], b["hits"]) == (5, 3, 0, 6)
    assert r["gap_split"] == {"belady_hits": 6, "total": 1, "eviction": 0,
                              "wrong_prefetch": 1, "late_prefetch": 0}


def test_trace_b_late_prefetch(fmoe, tmp_path):
    r, b = split(fmoe, spec_trace(tmp_path / "b.h5", [0, 0]),
                 profile(tmp_path / "slow.json", 1.0))
    assert (r["hits"], r["misses"], r["late_hits"], b["hits"]) == (2, 1, 1, 2)
    assert r["gap_split"] == {"belady_hits": 2, "total": 0, "eviction": -1,
                              "wrong_prefetch": 0, "late_prefetch": 1}


def test_no_prefetch_gap_is_eviction(fmoe, tmp_path):
    rng = random.Random(5)
    reqs = random_requests(rng, 8, 3, 12, 2)
    trace = tmp_path / "r.h5"
    write_trace(trace, reqs, 3, 12, 2)
    seq = sequence(reqs)[0]
    p = fmoe("simulate", "--trace", trace, "--policy", "lru,predicted-reuse",
             "--cache-experts", "4,9", "--gap-split", "--json", "--quiet")
    for r in json.loads(p.stdout)["results"]:
        if r["policy"] == "belady":
            continue
        g, c = r["gap_split"], r["cache_experts"]
        assert g["total"] == hits(seq, c, "belady") - r["hits"]
        assert (g["eviction"], g["wrong_prefetch"], g["late_prefetch"]) == (g["total"], 0, 0)
        if r["policy"] == "lru":
            assert g["total"] == hits(seq, c, "belady") - hits(seq, c, "lru")


def test_table_and_refusal(fmoe, tmp_path):
    trace = spec_trace(tmp_path / "a.h5", [2, 1, 0, 0])
    p = fmoe("simulate", "--trace", trace, "--policy", "mixtral-offload", "--cache-experts", 2,
             "--gap-split", "--profile", profile(tmp_path / "zero.json", 0.0), "--quiet")
    row = [x.split() for x in p.stdout.splitlines()[-2:]]
    assert row[-1][:2] == ["mixtral-offload", "2"] and row[-1][3:] == ["1", "0", "1", "0"]
    bad = fmoe("simulate", "--trace", trace, "--policy", "lru", "--cache-experts", 2,
               "--gap-split", "--decision-log", tmp_path / "x.jsonl", check=False)
    assert bad.returncode == 2 and "--gap-split" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    bad = fmoe("simulate", "--trace", trace, "--policy", "lru", "--cache-experts", 2,
               "--gap-split", "--sweep-out", tmp_path / "s.jsonl", check=False)
    assert bad.returncode == 2 and "--gap-split" in bad.stderr and "--sweep-out" in bad.stderr
