"""A straightforward reference for `fmoe simulate --policy fmoe` with a frozen store
(offline mode), independent of the C code: the executor of
docs/design.md §7 (access model §7.1, one copy engine, demand loads before queued
prefetches, a prefetch may start only after the matcher's delay) and the fMoE policy of the
fMoE paper ("fMoE: Fine-Grained Expert Offloading for Large Mixture-of-Experts Serving",
§4.2-§4.5) with the choices lib/policies/fmoe.c documents where the paper is silent
(budget per target layer, protection of the current layer, a prefetch never evicts an
expert worth more than itself, pause on a miss).

Written from those descriptions, one access at a time in plain Python; the searches use
NumPy float32 arithmetic in the orders the matcher defines (lib/expertmap/matcher.c):
trajectory, per layer s = 0; s = s + m_j * r_j for j in order; d = d + s; the same for
the norms; key = d * |d| / n; the first entry of the largest key; semantic, 16 running
sums over the elements i, i + 16, ... folded 8, 4, 2, 1 apart, scaled by the float norms
of the query and the entry; so that the chosen maps are the same bits. Everything else (priorities, probabilities for eviction, time) is double, as
in the C code, and in the same order of operations, so the counts must be identical.

    replay(trace, maps, capacity, distance, costs, match_delay=0.0, delta=True)
        trace  dict from read_trace(path)
        maps   float32 [E, L, J] (the store's /maps)
        costs  dict: alpha, beta, expert_bytes, layer (base, per_token, per_token_context),
               expert (base, per_token)
        delta  similarity-aware selection (fmoe); False: K experts per map (fmoe-map-t/ts)
        semantic  semantic search for the first d layers when the trace and the store
               have embeddings (fmoe, fmoe-map-ts, fmoe-lru, fmoe-lfu; not fmoe-map-t)
        eviction  "pfreq" (fmoe), "lru" (fmoe-lru) or "lfu" (fmoe-lfu)
        -> dict of hits, late_hits, misses, prefetches, prefetch_hits

`python3 reference_fmoe.py TRACE STORE PROFILE N D [MATCH_DELAY]` replays one cell and
prints the counts and token-iterations per second (tests/bench/bench_fmoe_simulate.py
--python uses it as the "straightforward NumPy" baseline of docs/design.md §9).
"""
import json
import math
import sys
import time

import numpy as np

INF = float("inf")
MAX_QUERIES = 64


def _h5py():
    """h5py, with the zstd filter (id 32015) that fmoe writes by default registered."""
    import h5py
    import hdf5plugin  # noqa: F401  (registers zstd)
    return h5py


def read_trace(path):
    h5py = _h5py()
    with h5py.File(path, "r") as f:
        a = f.attrs
        t = {
            "L": int(a["num_layers"]), "J": int(a["num_experts"]), "K": int(a["top_k"]),
            "expert_bytes": int(a["expert_bytes"]),
            "prompt": np.asarray(f["requests/prompt_tokens"]).astype(int).tolist(),
            "output": np.asarray(f["requests/output_tokens"]).astype(int).tolist(),
            "offset": np.asarray(f["requests/token_offset"]).astype(int).tolist(),
            "experts": np.asarray(f["tokens/experts"]).astype(int),
            "probs": np.asarray(f["tokens/probs"]).astype(np.float32),
            "semantic": (np.asarray(f["tokens/semantic"]).astype(np.float32)
                         if "tokens/semantic" in f else None),
        }
    return t


def read_store_maps(path):
    h5py = _h5py()
    with h5py.File(path, "r") as f:
        return np.asarray(f["maps"], dtype=np.float32)


def read_store_semantic(path):
    """The store's embeddings [E, h], or None."""
    h5py = _h5py()
    with h5py.File(path, "r") as f:
        return np.asarray(f["semantic"], dtype=np.float32) if "semantic" in f else None


def semantic_search(x, sem):
    """(best entry, score) of query x against the embeddings sem [E, h]."""
    E, h = sem.shape
    H = (h + 15) // 16 * 16
    ep = np.zeros((E, H), dtype=np.float32)
    ep[:, :h] = sem
    xp = np.zeros(H, dtype=np.float32)
    xp[:h] = x
    acc = np.zeros((E, 16), dtype=np.float32)
    for k in range(0, H, 16):
        acc = acc + ep[:, k:k + 16] * xp[k:k + 16]
    for w in (8, 4, 2, 1):
        acc[:, :w] = acc[:, :w] + acc[:, w:2 * w]
    dot = acc[:, 0]
    n2 = 0.0
    for v in x:
        n2 += float(v) * float(v)
    rq = np.float32(1.0 / math.sqrt(n2)) if n2 > 0 else np.float32(0)
    best, best_score = -1, np.float32(0)
    for y in range(E):
        en = 0.0
        for v in sem[y]:
            en += float(v) * float(v)
        ny = np.float32(math.sqrt(en))
        sc = np.float32(np.float32(dot[y] * rq) / ny) if ny > 0 else np.float32(0)
        if best < 0 or sc > best_score:
            best, best_score = y, sc
    return best, float(best_score)


def iterations(t):
    """(first token, tokens, context) per iteration, per request: the prompt is one
    iteration, each output token one more (docs/design.md §7.1)."""
    out = []
    for r, p in enumerate(t["prompt"]):
        t0 = t["offset"][r]
        n = t["offset"][r + 1] - t0
        its = [(t0, min(p, n), min(p, n))] if p > 0 else []
        for i in range(p, n):
            its.append((t0 + i, 1, i + 1))
        out.append(its)
    return out


def select(p, score, k_min):
    """The fewest experts, most likely first (ties: lower index), whose probability
    reaches delta = clip(1 - score) of the row's positive mass; at least k_min."""
    J = len(p)
    k_min = min(k_min, J)
    total = 0.0
    for j in range(J):
        if p[j] > 0:
            total += float(p[j])
    delta = min(max(1.0 - score, 0.0), 1.0)
    threshold = delta * total * (1.0 - 1e-6)
    order = sorted(range(J), key=lambda j: (-float(p[j]), j))
    chosen, acc = [], 0.0
    for j in order:
        if not (len(chosen) < k_min or (acc < threshold and p[j] > 0)):
            break
        chosen.append(j)
        acc += float(p[j]) if p[j] > 0 else 0.0
    return chosen


def complete_row(row):
    """A row with zeros and less than all of the mass gives the rest to its zeros."""
    s = 0.0
    zeros = 0
    for v in row:
        s += float(v)
        zeros += v <= 0
    if zeros == 0 or s >= 1.0 - 1e-3:
        return row
    fill = np.float32((1.0 - s) / zeros)
    return np.where(row <= 0, fill, row).astype(np.float32)


def popularity(maps, K):
    E, L, J = maps.shape
    pop = np.zeros((L, J), dtype=np.int64)
    for y in range(E):
        for l in range(L):
            order = sorted(range(J), key=lambda j: (-float(maps[y, l, j]), j))
            for j in order[:K]:
                pop[l, j] += 1
    return pop


class Matcher:
    """Trajectory search, incremental, in the matcher's float32 arithmetic."""

    def __init__(self, maps):
        self.maps = maps

    def begin(self, nq):
        E = self.maps.shape[0]
        self.d = np.zeros((nq, E), dtype=np.float32)
        self.n = np.zeros(E, dtype=np.float32)
        self.qn2 = [0.0] * nq
        self.first = True

    def add(self, l, rows):
        m = self.maps[:, l, :]
        J = m.shape[1]
        t = np.zeros(m.shape[0], dtype=np.float32)
        for j in range(J):
            t = t + m[:, j] * m[:, j]
        self.n = t if self.first else self.n + t
        best, score = [], []
        for q, r in enumerate(rows):
            s = np.zeros(m.shape[0], dtype=np.float32)
            for j in range(J):
                s = s + m[:, j] * r[j]
            self.d[q] = s if self.first else self.d[q] + s
            n2 = 0.0
            for j in range(J):
                n2 += float(r[j]) * float(r[j])
            self.qn2[q] += n2
            d = self.d[q]
            with np.errstate(divide="ignore", invalid="ignore"):
                key = np.where(self.n > 0, (d * np.abs(d)) / self.n, np.float32(0))
            b = int(np.argmax(key)) if len(key) else -1
            best.append(b)
            if b >= 0 and self.n[b] > 0 and self.qn2[q] > 0:
                score.append(float(np.float32(float(d[b]) / math.sqrt(float(self.n[b]) * self.qn2[q]))))
            else:
                score.append(0.0)
        self.first = False
        return best, score


FEEDBACK_RANKS, FEEDBACK_WINDOW = 8, 128


def replay(t, maps, N, dist, costs, match_delay=0.0, delta=True, eviction="pfreq",
           semantic=True, store_sem=None, feedback=False):
    L, J, K = t["L"], t["J"], t["K"]
    experts, probs = t["experts"], t["probs"]
    E = maps.shape[0]
    pop = popularity(maps, K)
    alpha, beta, eb = costs["alpha"], costs["beta"], costs["expert_bytes"]
    xfer = alpha + eb / beta

    def layer_s(n, ctx):
        c = costs["layer"]
        return c["base"] + c["per_token"] * n + c.get("per_token_context", 0.0) * n * ctx

    def expert_s(n):
        c = costs["expert"]
        return c["base"] + c["per_token"] * n

    # ---- cache: slots, the free stack (slot 0 on top first), counts
    slot_expert = [-1] * N
    slot_state = [0] * N             # 0 free, 1 loading, 2 resident
    slot_last = [0] * N
    slot_acc = [0] * N               # accesses since loaded
    expert_slot = [-1] * (L * J)
    expert_acc = [0] * (L * J)
    free_stack = [N - 1 - s for s in range(N)]
    tick = [0]
    # ---- executor
    st = {"compute_free": 0.0, "engine_free": 0.0, "seq": 0, "now": 0.0}
    slot_free_at = [0.0] * N
    slot_ready_at = [0.0] * N
    prefetched = [False] * N
    queued = [False] * N
    queue = []                       # [slot, priority, seq, issued]
    inflight = []
    res = {"hits": 0, "late_hits": 0, "misses": 0, "prefetches": 0, "prefetch_hits": 0}
    # ---- policy
    P = {"cur_p": np.zeros((L, J), dtype=np.float32), "protect": [False] * J,
         "cur_layer": -1, "paused": False, "held": [], "prefetching": False,
         "incoming": 0.0}
    budget = max(K, N // (dist + 1))
    matcher = Matcher(maps)
    # ---- feedback-directed prefetching (lib/prefetch_feedback.c), written from its
    # description: per (layer, rank) accuracy of the predictions, the regret of evictions
    # and the link's use, all measured at the gates
    FB = {"pred": [[-1] * J for _ in range(L)], "made": [0] * L, "victim": [False] * (L * J),
          "right": [[0.0] * FEEDBACK_RANKS for _ in range(L)],
          "scored": [[0.0] * FEEDBACK_RANKS for _ in range(L)],
          "regrets": 0.0, "evictions": 0.0, "use": 0.0, "last_busy": 0.0, "last_now": 0.0,
          "busy_avg": 0.0, "time_avg": 0.0}
    st["busy"] = 0.0

    # ---- eviction "duel" (fmoe): shadow directories of N experts, one by recency, one by
    # p x freq, fed each layer's accesses at its gate; the real cache evicts by the rule
    # whose shadow missed less over the last ~256 misses (counts halved when together they
    # reach 256: a horizon counted in misses, as DIP's PSEL)
    DU = {"lru": [0] * (L * J), "pf": [0] * (L * J), "n_lru": 0, "n_pf": 0, "tick": 0,
          "miss_lru": 0.0, "miss_pf": 0.0}

    def shadow_access(stamp, nkey, by_pfreq, e):
        miss = stamp[e] == 0
        if miss and DU[nkey] == N:
            victim, vk = -1, 0.0
            for x in range(L * J):
                if not stamp[x]:
                    continue
                k = (keep(float(P["cur_p"][x // J, x % J]), float(expert_acc[x]) + 1.0)
                     if by_pfreq else float(stamp[x]))
                if victim < 0 or k < vk or (k == vk and stamp[x] < stamp[victim]):
                    victim, vk = x, k
            stamp[victim] = 0
            DU[nkey] -= 1
        if miss:
            DU[nkey] += 1
        stamp[e] = DU["tick"]
        return 1 if miss else 0

    def duel_observe(l, dist_e):
        for j in dist_e:
            e = l * J + j
            DU["tick"] += 1
            DU["miss_lru"] += shadow_access(DU["lru"], "n_lru", False, e)
            DU["miss_pf"] += shadow_access(DU["pf"], "n_pf", True, e)
            if DU["miss_lru"] + DU["miss_pf"] >= 256:
                DU["miss_lru"] /= 2
                DU["miss_pf"] /= 2

    def fb_predict(l, j):
        if FB["pred"][l][j] < 0:
            FB["pred"][l][j] = min(FB["made"][l], FEEDBACK_RANKS - 1)
            FB["made"][l] += 1
        return FB["pred"][l][j]

    def fb_admit(l, r):
        a = (FB["right"][l][r] + 1) / (FB["scored"][l][r] + 2)
        regret = (FB["regrets"] + 1) / (FB["evictions"] + 2)
        return a - FB["use"] - regret > 0

    def fb_gate(l, chosen):
        # early preemption: queued prefetches of layer l not chosen, in the order the C
        # queue array is scanned (from its end; a removal moves the last entry in)
        i = len(queue) - 1
        while i >= 0:
            s = queue[i][0]
            e = slot_expert[s]
            if e // J == l and (e % J) not in chosen:
                queue[i] = queue[-1]
                queue.pop()
                evict(s)
                prefetched[s] = queued[s] = False
            i -= 1
        dt = st["now"] - FB["last_now"]
        if dt > 0:  # busy and elapsed time averaged apart: u is a share of time
            w = 1.0 / (L + 1)
            FB["busy_avg"] += w * ((st["busy"] - FB["last_busy"]) - FB["busy_avg"])
            FB["time_avg"] += w * (dt - FB["time_avg"])
            u = FB["busy_avg"] / FB["time_avg"]
            FB["use"] = 0.0 if u < 0 else 1.0 if u > 1 else u
        FB["last_busy"], FB["last_now"] = st["busy"], st["now"]
        for j in range(J):
            r = FB["pred"][l][j]
            if r >= 0:
                FB["right"][l][r] += 1 if j in chosen else 0
                FB["scored"][l][r] += 1
                if FB["scored"][l][r] >= FEEDBACK_WINDOW:
                    FB["right"][l][r] /= 2
                    FB["scored"][l][r] /= 2
                FB["pred"][l][j] = -1
            if FB["victim"][l * J + j]:
                FB["regrets"] += 1 if j in chosen else 0
                FB["evictions"] += 1
                if FB["evictions"] >= FEEDBACK_WINDOW:
                    FB["regrets"] /= 2
                    FB["evictions"] /= 2
                FB["victim"][l * J + j] = False
        FB["made"][l] = 0

    def insert(s, e, state):
        free_stack.remove(s)
        slot_expert[s], slot_state[s] = e, state
        slot_last[s] = tick[0]
        slot_acc[s] = 0
        expert_slot[e] = s

    def evict(s):
        expert_slot[slot_expert[s]] = -1
        slot_expert[s], slot_state[s] = -1, 0
        free_stack.append(s)

    def touch(s):
        tick[0] += 1
        slot_last[s] = tick[0]
        slot_acc[s] += 1
        expert_acc[slot_expert[s]] += 1

    def keep(p, freq):
        return (p if p > 1e-6 else 1e-6) * freq

    def victim():
        """Lowest p * freq (fmoe-lru: last access; fmoe-lfu: accesses since loaded; ties:
        least recently accessed, then lowest slot) among the resident experts, the current
        layer's routed ones only when nothing else is left; a prefetch takes only an
        unprotected one, and for p * freq only one worth at most what it brings."""
        rule = eviction
        duel_lru = rule == "duel" and DU["miss_lru"] < DU["miss_pf"]
        if rule == "duel":  # whichever shadow directory missed less lately
            rule = "lru" if duel_lru else "pfreq"
        best, fallback = None, None
        for s in range(N):
            if slot_state[s] != 2:
                continue
            e = slot_expert[s]
            if rule == "lru":
                k = float(slot_last[s])
            elif rule == "lfu":
                k = float(slot_acc[s])
            else:
                k = keep(float(P["cur_p"][e // J, e % J]), float(expert_acc[e]) + 1.0)
            prot = e // J == P["cur_layer"] and P["protect"][e % J]
            cand = (k, slot_last[s], s)
            if prot:
                fallback = cand if fallback is None or cand < fallback else fallback
            else:
                best = cand if best is None or cand < best else best
        if P["prefetching"]:
            if best is None or (rule == "pfreq" and best[0] > P["incoming"]):
                return -1
            if duel_lru:  # by recency, but a prefetch still passes p x freq's value test
                e = slot_expert[best[2]]
                if keep(float(P["cur_p"][e // J, e % J]), float(expert_acc[e]) + 1.0) > P["incoming"]:
                    return -1
            return best[2]
        if best is not None:
            return best[2]
        return fallback[2] if fallback is not None else -1

    def make_room():
        if free_stack:
            return free_stack[-1]
        s = victim()
        if s < 0:
            return -1
        if feedback:
            FB["victim"][slot_expert[s]] = True
        evict(s)
        prefetched[s] = False
        queued[s] = False
        return s

    def engine_advance(tt):
        while queue:
            b = 0
            for i in range(1, len(queue)):
                if queue[i][1] > queue[b][1] or (queue[i][1] == queue[b][1] and queue[i][2] < queue[b][2]):
                    b = i
            s = queue[b][0]
            start = max(max(st["engine_free"], queue[b][3]), slot_free_at[s])
            if start > tt:
                break
            queue[b] = queue[-1]  # the C queue's removal: the last entry moves in
            queue.pop()
            st["engine_free"] = start + xfer
            st["busy"] += xfer
            slot_ready_at[s] = st["engine_free"]
            queued[s] = False
            inflight.append(s)
            res["prefetches"] += 1
        for s in list(inflight):
            if slot_ready_at[s] <= tt:
                slot_state[s] = 2
                inflight.remove(s)

    def prefetch(l, j, pri):
        e = l * J + j
        if expert_slot[e] >= 0:  # a resident expert's prediction is neither ranked nor scored
            return
        rank = fb_predict(l, j) if feedback else 0
        if inflight or queue:
            engine_advance(st["now"])
        if feedback and not free_stack and not fb_admit(l, rank):
            return
        s = make_room()
        if s < 0:
            return
        insert(s, e, 1)
        prefetched[s] = queued[s] = True
        queue.append([s, pri, st["seq"], st["now"] + match_delay])
        st["seq"] += 1

    def issue(l, j, pri, p):
        if P["paused"]:
            P["held"].append((l, j, pri, p))
            return
        P["prefetching"] = True
        P["incoming"] = keep(p, 1.0)
        prefetch(l, j, pri)
        P["prefetching"] = False

    def plan_add(plan, j, p, tl, l_now):
        pr = p / (tl - l_now) if tl > l_now else p
        if pr > plan[j][0]:
            plan[j] = (pr, p)

    def plan_issue(plan, tl):
        order = [j for j in range(J) if plan[j][0] >= 0]
        order.sort(key=lambda j: -plan[j][0])  # stable: ties keep the lower index first
        for j in order[:budget]:
            issue(tl, j, plan[j][0], plan[j][1])

    def plan_popular(plan, tl, l_now, n):
        c = pop[tl]
        total = float(sum(int(x) for x in c))
        if total <= 0:
            return
        expect = 0.0
        for j in range(J):
            expect += 1.0 - math.pow(1.0 - int(c[j]) / total, float(n * K))
        m = int(math.floor(expect + 0.5))
        m = min(max(m, K), J)
        share = np.array([np.float32(int(c[j]) / total) for j in range(J)], dtype=np.float32)
        for j in select(share, 1.0, m):
            plan_add(plan, j, int(c[j]) / total, tl, l_now)

    # ---- the replay
    for its in iterations(t):
        for (t0, n, ctx) in its:
            stride = (n + MAX_QUERIES - 1) // MAX_QUERIES
            nq = (n + stride - 1) // stride
            qtok = [t0 + q * stride for q in range(nq)]
            best = [-1] * nq
            score = [0.0] * nq
            matcher.begin(nq)
            st["now"] = st["compute_free"]
            if semantic and store_sem is not None and t["semantic"] is not None and E > 0:
                # the first d layers from the semantically closest maps
                for q in range(nq):
                    best[q], score[q] = semantic_search(t["semantic"][qtok[q]], store_sem)
                for tl in range(min(dist, L)):
                    plan = [(-1.0, 0.0)] * J
                    for q in range(nq):
                        prow = maps[best[q], tl]
                        for j in select(prow, score[q] if delta else 1.0, K):
                            plan_add(plan, j, float(prow[j]), tl, -1)
                    plan_issue(plan, tl)
                for ll in range(min(dist, L)):
                    row = np.zeros(J, dtype=np.float32)
                    for b in best:
                        row = np.maximum(row, maps[b, ll])
                    P["cur_p"][ll] = complete_row(row)
            else:
                for tl in range(min(dist, L)):  # no embeddings: the store's popular experts
                    plan = [(-1.0, 0.0)] * J
                    plan_popular(plan, tl, -1, n)
                    plan_issue(plan, tl)
            for l in range(L):
                st["compute_free"] += layer_s(n, ctx)
                t_gate = st["compute_free"]
                if queue or inflight:
                    engine_advance(t_gate)
                st["now"] = t_gate
                # the layer's accesses: distinct experts in order of first appearance
                dist_e, count = [], {}
                for tok in range(t0, t0 + n):
                    for k in range(K):
                        j = int(experts[tok, l, k])
                        if j not in count:
                            dist_e.append(j)
                            count[j] = 0
                        count[j] += 1
                if feedback:
                    fb_gate(l, set(dist_e))
                if eviction == "duel":
                    duel_observe(l, dist_e)
                # --- the gate (the policy)
                P["cur_layer"] = l
                P["protect"] = [False] * J
                for j in dist_e:
                    P["protect"][j] = True
                    if expert_slot[l * J + j] < 0:
                        P["paused"] = True
                rows = [probs[tok, l] for tok in qtok]
                row = np.zeros(J, dtype=np.float32)
                for r in rows:
                    row = np.maximum(row, r)
                P["cur_p"][l] = complete_row(row)
                if l < L - 1 and E > 0:
                    best, score = matcher.add(l, rows)
                tl = l + dist
                if tl < L:
                    plan = [(-1.0, 0.0)] * J
                    anyb = False
                    for q in range(nq):
                        if best[q] < 0:
                            continue
                        anyb = True
                        prow = maps[best[q], tl]
                        for j in select(prow, score[q] if delta else 1.0, K):
                            plan_add(plan, j, float(prow[j]), tl, l)
                    if not anyb:
                        plan_popular(plan, tl, l, n)
                    plan_issue(plan, tl)
                if any(b >= 0 for b in best):
                    for ll in range(l + 1, L):
                        row = np.zeros(J, dtype=np.float32)
                        for b in best:
                            if b >= 0:
                                row = np.maximum(row, maps[b, ll])
                        P["cur_p"][ll] = complete_row(row)
                # --- the accesses
                for j in dist_e:
                    e = l * J + j
                    tokens = count[j]
                    s = expert_slot[e]
                    if s >= 0 and slot_state[s] == 2:
                        kind = "hit"
                        ready = 0.0
                        if prefetched[s]:
                            res["prefetch_hits"] += 1
                    elif s >= 0:
                        if queued[s]:
                            i = next(i for i, x in enumerate(queue) if x[0] == s)
                            queue[i] = queue[-1]
                            queue.pop()
                            start = max(max(t_gate, st["engine_free"]), slot_free_at[s])
                            st["engine_free"] = start + xfer
                            st["busy"] += xfer
                            slot_ready_at[s] = st["engine_free"]
                            queued[s] = False
                            res["prefetches"] += 1
                        else:
                            inflight.remove(s)
                        ready = slot_ready_at[s]
                        slot_state[s] = 2
                        if ready <= st["compute_free"]:
                            kind = "hit"
                            res["prefetch_hits"] += 1
                        else:
                            kind = "late"
                    else:
                        kind = "miss"
                        s = make_room()
                        start = max(t_gate, st["engine_free"])
                        if s >= 0:
                            start = max(start, slot_free_at[s])
                            insert(s, e, 2)
                        ready = st["engine_free"] = start + xfer
                        st["busy"] += xfer
                    if s >= 0:
                        prefetched[s] = False
                    res[{"hit": "hits", "late": "late_hits", "miss": "misses"}[kind]] += 1
                    if ready > st["compute_free"]:
                        st["compute_free"] = ready
                    st["compute_free"] += expert_s(tokens)
                    if s >= 0:
                        slot_free_at[s] = st["compute_free"]
                        touch(s)
                    else:
                        tick[0] += 1
                        expert_acc[e] += 1
                # --- the layer is done
                st["now"] = st["compute_free"]
                P["protect"] = [False] * J
                P["cur_layer"] = -1
                if P["paused"]:
                    P["paused"] = False
                    held, P["held"] = P["held"], []
                    for h in held:
                        issue(*h)
    return res


def costs_from_profile(profile, expert_bytes):
    c = profile["compute"]
    return {"alpha": profile["link"]["alpha_s"], "beta": profile["link"]["beta_bytes_per_s"],
            "expert_bytes": expert_bytes,
            "layer": {"base": c["attention_s"]["base"], "per_token": c["attention_s"]["per_token"],
                      "per_token_context": c["attention_s"].get("per_token_context", 0.0)},
            "expert": {"base": c["expert_s"]["base"], "per_token": c["expert_s"]["per_token"]}}


def main(argv):
    trace, store, profile, N, d = argv[1], argv[2], argv[3], int(argv[4]), int(argv[5])
    delay = float(argv[6]) if len(argv) > 6 else 0.0
    t = read_trace(trace)
    maps = read_store_maps(store)
    costs = costs_from_profile(json.load(open(profile)), t["expert_bytes"])
    tokens = t["offset"][-1]
    c0 = time.process_time()
    r = replay(t, maps, N, d, costs, delay, store_sem=read_store_semantic(store))
    cpu = time.process_time() - c0
    r["token_iterations_per_cpu_s"] = tokens / cpu
    print(json.dumps(r))


if __name__ == "__main__":
    main(sys.argv)
