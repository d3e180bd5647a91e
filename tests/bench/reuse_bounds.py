"""What knowledge closes how much of the LRU -> Belady hit gap on a trace (docs/results.md,
"Where the rest of the gap is"): the ceiling of each kind of next-use estimate.

    .venv/bin/python tests/bench/reuse_bounds.py TRACE.h5 [--store STORE.h5]
        [--shares 0.1,0.25,0.5,0.75] [--json OUT]

Plain Python, independent of the C policies (the access sequence and the LRU and Belady
counts come from tests/python/reference_cache.py). With --store, only the requests the
store held out are replayed, in trace order, as `fmoe simulate --holdout` does. Each rule
below is Belady's rule (the victim: furthest predicted next use, ties to the least
recently used) fed a different knowledge of the future, so its hit count is what a
perfect estimate of that kind would get, not what an online one does:

  freq-all      every expert's access count over the whole replay, known in advance: the
                best a per-expert popularity statistic can know (the victim has the fewest)
  freq-request  the current request's access counts of each expert, known in advance: the
                best a request-level rate (MoE-Infinity §4.2's activation matrix, the
                `request` estimate of predicted-reuse) can know
  freq-train    (with --store) every expert's access count over the requests the store was
                built from, not the replayed ones: popularity learned on other requests, a
                rule an online policy could run
  rate-online   predicted-reuse's estimate=rate without its guard: the request-level rate
                formed online (w = 4 iterations of the all-requests rate), ranked by rate
                alone with no recency term, the current layer's experts still to come (its
                gate's choice) last: what is left of freq-request once it must be learned
  ahead-0       the true next uses that fall in the rest of the current iteration: what a
                perfect next-layer predictor (speculative gates, promoe's and duoserve's
                learned predictors) can tell; an expert not needed there goes first, by LRU
  ahead-1, ahead-4  the same with the next 1 or 4 iterations also known (ahead-1 is a
                perfect prediction of the next token's routing at every layer)

Printed per cache size: hit rate and share of the LRU -> Belady hit gap of each, and the
misses Belady cannot avoid (first accesses of an expert in the replay).
"""
import argparse
import collections
import json
import pathlib
import sys

import h5py
import hdf5plugin  # noqa: F401  (registers the zstd filter the traces use)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
from reference_cache import hits, sequence  # noqa: E402

RULES = ["freq-all", "freq-request", "freq-train", "rate-online", "ahead-0", "ahead-1", "ahead-4"]
REQUEST_WEIGHT = 4  # predicted-reuse's request_weight default


def read_requests(trace, store=None, which="held_out_id"):
    """[(prompt_tokens, experts[T][L][K])] of the trace; with a store only the requests it
    held out (or, which="used_id", the ones it was built from)."""
    with h5py.File(trace) as f:
        off = f["requests/token_offset"][:]
        prompt = f["requests/prompt_tokens"][:]
        ids = f["requests/id"][:]
        experts = f["tokens/experts"][:]
        L, J = int(f.attrs["num_layers"]), int(f.attrs["num_experts"])
    keep = None
    if store:
        with h5py.File(store) as s:
            keep = set(int(x) for x in s["requests/" + which][:])
    reqs = [(int(prompt[r]), experts[off[r]:off[r + 1]].tolist()) for r in range(len(off) - 1)
            if keep is None or int(ids[r]) in keep]
    return L, J, reqs


def next_uses(seq):
    nxt, later = [float("inf")] * len(seq), {}
    for p in range(len(seq) - 1, -1, -1):
        nxt[p] = later.get(seq[p], float("inf"))
        later[seq[p]] = p
    return nxt


def bounded_hits(seq, iters, reqs, capacity, rule, train=None, J=1 << 30):
    """Hits of Belady's rule on the knowledge `rule` names (module docstring); `train`: the
    access counts of freq-train; expert ids are l * J + j."""
    nxt = next_uses(seq)
    total = collections.Counter(seq)
    per_request = collections.defaultdict(collections.Counter)
    for e, r in zip(seq, reqs):
        per_request[r][e] += 1
    window = int(rule.split("-")[1]) if rule.startswith("ahead") else 0
    # first access of each iteration, to find where the known window ends
    it_first, it_of = {}, iters
    for p, it in enumerate(iters):
        it_first.setdefault(it, p)
    ends = sorted(it_first.values()) + [len(seq)]
    end_of = {it: ends[i + 1] for i, it in enumerate(sorted(it_first))}
    last_it = max(it_first) if it_first else 0
    cache = {}  # expert -> [last access position, its next use]
    used_req, used_all = collections.Counter(), collections.Counter()
    req_iters = all_iters = 0
    n_hits = 0
    for p, e in enumerate(seq):
        if p == 0 or iters[p] != iters[p - 1]:
            if p == 0 or reqs[p] != reqs[p - 1]:
                used_req, req_iters = collections.Counter(), 0
            req_iters += 1
            all_iters += 1
        if e in cache:
            n_hits += 1
        elif len(cache) >= capacity:
            if rule == "freq-all":
                key = lambda x: (total[x], cache[x][0])  # noqa: E731
            elif rule == "freq-train":
                key = lambda x: (train[x], cache[x][0])  # noqa: E731
            elif rule == "freq-request":
                key = lambda x: (per_request[reqs[p]][x], cache[x][0])  # noqa: E731
            elif rule == "rate-online":
                def key(x):  # the current layer's experts still to come last (the gate's)
                    q = cache[x][1]
                    if x // J == seq[p] // J and q < len(seq) and iters[q] == iters[p]:
                        return (1, -q, 0)
                    prior = used_all[x] / all_iters
                    return (0, (used_req[x] + REQUEST_WEIGHT * prior) /
                            (req_iters + REQUEST_WEIGHT), cache[x][0])
            else:
                horizon = end_of[min(it_of[p] + window, last_it)]

                def key(x):  # not needed in the window first (LRU), then the furthest
                    q = cache[x][1]
                    return (0, cache[x][0]) if q >= horizon else (1, -q)
            del cache[min(cache, key=key)]
        cache[e] = [p, nxt[p]]
        used_req[e] += 1
        used_all[e] += 1
    return n_hits


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=pathlib.Path)
    ap.add_argument("--store", type=pathlib.Path, help="replay only the requests it held out")
    ap.add_argument("--shares", default="0.1,0.25,0.5,0.75")
    ap.add_argument("--json", type=pathlib.Path)
    a = ap.parse_args()
    L, J, requests = read_requests(a.trace, a.store)
    seq, iters, reqs = sequence(requests)
    seq = [l * J + j for l, j in seq]
    rules = RULES if a.store else [r for r in RULES if r != "freq-train"]
    train = None
    if a.store:
        train = collections.Counter(l * J + j for l, j in
                                    sequence(read_requests(a.trace, a.store, "used_id")[2])[0])
    n = len(seq)
    print(f"{a.trace.name}: {len(requests)} requests, {n} accesses, "
          f"{len(set(seq))} first accesses (misses no rule avoids)")
    out = []
    for share in map(float, a.shares.split(",")):
        c = max(1, round(share * L * J))
        got = {"lru": hits(seq, c, "lru"), "belady": hits(seq, c, "belady")}
        got.update({r: bounded_hits(seq, iters, reqs, c, r, train, J) for r in rules})
        lo, hi = got["lru"], got["belady"]
        share_of = {r: (h - lo) / (hi - lo) if hi > lo else float("nan") for r, h in got.items()}
        print(f"cache {c:>5} ({share:.0%}): " + "  ".join(
            f"{r} {h / n * 100:.1f}% ({share_of[r] * 100:.0f}%)" for r, h in got.items()),
            flush=True)
        out.append({"cache_experts": c, "share": share, "accesses": n, "hits": got,
                    "hit_gap_closed": share_of})
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
