#!/usr/bin/env python3
"""Decode and prefill tokens/s of fmoe against llama.cpp, one GGUF tensor type at a time,
on the same file, at each thread count (the target: fmoe at least llama.cpp's decode on
every type).

    tests/bench/bench_types_vs_llama.py --llama-cpp DIR [--types LIST] [--threads 1,2]
        [--rounds R] [--layers N] [--prompt P] [--gen G] [--quick] [--work DIR]
        [--build DIR] [--json FILE]

The model: make_shaped_gguf.py's small Mixtral layout (8 experts of which 2 are used,
hidden 1024, expert width 1024, vocabulary 32000; --layers N layers, default 8: 288 M
parameters, 104 M multiply-adds a token), written once as a Q4_K_M file with random
weights, then re-quantized by llama-quantize (--allow-requantize) to each type in --types:
a ggml type name (Q4_0 ... IQ1_M) is one file of that type throughout (`--pure`), MXFP4
is llama-quantize's MXFP4_MOE (the expert tensors MXFP4, the rest Q8_0, as gpt-oss's
files are), `mix:NAME` is llama-quantize's own mix NAME (its
choice of type per tensor, e.g. Q6_K for the output head of Q4_K_M). The i-quants that
llama-quantize refuses without an importance matrix get a flat one (every weight 1),
written here in its legacy .dat format. Files are kept in --work and reused: the first run
quantizes every type (about a minute a type for 8 layers on the 2-core VM), later runs
only time.

What is timed: fmoe through tests/model/forward_driver --bench --activations q8 --warmup
(the CPU backend's default, llama.cpp's 8-bit-activation scheme), llama.cpp through
llama-bench: prefill = one forward pass over --prompt tokens, decode = --gen single-token
steps (as llama-bench's pp P and tg G count them). Both warm up first: llama-bench runs the
prompt once untimed, and so does --warmup (without it fmoe's timed prefill was the
process's first pass, paying the page faults of every routed expert's weights). Each (type, threads) pair first runs once per
program, discarded (pages the file in), then --rounds rounds; a round runs every pair,
fmoe then llama.cpp, so that load from other jobs falls on both programs and all types
alike. The table gives the best of the rounds (the JSON every run): on a shared machine
the best is the run that load hit least. Ratio = fmoe / llama.cpp (above 1: fmoe faster).
Bits per weight: the file's tensor bytes × 8 over its parameters (norms and routers,
F32 in every file, included).

--quick: one layer, 8 prompt tokens, 4 generated, one round, types Q4_0,Q4_K unless
--types says otherwise: a smoke test of the whole path (seconds once the files exist).

Exit status: 0 done, 1 a run failed (its stderr is printed; the other types are still
measured, the failed ones named under the table), 2 bad arguments.
"""
import argparse
import json
import pathlib
import statistics
import struct
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
from bench_bigger_than_ram import log  # noqa: E402
from make_shaped_gguf import positive_int as positive  # noqa: E402

PROG = "bench_types_vs_llama"
GENERATOR = HERE / "make_shaped_gguf.py"

# ggml type name -> llama-quantize's file type that, with --pure, gives that type
# throughout (its default type). Q3_K, Q4_K and Q5_K are its aliases of the _M mixes;
# the file type IQ2_S's default type is IQ2_XS, and IQ2_M's is IQ2_S (llama.cpp's
# src/llama-quant.cpp: until 2026-12-07 this table said IQ2_S and the IQ2_S row timed an
# IQ2_XS file).
PURE = {"Q4_0": "Q4_0", "Q4_1": "Q4_1", "Q5_0": "Q5_0", "Q5_1": "Q5_1", "Q8_0": "Q8_0",
        "Q2_K": "Q2_K", "Q3_K": "Q3_K", "Q4_K": "Q4_K", "Q5_K": "Q5_K", "Q6_K": "Q6_K",
        "IQ4_NL": "IQ4_NL", "IQ4_XS": "IQ4_XS", "IQ3_XXS": "IQ3_XXS", "IQ3_S": "IQ3_S",
        "IQ2_XXS": "IQ2_XXS", "IQ2_XS": "IQ2_XS", "IQ2_S": "IQ2_M", "IQ1_S": "IQ1_S",
        "IQ1_M": "IQ1_M", "MXFP4": "MXFP4_MOE"}
# Not --pure: MXFP4_MOE's own rule, the expert tensors MXFP4 and the rest Q8_0, as in
# gpt-oss's files (fmoe refused to load the --pure MXFP4 file llama-quantize wrote: "the
# embeddings holds a non-finite weight"; not looked into)
NOT_PURE = ("MXFP4",)
# llama-quantize's mixes accepted after mix: (those of its list this benchmark knows)
MIXES = ("Q2_K", "Q2_K_S", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S",
         "Q5_K_M", "IQ2_M", "IQ3_XS", "IQ3_M")
# llama-quantize aborts on these without an importance matrix (tensor_requires_imatrix in
# llama.cpp's src/llama-quant.cpp), and ggml's quantiser asserts one for every tensor
# (output and token_embd too under --pure)
NEEDS_IMATRIX = ("IQ3_XXS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M", "IQ2_M",
                 "IQ3_XS", "IQ3_M")
DEFAULT_TYPES = ("Q4_0,Q4_1,Q5_0,Q5_1,Q8_0,Q2_K,Q3_K,Q4_K,Q5_K,Q6_K,IQ4_NL,IQ4_XS,IQ3_XXS,"
                 "IQ3_S,IQ2_XXS,IQ2_XS,IQ2_S,IQ1_S,IQ1_M,MXFP4,mix:Q4_K_M,mix:Q2_K")
QUICK_TYPES = "Q4_0,Q4_K"


def parse_types(s):
    """'Q4_0,mix:Q4_K_M' -> ['Q4_0', 'mix:Q4_K_M'] (upper-cased), or ValueError naming the
    entry that is neither a known type nor mix:<known mix>."""
    out = []
    for item in s.split(","):
        t = item.strip()
        if not t:
            raise ValueError(f"empty entry in '{s}'")
        if t.lower().startswith("mix:"):
            t = "mix:" + t[4:].upper()
            if t[4:] not in MIXES:
                raise ValueError(f"{t}: unknown mix (known: {', '.join(MIXES)})")
        else:
            t = t.upper()
            if t not in PURE:
                raise ValueError(f"{t}: unknown type (known: {', '.join(PURE)}, or mix:NAME)")
        if t in out:
            raise ValueError(f"{t} given twice")
        out.append(t)
    return out


def parse_threads(s):
    out = []
    for item in s.split(","):
        try:
            n = int(item)
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"'{item}' is not a positive integer")
        out.append(n)
    return out


# ---------------------------------------------------------------- the files

def file_summary(path):
    """Bits per weight (all tensors' bytes × 8 over all their elements) and the bytes of
    each ggml type in the file."""
    import gguf
    r = gguf.GGUFReader(str(path))
    nbytes = nelem = 0
    by_type = {}
    for t in r.tensors:
        nbytes += int(t.n_bytes)
        nelem += int(t.n_elements)
        by_type[t.tensor_type.name] = by_type.get(t.tensor_type.name, 0) + int(t.n_bytes)
    return {"bpw": 8.0 * nbytes / nelem if nelem else 0.0, "bytes": nbytes,
            "params": nelem, "bytes_by_type": by_type}


def write_flat_imatrix(src, out):
    """An importance matrix of ones for every matrix of src, in llama.cpp's legacy .dat
    layout (common/imatrix-loader.cpp): int32 entry count, then per entry int32 name
    length, the name, int32 call count (1), int32 value count (row width × experts), the
    f32 values."""
    import gguf
    r = gguf.GGUFReader(str(src))
    entries = []
    for t in r.tensors:
        ne = [int(x) for x in t.shape]
        if len(ne) >= 2:
            entries.append((t.name, ne[0] * (ne[2] if len(ne) > 2 else 1)))
    tmp = out.with_suffix(".partial")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<i", len(entries)))
        for name, n in entries:
            b = name.encode()
            f.write(struct.pack("<i", len(b)) + b + struct.pack("<ii", 1, n))
            f.write(struct.pack(f"<{n}f", *([1.0] * n)))
    tmp.rename(out)


class RunFailed(Exception):
    pass


def run_checked(what, argv, log_file=None):
    """The finished process, or RunFailed with its stderr's end on stderr: the type it
    was for is left out of the table and the exit status is 1."""
    p = subprocess.run([str(x) for x in argv], capture_output=True, text=True)
    if log_file:
        pathlib.Path(log_file).write_text(p.stdout + p.stderr)
    if p.returncode != 0:
        tail = (p.stdout + p.stderr).strip()[-3000:]
        sys.stderr.write(f"{PROG}: {what} exited {p.returncode}: "
                         f"{' '.join(map(str, argv))[:400]}\n{tail}\n")
        raise RunFailed(f"{what} exited {p.returncode}: {tail.splitlines()[-1] if tail else ''}")
    return p


def source_file(a, work):
    src = work / f"mixtral-small-{a.layers}l-q4_k_m.gguf"
    if not src.exists():
        log(f"writing {src.name} ...")
        run_checked("make_shaped_gguf.py",
                    [sys.executable, GENERATOR, "--shape", "mixtral-8x7b", "--small",
                     "--layers", a.layers, "--llama-keys-only", "--quiet", "-o", src])
    return src


def type_file(a, bins, work, src, t, threads):
    """The file of type (or mix) t, quantized from src if it is not in work yet."""
    name = t.replace("mix:", "mix-")
    out = work / f"mixtral-small-{a.layers}l-{name}.gguf"
    if out.exists():
        return out
    mix = t.startswith("mix:")
    ftype = t[4:] if mix else PURE[t]
    pure = not mix and t not in NOT_PURE
    argv = [bins / "llama-quantize", "--allow-requantize"] + (["--pure"] if pure else [])
    if ftype in NEEDS_IMATRIX:
        imx = work / f"mixtral-small-{a.layers}l-flat-imatrix.dat"
        if not imx.exists():
            write_flat_imatrix(src, imx)
        argv += ["--imatrix", imx]
    part = out.with_name(out.name + ".partial")
    argv += [src, part, ftype, max(threads)]
    log(f"llama-quantize {ftype}{' --pure' if pure else ''} -> {out.name} ...")
    t0 = time.monotonic()
    run_checked("llama-quantize", argv, work / (out.name + ".log"))
    part.rename(out)
    log(f"  {time.monotonic() - t0:.0f} s")
    return out


# ---------------------------------------------------------------- the runs

def fmoe_cmd(a, model, threads):
    tokens = ",".join(str(1 + (i * 37) % 4000) for i in range(a.prompt))
    return [a.driver, model, "--tokens", tokens, "--generate", a.gen, "--threads", threads,
            "--activations", "q8", "--bench", "--warmup"]


def llama_cmd(a, bins, model, threads):
    return [bins / "llama-bench", "-m", model, "-p", a.prompt, "-n", a.gen, "-t", threads,
            "-r", 1, "-o", "json"]


def run_fmoe(argv):
    j = json.loads(run_checked("forward_driver", argv).stdout)
    return j["prefill_tok_s"], j["decode_tok_s"]


def run_llama(argv):
    rows = json.loads(run_checked("llama-bench", argv).stdout)
    pp = max(r["avg_ts"] for r in rows if r["n_prompt"] > 0)
    tg = max(r["avg_ts"] for r in rows if r["n_gen"] > 0)
    return pp, tg


# ---------------------------------------------------------------- the table

def ratio(a, b):
    return a / b if a and b else None


def fmt(x, spec=".1f"):
    return "-" if x is None else format(x, spec)


def best(runs, key):
    v = [r[key] for r in runs if r.get(key)]
    return max(v) if v else None


def table(results, threads):
    """Markdown, one row per type and thread count: results[type] = {"bpw": float,
    "runs": {threads: {"fmoe": [{"prefill": tok/s, "decode": tok/s}, ...],
                       "llama.cpp": [...]}}}; best of the runs."""
    out = ["| type | bits/weight | threads | decode fmoe | decode llama.cpp | ratio | "
           "prefill fmoe | prefill llama.cpp | ratio |",
           "|---|---|---|---|---|---|---|---|---|"]
    for t, r in results.items():
        for th in threads:
            runs = r["runs"].get(th) or r["runs"].get(str(th)) or {}
            f, l = runs.get("fmoe", []), runs.get("llama.cpp", [])
            fd, ld, fp, lp = best(f, "decode"), best(l, "decode"), best(f, "prefill"), \
                best(l, "prefill")
            out.append(f"| {t} | {fmt(r.get('bpw'), '.2f')} | {th} | {fmt(fd)} | {fmt(ld)} | "
                       f"{fmt(ratio(fd, ld), '.2f')} | {fmt(fp)} | {fmt(lp)} | "
                       f"{fmt(ratio(fp, lp), '.2f')} |")
    return "\n".join(out) + "\n"


def medians(results, threads):
    """{threads: (median decode ratio, median prefill ratio)} over the types with both."""
    out = {}
    for th in threads:
        dr, pr = [], []
        for r in results.values():
            runs = r["runs"].get(th, {})
            f, l = runs.get("fmoe", []), runs.get("llama.cpp", [])
            d, p = ratio(best(f, "decode"), best(l, "decode")), \
                ratio(best(f, "prefill"), best(l, "prefill"))
            if d:
                dr.append(d)
            if p:
                pr.append(p)
        out[th] = (statistics.median(dr) if dr else None, statistics.median(pr) if pr else None)
    return out


class Parser(argparse.ArgumentParser):
    def error(self, message):
        sys.stderr.write(f"{PROG}: error: {message} (see --help)\n")
        sys.exit(2)


def parse_args(argv):
    p = Parser(prog=PROG, description="fmoe against llama.cpp per GGUF tensor type: decode "
               "and prefill tokens/s on the same file at each thread count.")
    p.add_argument("--llama-cpp", required=True, metavar="DIR",
                   help="llama.cpp tree or folder with llama-bench and llama-quantize "
                        "(build/bin, bin, or the folder itself)")
    p.add_argument("--types", help=f"comma-separated (default {DEFAULT_TYPES})")
    p.add_argument("--threads", default="1,2", help="thread counts (default 1,2)")
    p.add_argument("--rounds", type=positive, help="measured rounds (default 3)")
    p.add_argument("--layers", type=positive, help="layers of the model (default 8)")
    p.add_argument("--prompt", type=positive, help="prefill tokens (default 64)")
    p.add_argument("--gen", type=positive, help="decode tokens (default 32)")
    p.add_argument("--quick", action="store_true", help="a tiny model and run: smoke test")
    p.add_argument("--work", default="/tmp/fmoe-types-bench",
                   help="folder for the model files (reused when there)")
    p.add_argument("--build", default=None,
                   help="meson build with tests/model/forward_driver (default $FMOE_BUILD_DIR "
                        "or build)")
    p.add_argument("--json", metavar="FILE", help="also write every run as JSON")
    a = p.parse_args(argv)
    q = a.quick
    try:
        a.types = parse_types(a.types or (QUICK_TYPES if q else DEFAULT_TYPES))
    except ValueError as e:
        p.error(f"--types: {e}")
    try:
        a.threads = parse_threads(a.threads)
    except ValueError as e:
        p.error(f"--threads: {e}")
    a.rounds = a.rounds or (1 if q else 3)
    a.layers = a.layers or (1 if q else 8)
    a.prompt = a.prompt or (8 if q else 64)
    a.gen = a.gen or (4 if q else 32)
    if a.gen < 2:
        p.error("--gen: at least 2 (forward_driver's decode steps are gen - 1)")
    import os
    build = pathlib.Path(a.build or os.environ.get("FMOE_BUILD_DIR") or REPO / "build")
    a.driver = build / "tests" / "model" / "forward_driver"
    if not a.driver.is_file():
        p.error(f"{a.driver}: not built (meson compile -C {build})")
    d = pathlib.Path(a.llama_cpp)
    a.bins = next((b for b in (d / "build" / "bin", d / "bin", d)
                   if (b / "llama-bench").is_file() and (b / "llama-quantize").is_file()), None)
    if a.bins is None:
        p.error(f"--llama-cpp {d}: no llama-bench and llama-quantize in build/bin, bin or "
                f"the folder itself")
    work = pathlib.Path(a.work)
    if work.exists() and not work.is_dir():
        p.error(f"--work {work}: not a folder")
    return a


def wrong_type(t, name, summary):
    """Why the file `name` (file_summary's `summary`) cannot stand for type t: a pure type's
    file whose bytes are mostly of another type (llama-quantize's file type gave another
    default type), else None. The norms and routers are F32; all else should be t."""
    if t not in PURE or t in NOT_PURE:
        return None
    share = summary["bytes_by_type"].get(t, 0) / summary["bytes"]
    if share >= 0.9:
        return None
    return f"only {share:.0%} of {name}'s bytes are {t}: {summary['bytes_by_type']}"


def main(argv=None):
    a = parse_args(argv)
    work = pathlib.Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    try:
        src = source_file(a, work)
    except RunFailed:
        return 1
    results, files, failed = {}, {}, {}
    for t in a.types:
        try:
            files[t] = type_file(a, a.bins, work, src, t, a.threads)
        except RunFailed as e:
            failed[t] = str(e)
            continue
        s = file_summary(files[t])
        results[t] = {"file": str(files[t]), "bpw": s["bpw"], "bytes": s["bytes"],
                      "params": s["params"], "bytes_by_type": s["bytes_by_type"],
                      "runs": {th: {"fmoe": [], "llama.cpp": []} for th in a.threads}}
        wrong = wrong_type(t, files[t].name, s)
        if wrong:  # not timed: a row under t's name would be another type's numbers
            failed[t] = wrong
            log(f"{t}: {wrong}")
            del results[t]

    def timed(t, th):
        return run_fmoe(fmoe_cmd(a, files[t], th)), run_llama(llama_cmd(a, a.bins, files[t], th))

    pairs = [(t, th) for t in results for th in a.threads]
    for t, th in list(pairs):
        log(f"warm-up {t} t{th}")
        try:
            timed(t, th)
        except RunFailed as e:
            failed[t] = str(e)
            pairs = [(u, n) for u, n in pairs if u != t]
    for rnd in range(a.rounds):
        for t, th in list(pairs):
            runs = results[t]["runs"][th]
            try:
                (fp, fd), (lp, ld) = timed(t, th)
            except RunFailed as e:
                failed[t] = str(e)
                pairs = [(u, n) for u, n in pairs if u != t]
                continue
            runs["fmoe"].append({"prefill": fp, "decode": fd})
            runs["llama.cpp"].append({"prefill": lp, "decode": ld})
            log(f"round {rnd + 1}/{a.rounds} {t} t{th}: decode fmoe {fd:.1f} llama.cpp "
                f"{ld:.1f} tok/s, prefill {fp:.1f} / {lp:.1f}")
    for t in failed:
        results.pop(t, None)
    load = open("/proc/loadavg").read().split()[:3]
    version = subprocess.run([str(a.bins / "llama-bench"), "--version"], capture_output=True,
                             text=True)
    version = (version.stdout + version.stderr).strip().splitlines()
    print(f"### fmoe vs llama.cpp per type: Mixtral layout, {a.layers} layers, "
          f"{a.prompt}-token prefill, {a.gen} decode tokens, best of {a.rounds} rounds\n")
    print(f"Load average at the end {' '.join(load)}; llama.cpp "
          f"{version[0] if version else 'version unknown'}.\n")
    sys.stdout.write(table(results, a.threads))
    for th, (d, p) in medians(results, a.threads).items():
        print(f"\nmedian ratio over the types at {th} thread{'s' if th > 1 else ''}: decode "
              f"{fmt(d, '.2f')}, prefill {fmt(p, '.2f')}")
    for t, why in failed.items():
        print(f"\n{t}: not measured, {why}")
    if results:
        t0 = next(iter(results))
        fc = [str(x) for x in fmoe_cmd(a, files[t0], a.threads[0])]
        fc[fc.index("--tokens") + 1] = f"<{a.prompt} ids: 1 + 37i mod 4000>"
        print("\nCommands (per type file):\n")
        print("    " + " ".join(fc))
        print("    " + " ".join(map(str, llama_cmd(a, a.bins, files[t0], a.threads[0]))))
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(
            {"layers": a.layers, "prompt": a.prompt, "gen": a.gen, "rounds": a.rounds,
             "threads": a.threads, "load": load, "llama_cpp": version[:1],
             "results": results, "failed": failed}, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
