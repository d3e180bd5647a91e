"""How much of the gap to the optimum eviction by predicted reuse closes, on every decode
trace at hand (docs/results.md, "Eviction by predicted reuse").

    .venv/bin/python tests/bench/predicted_reuse.py --build BUILD [--data DATA]
        [--work /tmp/fmoe-predicted-reuse] [--json OUT]

Traces, with the cache at 10, 25, 50 and 75% of all routed experts:
  tuning (predicted-reuse's defaults reuse_overdue = 2 and guard_margin = 0.01 were chosen
  on these two, nothing on the others):
    - synthetic A (tests/bench/prefetch_vs_lru.py's: 24 x 128, top-1, topics that stay)
    - fmoe-tiny, `fmoe record` of datasets/samples/prompts_100.txt, greedy, <= 64 tokens
  reported (held out):
    - Qwen1.5-MoE-A2.7B on vLLM (5 of 24 layers, top-4 of 60; DATA/qwen1.5-moe-a2.7b-vllm-logger)
    - OLMoE-1B-7B on vLLM (layer 0 only, top-8 of 64; DATA/olmoe-1b-7b-vllm-logger)
    - synthetic B, C and D of prefetch_vs_lru.py
Each trace gets a 1000-entry store from 70% of its requests (d = 3, split seed 0), and every
policy is replayed on the other 30% (--holdout) on rtx3090-pcie4 at d = 3: lru, belady,
oracle, fmoe, moe-infinity-fb and predicted-reuse (its defaults), with --gap-split, and the
options of EXTRA: moe-infinity-fb with --policy-opt evict=predicted-reuse ("mifb-pr") and
evict=request-reuse ("mifb-req": the matched rEAM's rates), fmoe with evict=request-reuse
("fmoe-req": the matched maps' p), predicted-reuse with estimate=request ("pr-req") and with
estimate=rate ("pr-rate": the same rate, memoryless: A0). The
one-layer OLMoE trace cannot prefetch at d = 3: lru, belady, predicted-reuse, pr-req and
pr-rate replay all of it (one prefill request, one decode stream).
Printed per trace and size: hit rate and TPOT p50 of each, the share of the LRU -> optimum
TPOT gap that each policy closes (the optimum: the lower TPOT of oracle and belady; oracle
cannot run on a one-layer trace), and predicted-reuse's share of the LRU -> belady hit gap;
then, per trace and size, the best shipped policy's share (all but belady and oracle) and
the highest TPOT / LRU's of the prefetching ones (the target: >= 30% and <= 1.02). Last,
predicted-reuse's and lru's simulation speed (one thread, accesses per second over the
whole run, trace reading included) on the largest trace, and pr-rate's.
"""
import argparse
import json
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from fmoe_vs_baselines import sh  # noqa: E402
from prefetch_vs_lru import SYNTHETIC, make_synthetic  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
POLICIES = ["lru", "belady", "oracle", "fmoe", "moe-infinity-fb", "predicted-reuse"]
# label: (policy, --policy-opt, prefetches)
EXTRA = {"mifb-pr": ("moe-infinity-fb", "evict=predicted-reuse", True),
         "mifb-req": ("moe-infinity-fb", "evict=request-reuse", True),
         "fmoe-req": ("fmoe", "evict=request-reuse", True),
         "pr-req": ("predicted-reuse", "estimate=request", False),
         "pr-rate": ("predicted-reuse", "estimate=rate", False)}
REPORTED = POLICIES + list(EXTRA)
SHIPPED = ["fmoe", "moe-infinity-fb", "predicted-reuse", *EXTRA]
PREFETCHING = ["fmoe", "moe-infinity-fb"] + [k for k, v in EXTRA.items() if v[2]]
SHARES = [0.1, 0.25, 0.5, 0.75]
QWEN_BYTES = 3 * 2048 * 1408 * 2


def import_real(fmoe, data, work):
    q, o = work / "qwen.h5", work / "olmoe.h5"
    if not q.exists():
        d = data / "qwen1.5-moe-a2.7b-vllm-logger"
        logs = [d / f"moe_layer{l:02d}.jsonl" for l in (0, 8, 12, 18, 23)]
        sh(sys.executable, REPO / "datasets" / "vllm_logger_to_jsonl.py", "--preset",
           "qwen1.5-moe-a2.7b-gsm8k25", *logs, "-o", work / "qwen.jsonl")
        sh(fmoe, "trace", "import", "--format", "jsonl", "--layers", 5, "--experts", 60,
           "--top-k", 4, "--expert-bytes", QWEN_BYTES, "--hidden-size", 2048, "--model-name",
           "Qwen1.5-MoE-A2.7B-Chat (layers 0,8,12,18,23)", work / "qwen.jsonl", "-o", q, "--quiet")
    if not o.exists():
        d = data / "olmoe-1b-7b-vllm-logger"
        sh(sys.executable, REPO / "datasets" / "vllm_logger_to_jsonl.py", "--preset",
           "olmoe-1b-7b-gsm8k25", d / "moe_routes_layer00.jsonl", "-o", work / "olmoe.jsonl")
        # OLMoE's expert: 3 x 2048 x 1024 bf16
        sh(fmoe, "trace", "import", "--format", "jsonl", "--layers", 1, "--experts", 64,
           "--top-k", 8, "--expert-bytes", 3 * 2048 * 1024 * 2, "--hidden-size", 2048,
           "--model-name", "OLMoE-1B-7B (layer 0)", work / "olmoe.jsonl", "-o", o, "--quiet")


def record_tiny(fmoe, work):
    t = work / "tiny-prompts100.h5"
    if not t.exists():
        sh(fmoe, "record", "--dataset", REPO / "datasets" / "samples" / "prompts_100.txt",
           "--max-new-tokens", 64, "--temperature", 0, "-o", t, "-q")


def closed(lru, opt, x):
    return (lru - x) / (lru - opt) if lru > opt else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", type=pathlib.Path, required=True)
    ap.add_argument("--data", type=pathlib.Path, default=os.environ.get("FMOE_REAL_DATA"))
    ap.add_argument("--work", type=pathlib.Path, default=pathlib.Path("/tmp/fmoe-predicted-reuse"))
    ap.add_argument("--json", type=pathlib.Path)
    a = ap.parse_args()
    if not a.data:
        raise SystemExit("predicted_reuse.py: give --data DIR (or FMOE_REAL_DATA)")
    fmoe = a.build / "cmd" / "fmoe"
    a.work.mkdir(parents=True, exist_ok=True)
    make_synthetic(fmoe, a.work)
    import_real(fmoe, a.data, a.work)
    record_tiny(fmoe, a.work)
    traces = [("synthetic A (tuning)", "synth-a.h5"), ("fmoe-tiny prompts100 (tuning)",
                                                         "tiny-prompts100.h5"),
              ("Qwen1.5-MoE", "qwen.h5"), ("OLMoE layer 0", "olmoe.h5")]
    traces += [(title, name) for title, name, _ in SYNTHETIC[1:]]
    out = []
    print(f"{'trace':<30}{'cache':>6}  {'hit% lru/bel/fmoe/mifb/pr':<34}"
          f"{'TPOT ms lru/opt/fmoe/mifb/pr':<38}"
          f"{'TPOT gap closed ' + '/'.join(SHIPPED):<38}"
          f"{'pr hit gap':>10}")
    for title, name in traces:
        src = a.work / name
        meta = json.loads(sh(fmoe, "inspect", src, "--json").stdout)
        L, J = meta["num_layers"], meta["num_experts"]
        caches = [max(1, round(s * L * J)) for s in SHARES]
        if L > 3:
            store = a.work / (src.stem + "-pr-store.h5")
            if not store.exists():
                sh(fmoe, "build-store", "--trace", src, "--capacity", 1000, "--prefetch-distance",
                   3, "--split", 0.7, "--seed", 0, "-o", store, "--quiet")
            run = ["--store", store, "--holdout", "--policy", ",".join(POLICIES),
                   "--prefetch-distance", 3]
        else:  # one layer (OLMoE): nothing to prefetch; all requests, no store
            run = ["--policy", "lru,belady,predicted-reuse"]
        res = json.loads(sh(fmoe, "simulate", "--trace", src, *run, "--cache-experts",
                            ",".join(map(str, caches)), "--hardware", "rtx3090-pcie4",
                            "--gap-split", "--json", "--quiet").stdout)["results"]
        r = {(x["policy"], x["cache_experts"]): x for x in res}
        for label, (policy, opt, prefetches) in EXTRA.items():
            if prefetches and L <= 3:
                continue
            base = [*run[:3], "--prefetch-distance", 3] if L > 3 else []
            for x in json.loads(sh(fmoe, "simulate", "--trace", src, *base, "--policy", policy,
                                   "--policy-opt", opt, "--cache-experts",
                                   ",".join(map(str, caches)), "--hardware", "rtx3090-pcie4",
                                   "--json", "--quiet").stdout)["results"]:
                r[(label, x["cache_experts"])] = x
        for c in caches:
            tp = {p: r[(p, c)]["tpot_s"]["p50"] * 1e3 for p in REPORTED if (p, c) in r}
            hit = {p: r[(p, c)]["hit_rate"] * 100 for p in REPORTED if (p, c) in r}
            opt = min(tp[p] for p in ("oracle", "belady") if p in tp)
            gaps = {p: closed(tp["lru"], opt, tp[p]) for p in SHIPPED if p in tp}
            best = max(gaps, key=lambda p: gaps[p])
            worst_pf = max((tp[p] / tp["lru"] for p in PREFETCHING if p in tp), default=None)
            hit_gap = closed(-r[("lru", c)]["hits"], -r[("belady", c)]["hits"],
                             -r[("predicted-reuse", c)]["hits"])
            three = ["fmoe", "moe-infinity-fb", "predicted-reuse"]
            hits_s = "/".join(f"{hit[k]:.1f}" if k in hit else "-"
                              for k in ["lru", "belady", *three])
            tpot_s = "/".join([f"{tp['lru']:.2f}", f"{opt:.2f}"] +
                              [f"{tp[k]:.1f}" if k in tp else "-" for k in three])
            gaps_s = "/".join(f"{gaps[k] * 100:.0f}%" if k in gaps else "-" for k in SHIPPED)
            print(f"{title:<30}{c:>6}  {hits_s:<34}{tpot_s:<38}{gaps_s:<38}{hit_gap * 100:>9.0f}%")
            extra_s = " ".join(f"{k} {hit[k]:.1f}%/{tp[k]:.2f}ms" for k in EXTRA if k in tp)
            worst_s = f"{worst_pf:.3f}" if worst_pf else "-"
            print(f"{'':<36}{extra_s}; best {best} {gaps[best] * 100:.0f}%, "
                  f"worst prefetching {worst_s} x lru")
            out.append({"trace": title, "cache_experts": c, "share": SHARES[caches.index(c)],
                        "hit_rate": hit, "tpot_p50_ms": tp, "tpot_opt_ms": opt,
                        "tpot_gap_closed": gaps, "predicted_reuse_hit_gap_closed": hit_gap,
                        "best_shipped": best, "worst_prefetching_vs_lru": worst_pf,
                        "gap_split": {p: r[(p, c)].get("gap_split") for p in POLICIES
                                      if (p, c) in r}})
    # speed: one thread, one cell, the largest trace (synthetic A)
    big = a.work / "synth-a.h5"
    for label, p, opt in (("lru", "lru", []), ("predicted-reuse", "predicted-reuse", []),
                          ("pr-rate", "predicted-reuse", ["--policy-opt", "estimate=rate"])):
        t0 = time.perf_counter()
        x = json.loads(sh(fmoe, "simulate", "--trace", big, "--policy", p, *opt, "--cache-experts",
                          768, "--threads", 1, "--json", "--quiet").stdout)
        dt = time.perf_counter() - t0
        rate = x["accesses"] / dt / 1e6
        print(f"speed {label}: {x['accesses']} accesses in {dt:.3f} s = {rate:.2f} M/s")
        out.append({"speed": label, "accesses": x["accesses"], "seconds": dt})
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
