"""Routing of fmoe-tiny next to a random-init model of the same architecture, measured on
traces that `fmoe record` writes (the numbers in datasets/fmoe-tiny/README.md).

    python datasets/train-fmoe-tiny/routing_report.py --fmoe BUILD/cmd/fmoe \
        --trained datasets/fmoe-tiny --random /tmp/fmoe-tiny-random \
        [--prompts datasets/samples/prompts_100.txt] [--new-tokens 32] [--json OUT]

(train.py --random-init-out DIR saves the random-init model.) Both models share the
tokenizer, and generation ignores EOS, so both traces hold the same number of tokens per
request. Per MoE layer, in bits (log2; uniform over 8 experts = 3, one-hot = 0):
  gate       mean entropy of a token's gate distribution (how decided the router is)
  popularity entropy of the whole trace's expert-usage histogram (load balance)
  coarse     fmoe inspect: entropy of activations aggregated per request (§2.4 of
             "fMoE: Fine-Grained Expert Offloading for Large Mixture-of-Experts Serving")
  fine       fmoe inspect: the same per iteration
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np


def record(fmoe, model, prompts, new_tokens, out):
    subprocess.run([fmoe, "record", "--model", model, "--dataset", prompts, "--max-new-tokens",
                    str(new_tokens), "--ignore-eos", "--threads", "1", "-q", "-o", out],
                   check=True)
    ins = json.loads(subprocess.run([fmoe, "inspect", out, "--json", "--quiet"], check=True,
                                    capture_output=True, text=True).stdout)
    import h5py
    import hdf5plugin  # noqa: F401

    with h5py.File(out) as f:
        p = f["tokens/probs"][:].astype(np.float64)
    gate = (-(p * np.log2(np.clip(p, 1e-12, None))).sum(-1)).mean(0)
    return {
        "gate": gate.tolist(),
        "popularity": [l["popularity_entropy_bits"] for l in ins["layers"]],
        "coarse": [l["coarse_entropy_bits"] for l in ins["layers"]],
        "fine": [l["fine_entropy_bits"] for l in ins["layers"]],
        "tokens": ins["tokens"], "requests": ins["requests"],
    }


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fmoe", required=True)
    ap.add_argument("--trained", default=os.path.join(repo, "datasets", "fmoe-tiny"))
    ap.add_argument("--random", required=True)
    ap.add_argument("--prompts", default=os.path.join(repo, "datasets", "samples", "prompts_100.txt"))
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    res = {}
    with tempfile.TemporaryDirectory() as d:
        for name, model in (("trained", a.trained), ("random", a.random)):
            res[name] = record(a.fmoe, model, a.prompts, a.new_tokens, os.path.join(d, name + ".h5"))
    L = len(res["trained"]["gate"])
    print(f"{res['trained']['requests']} requests, {res['trained']['tokens']} tokens per trace; "
          "entropy in bits (8 experts: uniform = 3.00)")
    print("layer | gate trained/random | popularity trained/random | coarse trained/random "
          "| fine trained/random")
    for l in range(L):
        t, r = res["trained"], res["random"]
        print(f"{l:5d} | {t['gate'][l]:7.2f} / {r['gate'][l]:5.2f} | {t['popularity'][l]:9.2f} / "
              f"{r['popularity'][l]:5.2f} | {t['coarse'][l]:7.2f} / {r['coarse'][l]:5.2f} | "
              f"{t['fine'][l]:5.2f} / {r['fine'][l]:5.2f}")
    for k in ("gate", "popularity", "coarse", "fine"):
        print(f"mean {k}: trained {np.mean(res['trained'][k]):.3f}, random {np.mean(res['random'][k]):.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
