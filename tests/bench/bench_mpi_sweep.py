#!/usr/bin/env python3
"""MPI sweep benchmark (docs/scaling-out.md): `fmoe simulate` over 1, 2, 3 ... ranks on one
grid, the parallel efficiency, and a model of R ranks on N nodes from the measured per-cell
costs.

    .venv/bin/python tests/bench/bench_mpi_sweep.py --build BUILD [--ranks 1,2,3]
        [--nodes 1,2,4,8] [--cores-per-node 16] [--markdown OUT.md]

The grid: the FLAME-MoE sample (datasets/samples/flame-moe-290m, 8 layers x 64 experts,
top-6, imported here) x 9 policies x 8 cache sizes x 3 prefetch distances x 2 hardware
presets = 304 cells (policies that do not prefetch run once per cache size), whose costs
differ by about 500x (lru at 8 slots against oracle at 192). Each run is
`mpirun --oversubscribe -n R fmoe simulate ... --threads 1 --sweep-out F` (one thread per
rank, so R is the number of workers), timed from outside; every run's JSON must equal the
1-rank run's.

Measured: wall time T(R) and the parallel efficiency E(R) = T(1) / (R T(R)). On a machine
with fewer cores than ranks (this project's 2-vCPU VM at 3 ranks) E is bounded by
cores / R; on a shared machine the timings carry the other processes' load too.

The model: the 1-rank run's --sweep-out gives each cell's cost c_i (its wall_s) and the
fixed part S = T(1) - sum c_i (process start, reading the trace, writing the result: every
rank reads the trace itself, so S does not shrink with ranks). A run of P workers is
modelled as rank 0's dynamic hand-out: cells in grid order, each to the worker that frees
first, so T(P) = S + makespan(P). Messages (one index out, one result line of a few KiB
back per cell) are left out: the measured runs say how much they add. For N nodes of C
cores the table gives P = N C ranks of one thread, the speedup sum c / makespan, and the
bound the costliest cell sets (makespan >= max c_i).
"""
import argparse
import heapq
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
POLICIES = "lru,lfu,belady,oracle,least-stale,moe-infinity,fmoe,fmoe-paper,fmoe-lru"
CACHES = "8,16,32,48,64,96,128,192"
DISTANCES = "1,2,3"
HARDWARE = "rtx3090-pcie4,h100-pcie5"


def env():
    return dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                OMPI_MCA_rmaps_base_oversubscribe="1")


def makespan(costs, workers):
    """Cells in grid order, each to the worker that frees first (rank 0's hand-out)."""
    free = [0.0] * workers
    heapq.heapify(free)
    end = 0.0
    for c in costs:
        t = heapq.heappop(free) + c
        end = max(end, t)
        heapq.heappush(free, t)
    return end


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", required=True, help="meson build directory (built with MPI)")
    ap.add_argument("--ranks", default="1,2,3")
    ap.add_argument("--nodes", default="1,2,4,8,16")
    ap.add_argument("--cores-per-node", type=int, default=16)
    ap.add_argument("--markdown", help="also write the tables here")
    a = ap.parse_args()
    fmoe = pathlib.Path(a.build).resolve() / "cmd" / "fmoe"
    if not fmoe.exists() or not shutil.which("mpirun"):
        sys.exit(f"bench_mpi_sweep: needs {fmoe} and mpirun")
    ranks = [int(x) for x in a.ranks.split(",")]
    if ranks[0] != 1:
        sys.exit("bench_mpi_sweep: --ranks must start with 1 (the reference and the costs)")
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        csvs = [str(REPO / "datasets/samples/flame-moe-290m" / f"layer0{i}.csv")
                for i in range(2, 10)]
        subprocess.run([str(fmoe), "trace", "import", "--format", "dense-csv", "--layers", "8",
                        "--experts", "64", "--top-k", "6", "--tokens-per-request", "64",
                        "--expert-bytes", "6291456", *csvs, "-o", str(tmp / "flame.h5"),
                        "--quiet"], check=True, capture_output=True)
        grid = ["simulate", "--trace", str(tmp / "flame.h5"), "--policy", POLICIES,
                "--cache-experts", CACHES, "--prefetch-distance", DISTANCES, "--hardware",
                HARDWARE, "--threads", "1", "--quiet", "--json"]
        runs, reference = {}, None
        for r in ranks:
            sweep = tmp / f"r{r}.jsonl"
            t0 = time.monotonic()
            cpu0 = os.times()
            p = subprocess.run(["mpirun", "--oversubscribe", "-n", str(r), str(fmoe), *grid,
                                "--sweep-out", str(sweep)], capture_output=True, text=True,
                               env=env())
            wall = time.monotonic() - t0
            cpu1 = os.times()
            if p.returncode != 0:
                sys.exit(f"bench_mpi_sweep: {r} ranks failed:\n{p.stderr}")
            if reference is None:
                reference = p.stdout
            elif p.stdout != reference:
                sys.exit(f"bench_mpi_sweep: the {r}-rank result differs from the first run's")
            cells = [json.loads(x) for x in sweep.read_text().splitlines()[1:]]
            runs[r] = (wall, (cpu1.children_user + cpu1.children_system) -
                       (cpu0.children_user + cpu0.children_system), cells)
    base = runs[ranks[0]]
    n = len(base[2])
    t1 = base[0]
    out.append(f"grid: {n} cells (FLAME-MoE sample: {POLICIES}; caches {CACHES}; "
               f"distances {DISTANCES}; {HARDWARE}); cores here: {os.cpu_count()}")
    out.append("")
    out.append("| ranks | wall s | CPU s (all ranks) | speedup | efficiency |")
    out.append("|---:|---:|---:|---:|---:|")
    for r in ranks:
        wall, cpu, _ = runs[r]
        out.append(f"| {r} | {wall:.2f} | {cpu:.2f} | {t1 / wall:.2f} | "
                   f"{t1 / (r * wall):.2f} |")
    # one worker runs the cells in grid order, so the 1-rank file is in grid order
    costs = [c["wall_s"] for c in base[2]]
    s = base[0] - sum(costs)
    out.append("")
    out.append(f"per-cell cost (1 rank): total {sum(costs):.2f} s, min {min(costs) * 1e3:.2f} ms,"
               f" median {sorted(costs)[n // 2] * 1e3:.2f} ms, max {max(costs) * 1e3:.1f} ms "
               f"({max(costs) / max(min(costs), 1e-9):.0f}x); fixed part S = {s:.2f} s")
    out.append("")
    out.append("| ranks (measured) | model s | measured s |")
    out.append("|---:|---:|---:|")
    for r in ranks:
        out.append(f"| {r} | {s + makespan(costs, r):.2f} | {runs[r][0]:.2f} |")
    out.append("")
    out.append(f"model, N nodes x {a.cores_per_node} cores, one rank of one thread per core:")
    out.append("")
    out.append("| nodes | ranks | makespan s | T s | speedup of the cells | efficiency |")
    out.append("|---:|---:|---:|---:|---:|---:|")
    for nodes in (int(x) for x in a.nodes.split(",")):
        p = nodes * a.cores_per_node
        m = makespan(costs, p)
        out.append(f"| {nodes} | {p} | {m:.3f} | {s + m:.2f} | {sum(costs) / m:.1f} | "
                   f"{sum(costs) / (p * m):.2f} |")
    out.append("")
    out.append(f"bound: the costliest cell, {max(costs):.3f} s, is the shortest makespan any "
               f"number of ranks reaches; the cells alone allow at most "
               f"{sum(costs) / max(costs):.0f}x.")
    text = "\n".join(out)
    print(text)
    if a.markdown:
        pathlib.Path(a.markdown).write_text(text + "\n")


if __name__ == "__main__":
    main()
