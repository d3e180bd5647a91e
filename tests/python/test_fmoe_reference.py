"""`fmoe simulate --policy fmoe` against the independent Python reference
(reference_fmoe.py): the executor with prefetch timing and the fMoE policy with a frozen
store, on random topic-structured traces written with h5py. Hits, late hits, misses,
prefetches and prefetch hits must be identical at several cache sizes, prefetch
distances and matcher delays, with and without semantic embeddings, for fmoe
(similarity-aware delta), fmoe-map-t (trajectory only, K experts per map), fmoe-map-ts
(and semantic search), fmoe-lru and fmoe-lfu (fmoe's prefetching with LRU / LFU
eviction).
"""
import json
import random

import h5py
import numpy as np
import pytest

from conftest import FULL_TIER, FULL_TIER_ONLY
from reference_fmoe import (costs_from_profile, read_store_maps, read_store_semantic,
                            read_trace, replay)
from test_simulate_reference import write_trace

PROFILE = {"format": "fmoe-hardware", "version": 1, "name": "test-box",
           "link": {"alpha_s": 2e-5, "beta_bytes_per_s": 2e10},
           "compute": {"attention_s": {"base": 3e-5, "per_token": 1e-6,
                                       "per_token_context": 1e-8},
                       "expert_s": {"base": 2e-5, "per_token": 5e-7}}}


# (policy, delta, eviction, semantic search)
# (policy, delta, eviction, semantic, feedback): fmoe is fmoe-paper with feedback-directed
# prefetching in the executor and eviction by whichever of p x freq and recency its shadow
# directories say missed less lately
VARIANTS = [("fmoe", True, "duel", True, True), ("fmoe-paper", True, "pfreq", True, False),
            ("fmoe-map-t", False, "pfreq", False, False),
            ("fmoe-map-ts", False, "pfreq", True, False), ("fmoe-lru", True, "lru", True, False),
            ("fmoe-lfu", True, "lfu", True, False)]


def topic_trace(path, rng, R, L, J, K, topk_only=False, h=0, topics=4):
    """R requests (prompt 1-10, 0-24 decode tokens), each about one of `topics` routing
    patterns: full gate distributions (softmax of a topic's logits plus noise), the top K
    chosen; with topk_only the chosen experts' weights only, the rest 0; with h > 0,
    semantic embeddings (the topic's direction plus noise)."""
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    logits = nrng.normal(0, 2.0, size=(topics, L, J))
    dirs = nrng.normal(0, 1.0, size=(topics, max(h, 1)))
    reqs, probs, sems = [], [], []
    for _ in range(R):
        P, D = rng.randint(1, 10), rng.randint(0, 24)
        tp = rng.randrange(topics)
        z = logits[tp][None] + nrng.normal(0, 1.0, size=(P + D, L, J))
        p = np.exp(z - z.max(axis=2, keepdims=True))
        p /= p.sum(axis=2, keepdims=True)
        p = p.astype(np.float32)
        ex = np.argsort(-p, axis=2, kind="stable")[:, :, :K]
        if topk_only:
            keep = np.zeros_like(p)
            np.put_along_axis(keep, ex, np.take_along_axis(p, ex, axis=2), axis=2)
            p = keep
        reqs.append((P, ex.tolist()))
        probs.append(p)
        sems.append((dirs[tp][None] + nrng.normal(0, 0.8, size=(P + D, max(h, 1))))
                    .astype(np.float32))
    write_trace(path, reqs, L, J, K, expert_bytes=1 << 20)
    with h5py.File(path, "r+") as f:
        f.attrs["probs_kind"] = "topk" if topk_only else "full"
        f.create_dataset("tokens/probs", data=np.concatenate(probs))
        if h:
            f.attrs["semantic_dim"] = np.int32(h)
            f.attrs["semantic_kind"] = "test"
            f.create_dataset("tokens/semantic", data=np.concatenate(sems))


# Two cases in the quick tier cover both kinds of probabilities and semantic rows or none;
# the full tier adds other shapes (J = 16 and 12, K = 3, h = 37). The Python replays take
# most of the time: the quick tier checks each distance at one matcher delay (d = 1 without,
# d = 2 with), the full tier both delays at both distances.
@pytest.mark.parametrize("seed,L,J,K,topk,h", [
    (1, 6, 8, 2, False, 0), pytest.param(2, 5, 16, 2, False, 37, marks=FULL_TIER_ONLY),
    pytest.param(3, 4, 12, 3, True, 0, marks=FULL_TIER_ONLY), (4, 6, 8, 2, True, 64)])
def test_fmoe_hits_equal_the_reference(fmoe, tmp_path, seed, L, J, K, topk, h):
    rng = random.Random(seed)
    store_trace, trace = tmp_path / "s.h5", tmp_path / "t.h5"
    topic_trace(store_trace, rng, 30, L, J, K, topk, h)
    topic_trace(trace, rng, 12, L, J, K, topk, h)
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps(PROFILE))
    t = read_trace(trace)
    costs = costs_from_profile(PROFILE, t["expert_bytes"])
    compared = feedback_mattered = duel_mattered = 0
    for d in (1, 2):
        store = tmp_path / f"store-d{d}.h5"
        fmoe("build-store", "--trace", store_trace, "--capacity", "40",
             "--prefetch-distance", str(d), "-o", store, "--quiet")
        maps = read_store_maps(store)
        sem = read_store_semantic(store)
        assert maps.shape[1:] == (L, J) and maps.shape[0] == 40
        assert (sem is None) == (h == 0)
        for delay in (0.0, 1e-4) if FULL_TIER else ((0.0,) if d == 1 else (1e-4,)):
            caches = [L * J // 8, L * J // 3, L * J // 2]
            out = fmoe("simulate", "--trace", trace, "--store", store, "--policy",
                       ",".join(v[0] for v in VARIANTS), "--cache-experts", ",".join(map(str, caches)),
                       "--prefetch-distance", str(d), "--profile", prof, "--match-delay",
                       repr(delay), "--json", "--quiet")
            got = {(r["policy"], r["cache_experts"]): r
                   for r in json.loads(out.stdout)["results"]}
            for N in caches:
                for policy, delta, evict, semantic, fb in VARIANTS:
                    want = replay(t, maps, N, d, costs, delay, delta=delta, eviction=evict,
                                  semantic=semantic, store_sem=sem, feedback=fb)
                    r = got[(policy, N)]
                    have = {k: r[k] for k in want}
                    assert have == want, (policy, N, d, delay)
                    assert want["prefetches"] > 0
                    compared += 1
                    if evict == "duel" and want != replay(
                            t, maps, N, d, costs, delay, delta=delta, eviction="pfreq",
                            semantic=semantic, store_sem=sem, feedback=fb):
                        duel_mattered += 1  # its recency branch was taken and checked
                if got[("fmoe", N)]["prefetches"] != got[("fmoe-paper", N)]["prefetches"]:
                    feedback_mattered += 1
    assert compared == (12 if FULL_TIER else 6) * len(VARIANTS)
    assert feedback_mattered > 0  # the feedback's own decisions were checked too
    assert duel_mattered > 0
