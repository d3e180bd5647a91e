#!/usr/bin/env python3
"""Prefill and decode tokens/s of fmoe against llama.cpp on the same GGUF file, for the
DeepSeek-V2-Lite and gpt-oss-20b shapes (the target: at least llama.cpp's decode tokens/s
on the CPU).

    tests/bench/bench_family_decode.py --shape deepseek-v2-lite|gpt-oss-20b [--small]
        --llama-cpp DIR [--threads N] [--tokens N] [--repeat N] [--work DIR]
        [--fmoe PATH] [--seed S] [--llama-repack on|off] [--json FILE]

The model is written by make_shaped_gguf.py into --work (default /tmp/fmoe-family-bench),
or reused when it is there: the full shapes are 10-13 GB (minutes to write), --small a few
hundred MB. Both programs then run the same prompt (bench_bigger_than_ram.PROMPT), greedy,
--tokens new tokens with end-of-sequence ignored, on --threads threads, with the whole
model in RAM: fmoe generate with every expert resident (its default), llama.cpp's
llama-completion with the file mmap'd (-lm mmap), nothing fitted to a device and its
weight repacking as a user gets it by default (--repack: the matrices of the types it
has an interleaved layout for, Q4_K, Q4_0, IQ4_NL, MXFP4 and others on AVX2, copied into
RAM in that layout at load; --llama-repack off passes --no-repack, as
bench_bigger_than_ram.py must, where the model does not fit). One
discarded run of each first (pages the file in), then --repeat rounds, each one fmoe run
followed by one llama.cpp run, so that load from other jobs falls on both alike. The table
gives the median and the best of the rounds; ratio = fmoe / llama.cpp (above 1: fmoe
faster). Prefill counts the prompt tokens each program itself reports (llama.cpp adds a
BOS where the file says so; fmoe tokenizes with the embedded tokenizer.json).

Exit status: 0 done, 1 a run failed (its stderr is printed), 2 bad arguments.
"""
import argparse
import importlib.util
import json
import pathlib
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import bench_bigger_than_ram as bbr  # noqa: E402
from bench_bigger_than_ram import PROMPT, llama_bins, llama_version, log, parse_llama  # noqa: E402
from make_shaped_gguf import positive_int as positive  # noqa: E402

PROG = "bench_family_decode"
SHAPES = ("deepseek-v2-lite", "gpt-oss-20b")


def load_generator():
    spec = importlib.util.spec_from_file_location("make_shaped_gguf", bbr.GENERATOR)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def make_model(a):
    """The file, through bench_bigger_than_ram.make_model (reuse, disk check, the
    generator's command), with the full size of these shapes from the generator's plan."""
    g = load_generator()
    cfg = g.model_config(a.shape, False, None)
    bbr.FULL_BYTES[a.shape] = sum(g.nbytes_of(ne, t) for _n, ne, t, _l in g.plan(cfg, a.type))
    return bbr.make_model(a, a.shape, pathlib.Path(a.work))


def fmoe_cmd(a, model):
    return [a.fmoe, "generate", "--model", model, "--prompt", PROMPT, "--max-new-tokens",
            a.tokens, "--ignore-eos", "--temperature", 0, "--threads", a.threads,
            "--backend", "cpu", "--json"]


def llama_cmd(a, bins, model):
    return [bins / "llama-completion", "-m", model, "-p", PROMPT, "-n", a.tokens,
            "-t", a.threads, "-c", 2048, "--temp", 0, "--seed", 0, "--ignore-eos", "-no-cnv",
            "--no-display-prompt", "--repack" if a.llama_repack == "on" else "--no-repack",
            "-fit", "off", "-lm", "mmap", "--no-warmup"]


def run_one(kind, argv):
    p = subprocess.run([str(x) for x in argv], capture_output=True, text=True,
                       errors="replace")  # generated text may cut a UTF-8 sequence
    if p.returncode != 0:
        sys.stderr.write(f"{PROG}: {kind} exited {p.returncode}: {' '.join(map(str, argv))}\n"
                         f"{p.stderr[-3000:]}\n")
        sys.exit(1)
    if kind == "fmoe":
        j = json.loads(p.stdout)
        return {"prefill_tokens": j["prefill_tokens"], "prefill_tok_s": j["prefill_tok_s"],
                "decode_tokens": j["decode_steps"], "decode_tok_s": j["decode_tok_s"]}
    m = parse_llama(p.stderr)
    if m is None:
        sys.stderr.write(f"{PROG}: no timings in llama-completion's output:\n"
                         f"{p.stderr[-3000:]}\n")
        sys.exit(1)
    return {"prefill_tokens": m["prefill_tokens"],
            "prefill_tok_s": m["prefill_tokens"] / m["prefill_s"] if m["prefill_s"] else None,
            "decode_tokens": m["decode_tokens"],
            "decode_tok_s": m["decode_tokens"] / m["decode_s"] if m["decode_s"] else None}


def summary(runs, key):
    v = [r[key] for r in runs if r[key]]
    return (statistics.median(v), max(v)) if v else (None, None)


def fmt(x):
    return "-" if x is None else f"{x:.1f}"


def ratio(a, b):
    return "-" if not a or not b else f"{a / b:.2f}"


def table(a, model, cmds, runs, version):
    out = [f"### {a.shape}{' (--small)' if a.small else ''}: fmoe vs llama.cpp, CPU, "
           f"{a.threads} threads",
           "",
           f"Model `{model}` ({model.stat().st_size / 1e9:.2f} GB), {a.tokens} new tokens, "
           f"{a.repeat} interleaved rounds after one discarded run each; llama.cpp "
           f"{version}, repacking {a.llama_repack}.",
           "",
           "| | prompt tokens | prefill tok/s (median, best) | decode tok/s (median, best) |",
           "|---|---|---|---|"]
    s = {}
    for kind in ("fmoe", "llama.cpp"):
        s[kind] = (summary(runs[kind], "prefill_tok_s"), summary(runs[kind], "decode_tok_s"))
        (pm, pb), (dm, db) = s[kind]
        out.append(f"| {kind} | {runs[kind][0]['prefill_tokens']} | {fmt(pm)}, {fmt(pb)} | "
                   f"{fmt(dm)}, {fmt(db)} |")
    out.append(f"| ratio fmoe / llama.cpp | | {ratio(s['fmoe'][0][0], s['llama.cpp'][0][0])}, "
               f"{ratio(s['fmoe'][0][1], s['llama.cpp'][0][1])} | "
               f"{ratio(s['fmoe'][1][0], s['llama.cpp'][1][0])}, "
               f"{ratio(s['fmoe'][1][1], s['llama.cpp'][1][1])} |")
    out += ["", "Commands:", ""]
    for label, argv in cmds.items():
        out.append(f"    # {label}")
        out.append("    " + " ".join(f"'{x}'" if " " in str(x) else str(x) for x in argv))
    return "\n".join(out) + "\n", s


class Parser(argparse.ArgumentParser):
    def error(self, message):
        sys.stderr.write(f"{PROG}: error: {message} (see --help)\n")
        sys.exit(2)




def main(argv=None):
    p = Parser(prog=PROG, description="fmoe against llama.cpp on the same DeepSeek-V2-Lite- "
               "or gpt-oss-20b-shape GGUF file: prefill and decode tokens/s.")
    p.add_argument("--shape", required=True, choices=SHAPES)
    p.add_argument("--small", action="store_true", help="the generator's small variant")
    p.add_argument("--llama-cpp", required=True, metavar="DIR",
                   help="llama.cpp tree or folder with llama-completion (build/bin, bin, or "
                        "the folder itself)")
    p.add_argument("--threads", type=positive, default=2)
    p.add_argument("--tokens", type=positive, default=64, help="new tokens per run")
    p.add_argument("--repeat", type=positive, default=3, help="measured rounds")
    p.add_argument("--work", default="/tmp/fmoe-family-bench",
                   help="folder for the model file (reused when there)")
    p.add_argument("--fmoe", default=str(REPO / "build" / "cmd" / "fmoe"))
    p.add_argument("--seed", type=int, default=0, help="the generator's seed")
    p.add_argument("--llama-repack", choices=("on", "off"), default="on",
                   help="llama.cpp's weight repacking (default on, llama.cpp's own default)")
    p.add_argument("--json", metavar="FILE", help="also write every run as JSON")
    a = p.parse_args(argv)
    a.type, a.skew, a.layers = "q4_k_m", None, None
    if not pathlib.Path(a.fmoe).is_file():
        p.error(f"--fmoe {a.fmoe}: no such file (build fmoe first)")
    work = pathlib.Path(a.work)
    if work.exists() and not work.is_dir():
        p.error(f"--work {work}: not a folder")
    work.mkdir(parents=True, exist_ok=True)
    if not pathlib.Path(a.llama_cpp).is_dir():
        p.error(f"--llama-cpp {a.llama_cpp}: not a folder")
    bins = llama_bins(a.llama_cpp)

    model = make_model(a)
    cmds = {"fmoe": fmoe_cmd(a, model), "llama.cpp": llama_cmd(a, bins, model)}
    for kind, argv in cmds.items():
        log(f"{kind}: warm-up run")
        run_one(kind, argv)
    runs = {"fmoe": [], "llama.cpp": []}
    for r in range(a.repeat):
        for kind, argv in cmds.items():
            t = time.monotonic()
            runs[kind].append(run_one(kind, argv))
            log(f"round {r + 1}/{a.repeat} {kind}: decode "
                f"{fmt(runs[kind][-1]['decode_tok_s'])} tok/s ({time.monotonic() - t:.1f} s)")
    cmds = {"generate the model": bbr.COMMANDS.get("generate the model",
                                                   ["(reused)", str(model)]), **cmds}
    text, s = table(a, model, cmds, runs, llama_version(bins))
    sys.stdout.write(text)
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(
            {"shape": a.shape, "small": a.small, "threads": a.threads, "tokens": a.tokens,
             "model": str(model), "runs": runs,
             "commands": {k: [str(x) for x in v] for k, v in cmds.items()}}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
