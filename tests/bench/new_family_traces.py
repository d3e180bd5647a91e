"""One recorded trace of each newer family's tiny model, through build-store and simulate.

    .venv/bin/python tests/bench/new_family_traces.py --build BUILD [--work /tmp/fmoe-new-families]
        [--families deepseek_v2,...] [--requests N] [--tokens N] [--json OUT]

For DeepSeek-V2, DeepSeek-V3, GLM-4.5, gpt-oss, Phi-3.5-MoE and Llama 4: the tiny random
checkpoint of tests/python/make_tiny_models.py (the family's own routing: V2's grouped
softmax, V3's and GLM's biased sigmoid groups, gpt-oss's softmax over the top-k logits,
PhiMoE's sparsemixer, Llama 4's top-1 sigmoid), widened to fmoe-tiny's vocabulary, is
recorded by `fmoe record` on the CPU over the first N prompts of prompts_100.txt (greedy,
EOS ignored, speculative gates one layer ahead for mixtral-offload). A store is built from 70% of the requests (prefetch distance 1) and the held-out
30% replayed through every policy at a quarter and a half of the routed experts, on
rtx3090-pcie4, with the experts sized as the published model's (--model-config: the tiny
config with the real hidden and expert widths in bf16; the tiny experts' few KiB would
make every transfer free; attention stays tiny, so TPOT is the experts' part).

Prints, per family, the routed experts and top-k, LRU's hit rate, and each policy's TPOT
against LRU's (p50). Random weights route close to uniformly, so this shows the
pipeline running on each family's routing, not what a policy gains on trained routers
(the real traces in docs/results.md are for that).
"""
import argparse
import json
import pathlib
import sys

from fmoe_vs_baselines import sh

REPO = pathlib.Path(__file__).resolve().parents[2]
POLICIES = ["lru", "lfu", "ondemand", "mixtral-offload", "moe-infinity", "moe-infinity-fb",
            "fmoe", "predicted-reuse", "belady", "oracle"]
# family -> (title, the published model whose expert size is simulated, its widths)
SIZED = {
    "deepseek_v2": ("DeepSeek-V2 (grouped softmax)", "DeepSeek-V2-Lite",
                    {"hidden_size": 2048, "moe_intermediate_size": 1408}),
    "deepseek_v3": ("DeepSeek-V3 (biased sigmoid groups)", "DeepSeek-V3",
                    {"hidden_size": 7168, "moe_intermediate_size": 2048}),
    "glm4_moe": ("GLM-4.5 (biased sigmoid)", "GLM-4.5-Air",
                 {"hidden_size": 4096, "moe_intermediate_size": 1408}),
    "gpt_oss": ("gpt-oss (softmax of top-k)", "gpt-oss-20b",
                {"hidden_size": 2880, "intermediate_size": 2880}),
    "phimoe": ("Phi-3.5-MoE (sparsemixer)", "Phi-3.5-MoE",
               {"hidden_size": 4096, "intermediate_size": 6400}),
    "llama4_scout": ("Llama 4 (top-1 sigmoid)", "Llama-4-Scout",
                     {"hidden_size": 5120, "intermediate_size": 8192,
                      "intermediate_size_mlp": 16384}),
}


def record(fmoe, work, family, requests, tokens):
    """The family's tiny checkpoint and its trace, unless work has them."""
    sys.path.insert(0, str(REPO / "tests" / "python"))
    import make_tiny_models as tiny
    model, trace = work / family, work / f"{family}.h5"
    if not (model / "config.json").exists():
        tiny.write_hf_checkpoint_with_vocab(family, model, 4096)
    cfg = json.loads((model / "config.json").read_text())
    cfg.update(SIZED[family][2], torch_dtype="bfloat16", dtype="bfloat16")
    sized = work / f"{family}-sized.json"
    sized.write_text(json.dumps(cfg))
    if not trace.exists():
        prompts = work / "prompts.txt"
        lines = (REPO / "datasets" / "samples" / "prompts_100.txt").read_text().splitlines()
        prompts.write_text("\n".join(lines[:requests]) + "\n")
        sh(fmoe, "record", "--model", model, "--tokenizer", REPO / "datasets" / "fmoe-tiny",
           "--dataset", prompts, "--max-new-tokens", tokens, "--ignore-eos", "--temperature", 0,
           "--speculative", 1, "--backend", "cpu", "-o", trace, "--quiet")
    return trace, sized


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True, type=pathlib.Path)
    ap.add_argument("--work", type=pathlib.Path, default=pathlib.Path("/tmp/fmoe-new-families"))
    ap.add_argument("--families", default=",".join(SIZED),
                    help=f"comma-separated, of {', '.join(SIZED)}")
    ap.add_argument("--requests", type=int, default=40, help="prompts recorded")
    ap.add_argument("--tokens", type=int, default=32, help="new tokens a prompt")
    ap.add_argument("--json", type=pathlib.Path)
    a = ap.parse_args()
    families = a.families.split(",")
    for f in families:
        if f not in SIZED:
            ap.error(f"--families: unknown family {f!r} (known: {', '.join(SIZED)})")
    fmoe = a.build / "cmd" / "fmoe"
    a.work.mkdir(parents=True, exist_ok=True)
    rows, out = [], []
    for family in families:
        trace, sized = record(fmoe, a.work, family, a.requests, a.tokens)
        meta = json.loads(sh(fmoe, "inspect", trace, "--json").stdout)
        L, J, K = meta["num_layers"], meta["num_experts"], meta["top_k"]
        store = a.work / f"{family}-store.h5"
        sh(fmoe, "build-store", "--trace", trace, "--capacity", 1000, "--prefetch-distance", 1,
           "--split", 0.7, "--seed", 0, "-o", store, "--quiet")
        caches = [max(1, round(s * L * J)) for s in (0.25, 0.5)]
        res = json.loads(sh(fmoe, "simulate", "--trace", trace, "--store", store,
                            "--model-config", sized, "--holdout", "--policy", ",".join(POLICIES),
                            "--cache-experts", ",".join(map(str, caches)),
                            "--prefetch-distance", 1, "--hardware", "rtx3090-pcie4", "--json",
                            "--quiet").stdout)["results"]
        r = {(x["policy"], x["cache_experts"]): x for x in res}
        for share, c in zip(("25%", "50%"), caches):
            lru = r[("lru", c)]["tpot_s"]["p50"]
            ratios = {p: r[(p, c)]["tpot_s"]["p50"] / lru for p in POLICIES}
            rows.append((SIZED[family][0], SIZED[family][1], f"{L}x{J} top-{K}", share,
                         r[("lru", c)]["hit_rate"], ratios))
            out.append({"family": family, "layers": L, "experts": J, "top_k": K,
                        "cache_experts": c, "share": share, "sized_as": SIZED[family][1],
                        "lru_hit_rate": r[("lru", c)]["hit_rate"], "tpot_vs_lru": ratios})
    shown = [p for p in POLICIES if p != "lru"]
    print("| family | sized as | MoE layers x experts | cache | LRU hits | "
          + " | ".join(shown) + " |")
    print("|---|---|---|---|---:|" + "---:|" * len(shown))
    for title, sized_as, shape, share, hit, ratios in rows:
        print(f"| {title} | {sized_as} | {shape} | {share} | {hit * 100:.0f}% | "
              + " | ".join(f"{ratios[p]:.3f}" for p in shown) + " |")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
