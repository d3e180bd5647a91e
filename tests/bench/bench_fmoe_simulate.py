#!/usr/bin/env python3
"""End-to-end throughput of `fmoe simulate --policy fmoe` (docs/design.md §9: >= 50 K
token-iterations/s per core with a 1K-entry store), on a synthetic Mixtral-like trace.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python tests/bench/bench_fmoe_simulate.py \\
        --build BUILD [--build OTHER_BUILD ...] [--repeat 5] [--hidden 0] [--markdown OUT.md]
        [--python]

For each build (e.g. before and after a change):

  in-process  BUILD/tests/expertmap/bench_fmoe_simulate: the simulator and the policy
              alone (fmoe_sim_run), CPU time of the process;
  command     `fmoe simulate --trace T.h5 --store S.h5 --policy fmoe` on the files the
              first build's bench wrote: everything a user waits for (reading the trace
              and the store, the run, the report), CPU time of the child (getrusage).

The workload (tests/bench/bench_fmoe_simulate.c): 32 MoE layers x 8 experts, top-2, 200
requests of 20 prompt + 100 decode tokens (24,000 token-iterations: a prefill of n tokens
counts n), 16 "topics" the store can learn; the store holds 1000 entries deduplicated from
100 other requests; cache 64 of the 256 experts, d = 3, offline mode. Rates are the best
and the median of --repeat runs, per CPU second (the machine may be shared). The hit and
prefetch counts of every build are printed next to each other: identical decisions give
identical counts. With --python, the Python/NumPy reference (tests/python/reference_fmoe.py)
replays the same files under a linear hardware profile next to `fmoe simulate` with that
profile: the counts must be identical, and the ratio of the rates is docs/design.md §9's
"at least 100x a straightforward implementation".
"""
import argparse
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]


def child_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_inprocess(build, repeat, extra, write=None):
    exe = pathlib.Path(build) / "tests" / "expertmap" / "bench_fmoe_simulate"
    args = [str(exe), "--repeat", str(repeat), *extra]
    if write:
        args += ["--write-trace", str(write[0]), "--write-store", str(write[1])]
    p = subprocess.run(args, capture_output=True, text=True, check=True)
    return [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]


def run_command(build, trace, store, repeat, tokens, extra=()):
    """`fmoe simulate` of the benchmark's cell, repeat times: (rates per CPU s, result)."""
    exe = pathlib.Path(build) / "cmd" / "fmoe"
    rates, res = [], None
    for _ in range(repeat):
        c0 = child_cpu()
        p = subprocess.run([str(exe), "simulate", "--trace", str(trace), "--store", str(store),
                            "--policy", "fmoe", "--cache-experts", "64", "--prefetch-distance",
                            "3", "--threads", "1", "--json", "--quiet", *extra],
                           capture_output=True, text=True, check=True)
        rates.append(tokens / (child_cpu() - c0))
        res = json.loads(p.stdout)["results"][0]
    return rates, res


PROFILE = {"format": "fmoe-hardware", "version": 1, "name": "bench-linear",
           "link": {"alpha_s": 1e-5, "beta_bytes_per_s": 2.5e10},
           "compute": {"attention_s": {"base": 5e-5, "per_token": 1e-6,
                                       "per_token_context": 1e-9},
                       "expert_s": {"base": 3e-5, "per_token": 1e-6}}}


def against_python(build, trace, store, tmp, repeat):
    """`fmoe simulate` and the Python reference on the same files and linear profile."""
    sys.path.insert(0, str(REPO / "tests" / "python"))
    import reference_fmoe as ref
    prof = pathlib.Path(tmp) / "profile.json"
    prof.write_text(json.dumps(PROFILE))
    t = ref.read_trace(trace)
    maps = ref.read_store_maps(store)
    tokens = t["offset"][-1]
    rates, res = run_command(build, trace, store, repeat, tokens,
                             ("--profile", str(prof), "--match-delay", "0"))
    c0 = time.process_time()
    want = ref.replay(t, maps, 64, 3, ref.costs_from_profile(PROFILE, t["expert_bytes"]),
                      store_sem=ref.read_store_semantic(store))
    py_s = time.process_time() - c0
    fm = max(rates)
    py = tokens / py_s
    same = all(res[k] == want[k] for k in want)
    lines = ["| on the same trace, linear profile | token-iterations / CPU s | hits | late hits "
             "| misses | prefetches |", "|---|---:|---:|---:|---:|---:|"]
    for name, rate, r in (("`fmoe simulate` (best of %d)" % repeat, fm, res),
                          ("Python/NumPy reference (one run)", py, want)):
        lines.append(f"| {name} | {rate:,.0f} | {r['hits']:,} | {r['late_hits']:,} | "
                     f"{r['misses']:,} | {r['prefetches']:,} |")
    lines += ["", f"ratio {fm / py:,.0f}x; counts identical: {'yes' if same else 'NO'}"]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", action="append", required=True,
                    help="meson build directory (repeat to compare builds)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=0,
                    help="semantic embedding size of the trace and store (default 0: none)")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--markdown", help="also write the table here")
    ap.add_argument("--python", action="store_true",
                    help="also replay the trace through the straightforward Python/NumPy "
                         "reference (tests/python/reference_fmoe.py, one run: about a "
                         "minute) and compare its counts and speed with `fmoe simulate` "
                         "under the same linear hardware profile (docs/design.md §9: >= 100x)")
    a = ap.parse_args()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    extra = ["--hidden", str(a.hidden), "--requests", str(a.requests)]
    rows = []
    python_text = ""
    with tempfile.TemporaryDirectory() as tmp:
        trace, store = pathlib.Path(tmp) / "t.h5", pathlib.Path(tmp) / "s.h5"
        for i, build in enumerate(a.build):
            runs = run_inprocess(build, a.repeat, extra, (trace, store) if i == 0 else None)
            tokens = runs[0]["tokens"]
            inproc = [r["token_iterations_per_cpu_s"] for r in runs]
            cmd, res = run_command(build, trace, store, a.repeat, tokens)
            rows.append((build, max(inproc), statistics.median(inproc), max(cmd),
                         statistics.median(cmd), runs[0], res))
        if a.python:
            python_text = against_python(a.build[0], trace, store, tmp, a.repeat)
    out = [f"machine: {os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}; "
           f"{rows[0][5]['tokens']} token-iterations, L=32 J=8 h={a.hidden}, 1000-entry store,"
           f" cache 64, d=3, offline; per CPU second, best / median of {a.repeat}",
           "",
           "| build | in-process best | median | `fmoe simulate` best | median | hits "
           "| prefetches |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for build, ib, im, cb, cm, r, res in rows:
        out.append(f"| {build} | {ib:,.0f} | {im:,.0f} | {cb:,.0f} | {cm:,.0f} | "
                   f"{r['hits']:,} ({res['hits']:,}) | {r['prefetches']:,} "
                   f"({res['prefetches']:,}) |")
    out.append("")
    out.append("hits and prefetches: in-process (command); the command's cost model takes the "
               "trace's own geometry, so its times differ, not its decisions")
    if a.python:
        out += ["", python_text]
    text = "\n".join(out)
    print(text)
    if a.markdown:
        pathlib.Path(a.markdown).write_text(text + "\n")
    same = len({(r[5]["hits"], r[5]["prefetches"]) for r in rows}) == 1
    if len(rows) > 1:
        print("decisions (hits, prefetches) identical across builds:", "yes" if same else "NO")
    return 0


if __name__ == "__main__":
    sys.exit(main())
