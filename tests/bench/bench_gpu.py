"""The CUDA backend's speed: against the CPU backend, and offloaded against its bounds.

    python3 tests/bench/bench_gpu.py [--build DIR] [--work DIR] [--json FILE]
        [--prompts 6] [--gen 32] [--offload-prompts 4] [--offload-gen 16]
        [--policies lru,mixtral-offload,fmoe] [--fractions 0.1,0.25,0.5]
        [--bench-layers 4] [--offload-model DIR] [--budget-s 80] [--paired]
        [--device-backend cuda|cpu]

Needs a CUDA device: without one it checks its arguments, says so in one line and exits
77 (a skip). --device-backend cpu runs every step with the CPU backend in place of the
device, to check the plumbing on a machine without a GPU (its figures mean nothing).

(a) All resident: prefill and decode tokens/s of `fmoe record --backend cuda` and
    `--backend cpu` in the same run, and their ratio, on the bundled fmoe-tiny and on the
    largest of tests/python/make_tiny_models.py's checkpoints, DeepSeek-MoE V1's
    (DEEPSEEK_CONFIG, 1.26 MB against Mixtral's and OLMoE's 1.21 MB; numpy-made, so no
    torch needed) with its vocabulary widened to fmoe-tiny's 4096 so that fmoe-tiny's
    tokenizer drives it. Prompts of ~140 tokens (ten bundled prompts each, joined) and
    --gen greedy tokens (ignore_eos); figures from the trace's /timing (each iteration's
    wall time: prefill chunks of 64, then one per decode step), the first request left
    out: it pays the device's first uses (weights uploaded on first use, lazily loaded
    kernels).
(b) Offloaded decode TPOT (mean over requests of decode seconds per token, the
    simulator's definition: bench_offload_live.live_tpot) of the random Mixtral-layout
    checkpoint of the CPU benchmarks (tests/model/make_bench_model.py, here
    --bench-layers MoE layers of 8 experts of 21 MiB, bf16) with `--backend cuda --tier
    host` (experts in host memory, copied to device slots), per policy and cache size,
    against
    - the link bound of docs/design.md §9 as bench_offload_live.py computes it: the
      all-resident TPOT (compute) + the bytes the run had to wait for per decode token
      (record's summary: "decode X MiB per token") / the calibrated host->device rate;
      target live / bound <= 1.10; also with the link the run's own copy engine measured
      ("link X GiB/s measured");
    - `fmoe simulate` of the trace the run wrote, with the profile `fmoe calibrate
      --backend cuda --link h2d` measured at the model's shapes in the same run, before
      the offloaded runs (--paired: and again after them, the two averaged as
      bench_offload_live --paired does, with its mean_profile: times arithmetically,
      rates harmonically); target |sim - live| / live <= 15%.
All figures go to --json, rewritten after every step (a run cut short still leaves what
it measured), and one table is printed at the end. Estimated (not yet measured) at about
a minute on an H100: making the 0.7 GB model (once per --work), the calibration and nine
offloaded runs take most of it; under a minute on a 2-core VM with --device-backend cpu.
An offloaded run is killed after POINT_TIMEOUT_S (its policy's other sizes are then not
run) and none starts past --budget-s, so a hang cannot eat the device's time (the device
check gives this bench 120 s); failed and skipped points are listed and make the exit
status 1.
Not a test: put the table in docs/results.md with the machine named.
"""
import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time
import types

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "bench"))
sys.path.insert(0, str(REPO / "tests" / "python"))
import bench_offload_live as bol  # noqa: E402  (live_tpot, mean_profile)

TINY = REPO / "datasets" / "fmoe-tiny"
PROMPTS = REPO / "datasets" / "samples" / "prompts_100.txt"
POLICIES = ("lru", "mixtral-offload", "fmoe")
SKIP = 77
POINT_TIMEOUT_S = 30  # one offloaded run: a few seconds on an H100


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.environ.get("FMOE_BUILD_DIR", str(REPO / "build")))
    ap.add_argument("--work", default="/tmp/fmoe-bench-gpu")
    ap.add_argument("--json", help="write every figure here")
    ap.add_argument("--prompts", type=int, default=6,
                    help="(a) requests per run, the first one a warm-up (>= 2)")
    ap.add_argument("--gen", type=int, default=32, help="(a) greedy tokens per request")
    ap.add_argument("--offload-prompts", type=int, default=4, help="(b) requests per run")
    ap.add_argument("--offload-gen", type=int, default=16, help="(b) greedy tokens per request")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--fractions", default="0.1,0.25,0.5",
                    help="(b) cache sizes as fractions of the routed experts")
    ap.add_argument("--bench-layers", type=int, default=4,
                    help="(b) MoE layers of the made model (8 experts of 21 MiB each)")
    ap.add_argument("--offload-model", help="(b) an existing model directory (with a "
                    "tokenizer) instead of making one")
    ap.add_argument("--budget-s", type=float, default=80,
                    help="(b) no offloaded run starts this many seconds after the start")
    ap.add_argument("--paired", action="store_true",
                    help="(b) calibrate again after the offloaded runs and simulate with the "
                         "mean of the two calibrations (bench_offload_live's --paired)")
    ap.add_argument("--device-backend", choices=["cuda", "cpu"], default="cuda",
                    help="cpu: plumbing check without a GPU; the figures mean nothing")
    a = ap.parse_args(argv)
    fmoe = pathlib.Path(a.build) / "cmd" / "fmoe"
    if not fmoe.exists():
        ap.error(f"no fmoe at {fmoe}: --build DIR (or FMOE_BUILD_DIR) names the meson build")
    if a.prompts < 2 or a.gen < 2 or a.offload_prompts < 1 or a.offload_gen < 2:
        ap.error("--prompts >= 2, --gen >= 2, --offload-prompts >= 1, --offload-gen >= 2")
    a.policy_list = [p for p in a.policies.split(",") if p]
    bad = [p for p in a.policy_list if p not in POLICIES]
    if bad or not a.policy_list:
        ap.error(f"--policies: some of {','.join(POLICIES)} (got {a.policies!r})")
    try:
        a.fraction_list = [float(x) for x in a.fractions.split(",") if x]
    except ValueError:
        ap.error(f"--fractions: numbers in (0, 1] (got {a.fractions!r})")
    if not a.fraction_list or any(not 0 < f <= 1 for f in a.fraction_list):
        ap.error(f"--fractions: numbers in (0, 1] (got {a.fractions!r})")
    if a.bench_layers < 1 or a.budget_s < 0:
        ap.error("--bench-layers >= 1, --budget-s >= 0")
    if a.offload_model and not (pathlib.Path(a.offload_model) / "config.json").exists():
        ap.error(f"--offload-model {a.offload_model}: no config.json there")
    a.fmoe = fmoe
    return a


class RunError(Exception):
    pass


def run(args, timeout=300):
    """bench_offload_live.run with a time limit (a hang would eat the device's time):
    (stdout, stderr, seconds); RunError with the command's error otherwise."""
    t = time.monotonic()
    try:
        p = subprocess.run([str(x) for x in args], capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RunError(f"{' '.join(map(str, args))} did not finish in {timeout} s") from None
    if p.returncode != 0:
        raise RunError(f"{' '.join(map(str, args))} exited {p.returncode}:\n{p.stderr[-3000:]}")
    return p.stdout, p.stderr, time.monotonic() - t


def cuda_line(fmoe):
    p = subprocess.run([str(fmoe), "--version"], capture_output=True, text=True, timeout=60)
    for line in p.stdout.splitlines():
        if line.startswith("cuda:"):
            return line[len("cuda:"):].strip()
    return "(no cuda line in fmoe --version)"


def has_device(line):
    m = re.search(r"(\d+) devices?\b", line)
    return bool(m) and int(m.group(1)) > 0


def backend_args(fmoe, tool, kind, notes):
    """["--backend", kind] when `fmoe TOOL` has the option. Without it the CPU needs none
    (its default), calibrate measures the device anyway when there is one (noted), and
    anything else cannot run on the device."""
    p = subprocess.run([str(fmoe), tool, "--help"], capture_output=True, text=True, timeout=60)
    if "--backend" in p.stdout + p.stderr:
        return ["--backend", kind]
    if kind == "cpu":
        return []
    if tool == "calibrate":
        notes.append("fmoe calibrate has no --backend: its default measures the device")
        return []
    sys.exit(f"bench_gpu: fmoe {tool} has no --backend option: cannot run on the device")


def h5_ready(plugin_dir):
    """bench_offload_live.live_tpot imports hdf5plugin for zstd; where it is missing, fmoe's
    own plugin (the build's trace/) is put on h5py's plugin path and a stand-in module
    satisfies the import. (This bench's traces are written uncompressed anyway.)"""
    try:
        import hdf5plugin  # noqa: F401
    except ImportError:
        import h5py
        h5py.h5pl.prepend(str(plugin_dir).encode())
        sys.modules["hdf5plugin"] = types.ModuleType("hdf5plugin")


# ---------------------------------------------------------------------------------------
# (a) all resident
# ---------------------------------------------------------------------------------------

def make_deepseek_tiny(out):
    """make_tiny_models' DeepSeek-MoE V1 checkpoint, vocabulary 4096, fmoe-tiny's tokenizer."""
    import make_tiny_models as tiny
    if (out / "model.safetensors").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    cfg = dict(tiny.DEEPSEEK_CONFIG, vocab_size=4096)
    t = tiny.deepseek_weights(cfg)
    tiny.save_safetensors(out / "model.safetensors", {k: (v, "F32") for k, v in t.items()})
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TINY / f, out / f)
    return out


def resident_speed(trace):
    """(prefill tokens/s, decode tokens/s) from /timing, request 0 left out."""
    import h5py
    with h5py.File(trace, "r") as f:
        pt = f["/requests/prompt_tokens"][:]
        ot = f["/requests/output_tokens"][:]
        it = f["/timing/iteration_s"][:]
        chunk = int(f.attrs.get("prefill_chunk", 0))
    at, pre_tok, pre_s, dec_tok, dec_s = 0, 0, 0.0, 0, 0.0
    for r, (p, o) in enumerate(zip(pt, ot)):
        npre = -(-int(p) // chunk) if chunk > 0 else 1
        pre, dec = it[at:at + npre], it[at + npre:at + npre + int(o)]
        at += npre + int(o)
        if r == 0:
            continue
        pre_tok, pre_s = pre_tok + int(p), pre_s + float(pre.sum())
        dec_tok, dec_s = dec_tok + len(dec), dec_s + float(dec.sum())
    return pre_tok / pre_s, dec_tok / dec_s


def bench_resident(a, work, dev, notes):
    lines = PROMPTS.read_text().splitlines()
    prompts = work / "long-prompts.txt"
    prompts.write_text("\n".join(" ".join(lines[10 * r:10 * r + 10])
                                 for r in range(a.prompts)) + "\n")
    models = {"fmoe-tiny": TINY, "deepseek-tiny": make_deepseek_tiny(work / "deepseek-tiny")}
    rows = []
    for name, model in models.items():
        row = {"model": name}
        for kind in dict.fromkeys([dev, "cpu"]):
            trace = work / f"resident-{name}-{kind}.h5"
            print(f"(a) {name}, --backend {kind} ...", file=sys.stderr)
            run([a.fmoe, "record", "--model", model, "--dataset", prompts,
                     "--max-new-tokens", a.gen, "--ignore-eos", "--temperature", 0,
                     "--compression", "none", "--quiet", "-o", trace,
                     *backend_args(a.fmoe, "record", kind, notes)])
            row[f"{kind}_prefill_tok_s"], row[f"{kind}_decode_tok_s"] = resident_speed(trace)
        row["device"] = dev
        row["prefill_ratio"] = row[f"{dev}_prefill_tok_s"] / row["cpu_prefill_tok_s"]
        row["decode_ratio"] = row[f"{dev}_decode_tok_s"] / row["cpu_decode_tok_s"]
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------
# (b) offloaded
# ---------------------------------------------------------------------------------------

def bench_offload(a, work, dev, notes, out):
    """Fills out["offload"] (info, rows, failed) as it goes; save() after each point."""
    if a.offload_model:
        model = pathlib.Path(a.offload_model)
    else:
        model = work / f"bench-model-{a.bench_layers}"
        if not (model / "model.safetensors").exists():
            print(f"(b) making the {a.bench_layers}-layer bench model ...", file=sys.stderr)
            subprocess.run([sys.executable, str(REPO / "tests" / "model" / "make_bench_model.py"),
                            str(model), "--layers", str(a.bench_layers), "--vocab", "4096"],
                           check=True)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            if not (model / f).exists():
                shutil.copy(TINY / f, model / f)
    cfg = json.loads((model / "config.json").read_text())
    L = cfg["num_hidden_layers"]
    J = cfg.get("num_local_experts") or cfg.get("num_experts")
    lines = PROMPTS.read_text().splitlines()
    prompts, other = work / "offload-prompts.txt", work / "offload-other.txt"
    prompts.write_text("\n".join(lines[:a.offload_prompts]) + "\n")
    other.write_text("\n".join(lines[50:50 + 2 * a.offload_prompts]) + "\n")
    rec = backend_args(a.fmoe, "record", dev, notes)
    common = ["--model", model, "--max-new-tokens", a.offload_gen, "--ignore-eos",
              "--temperature", 0, "--compression", "none", *rec]
    link = "h2d" if dev == "cuda" else "ram"
    cal = backend_args(a.fmoe, "calibrate", dev, notes)
    store = work / "store.h5"

    def calibrate(i):
        path = work / f"profile-{i}.json"
        print("(b) fmoe calibrate " + " ".join([*cal, "--link", link]) + " ...", file=sys.stderr)
        run([a.fmoe, "calibrate", "--model-config", model / "config.json", "--link", link,
             *cal, "-o", path, "--quiet"])
        return path

    def simulate(trace, policy, n, profile, use_store):
        o, _, _ = run([a.fmoe, "simulate", "--trace", trace, "--profile", profile,
                       "--policy", policy, "--cache-experts", n,
                       *(["--store", store] if use_store else []), "--copy-chunks", 4,
                       "--json", "--quiet"])
        return json.loads(o)

    def figures(r, prof_path, res_tpot):
        """The point's simulated TPOTs and bounds, with the profile at prof_path."""
        prof = json.loads(pathlib.Path(prof_path).read_text())
        beta = prof["link"]["beta_bytes_per_s"]
        own = json.loads(json.dumps(prof))
        own["link"]["beta_bytes_per_s"] = r["own_link_bytes_per_s"]
        own_path = work / f"profile-own-{r['policy']}-{r['cache_experts']}.json"
        own_path.write_text(json.dumps(own))
        args = (r["trace"], r["policy"], r["cache_experts"])
        sim = simulate(*args, prof_path, r["policy"] == "fmoe")["results"][0]["tpot_s"]["mean"]
        sim_own = simulate(*args, own_path, r["policy"] == "fmoe")["results"][0]["tpot_s"]["mean"]
        tp = r["live_tpot_s"]
        bound = res_tpot + r["awaited_bytes_per_token"] / beta
        bound_own = res_tpot + r["awaited_bytes_per_token"] / r["own_link_bytes_per_s"] \
            if r["own_link_bytes_per_s"] > 0 else bound
        r.update({"sim_tpot_s": sim, "gap": (sim - tp) / tp, "sim_own_link_tpot_s": sim_own,
                  "gap_own_link": (sim_own - tp) / tp, "bound_tpot_s": bound,
                  "live_over_bound": tp / bound, "bound_own_link_tpot_s": bound_own,
                  "live_over_bound_own_link": tp / bound_own,
                  "live_over_resident": tp / res_tpot,
                  "bound_target_met": tp / bound <= 1.10,
                  "sim_target_met": abs(sim - tp) / tp <= 0.15})

    prof_path = calibrate(0)
    prof = json.loads(prof_path.read_text())
    print("(b) all resident, store ...", file=sys.stderr)
    resident = work / "offload-resident.h5"
    run([a.fmoe, "record", *common, "--dataset", prompts, "--speculative", 1, "--quiet",
         "-o", resident])
    res_tpot, _ = bol.live_tpot(resident)
    res_sim = simulate(resident, "lru", L * J, prof_path, False)
    rows, failed, broken = [], [], set()
    info = {"model": str(model), "layers": L, "experts": J,
            "expert_bytes": res_sim["expert_bytes"],
            "link_used": prof.get("calibration", {}).get("link_used", link),
            "link_alpha_s": prof["link"]["alpha_s"],
            "link_beta_bytes_per_s": prof["link"]["beta_bytes_per_s"],
            "calibrations": [prof], "rows": rows, "failed": failed}
    out["offload"] = info
    rows.append({"policy": "all resident", "fraction": 1.0, "cache_experts": L * J,
                 "live_tpot_s": res_tpot,
                 "sim_tpot_s": res_sim["results"][0]["tpot_s"]["mean"]})
    rows[0]["gap"] = (rows[0]["sim_tpot_s"] - res_tpot) / res_tpot
    a.save()
    if "fmoe" in a.policy_list:
        run([a.fmoe, "record", *common, "--dataset", other, "--quiet",
             "-o", work / "store-src.h5"])
        run([a.fmoe, "build-store", "--trace", work / "store-src.h5", "-o", store,
             "--prefetch-distance", 1, "--quiet"])

    for policy in a.policy_list:
        for frac in a.fraction_list:
            n = max(1, round(frac * L * J))
            extra = (["--store", store] if policy == "fmoe" else []) + \
                (["--speculative", 1] if policy == "mixtral-offload" else [])
            trace = work / f"offload-{policy}-{n}.h5"
            point = {"policy": policy, "fraction": frac, "cache_experts": n}
            # One point failing or hanging leaves the others' figures; a policy that failed
            # is not run at its other sizes, and no run starts past the budget, so that a
            # hang costs the device one POINT_TIMEOUT_S.
            if policy in broken:
                failed.append({**point, "error": f"not run: {policy} failed at another size"})
                continue
            if time.monotonic() - a.t0 > a.budget_s:
                failed.append({**point, "error": f"not run: past --budget-s {a.budget_s:g}"})
                continue
            print(f"(b) {policy}, {n} of {L * J} slots ...", file=sys.stderr)
            try:
                _, err, _ = run([a.fmoe, "record", *common, "--dataset", prompts, "--policy",
                                 policy, "--cache-experts", n, *extra, "--tier", "host",
                                 "--copy-chunks", 4, "-o", trace], timeout=POINT_TIMEOUT_S)
            except RunError as e:
                print(f"bench_gpu: {e}", file=sys.stderr)
                failed.append({**point, "error": str(e)[:2000]})
                broken.add(policy)
                a.save()
                continue
            m = re.search(r"decode ([0-9.]+) MiB per token", err)
            ml = re.search(r"link ([0-9.]+) GiB/s measured", err)
            if not m or not ml:
                raise RunError(f"no awaited bytes or link in record's summary:\n{err}")
            tpot, _ = bol.live_tpot(trace)
            r = {**point, "trace": str(trace), "live_tpot_s": tpot,
                 "awaited_bytes_per_token": float(m.group(1)) * 2**20,
                 "own_link_bytes_per_s": float(ml.group(1)) * 2**30}
            figures(r, prof_path, res_tpot)
            rows.append(r)
            print(f"(b) {policy} {n}: live {tpot * 1e3:.2f} ms, sim {r['sim_tpot_s'] * 1e3:.2f} "
                  f"ms, bound {r['bound_tpot_s'] * 1e3:.2f} ms", file=sys.stderr)
            a.save()
    if a.paired:
        # the calibration after the runs, and every point again with the mean of the two
        # (times arithmetically, rates harmonically: bench_offload_live.mean_profile)
        after = json.loads(calibrate(1).read_text())
        mean = bol.mean_profile(prof, after)
        mean_path = work / "profile-mean.json"
        mean_path.write_text(json.dumps(mean))
        info["calibrations"].append(after)
        info["link_beta_bytes_per_s"] = mean["link"]["beta_bytes_per_s"]
        info["link_alpha_s"] = mean["link"]["alpha_s"]
        res = simulate(resident, "lru", L * J, mean_path, False)
        rows[0]["sim_tpot_s"] = res["results"][0]["tpot_s"]["mean"]
        rows[0]["gap"] = (rows[0]["sim_tpot_s"] - res_tpot) / res_tpot
        for r in rows[1:]:
            figures(r, mean_path, res_tpot)
        a.save()
    return info


# ---------------------------------------------------------------------------------------

def main(argv=None):
    a = parse_args(argv)
    dev = a.device_backend
    line = cuda_line(a.fmoe)
    if dev == "cuda" and not has_device(line):
        print(f"bench_gpu: needs a CUDA device (fmoe --version: cuda: {line})")
        return SKIP
    work = pathlib.Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    h5_ready(pathlib.Path(a.build) / "trace")
    notes = []
    if dev == "cpu":
        notes.append("--device-backend cpu: the device side ran the CPU backend (plumbing "
                     "check); the figures mean nothing")
    t0 = a.t0 = time.monotonic()
    out = {"cuda": line, "device_backend": dev, "notes": notes, "resident": [], "offload": None}

    def save():
        """Everything so far into --json: a run cut short still leaves its figures."""
        out["seconds"] = time.monotonic() - t0
        out["notes"] = list(dict.fromkeys(notes))
        if a.json:
            pathlib.Path(a.json).write_text(json.dumps(out, indent=1))
    a.save = save
    try:
        out["resident"] = bench_resident(a, work, dev, notes)
        save()
        info = bench_offload(a, work, dev, notes, out)
    except RunError as e:
        print(f"bench_gpu: {e}", file=sys.stderr)
        out["error"] = str(e)[:4000]
        save()
        return 1
    resident, offload = out["resident"], info["rows"]
    secs = time.monotonic() - t0
    save()
    print(f"\nfmoe --version: cuda: {line}; device side --backend {dev}")
    print("(a) all resident, tokens/s (first request left out)")
    print(f"{'model':<16}{dev + ' prefill':>14}{'cpu prefill':>13}{'ratio':>8}"
          f"{dev + ' decode':>13}{'cpu decode':>12}{'ratio':>8}")
    for r in resident:
        print(f"{r['model']:<16}{r[dev + '_prefill_tok_s']:>14.0f}{r['cpu_prefill_tok_s']:>13.0f}"
              f"{r['prefill_ratio']:>8.2f}{r[dev + '_decode_tok_s']:>13.0f}"
              f"{r['cpu_decode_tok_s']:>12.0f}{r['decode_ratio']:>8.2f}")
    print(f"\n(b) offloaded decode, --backend {dev} --tier host: {info['layers']} MoE layers x "
          f"{info['experts']} experts of {info['expert_bytes'] / 2**20:.1f} MiB; calibrated "
          f"link ({info['link_used']}) alpha {info['link_alpha_s'] * 1e6:.1f} us, beta "
          f"{info['link_beta_bytes_per_s'] / 2**30:.2f} GiB/s")
    print(f"{'policy':<16}{'cache':>6}{'N':>4}{'live ms':>9}{'sim ms':>9}{'gap':>8}"
          f"{'own-link gap':>13}{'bound ms':>10}{'live/bnd':>9}{'own-link':>9}"
          f"{'live/res':>9}{'link GiB/s':>11}  targets")
    for r in offload:
        if "bound_tpot_s" not in r:
            print(f"{r['policy']:<16}{'100%':>6}{r['cache_experts']:>4}"
                  f"{r['live_tpot_s'] * 1e3:>9.2f}{r['sim_tpot_s'] * 1e3:>9.2f}"
                  f"{r['gap'] * 100:>7.1f}%")
            continue
        met = ("bound ok" if r["bound_target_met"] else "BOUND MISSED") + ", " + \
            ("sim ok" if r["sim_target_met"] else "SIM MISSED")
        print(f"{r['policy']:<16}{r['fraction'] * 100:>5.0f}%{r['cache_experts']:>4}"
              f"{r['live_tpot_s'] * 1e3:>9.2f}{r['sim_tpot_s'] * 1e3:>9.2f}"
              f"{r['gap'] * 100:>7.1f}%{r['gap_own_link'] * 100:>12.1f}%"
              f"{r['bound_tpot_s'] * 1e3:>10.2f}{r['live_over_bound']:>9.2f}"
              f"{r['live_over_bound_own_link']:>9.2f}{r['live_over_resident']:>9.2f}"
              f"{r['own_link_bytes_per_s'] / 2**30:>11.2f}  {met}")
    points = [r for r in offload if "bound_tpot_s" in r]
    print(f"targets: live / bound <= 1.10 at {sum(r['bound_target_met'] for r in points)} of "
          f"{len(points)} points, |sim gap| <= 15% at {sum(r['sim_target_met'] for r in points)}"
          f" of {len(points)}; {secs:.0f} s")
    for f in info["failed"]:
        print(f"FAILED {f['policy']} {f['fraction'] * 100:.0f}% ({f['cache_experts']} slots): "
              f"{f['error'].splitlines()[0]}")
    for n in dict.fromkeys(notes):
        print(f"note: {n}")
    return 1 if info["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
