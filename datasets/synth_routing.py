#!/usr/bin/env python3
"""Synthetic MoE routing with the locality of real decode traffic, as fmoe's JSON Lines
(docs/design.md §4.1), for `fmoe trace import --format jsonl`. It needs numpy: run it with
the project's `.venv/bin/python` (tests/run.sh makes it), not a bare python3.

    .venv/bin/python datasets/synth_routing.py --layers 24 --experts 128 --top-k 1 \\
        --requests 200 --seed 1 -o synth.jsonl
    fmoe trace import --layers 24 --experts 128 --top-k 1 --expert-bytes 17301504 \\
        synth.jsonl -o synth.h5

Why. The public routing logs at hand are top-4..top-8 over 60-64 experts. Large top-1
models with many experts per layer route so that plain LRU already hits most accesses
(75-96% at 10-50% of the experts cached), a regime where a prefetch is more likely to
cost link time and a useful resident expert than to save a miss. This generator makes
that regime, with knobs, so policies can be chosen on some instances and reported on
others (docs/simulating.md, "Synthetic routing").

The model (every draw from one numpy Generator seeded by --seed):

  * Topics. T latent topics (--topics) with Zipf(--zipf) popularity. Each MoE layer l
    maps topic z to a home expert h_l(z) (uniform at random, so several topics share an
    expert and expert popularity is Zipf-like too) and to a second choice s_l(z).
  * Requests. A request draws its own small set of topics (--request-topics, from the
    popularity without replacement) with Dirichlet(1) weights: per-request locality.
    Prompt tokens (--prompt-tokens lo,hi) then decode tokens (--decode-tokens lo,hi),
    lengths uniform in the ranges.
  * Tokens. Each token carries a topic z_t: with probability --stay it keeps the
    previous token's topic, else draws one from the request's set. The same z_t drives
    every layer, which correlates the layers (the expert trajectories fMoE matches).
  * Gate. At layer l the token's logits over J experts are Gumbel noise (scale
    --noise) plus --strength at h_l(z_t) and half of it at s_l(z_t); the gate
    probabilities are their softmax and the routed experts the top-k of the logits.
    So the routing follows from the probabilities, as in a real router, and a larger
    --noise makes routing less predictable.

Output: a first line {"type": "meta", ...} holding every parameter (which the importer
skips), then one record per (request, token, layer) with the K routed experts and their
K probabilities (or all J with --full-probs). Requires numpy.
"""
import argparse
import json
import sys

import numpy as np


def parse_range(s):
    lo, _, hi = s.partition(",")
    lo, hi = int(lo), int(hi or lo)
    if lo < 1 or hi < lo:
        raise argparse.ArgumentTypeError(f"range '{s}': want LO,HI with 1 <= LO <= HI")
    return lo, hi


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=1)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--prompt-tokens", type=parse_range, default=(8, 32))
    ap.add_argument("--decode-tokens", type=parse_range, default=(64, 256))
    ap.add_argument("--topics", type=int, default=512)
    ap.add_argument("--zipf", type=float, default=1.0, help="topic popularity exponent")
    ap.add_argument("--request-topics", type=int, default=6)
    ap.add_argument("--stay", type=float, default=0.8,
                    help="chance a token keeps the previous token's topic")
    ap.add_argument("--noise", type=float, default=1.0, help="Gumbel noise scale of the logits")
    ap.add_argument("--strength", type=float, default=4.0,
                    help="logit boost of the topic's home expert")
    ap.add_argument("--full-probs", action="store_true",
                    help="write all J probabilities (probs_kind full) instead of the top-k")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args(argv)
    L, J, K, T = a.layers, a.experts, a.top_k, a.topics
    for name, v, lo in (("--layers", L, 1), ("--experts", J, 2), ("--top-k", K, 1),
                        ("--requests", a.requests, 1), ("--topics", T, 1),
                        ("--request-topics", a.request_topics, 1)):
        if v < lo:
            ap.error(f"{name} {v}: must be at least {lo}")
    if K > J:
        ap.error(f"--top-k {K} exceeds --experts {J}")
    if not 0 <= a.stay <= 1:
        ap.error(f"--stay {a.stay}: must be in [0, 1]")
    rng = np.random.default_rng(a.seed)
    pop = 1.0 / np.arange(1, T + 1) ** a.zipf
    pop = pop[rng.permutation(T)]
    pop /= pop.sum()
    home = rng.integers(0, J, size=(L, T))
    second = rng.integers(0, J, size=(L, T))
    rt = min(a.request_topics, T)
    meta = {"type": "meta", "generator": "datasets/synth_routing.py", **{
        k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(a).items() if k != "output"}}
    out = sys.stdout if a.output == "-" else open(a.output, "w")
    out.write(json.dumps(meta) + "\n")
    rows = np.arange(L)
    for r in range(a.requests):
        topics = rng.choice(T, size=rt, replace=False, p=pop)
        weights = rng.dirichlet(np.ones(rt))
        n_prompt = int(rng.integers(a.prompt_tokens[0], a.prompt_tokens[1] + 1))
        n_decode = int(rng.integers(a.decode_tokens[0], a.decode_tokens[1] + 1))
        z = topics[rng.choice(rt, p=weights)]
        for t in range(n_prompt + n_decode):
            if t > 0 and rng.random() >= a.stay:
                z = topics[rng.choice(rt, p=weights)]
            logits = a.noise * rng.gumbel(size=(L, J))
            logits[rows, home[:, z]] += a.strength
            logits[rows, second[:, z]] += a.strength / 2
            p = np.exp(logits - logits.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            top = np.argsort(-logits, axis=1, kind="stable")[:, :K]
            phase = "prefill" if t < n_prompt else "decode"
            for l in range(L):
                rec = {"request": r, "token": t, "phase": phase, "layer": l,
                       "experts": top[l].tolist()}
                rec["probs"] = ([round(float(x), 6) for x in p[l]] if a.full_probs else
                                [round(float(p[l, j]), 6) for j in top[l]])
                out.write(json.dumps(rec) + "\n")
    if out is not sys.stdout:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
