"""Live offloading against the simulator's prediction: fidelity, speed and memory.

    .venv/bin/python tests/bench/bench_offload_live.py [--work DIR] [--prompts 4] [--gen 16]
        [--threads N] [--policies lru,fmoe,mixtral-offload] [--fractions 0.1,0.25,0.5]
        [--repeat 2] [--paired] [--weights bf16,q4_k] [--json FILE]

--paired calibrates again before every live run (and once after the last), simulates each
run with the mean of the calibrations made just before and just after it, and reports the
run whose gap is the median: on a machine whose disk and CPU drift from one minute to the
next, one calibration set against the fastest of several live runs measures the drift,
not the simulator. It also simulates each run with the link its own copy engine measured
(bytes copied over the I/O thread's busy seconds, from record's summary): the "own-link
gap" is the model's error with the link's drift taken out.

On the random ~0.8B Mixtral-layout checkpoint of the CPU-speed benchmark
(tests/model/make_bench_model.py: 8 MoE layers x 8 experts of 21 MiB), with fmoe-tiny's
tokenizer copied beside it:

1. `fmoe calibrate --link-file model.safetensors` measures this machine's file->RAM link on
   O_DIRECT reads of the model's own file (what the live runs read) and its compute at the
   model's shapes with the CPU backend's kernels: the profile the simulator predicts with.
2. An all-resident `fmoe record` gives the ceiling (decode TPOT with every expert in RAM).
3. For each policy and cache fraction, `fmoe record --tier file --direct-io` runs the
   prompts offloaded and records the measured iteration times; `fmoe simulate` replays
   the trace that run wrote with the calibrated profile. Printed per point:
   - live and simulated decode TPOT (mean over requests of decode seconds per token, the
     simulator's definition) and the gap (sim - live) / live (target |gap| <= 15%);
   - the bound (docs/design.md §9): the all-resident TPOT plus, per decode token, the bytes
     the run had to wait for (a miss's expert, the rest of a prefetch still in flight, as
     the live executor counts them) over the calibrated link rate; live / bound (target
     <= 1.10) and live / all-resident;
   - peak RSS of the run (getrusage of the child) against the stated bound: the weights
     that stay resident + N slots + 1 scratch slot + the KV cache + 96 MiB fixed overhead
     (binary, BLAS and session buffers, tokenizer, trace writer).

The fmoe policy uses a store built from an all-resident recording of other prompts; its
matcher runs on its own thread (the live default); `fmoe:sync` in --policies runs it
inline at each gate instead (`--sync-predictions`), for the cost of the thread's later plans
against the searches' time at the gates (the simulator models the matcher by the profile's
measured delay either way).
--weights bf16,q4_k runs the whole table once per expert format: the checkpoint's bf16
experts, then the same model written by `fmoe quantize --type q4_k --experts-only` (every
routed expert in Q4_K, 144 bytes per 256 weights: 0.28x the bytes; attention and the rest
stay bf16), read from the GGUF file with the same tier, slots and prompts. The link bound
moves with the bytes: the awaited bytes per token shrink with the expert size, and the
calibration is made on the file each run reads.

Figures are this machine's; the disk and the page cache of the host decide them. Not a
test: run it by hand, put the table in docs/results.md with the machine named.
"""
import argparse
import json
import pathlib
import re
import shutil
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from offload_bench_util import live_tpot, mean_profile, run, run_rss  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
PROMPTS = REPO / "datasets" / "samples" / "prompts_100.txt"
TINY = REPO / "datasets" / "fmoe-tiny"
OVERHEAD_MIB = 96


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", default="/tmp/fmoe-bench-offload")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--gen", type=int, default=16)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--policies", default="lru,fmoe,mixtral-offload")
    ap.add_argument("--fractions", default="0.1,0.25,0.5")
    ap.add_argument("--repeat", type=int, default=2,
                    help="live runs per point; the fastest is kept (the machine is shared)")
    ap.add_argument("--paired", action="store_true",
                    help="calibrate before every live run and after the last; simulate "
                         "each run with the mean of the calibrations around it; report the "
                         "run with the median gap (for a machine whose disk and CPU speeds "
                         "drift between runs)")
    ap.add_argument("--build", default=str(REPO / "build"))
    ap.add_argument("--weights", default="bf16",
                    help="expert formats to compare, comma-separated: bf16 (the checkpoint) "
                         "and any of fmoe quantize's types (q8_0, q4_k, q5_k, q6_k), whose "
                         "GGUF quantizes the routed experts only")
    ap.add_argument("--json")
    a = ap.parse_args()
    tables = []
    for weights in a.weights.split(","):
        tables.append(bench_one(a, weights))
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(tables if len(tables) > 1 else tables[0],
                                                   indent=1))


# bytes per 256 weights of each block format fmoe quantize writes (docs/quantization.md)
BLOCK_BYTES_PER_256 = {"q8_0": 272, "q4_k": 144, "q5_k": 176, "q6_k": 210}


def bench_one(a, weights):
    """The table for one expert format; returns it as a dict."""
    fmoe = pathlib.Path(a.build) / "cmd" / "fmoe"
    work = pathlib.Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    model = work / "model"
    if not (model / "model.safetensors").exists():
        print("making the ~0.8B bench model ...", file=sys.stderr)
        subprocess.run([sys.executable, str(REPO / "tests" / "model" / "make_bench_model.py"),
                        str(model)], check=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TINY / f, model / f)
    cfg = json.loads((model / "config.json").read_text())
    L, J = cfg["num_hidden_layers"], cfg["num_local_experts"]
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    expert_bytes = 3 * h * inter * 2
    model_file, model_config = model / "model.safetensors", model / "config.json"
    if weights != "bf16":
        if weights not in BLOCK_BYTES_PER_256:
            sys.exit(f"bench_offload_live: --weights {weights}: not one of bf16, "
                     f"{', '.join(BLOCK_BYTES_PER_256)}")
        gguf = work / f"model-{weights}.gguf"
        if not gguf.exists():
            print(f"fmoe quantize --type {weights} --experts-only ...", file=sys.stderr)
            run([fmoe, "quantize", "--type", weights, "--experts-only", model, "-o", gguf,
                 "--quiet"])
        model, model_file, model_config = gguf, gguf, gguf
        expert_bytes = 3 * h * inter * BLOCK_BYTES_PER_256[weights] // 256
        work = work / weights
        work.mkdir(exist_ok=True)
    lines = PROMPTS.read_text().splitlines()
    prompts, other = work / "prompts.txt", work / "other.txt"
    prompts.write_text("\n".join(lines[:a.prompts]) + "\n")
    other.write_text("\n".join(lines[50:50 + 2 * a.prompts]) + "\n")
    threads = ["--threads", a.threads] if a.threads else []
    common = ["--model", model, "--max-new-tokens", a.gen, "--ignore-eos", "--temperature", 0,
              "--quiet", *threads]

    profile = work / "profile.json"
    print(f"fmoe calibrate --link-file {model_file.name} ...", file=sys.stderr)
    run([fmoe, "calibrate", "--model-config", model_config, "--link-file", model_file, "-o",
         profile, "--quiet", *threads])
    prof = json.loads(profile.read_text())
    alpha, beta = prof["link"]["alpha_s"], prof["link"]["beta_bytes_per_s"]

    print("all resident ...", file=sys.stderr)
    resident = work / "resident.h5"
    rss_res, _, _ = run_rss([fmoe, "record", *common, "--dataset", prompts, "--speculative", 1,
                             "-o", resident])
    res_tpot, _ = live_tpot(resident)
    out, _, _ = run([fmoe, "simulate", "--trace", resident, "--profile", profile, "--policy",
                     "lru", "--cache-experts", L * J, "--json", "--quiet"])
    res_sim = json.loads(out)["results"][0]["tpot_s"]["mean"]
    run([fmoe, "record", *common, "--dataset", other, "-o", work / "store-src.h5"])
    store = work / "store.h5"
    run([fmoe, "build-store", "--trace", work / "store-src.h5", "-o", store,
         "--prefetch-distance", 1, "--quiet"])

    total_bytes = model_file.stat().st_size
    resident_weights = total_bytes - L * J * expert_bytes
    kv = L * 4096 * (cfg["num_key_value_heads"] * (h // cfg["num_attention_heads"])) * 4 * 2

    rows = [{"policy": "all resident", "fraction": 1.0, "cache_experts": L * J,
             "live_tpot_s": res_tpot, "sim_tpot_s": res_sim,
             "gap": (res_sim - res_tpot) / res_tpot, "peak_rss_mib": rss_res}]
    calibs = []  # --paired: every calibration, in the order they were made

    def calibrate():
        c = work / f"profile-{len(calibs)}.json"
        run([fmoe, "calibrate", "--model-config", model_config, "--link-file", model_file,
             "-o", c, "--quiet", *threads])
        calibs.append(c)

    points = []
    for name in a.policies.split(","):
        policy, _, matcher = name.partition(":")
        for frac in (float(x) for x in a.fractions.split(",")):
            n = max(1, round(frac * L * J))
            extra = ["--store", store] if policy == "fmoe" else []
            live_extra = ["--sync-predictions"] if matcher == "sync" else []
            spec = ["--speculative", 1] if policy == "mixtral-offload" else []
            print(f"{name} {n} slots, file tier, O_DIRECT ...", file=sys.stderr)
            pt = {"name": name, "policy": policy, "frac": frac, "n": n, "extra": extra,
                  "runs": []}
            for rep in range(a.repeat):
                t_rep = work / f"live-{name.replace(':', '-')}-{n}-{rep}.h5"
                if a.paired:
                    calibrate()
                rss, secs, err = run_rss([fmoe, "record", *[c for c in common if c != "--quiet"],
                                          "--dataset", prompts, *spec, "--policy", policy,
                                          "--cache-experts", n, *extra, *live_extra,
                                          "--tier", "file",
                                          "--direct-io", "--copy-chunks", 4, "-o", t_rep])
                m = re.search(r"decode ([0-9.]+) MiB per token", err)
                ml = re.search(r"link ([0-9.]+) GiB/s measured", err)
                if not m or not ml:
                    sys.exit(f"bench_offload_live: no awaited bytes or link in record's "
                             f"summary:\n{err}")
                tp, _ = live_tpot(t_rep)
                pt["runs"].append({"trace": t_rep, "live": tp, "rss": rss,
                                   "awaited": float(m.group(1)) * 2**20,
                                   "beta_own": float(ml.group(1)) * 2**30,
                                   "calib": len(calibs) - 1})
            points.append(pt)
    if a.paired:
        calibrate()  # the one after the last run

    def simulate(pt, trace, prof):
        out, _, _ = run([fmoe, "simulate", "--trace", trace, "--profile", prof, "--policy",
                         pt["policy"], "--cache-experts", pt["n"], *pt["extra"],
                         "--copy-chunks", 4, "--json", "--quiet"])
        return json.loads(out)["results"][0]["tpot_s"]["mean"]

    for pt in points:
        n = pt["n"]
        if a.paired:
            # Each run against the calibrations made just before and just after it, averaged
            # (times averaged; rates as their harmonic mean: the mean time per byte), so a
            # link or CPU that drifts during the run is taken at its mean; and, apart, against
            # the link its own copy engine measured (bytes copied over the I/O thread's busy
            # seconds), which takes the link's drift out and leaves the model's error.
            for i, r in enumerate(pt["runs"]):
                before = json.loads(calibs[r["calib"]].read_text())
                after = json.loads(calibs[r["calib"] + 1].read_text())
                both = mean_profile(before, after)
                p_both = work / f"profile-run-{pt['name'].replace(':', '-')}-{n}-{i}.json"
                p_both.write_text(json.dumps(both))
                r["sim"] = simulate(pt, r["trace"], p_both)
                own = json.loads(json.dumps(both))
                own["link"]["beta_bytes_per_s"] = r["beta_own"]
                p_own = p_both.with_suffix(".own.json")
                p_own.write_text(json.dumps(own))
                r["sim_own"] = simulate(pt, r["trace"], p_own)
                r["beta"] = both["link"]["beta_bytes_per_s"]
                r["wait"] = r["awaited"] / r["beta"]
            runs = sorted(pt["runs"], key=lambda r: r["sim"] / r["live"])
            mid = runs[len(runs) // 2]  # the run whose gap is the median
            tpot, sim, own = mid["live"], mid["sim"], mid["sim_own"]
            bound = res_tpot + mid["wait"]
            awaited = mid["awaited"]
        else:
            mid = min(pt["runs"], key=lambda r: r["live"])  # the fastest run
            tpot, awaited = mid["live"], mid["awaited"]
            sim, own = simulate(pt, mid["trace"], profile), None
            bound = res_tpot + awaited / beta
        rss = max(r["rss"] for r in pt["runs"])
        rss_bound = (resident_weights + (n + 1) * expert_bytes + kv) / 2**20 + OVERHEAD_MIB
        rows.append({"policy": pt["name"], "fraction": pt["frac"], "cache_experts": n,
                     "live_tpot_s": tpot, "sim_tpot_s": sim, "gap": (sim - tpot) / tpot,
                     "bound_tpot_s": bound, "live_over_bound": tpot / bound,
                     "live_over_resident": tpot / res_tpot,
                     "awaited_bytes_per_token": awaited, "peak_rss_mib": rss,
                     "rss_bound_mib": rss_bound})
        if own is not None:
            rows[-1].update({"sim_own_link_tpot_s": own, "gap_own_link": (own - tpot) / tpot,
                             "runs": [{k: (str(v) if k == "trace" else v) for k, v in r.items()}
                                      for r in pt["runs"]]})

    print(f"\nmodel {model} ({weights} experts): {L} MoE layers x {J} experts of "
          f"{expert_bytes / 2**20:.1f} MiB; "
          f"calibrated link alpha {alpha * 1e6:.0f} us, beta {beta / 2**30:.2f} GiB/s")
    print(f"{'policy':<16}{'cache':>6}{'N':>4}{'live ms':>9}{'sim ms':>9}{'gap':>8}"
          + (f"{'own-link gap':>13}" if a.paired else "")
          + f"{'bound ms':>10}{'live/bnd':>9}{'live/res':>9}{'RSS MiB':>9}{'RSS bnd':>9}")
    for r in rows:
        own = (f"{r['gap_own_link'] * 100:>12.1f}%" if "gap_own_link" in r else " " * 13) \
            if a.paired else ""
        print(f"{r['policy']:<16}{r['fraction'] * 100:>5.0f}%{r['cache_experts']:>4}"
              f"{r['live_tpot_s'] * 1e3:>9.1f}{r['sim_tpot_s'] * 1e3:>9.1f}{r['gap'] * 100:>7.1f}%"
              + own
              + (f"{r['bound_tpot_s'] * 1e3:>10.1f}{r['live_over_bound']:>9.2f}"
                 f"{r['live_over_resident']:>9.2f}" if 'bound_tpot_s' in r else " " * 28)
              + f"{r['peak_rss_mib']:>9.0f}"
              + (f"{r['rss_bound_mib']:>9.0f}" if 'rss_bound_mib' in r else ""))
    return {"weights": weights, "expert_bytes": expert_bytes, "alpha_s": alpha,
            "beta_bytes_per_s": beta, "rows": rows}


if __name__ == "__main__":
    main()
