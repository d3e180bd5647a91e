"""Reference expert-cache replay following docs/design.md §7.1, independent of the C code.

accesses(experts, prompt_tokens) turns one request's routing ([T][L][K] chosen experts) into
that access sequence: one iteration for the prompt, one per decode token; per iteration
and layer, each distinct expert chosen by any token once, in order of first appearance.
sequence(requests) does it for many requests and also returns, per access, its iteration
and request index (needed by least-stale and moe-infinity-code).

hits(seq, capacity, policy, iters=None, reqs=None) replays the sequence through one of
  lru                least recently accessed goes
  lfu                fewest accesses since loaded goes, ties to the least recently accessed
  belady             next access furthest away goes (never = infinity), ties to LRU
  least-stale        (SpecMD) experts not accessed in the current iteration go first,
                     first-loaded first among them; FIFO among the rest when all are fresh
  moe-infinity-code  fewest hits since the request started (counted across residencies)
                     goes, ties to the least recently accessed
and returns the hit count. None of these prefetches, so the counts depend only on the
sequence (and its iteration / request boundaries) and the capacity.

Also the "straightforward Python" baseline of tests/bench/run_bench_simulate.sh:
`python3 reference_cache.py DUMP CAPACITY POLICY[,...]` replays the routing that
tests/bench/bench_simulate --dump wrote and prints hits and accesses per second.
"""
import sys
import time

POLICIES = ("lru", "lfu", "belady", "least-stale", "moe-infinity-code")


def accesses(experts, prompt_tokens):
    return sequence([(prompt_tokens, experts)])[0]


def sequence(requests):
    """requests: [(prompt_tokens, experts[T][L][K])] -> (seq, iters, reqs)."""
    seq, iters, reqs = [], [], []
    it_index = 0
    for r, (prompt_tokens, experts) in enumerate(requests):
        T = len(experts)
        L = len(experts[0]) if T else 0
        iterations = [range(0, prompt_tokens)] if prompt_tokens > 0 else []
        iterations += [range(t, t + 1) for t in range(prompt_tokens, T)]
        for it in iterations:
            for l in range(L):
                seen = []
                for t in it:
                    for j in experts[t][l]:
                        if (l, int(j)) not in seen:
                            seen.append((l, int(j)))
                seq.extend(seen)
                iters.extend([it_index] * len(seen))
                reqs.extend([r] * len(seen))
            it_index += 1
    return seq, iters, reqs


def hits(seq, capacity, policy, iters=None, reqs=None):
    assert capacity >= 1 and policy in POLICIES
    if policy == "least-stale":
        assert iters is not None
    if policy == "moe-infinity-code":
        assert reqs is not None
    nxt = [len(seq)] * len(seq)  # position of the next access to the same expert
    later = {}
    for p in range(len(seq) - 1, -1, -1):
        nxt[p] = later.get(seq[p], float("inf"))
        later[seq[p]] = p
    # expert -> [last access position, accesses since loaded, next access, load position]
    cache = {}
    visits = {}  # moe-infinity-code: hits since the request started
    n_hits = 0
    for p, e in enumerate(seq):
        if policy == "moe-infinity-code" and (p == 0 or reqs[p] != reqs[p - 1]):
            visits = {}
        if e in cache:
            n_hits += 1
            cache[e][1] += 1
            visits[e] = visits.get(e, 0) + 1
        else:
            if len(cache) >= capacity:
                if policy == "lru":
                    key = lambda x: cache[x][0]
                elif policy == "lfu":
                    key = lambda x: (cache[x][1], cache[x][0])
                elif policy == "belady":  # furthest next access, then least recently accessed
                    key = lambda x: (-cache[x][2], cache[x][0])
                elif policy == "least-stale":  # stale first, then first loaded
                    key = lambda x: (iters[cache[x][0]] == iters[p], cache[x][3])
                else:
                    key = lambda x: (visits.get(x, 0), cache[x][0])
                del cache[min(cache, key=key)]
            cache[e] = [p, 1, None, p]
        cache[e][0] = p
        cache[e][2] = nxt[p]
    return n_hits


def load_bench_dump(path):
    """The routing written by tests/bench/bench_simulate --dump: requests [(P, experts)]."""
    import struct
    with open(path, "rb") as f:
        assert f.read(8) == b"FMOEBNCH", f"{path}: not a bench_simulate dump"
        L, J, K, R, P, D = struct.unpack("<6i", f.read(24))
        T = P + D
        reqs = []
        for _ in range(R):
            flat = struct.unpack(f"<{T * L * K}H", f.read(2 * T * L * K))
            ex = [[list(flat[(t * L + l) * K:(t * L + l + 1) * K]) for l in range(L)]
                  for t in range(T)]
            reqs.append((P, ex))
    return reqs


if __name__ == "__main__":
    # python3 reference_cache.py DUMP CAPACITY POLICY[,POLICY...]
    path, cap, policies = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
    seq, iters, reqs = sequence(load_bench_dump(path))
    for policy in policies:
        t0 = time.perf_counter()
        h = hits(seq, cap, policy, iters, reqs)
        dt = time.perf_counter() - t0
        print(f"policy {policy} accesses {len(seq)} hits {h} seconds {dt:.3f} "
              f"accesses_per_s {len(seq) / dt:.1f}", flush=True)
