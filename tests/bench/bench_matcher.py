#!/usr/bin/env python3
"""Matcher and store benchmark (targets: docs/design.md §9): fmoe's C matcher and build-store
against NumPy implementations of the same searches, in the same run, on the same machine.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python tests/bench/bench_matcher.py \
        --bench BUILD/tests/expertmap/bench_matcher [--quick] [--markdown OUT.md]

For each geometry (Mixtral-like: 32 layers x 8 experts, h = 4096; Qwen3-like: 48 x 128,
h = 2048) and store size C (1K, 10K, 50K):

  trajectory  one token-iteration = the trajectory search after every layer (L searches).
              C: fmoe_matcher (incremental running dot products and norms, one
              vectorised pass over the layer's rows).
              NumPy "naive": per layer, the cosine of the observed prefix with the same
              rows of every map, recomputed from scratch (what a straightforward
              implementation does; O(C*l*J) per layer).
              NumPy "incremental": the same algorithm as the C code (running dots; the
              prefix norms precomputed, [L][C], where the C matcher accumulates them in
              the same pass to keep the store small), so the ratio isolates the
              language and the kernel, not the algorithm.
  semantic    one query against C embeddings: the matcher's semantic pass (fixed-order dot
              products, matcher.c) against NumPy's S @ q.
  build       build-store: new tokens deduplicated into a full store (RDY argmax and
              replacement). C: batches of 256 (products with the store by the matcher's
              kernel, within the batch by sgemm); NumPy: token by token.
  memory      the C store's measured resident size vs C*(h + L*J)*4 bytes (anonymous
              resident memory, after the process's BLAS buffers are warm).
  sgemv       OpenBLAS's matrix-vector product on this core at the search's shapes: the
              rate a BLAS-based search could reach at best.

Rates are per CPU-second of the measuring process (the machine may be shared; wall time
is printed too). Both sides use OpenBLAS through one thread when OPENBLAS_NUM_THREADS=1.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np


def run_c(bench, *args):
    p = subprocess.run([bench, *map(str, args)], capture_output=True, text=True, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def rand_rows(rng, shape):
    v = rng.random(shape, dtype=np.float32) ** 4
    return (v / v.sum(axis=-1, keepdims=True)).astype(np.float32)


def timed(fn, min_s=1.0, min_iter=2):
    """Calls fn() until min_s CPU seconds and min_iter calls; returns (calls, cpu_s, wall_s)."""
    n = 0
    c0, w0 = time.process_time(), time.perf_counter()
    while True:
        fn()
        n += 1
        c = time.process_time() - c0
        if n >= min_iter and c >= min_s:
            return n, c, time.perf_counter() - w0


def np_traj_naive(maps, q):
    C, L, J = maps.shape
    best = 0
    for l in range(L):
        pre = maps[:, : l + 1, :].reshape(C, -1)
        qq = q[: l + 1].ravel()
        s = pre @ qq / (np.linalg.norm(pre, axis=1) * np.linalg.norm(qq) + 1e-30)
        best += int(np.argmax(s))
    return best


def np_traj_incremental(maps_lm, prn, q):
    """maps_lm: [L][C][J] (layer-major copy), prn: [L][C] 1/prefix norms."""
    L, C, J = maps_lm.shape
    dots = np.zeros(C, np.float32)
    qn = 0.0
    best = 0
    for l in range(L):
        dots += maps_lm[l] @ q[l]
        qn += float(q[l] @ q[l])
        best += int(np.argmax(dots * prn[l] / np.sqrt(qn)))
    return best


def np_build(store_m, store_s, new_m, new_s, d):
    """Token-by-token deduplication into a full store (in place)."""
    C = store_m.shape[0]
    L = 1 if store_m.ndim == 2 else None
    flat = store_m.reshape(C, -1)
    nm = np.linalg.norm(flat, axis=1)
    ns = np.linalg.norm(store_s, axis=1) if store_s is not None else None
    Lg = new_m.shape[1]
    ws, wm = d / Lg, (Lg - d) / Lg
    for x in range(new_m.shape[0]):
        xm = new_m[x].ravel()
        r = wm * (flat @ xm) / (nm * np.linalg.norm(xm) + 1e-30)
        if store_s is not None:
            xs = new_s[x]
            r += ws * (store_s @ xs) / (ns * np.linalg.norm(xs) + 1e-30)
        y = int(np.argmax(r))
        flat[y] = xm
        nm[y] = np.linalg.norm(xm)
        if store_s is not None:
            store_s[y] = new_s[x]
            ns[y] = np.linalg.norm(new_s[x])
    return flat


GEOMS = [("Mixtral-like", 32, 8, 4096), ("Qwen3-like", 48, 128, 2048)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", required=True, help="path of the built bench_matcher")
    ap.add_argument("--quick", action="store_true", help="C = 1K and 10K only")
    ap.add_argument("--markdown", help="also write the tables here")
    a = ap.parse_args()
    sizes = [1000, 10000] if a.quick else [1000, 10000, 50000]
    rng = np.random.default_rng(0)
    out = []

    def emit(line=""):
        print(line, flush=True)
        out.append(line)

    emit(f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', '(unset)')}, "
         f"numpy {np.__version__}, {os.cpu_count()} CPUs")
    emit()
    emit("| geometry | C | fmoe C (tok-it/s) | NumPy naive | ratio | NumPy incremental | ratio | "
         "fmoe C batch 16 |")
    emit("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, L, J, h in GEOMS:
        for C in sizes:
            c1 = run_c(a.bench, "traj", L, J, C, 1)
            c16 = run_c(a.bench, "traj", L, J, C, 16)
            maps = rand_rows(rng, (C, L, J))
            q = rand_rows(rng, (L, J))
            n, cpu, _ = timed(lambda: np_traj_naive(maps, q), min_s=1.0, min_iter=1)
            naive = n / cpu
            lm = np.ascontiguousarray(maps.transpose(1, 0, 2))
            prn = 1.0 / np.sqrt(np.cumsum((maps ** 2).sum(axis=2), axis=1)).T.astype(np.float32)
            n, cpu, _ = timed(lambda: np_traj_incremental(lm, prn, q), min_s=1.0)
            inc = n / cpu
            del maps, lm, prn
            r = c1["tokens_per_cpu_s"]
            emit(f"| {name} {L}x{J} | {C} | {r:,.0f} | {naive:,.1f} | {r / naive:,.0f}x | "
                 f"{inc:,.0f} | {r / inc:.1f}x | {c16['tokens_per_cpu_s']:,.0f} |")
    emit()
    emit("| semantic search | C | fmoe C (queries/s) | NumPy | ratio |")
    emit("|---|---:|---:|---:|---:|")
    for name, L, J, h in GEOMS:
        for C in sizes:
            c = run_c(a.bench, "sem", h, C, 1)
            S = rng.standard_normal((C, h), dtype=np.float32)
            ns = np.linalg.norm(S, axis=1)
            x = rng.standard_normal(h, dtype=np.float32)
            n, cpu, _ = timed(lambda: int(np.argmax(S @ x / (ns * np.linalg.norm(x)))))
            del S
            r = c["queries_per_cpu_s"]
            emit(f"| h = {h} ({name}) | {C} | {r:,.0f} | {n / cpu:,.0f} | {r / (n / cpu):.1f}x |")
    emit()
    emit("| build-store | C | fmoe C (tokens/s) | NumPy token by token | ratio |")
    emit("|---|---:|---:|---:|---:|")
    for name, L, J, h in GEOMS:
        for C in sizes[:2]:
            N = 2048
            c = run_c(a.bench, "build", L, J, h, C, N)
            sm = rand_rows(rng, (C, L, J))
            ss = rng.standard_normal((C, h), dtype=np.float32)
            nmaps = rand_rows(rng, (256, L, J))
            nsem = rng.standard_normal((256, h), dtype=np.float32)
            n, cpu, _ = timed(lambda: np_build(sm, ss, nmaps, nsem, 3), min_s=1.0, min_iter=1)
            del sm, ss
            npr = n * 256 / cpu
            r = c["tokens_per_cpu_s"]
            emit(f"| {name} {L}x{J}, h = {h} | {C} | {r:,.0f} | {npr:,.0f} | {r / npr:.1f}x |")
    emit()
    emit("| store memory | C | C*(h+L*J)*4 | measured resident | ratio |")
    emit("|---|---:|---:|---:|---:|")
    for name, L, J, h in GEOMS + [("Mixtral-like, no embeddings", 32, 8, 0),
                                  ("Qwen3-like, no embeddings", 48, 128, 0)]:
        for C in sizes:
            m = run_c(a.bench, "memory", L, J, h, C)
            emit(f"| {name} | {C} | {m['formula_bytes'] / 2**20:,.1f} MiB | "
                 f"{m['resident_bytes'] / 2**20:,.1f} MiB | {m['ratio']:.3f} |")
    emit()
    emit("| OpenBLAS sgemv on this core | shape | GFLOP/s | calls/s |")
    emit("|---|---|---:|---:|")
    for what, M, N in [("whole maps, Mixtral-like", 1000, 32 * 8),
                       ("one layer, Mixtral-like", 1000, 8),
                       ("whole maps, Qwen3-like", 1000, 48 * 128),
                       ("embeddings, h = 4096", 1000, 4096)]:
        g = run_c(a.bench, "sgemv", M, N)
        emit(f"| {what} | {M} x {N} | {g['gflops_per_cpu_s']:.1f} | "
             f"{g['calls_per_cpu_s']:,.0f} |")
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    sys.exit(main())
