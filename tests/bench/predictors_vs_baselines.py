"""ProMoE's and DuoServe-MoE's learned predictors against fmoe and the baselines on held-out
requests.

    .venv/bin/python tests/bench/predictors_vs_baselines.py --build BUILD [--work DIR]
        [--plot FILE.svg] [--json FILE]

fMoE's Fig. 9 / Fig. 12a for the bundled model: fmoe-tiny records the 100 bundled prompts
(greedy, 32 new tokens, gate inputs with --hidden, speculative gates with --speculative 1)
in two traces by request, 70 to train and 30 held out; the expert-map store (d = 1), the
ProMoE predictor (stride 1) and the DuoServe predictor are built from the first, and the
held-out requests are replayed at 10%..90% of the experts on the default rtx3090-pcie4
profile. Printed per policy and cache size: hit rate, GOODPRED (prefetches used in time /
accesses) and decode TPOT, and the share of the LRU -> oracle TPOT gap each policy closes;
then DuoServe's own configuration, a cache of K experts (its k-slot ring), against lru,
ondemand and oracle at the same size.
"""
import argparse
import json
import pathlib
import sys

from fmoe_vs_baselines import SHARES, sh

REPO = pathlib.Path(__file__).resolve().parents[2]
PROMPTS = REPO / "datasets" / "samples" / "prompts_100.txt"
POLICIES = ["lru", "mixtral-offload", "moe-infinity", "promoe", "duoserve", "fmoe", "oracle"]
K_SLOTS = ["lru", "ondemand", "duoserve", "oracle"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True, type=pathlib.Path)
    ap.add_argument("--work", type=pathlib.Path, default=pathlib.Path("/tmp/fmoe-predictors"))
    ap.add_argument("--plot", type=pathlib.Path)
    ap.add_argument("--json", type=pathlib.Path)
    a = ap.parse_args()
    fmoe = a.build / "cmd" / "fmoe"
    a.work.mkdir(parents=True, exist_ok=True)
    lines = [l for l in PROMPTS.read_text().splitlines() if l.strip()]
    train_txt, held_txt = a.work / "train.txt", a.work / "heldout.txt"
    train_txt.write_text("\n".join(lines[:70]) + "\n")
    held_txt.write_text("\n".join(lines[70:100]) + "\n")
    train, held = a.work / "train.h5", a.work / "heldout.h5"
    common = ["--max-new-tokens", 32, "--temperature", 0, "--hidden", "--speculative", 1,
              "--probs-f32", "--quiet"]
    for txt, h5 in ((train_txt, train), (held_txt, held)):
        if not h5.exists():
            print(f"fmoe record {txt.name} ...", file=sys.stderr)
            sh(fmoe, "record", "--dataset", txt, *common, "-o", h5)
    store, pred, duo = a.work / "store.h5", a.work / "promoe.h5", a.work / "duoserve.h5"
    sh(fmoe, "build-store", "--trace", train, "--capacity", 1000, "--prefetch-distance", 1,
       "-o", store, "--quiet")
    sh(fmoe, "train-predictor", "--kind", "promoe", "--trace", train, "--stride", 1,
       "--split", 0.9, "--seed", 0, "-o", pred, "--quiet")
    sh(fmoe, "train-predictor", "--kind", "duoserve", "--trace", train, "--split", 0.9,
       "--seed", 0, "-o", duo, "--quiet")
    meta = json.loads(sh(fmoe, "inspect", held, "--json").stdout)
    L, J = meta["num_layers"], meta["num_experts"]
    caches = [max(1, round(s * L * J)) for s in SHARES]
    args = ["simulate", "--trace", held, "--policy", ",".join(POLICIES), "--store", store,
            "--predictor", pred, "--predictor", duo, "--cache-experts", ",".join(map(str, caches)),
            "--prefetch-distance", 1, "--json", "--quiet"]
    if a.plot:
        args += ["--plot", a.plot]
    res = json.loads(sh(fmoe, *args).stdout)["results"]
    by = {(r["policy"], r["cache_experts"]): r for r in res}
    print(f"fmoe-tiny, 30 held-out requests (store and predictors from 70 others), "
          f"{L} x {J} experts, rtx3090-pcie4")
    print("| policy | " + " | ".join(f"{round(100 * s)}%" for s in SHARES) + " |")
    print("|---|" + "---|" * len(SHARES))
    for p in POLICIES:
        cells = []
        for c in caches:
            r = by[(p, c)]
            cells.append(f"{100 * r['hit_rate']:.1f}% / {r['goodpred']:.2f} / "
                         f"{1e3 * r['tpot_s']['mean']:.3f}")
        print(f"| {p} | " + " | ".join(cells) + " |")
    print("(each cell: hit rate / GOODPRED / mean decode TPOT ms)")
    print()
    print("| policy | LRU -> oracle TPOT gap closed, mean over sizes | worst TPOT / LRU |")
    print("|---|---|---|")
    for p in POLICIES:
        closed, worst = [], 0.0
        for c in caches:
            lru = by[("lru", c)]["tpot_s"]["mean"]
            orc = by[("oracle", c)]["tpot_s"]["mean"]
            t = by[(p, c)]["tpot_s"]["mean"]
            worst = max(worst, t / lru)
            if lru - orc > 1e-12:
                closed.append((lru - t) / (lru - orc))
        mean = sum(closed) / len(closed) if closed else float("nan")
        print(f"| {p} | {100 * mean:.0f}% | {worst:.3f} |")
    K = meta["top_k"]
    ks = json.loads(sh(fmoe, "simulate", "--trace", held, "--policy", ",".join(K_SLOTS),
                       "--predictor", duo, "--cache-experts", K, "--prefetch-distance", 1,
                       "--json", "--quiet").stdout)["results"]
    print()
    print(f"DuoServe's configuration: a cache of K = {K} experts (its k-slot ring)")
    print("| policy | hit rate | late hits | misses | GOODPRED | mean decode TPOT ms | TTFT p50 ms |")
    print("|---|---|---|---|---|---|---|")
    for r in sorted(ks, key=lambda r: K_SLOTS.index(r["policy"])):
        print(f"| {r['policy']} | {100 * r['hit_rate']:.1f}% | {r['late_hits']} | {r['misses']} "
              f"| {r['goodpred']:.2f} | {1e3 * r['tpot_s']['mean']:.3f} | "
              f"{1e3 * r['ttft_s']['p50']:.3f} |")
    if a.json:
        a.json.write_text(json.dumps(res + ks, indent=1))


if __name__ == "__main__":
    main()
