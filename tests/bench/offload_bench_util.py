"""Helpers shared by the live-offloading benchmarks (bench_offload_live.py,
bench_bigger_than_ram.py): running fmoe, reading a recorded trace's measured times, the
summary line of an offloaded run, and averaging hardware profiles."""
import json
import os
import pathlib
import re
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))


def prog():
    """The running script's name, for error messages."""
    return os.path.basename(sys.argv[0]).removesuffix(".py") or "bench"


def run(args):
    """Runs fmoe; returns (stdout, stderr, seconds), or exits with its error."""
    t = time.monotonic()
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    secs = time.monotonic() - t
    if p.returncode != 0:
        sys.exit(f"{prog()}: {' '.join(map(str, args))} exited {p.returncode}:\n"
                 f"{p.stderr}")
    return p.stdout, p.stderr, secs


def run_rss(args):
    """As run, measuring the child's peak RSS; returns (MiB, seconds, stderr). The peak is
    the child's VmHWM sampled every 20 ms (memory_budget.run_measured), not wait4's
    ru_maxrss, into which Linux carries the forking parent's RSS at exec: a Python parent
    with h5py and numpy loaded adds its own 50-100 MiB to every child's figure."""
    from memory_budget import run_measured
    r = run_measured(args)
    if r.returncode != 0:
        sys.exit(f"{prog()}: {' '.join(map(str, args))} exited {r.returncode}:\n{r.stderr}")
    return r.peak_rss / 2**20, r.wall_s, r.stderr


def trace_phases(trace):
    """Per request of a recorded trace: (prompt tokens, prefill seconds, decode tokens,
    decode seconds), from /timing/iteration_s (a prompt takes ceil(prompt / prefill_chunk)
    iterations, one without a chunk; then one iteration per decode token)."""
    import h5py
    import hdf5plugin  # noqa: F401
    with h5py.File(trace, "r") as f:
        pt = f["/requests/prompt_tokens"][:]
        ot = f["/requests/output_tokens"][:]
        it = f["/timing/iteration_s"][:]
        chunk = int(f.attrs.get("prefill_chunk", 0))
    out, at = [], 0
    for p, o in zip(pt, ot):
        pre = -(-int(p) // chunk) if chunk > 0 else 1
        pre_s = float(it[at: at + pre].sum())
        dec = it[at + pre: at + pre + int(o)]
        at += pre + int(o)
        out.append((int(p), pre_s, len(dec), float(dec.sum())))
    return out


def live_tpot(trace):
    """Mean over requests of decode seconds per decode token, from /timing/iteration_s
    (the simulator's TPOT on a trace whose prompts take one chunk each)."""
    import numpy as np
    tpots = [ds / dn for _, _, dn, ds in trace_phases(trace) if dn > 0]
    return float(np.mean(tpots)), None


OFFLOAD_LINE = re.compile(r"offload (\d+) slots: ([0-9.]+)% hits \((\d+) late\), (\d+) misses")


def offload_summary(stderr):
    """The figures of an offloaded record/generate run's summary line on stderr: slots,
    hit_pct, late, misses, awaited_decode_bytes_per_token, link_bytes_per_s (the copy
    engine's bytes over its busy seconds) and link_decode_bytes_per_s (the same for the
    copies started in decode iterations); None for what the line does not hold."""
    m = OFFLOAD_LINE.search(stderr)
    md = re.search(r"decode ([0-9.]+) MiB per token", stderr)
    ml = re.search(r"link ([0-9.]+) GiB/s measured", stderr)
    mld = re.search(r"link [0-9.]+ GiB/s measured \(decode ([0-9.]+)\)", stderr)
    return {"slots": int(m.group(1)) if m else None,
            "hit_pct": float(m.group(2)) if m else None,
            "late": int(m.group(3)) if m else None,
            "misses": int(m.group(4)) if m else None,
            "awaited_decode_bytes_per_token": float(md.group(1)) * 2**20 if md else None,
            "link_bytes_per_s": float(ml.group(1)) * 2**30 if ml else None,
            "link_decode_bytes_per_s": float(mld.group(1)) * 2**30
            if mld and float(mld.group(1)) > 0 else None}


def mean_profile(a, b, key=""):
    """Two hardware profiles averaged leaf by leaf: times arithmetically, rates (bytes/s,
    FLOP/s) harmonically, so that the mean profile takes the mean time for any work."""
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: mean_profile(a[k], b[k], k) if k in b else a[k] for k in a}
    if isinstance(a, bool) or not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return a
    if ("per_s" in key or "flops" in key) and a > 0 and b > 0:
        return 2.0 / (1.0 / a + 1.0 / b)
    return 0.5 * (a + b)


def simulate_tpot(fmoe, trace, profile, policy, cache_experts, extra=(), copy_chunks=4):
    """fmoe simulate of one policy at one cache size; returns its result object (the
    mean TPOT is ["tpot_s"]["mean"])."""
    out, _, _ = run([fmoe, "simulate", "--trace", trace, "--profile", profile, "--policy",
                     policy, "--cache-experts", cache_experts, *extra, "--copy-chunks",
                     copy_chunks, "--json", "--quiet"])
    return json.loads(out)["results"][0]
