"""fmoe against llama.cpp on a model larger than the memory they are given.

    .venv/bin/python tests/bench/bench_bigger_than_ram.py [--small] [--llama-cpp DIR]
        [--threads N] [--tokens N] [--repeat R] [--json OUT] [--work DIR] [--keep]
        [--shapes mixtral-8x7b,qwen3-30b-a3b] [--policies lru,fmoe,moe-infinity,...]

For each shape, a GGUF file with the tensor names, shapes and Q4_K_M type mix of
Mixtral-8x7B or Qwen3-30B-A3B and random weights (tests/bench/make_shaped_gguf.py; with
--small its narrow variant with 24 layers instead of 8, about 450 MB, see below) is
written under --work, and:

1. **The same memory for both programs.** A helper process (tests/bench/memory_budget.py)
   holds the rest of RAM as touched anonymous memory, so that MemAvailable equals the
   budget when each run starts (checked, and shown in the table); the page cache is
   dropped before each run (`echo 3 > /proc/sys/vm/drop_caches`, else posix_fadvise
   DONTNEED on the model file). The machines have no swap, so a program that needs more
   than the budget is killed by the OOM killer; the holder lowers its own oom_score_adj
   where allowed, else the programs run with oom_score_adj 1000, so the killer picks the
   program, and an OOM kill is reported as such. What a program can really hold is
   measured before and after each shape's runs (a probe that grows until the OOM killer
   stops it) and printed: MemAvailable leaves out the kernel's reserves above its min
   watermark and part of the page cache of other processes, 100-300 MiB on the 24 GiB
   development VM, which a program under pressure gets too. `--budget-mode capacity`
   lowers MemAvailable by that much instead, which is exact on an idle machine but, on a
   shared one, squeezes out the working sets of the other processes and everything
   thrashes. Budget: a third of the file (about 8.8 GiB for Mixtral-8x7B Q4_K_M, 5.8 GiB
   for Qwen3-30B-A3B); with --small a third of the file plus --budget-extra-mib (default
   96 with --small, 0 without). The small files need both: each program's own memory
   (binary, libraries, tokenizer, buffers, the non-expert weights: 100-150 MiB for fmoe)
   does not shrink with the model's width, and the kernel's few hundred MiB of slack do
   not either; with the generator's 8 layers (180 MB files) a third of the file is less
   than either program's fixed memory, and with an allowance that makes fmoe fit, the
   whole file fits in llama.cpp's page cache. 24 layers and 96 MiB leave fmoe's slots
   about a quarter of the experts, as a third of the real files does.
2. **fmoe** records the prompt with `--tier file --direct-io --cache-gb X` and each policy
   of --policies (`fmoe` with a store built by `fmoe build-store` from a recording of
   other prompts on the same model; `mixtral-offload` with `--speculative 1`). X is the
   budget less fmoe's fixed memory, measured by a probe run with top-k slots (its peak RSS
   less those slots and the scratch slot: the resident non-expert weights, the KV cache,
   the tokenizer and the buffers), less the scratch slot and a margin (6% of the budget,
   at least 32 MiB: with less, the kernel evicts fmoe's own file pages, its binary and
   the mapped non-expert weights, whenever another process on the machine allocates, and
   decode slows several times). The bench prints X and its parts.
3. **llama.cpp** (`llama-completion`, built from source: tests/bench/bench_cpu_forward.sh
   says how) decodes the same prompt from the same file with the same threads and context,
   reading the file with mmap (`-lm mmap`, as it must when the model does not fit) and
   without weight repacking (`--no-repack`: repacking copies the Q4_K tensors into RAM),
   `--no-warmup` (its warm-up reads every expert; fmoe's runs start cold too), `-fit off`
   (otherwise it shrinks unset parameters when little memory is free),
   `-b/-ub --ubatch` (default 128: one batch holds the prompt; llama.cpp's default 512
   reserves compute buffers that are a large part of a small budget). Once more with
   `-lm none` (no mmap: the weights read into RAM) to show what happens then.
4. Runs are interleaved: --repeat rounds, each one run of every configuration, the
   fastest decode of each kept, among the rounds in which other processes did not take
   more than max(32 MiB, 10% of the budget) of the memory while it ran (the machine's
   anonymous memory growing beyond the program's own; such a round is counted as
   disturbed and shown; all rounds' decode rates are in the table). Then both programs with the whole RAM (the ceiling): no
   holder, page cache kept, after one discarded warm-up run each; fmoe all resident (the
   file mapped and read in place, as llama.cpp's mmap) when the file fits in 85% of
   MemAvailable, llama.cpp then with its default repacking (`--repack`); else fmoe
   offloaded with four fifths of it in slots and llama.cpp with `--no-repack`.
5. **The bound.** fmoe's decode time per token against the bytes it waited for per decode
   token (its summary line) over the disk bandwidth `fmoe calibrate --link-file
   --link-decode-gb X` measured in a short decode with the runs' slots and threads (the
   reads a decode step makes, beside its products on the same cores: on two cores 8-12%
   slower than reads timed on an idle CPU), plus the decode time with every expert resident (the
   ceiling run when it is all resident, else the simulator's, with the calibrated
   profile, on the ceiling's trace). Beside it, the same plus the calibrated per-read
   latency for each miss of a decode token (the simulator's count on the run's trace):
   with Qwen3's 128 small experts a token waits for many short reads.
6. **The simulator.** `fmoe simulate --profile` (the calibration above) replays each live
   run's own trace with its policy and slots (the gap against live TPOT), and the
   ceiling run's trace (recorded with --speculative 1) with every policy at the same slots:
   the policy it would recommend, against the fastest live; and each run's trace once more
   with the link that run's copy engine measured in its decode steps, its bytes over its
   busy seconds (the "own link" gap: the model's error with the disk's drift since the
   calibration, and prefill's contention for the cores, taken out); and with the link
   measured again seconds before each run, under the holder, by `fmoe calibrate --base
   --link-decode-gb X` (the first calibration's compute, this minute's disk).

Targets, printed as met or not: decode tokens/s at least 3x llama.cpp's (mmap) and
prefill at least 1x; live TPOT within 1.2x of the bound; peak RSS (VmHWM sampled every
20 ms) at or under the budget; simulated TPOT within 15% of every
live one; the simulator's best policy is the fastest live.

Output: markdown tables ready for docs/results.md, then the exact commands (--json: every
figure). Not a test: figures depend on the machine, its disk and what else runs on it.
The holder takes most of the machine's memory while the budget runs last; other
processes on the machine share the budget meanwhile.
"""
import argparse
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
from memory_budget import (GIB, MIB, Holder, HolderDied, drop_caches,  # noqa: E402
                           mem_available, meminfo, run_measured)
from offload_bench_util import offload_summary, run, simulate_tpot, trace_phases  # noqa: E402

PROG = "bench_bigger_than_ram"
PROMPTS = REPO / "datasets" / "samples" / "prompts_100.txt"
GENERATOR = HERE / "make_shaped_gguf.py"
SHAPES = ("mixtral-8x7b", "qwen3-30b-a3b")
POLICIES = "lru,fmoe,moe-infinity,mixtral-offload,ondemand"
PROMPT = ("In a small village at the edge of a great forest there lived an old clockmaker "
          "who spent his days repairing the watches of travellers. One winter evening a "
          "stranger arrived with a pocket watch that ran backwards, and asked the "
          "clockmaker to tell him the story of every hour it had lost.")
# bytes of the full-size files, for the disk-space check (make_shaped_gguf.py's docstring)
FULL_BYTES = {"mixtral-8x7b": 28.5e9, "qwen3-30b-a3b": 19e9}

COMMANDS = {}  # label -> argv, the first of each kind that ran


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def note_cmd(label, argv):
    COMMANDS.setdefault(label, [str(a) for a in argv])


def runc(label, argv):
    """run() with the command noted for the report."""
    note_cmd(label, argv)
    return run(argv)


# ---------------------------------------------------------------- the model file

def gguf_layout(path):
    """What the budget arithmetic needs from a GGUF file: the architecture's counts, each
    layer's bytes per routed expert, and the bytes of everything else (resident)."""
    import gguf
    r = gguf.GGUFReader(str(path))

    def kv(key, default=None):
        f = r.fields.get(key)
        return default if f is None else f.contents()

    arch = kv("general.architecture")
    L = int(kv(f"{arch}.block_count"))
    J = int(kv(f"{arch}.expert_count"))
    heads = int(kv(f"{arch}.attention.head_count"))
    h = int(kv(f"{arch}.embedding_length"))
    layer = [0] * L
    total = 0
    types = {}
    for t in r.tensors:
        total += int(t.n_bytes)
        if "_exps." in t.name:
            layer[int(t.name.split(".")[1])] += int(t.n_bytes)
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    per_expert = [b // J for b in layer]
    return {"arch": arch, "layers": L, "experts": J,
            "top_k": int(kv(f"{arch}.expert_used_count")),
            "hidden": h, "heads": heads,
            "kv_heads": int(kv(f"{arch}.attention.head_count_kv")),
            "head_dim": int(kv(f"{arch}.attention.key_length", h // heads)),
            "vocab": len(r.fields["tokenizer.ggml.tokens"].data)
            if "tokenizer.ggml.tokens" in r.fields else None,
            "expert_bytes": per_expert, "experts_total": sum(layer),
            "non_expert_bytes": total - sum(layer), "tensor_bytes": total,
            "types": types, "fmoe_tokenizer": "fmoe.file.tokenizer.json" in r.fields}


def make_model(a, shape, work):
    out = work / (f"{shape}{'-small' if a.small else ''}"
                  f"{f'-{a.layers}l' if a.layers else ''}-{a.type}.gguf")
    if out.exists():
        log(f"{out.name}: reusing the file there")
        return out
    need = 1e9 if a.small else FULL_BYTES[shape]
    free = shutil.disk_usage(work).free
    if free < need * 1.05:
        sys.exit(f"{PROG}: {work}: {free / 1e9:.1f} GB free, {need / 1e9:.1f} GB needed for "
                 f"{shape}")
    cmd = [sys.executable, GENERATOR, "--shape", shape, "--type", a.type, "--seed", a.seed,
           "-o", out] + (["--small"] if a.small else []) \
        + (["--skew", a.skew] if a.skew is not None else []) \
        + (["--layers", a.layers] if a.layers else [])
    log(f"writing {out.name} ...")
    note_cmd("generate the model", cmd)
    subprocess.run([str(c) for c in cmd], check=True)
    return out


# ---------------------------------------------------------------- llama.cpp

def llama_bins(d):
    if not d:
        return None
    d = pathlib.Path(d)
    for b in (d / "build" / "bin", d / "bin", d):
        if (b / "llama-completion").is_file():
            return b
    sys.exit(f"{PROG}: --llama-cpp {d}: no llama-completion in build/bin, bin or the folder "
             f"itself")


def llama_version(bins):
    p = subprocess.run([str(bins / "llama-completion"), "--version"], capture_output=True,
                       text=True)
    m = re.search(r"version: .*", p.stdout + p.stderr)
    return m.group(0) if m else "version unknown"


def llama_cmd(a, bins, model, ctx, load_mode, warmup, repack=False):
    """repack: llama.cpp's default weight repacking (Q4_K, Q4_0, IQ4_NL, MXFP4 rows copied
    into its interleaved layout in anonymous memory at load): only where the whole file
    fits in RAM, as for fmoe's all-resident ceiling; otherwise --no-repack, as a model
    larger than RAM cannot be copied into it."""
    return [bins / "llama-completion", "-m", model, "-p", PROMPT, "-n", a.tokens,
            "-t", a.threads, "-c", ctx, "-b", a.ubatch, "-ub", a.ubatch, "--temp", 0,
            "--seed", 0, "--ignore-eos", "-no-cnv", "--no-display-prompt",
            "--repack" if repack else "-nr",
            "-fit", "off", "-lm", load_mode] + ([] if warmup else ["--no-warmup"])


def parse_llama(stderr):
    pe = re.search(r"prompt eval time =\s*([0-9.]+) ms /\s*(\d+) tokens", stderr)
    ev = re.search(r":\s+eval time =\s*([0-9.]+) ms /\s*(\d+) runs", stderr)
    if not pe or not ev:
        return None
    return {"prefill_tokens": int(pe.group(2)), "prefill_s": float(pe.group(1)) / 1e3,
            "decode_tokens": int(ev.group(2)), "decode_s": float(ev.group(1)) / 1e3}


# ---------------------------------------------------------------- fmoe

def fmoe_record_cmd(a, fmoe, model, dataset, ctx, out, tokens=None, offload=None,
                    speculative=False):
    """offload: None (all resident) or dict(policy, cache=["--cache-gb", X] or
    ["--cache-experts", N], store=path or None)."""
    cmd = [fmoe, "record", "--backend", "cpu", "--model", model, "--dataset", dataset,
           "--dataset-format", "text", "--max-new-tokens", tokens or a.tokens,
           "--ignore-eos", "--temperature", 0, "--threads", a.threads, "--max-context", ctx]
    if speculative:
        cmd += ["--speculative", 1]
    if offload:
        cmd += ["--policy", offload["policy"], *offload["cache"], "--tier", "file",
                "--direct-io", "--copy-chunks", 4]
        if offload.get("store"):
            cmd += ["--store", offload["store"]]
    return cmd + ["-o", out]


def phases_of(trace):
    ph = trace_phases(trace)
    p, ps, d, ds = (sum(x[i] for x in ph) for i in range(4))
    return {"prefill_tokens": p, "prefill_s": ps, "decode_tokens": d, "decode_s": ds,
            "tpot_s": ds / d if d else None}


def rates(m):
    m["prefill_tok_s"] = m["prefill_tokens"] / m["prefill_s"] if m.get("prefill_s") else None
    m["decode_tok_s"] = m["decode_tokens"] / m["decode_s"] if m.get("decode_s") else None
    return m


# ---------------------------------------------------------------- one shape

class Shape:
    def __init__(self, a, shape, fmoe, bins):
        self.a, self.shape, self.fmoe, self.bins = a, shape, fmoe, bins
        self.work = pathlib.Path(a.work) / (shape + ("-small" if a.small else ""))
        self.work.mkdir(parents=True, exist_ok=True)
        self.runs = []  # every measured run
        self.notes = []

    def note(self, s):
        log(s)
        self.notes.append(s)

    def relink(self, out):
        """The disk measured again, under the same conditions as the run that follows (the
        holder in place, the page cache dropped), a few seconds before it: `fmoe calibrate
        --base` keeps the first calibration's compute and replaces its link. The disk of a
        shared VM drifts by a third within an hour; a profile is as good as the minutes it
        was measured in."""
        cmd = [self.fmoe, "calibrate", "--base", self.profile, "--link-file", self.model,
               *self.decode_link_args(), "-o", out, "--quiet"]
        note_cmd("re-measure the link before a run", cmd)
        r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
        if r.returncode != 0:
            self.note(f"calibrate --base failed ({r.stderr.strip()}); that run has no fresh "
                      f"profile")
            return None
        drop_caches([self.model])
        return out

    def measured(self, label, cfg, argv, phase, rnd, holder=None, trace=None, relink=None):
        """One run under the memory conditions of PHASE (budget: page cache dropped,
        MemAvailable brought to the budget; ceiling: nothing done). RELINK: a path for a
        profile with the link measured just before the run (self.relink)."""
        a = self.a
        note_cmd(f"{label}", argv)
        avail = None
        fresh = None
        if phase == "budget":
            drop_caches([self.model])
            try:
                avail = holder.hold_to_budget(self.budget)
            except HolderDied as e:
                self.note(f"{e}; restarting it")
                avail = holder.hold_to_budget(self.budget)
            if relink:
                fresh = self.relink(relink)
        else:
            avail = mem_available()
        r = run_measured(argv, oom_adj=holder.program_oom_adj if holder else 0,
                         timeout=a.run_timeout)
        rec = {"config": cfg, "phase": phase, "round": rnd, "status": r.status,
               "wall_s": r.wall_s, "peak_rss": r.peak_rss, "available_at_start": avail,
               "min_available": r.min_available, "others_grew": r.others_grew,
               "disturbed": phase == "budget"
               and r.others_grew > max(32 * MIB, self.budget // 10),
               "major_faults": r.major_faults,
               "user_s": r.user_s, "sys_s": r.sys_s, "argv": [str(x) for x in argv],
               "fresh_profile": str(fresh) if fresh else None}
        if r.status == "ok":
            if cfg.startswith("llama"):
                m = parse_llama(r.stderr)
                if m is None:
                    rec["status"] = "no timings"
                    rec["stderr_tail"] = r.stderr[-2000:]
                else:
                    rec.update(rates(m))
            else:
                rec.update(rates(phases_of(trace)))
                rec["trace"] = str(trace)
                rec.update(offload_summary(r.stderr))
        else:
            rec["stderr_tail"] = r.stderr[-2000:]
        if holder is not None and phase == "budget" and not holder.alive():
            rec["holder_died"] = True
        self.runs.append(rec)
        dec = rec.get("decode_tok_s")
        phase = {"unheld": "no holder"}.get(phase, phase)
        log(f"  {cfg:<22} {phase:<8} round {rnd}: {rec['status']}"
            + (f", prefill {rec['prefill_tok_s']:.1f} tok/s, decode {dec:.2f} tok/s"
               if dec else "")
            + f", peak RSS {r.peak_rss / MIB:.0f} MiB, {r.major_faults} major faults"
            + (f", others took {r.others_grew / MIB:.0f} MiB meanwhile (disturbed)"
               if rec["disturbed"] else "")
            + (f", MemAvailable at start {avail / MIB:.0f} MiB" if avail else ""))
        return rec

    def prepare(self):
        a = self.a
        self.model = make_model(a, self.shape, pathlib.Path(a.work))
        self.size = self.model.stat().st_size
        L = self.layout = gguf_layout(self.model)
        if not L["fmoe_tokenizer"]:
            sys.exit(f"{PROG}: {self.model} has no fmoe.file.tokenizer.json (made with "
                     f"--llama-keys-only?)")
        self.budget = int(self.size * a.budget_frac) + a.budget_extra_mib * MIB
        self.slot = -(-max(L["expert_bytes"]) // 4096) * 4096
        self.ctx = max(256, -(-(a.tokens + 128) // 64) * 64)
        self.kv_bytes = 2 * L["layers"] * L["kv_heads"] * L["head_dim"] * 4 * self.ctx
        w = self.work
        self.prompt = w / "prompt.txt"
        self.prompt.write_text(PROMPT + "\n")
        lines = PROMPTS.read_text().splitlines()
        self.other = w / "other.txt"
        self.other.write_text("\n".join(lines[50:50 + a.store_prompts]) + "\n")
        # the ceiling runs fmoe all resident, its GGUF mapped and read in place, as
        # llama.cpp runs, when the page cache can hold the file beside the rest of the
        # process: offloaded with --direct-io, it would read every expert from the disk
        # each run while llama.cpp's come from the warm page cache
        fits = self.size < 0.85 * mem_available()
        self.all_resident_fits = fits

        log(f"{self.shape}: recording {a.store_prompts} other prompts for the store ...")
        src = w / "store-src.h5"
        src.unlink(missing_ok=True)
        off = None if fits else {"policy": "lru", "cache": ["--cache-gb", f"{0.4 * mem_available() / GIB:.3f}"]}
        runc("record other prompts (store source)",
             fmoe_record_cmd(a, self.fmoe, self.model, self.other, self.ctx, src, offload=off))
        self.store = w / "store.h5"
        runc("build the store", [self.fmoe, "build-store", "--trace", src, "-o", self.store,
                                 "--quiet"])

        # fmoe's memory besides its slots: a probe run with top-k slots, no holder
        k = L["top_k"]
        probe = w / "probe.h5"
        probe.unlink(missing_ok=True)
        cmd = fmoe_record_cmd(a, self.fmoe, self.model, self.prompt, self.ctx, probe,
                              tokens=min(4, a.tokens),
                              offload={"policy": "lru", "cache": ["--cache-experts", k]})
        note_cmd("probe: fmoe's fixed memory", cmd)
        r = run_measured(cmd, timeout=a.run_timeout)
        if r.status != "ok":
            sys.exit(f"{PROG}: probe run {r.status}:\n{r.stderr[-2000:]}")
        self.probe_rss = r.peak_rss
        self.fixed = r.peak_rss - (k + 1) * self.slot
        margin = max(32 * MIB, int(0.06 * self.budget))
        room = self.budget - self.fixed - self.slot - margin
        n = max(0, room // self.slot)
        total_experts = L["layers"] * L["experts"]
        self.n_slots = min(n, total_experts)
        self.cache_gb = self.n_slots * self.slot / GIB
        self.sizing = (f"X = budget {self.budget / MIB:.0f} MiB - fmoe's fixed memory "
                       f"{self.fixed / MIB:.0f} MiB (peak RSS {r.peak_rss / MIB:.0f} MiB of a "
                       f"probe run with {k} slots, less those slots and the scratch slot: "
                       f"the resident non-expert weights {L['non_expert_bytes'] / MIB:.0f} "
                       f"MiB, a KV cache of up to {self.kv_bytes / MIB:.1f} MiB for "
                       f"{self.ctx} positions, the tokenizer, binary and buffers) - the "
                       f"scratch slot {self.slot / MIB:.2f} MiB - a margin {margin / MIB:.0f} "
                       f"MiB = {room / MIB:.0f} MiB: {self.n_slots} slots of "
                       f"{self.slot / MIB:.2f} MiB (the largest expert, pages rounded) of "
                       f"{total_experts} experts ({self.n_slots / total_experts:.0%}), "
                       f"X = {self.cache_gb:.4f} GiB")
        log(self.sizing)
        self.fmoe_can_run = self.n_slots >= k
        if not self.fmoe_can_run:
            self.note(f"fmoe cannot run under the budget: room for {self.n_slots} slots, "
                      f"fewer than top-k = {k}")

        # the profile, after the sizing: its link is the one a decode with the runs' slots
        # and threads sees (--link-decode-gb), the reads on an idle CPU kept in its record
        log(f"{self.shape}: fmoe calibrate --link-file {self.model.name} "
            f"{' '.join(map(str, self.decode_link_args()))} ...")
        drop_caches([self.model])
        self.profile = w / "profile.json"
        runc("calibrate (disk in decode, and compute)",
             [self.fmoe, "calibrate", "--backend", "cpu", "--model-config", self.model,
              "--link-file", self.model, *self.decode_link_args(), "-o", self.profile,
              "--quiet"])
        drop_caches([self.model])
        prof = json.loads(self.profile.read_text())
        self.alpha = prof["link"]["alpha_s"]
        self.beta = prof["link"]["beta_bytes_per_s"]
        fl = prof["calibration"]["links"]["file"]
        self.idle_beta = 1.0 / fl["slope_s"] if fl.get("slope_s") else None

    def decode_link_args(self):
        """calibrate's link as the runs' decode sees it: their slots and compute threads
        (none when fmoe cannot run under the budget: the idle reads then)."""
        t = ["--threads", self.a.threads]
        if self.fmoe_can_run:
            t += ["--link-decode-gb", self.cache_args()[1]]
        return t

    def cache_args(self):
        # a hair over N slots, so that fmoe's division gives N whatever its rounding
        return ["--cache-gb", f"{(self.n_slots + 0.5) * self.slot / GIB:.6f}"]

    def fmoe_cfg(self, policy, trace, ceiling=False):
        a = self.a
        if ceiling and self.all_resident_fits:
            off = None
        elif ceiling:
            n = int((0.8 * mem_available() - self.fixed) // self.slot)
            off = {"policy": "lru", "cache": ["--cache-experts", n]}
        else:
            off = {"policy": policy, "cache": self.cache_args(),
                   "store": self.store if policy.startswith("fmoe") else None}
        return fmoe_record_cmd(a, self.fmoe, self.model, self.prompt, self.ctx, trace,
                               offload=off,
                               speculative=ceiling or policy == "mixtral-offload")

    def ceiling(self):
        """Both programs with the whole RAM: warm-up, then --repeat interleaved rounds."""
        a = self.a
        log(f"{self.shape}: the ceiling (whole RAM, page cache kept) ...")
        for rnd in range(a.repeat + 1):  # round 0: warm-up, discarded
            t = self.work / f"ceiling-{rnd}.h5"
            t.unlink(missing_ok=True)
            rec = self.measured("fmoe, whole RAM", "fmoe ceiling", self.fmoe_cfg(None, t, True),
                                "ceiling", rnd, trace=t)
            rec["warmup"] = rnd == 0
            if self.bins:
                rec = self.measured("llama.cpp, whole RAM", "llama.cpp ceiling",
                                    llama_cmd(a, self.bins, self.model, self.ctx, "mmap", True,
                                              repack=self.all_resident_fits),
                                    "ceiling", rnd)
                rec["warmup"] = rnd == 0

    def unheld(self):
        """Each policy with the budget's slots but no holder (page cache dropped, cold, as
        the budget runs): what the memory pressure itself costs fmoe."""
        if not self.fmoe_can_run:
            return
        log(f"{self.shape}: fmoe with the budget's slots, no holder ...")
        for p in self.a.policies:
            t = self.work / f"unheld-{p}.h5"
            t.unlink(missing_ok=True)
            drop_caches([self.model])
            self.measured(f"fmoe {p}, same slots, no holder", f"fmoe {p}", self.fmoe_cfg(p, t),
                          "unheld", 1, trace=t)

    def budget_runs(self, holder):
        a = self.a
        log(f"{self.shape}: under the budget of {self.budget / MIB:.0f} MiB: measuring what "
            f"a program can hold ...")
        if a.budget_mode == "capacity":
            held, cap, caps = holder.hold_budget(self.budget, files=[self.model])
        else:
            holder.slack = 0
            caps = [holder.capacity(self.budget, files=[self.model])]
            held = holder.hold_to(self.budget)
        self.capacity = {"probes": caps, "slack": holder.slack, "available": held}
        log(f"  MemAvailable {held / MIB:.0f} MiB: a program can hold {caps[-1] / MIB:.0f} MiB "
            f"(probes: {', '.join(f'{c / MIB:.0f}' for c in caps)} MiB)")
        for rnd in range(1, a.repeat + 1):
            if self.fmoe_can_run:
                for p in a.policies:
                    t = self.work / f"live-{p}-{rnd}.h5"
                    t.unlink(missing_ok=True)
                    self.measured(f"fmoe {p}, budget", f"fmoe {p}", self.fmoe_cfg(p, t),
                                  "budget", rnd, holder, trace=t,
                                  relink=self.work / f"profile-fresh-{p}-{rnd}.json")
            if self.bins:
                self.measured("llama.cpp mmap, budget", "llama.cpp mmap",
                              llama_cmd(a, self.bins, self.model, self.ctx, "mmap", False),
                              "budget", rnd, holder)
        if self.bins:
            self.measured("llama.cpp no mmap, budget", "llama.cpp no-mmap",
                          llama_cmd(a, self.bins, self.model, self.ctx, "none", False),
                          "budget", 1, holder)
        self.capacity["after"] = holder.capacity(self.budget - holder.slack, files=[self.model])
        log(f"  after the runs, a program can hold {self.capacity['after'] / MIB:.0f} MiB")

    # -------------------------------------------------------------- analysis

    def best(self, cfg, phase):
        rs = [r for r in self.runs if r["config"] == cfg and r["phase"] == phase
              and not r.get("warmup")]
        ok = [r for r in rs if r["status"] == "ok"]
        if not ok:
            return rs[0] if rs else None
        calm = [r for r in ok if not r.get("disturbed")]
        b = dict(max(calm or ok, key=lambda r: r["decode_tok_s"]))
        b["decode_all"] = [r.get("decode_tok_s") for r in rs]
        b["disturbed_rounds"] = sum(1 for r in rs if r.get("disturbed"))
        b["rounds"] = len(rs)
        b["peak_rss_max"] = max(r["peak_rss"] for r in rs)
        b["available_min_at_start"] = min(r["available_at_start"] for r in rs
                                          if r["available_at_start"])
        b["statuses"] = sorted({r["status"] for r in rs})
        return b

    def analyse(self):
        a, L = self.a, self.layout
        res = {"shape": self.shape, "small": a.small, "type": a.type,
               "file_bytes": self.size, "budget_bytes": self.budget, "layout": L,
               "slot_bytes": self.slot, "cache_slots": self.n_slots,
               "cache_gb": self.cache_gb, "sizing": self.sizing,
               "fixed_bytes": self.fixed, "probe_rss": self.probe_rss,
               "link_alpha_s": self.alpha, "link_beta_bytes_per_s": self.beta,
               "link_idle_beta_bytes_per_s": self.idle_beta,
               "ctx": self.ctx, "notes": self.notes, "runs": self.runs,
               "capacity": getattr(self, "capacity", None)}
        ceil_f = self.best("fmoe ceiling", "ceiling")
        ceil_l = self.best("llama.cpp ceiling", "ceiling")
        llama = self.best("llama.cpp mmap", "budget")
        nommap = self.best("llama.cpp no-mmap", "budget")
        plan = pathlib.Path(ceil_f["trace"]) if ceil_f and ceil_f.get("trace") else None
        total = L["layers"] * L["experts"]
        res_sim = None
        if plan:
            res_sim = simulate_tpot(self.fmoe, plan, self.profile, "lru", total)["tpot_s"]["mean"]
        if self.all_resident_fits and ceil_f and ceil_f.get("tpot_s"):
            res_tpot, res_src = ceil_f["tpot_s"], "measured (ceiling run, all resident)"
        else:
            res_tpot, res_src = res_sim, "simulated (calibrated profile, all resident)"
        rows = []
        for p in a.policies if self.fmoe_can_run else []:
            b = self.best(f"fmoe {p}", "budget")
            if b is None:
                continue
            row = {"policy": p, "run": b}
            if b["status"] == "ok":
                extra = ["--store", self.store] if p.startswith("fmoe") else []
                n = b.get("slots") or self.n_slots
                row["slots"] = n
                sim = simulate_tpot(self.fmoe, b["trace"], self.profile, p, n, extra)
                row["sim_own"] = sim["tpot_s"]["mean"]
                row["gap"] = (row["sim_own"] - b["tpot_s"]) / b["tpot_s"]
                dm = sim.get("per_phase", {}).get("decode", {}).get("misses")
                if dm is not None and b.get("decode_tokens"):
                    row["decode_misses_per_token"] = dm / b["decode_tokens"]
                own_rate = b.get("link_decode_bytes_per_s") or b.get("link_bytes_per_s")
                if own_rate:
                    # the same replay with the link this run's copy engine measured in
                    # decode (its bytes over its busy seconds, each read's latency in
                    # them, so no alpha): the model's error with the disk's drift since
                    # the calibration, and prefill's contention for the cores, taken out
                    own = json.loads(self.profile.read_text())
                    own["link"] = {"alpha_s": 0, "beta_bytes_per_s": own_rate}
                    po = self.work / f"profile-own-{p}.json"
                    po.write_text(json.dumps(own))
                    row["sim_own_link"] = simulate_tpot(self.fmoe, b["trace"], po, p, n,
                                                        extra)["tpot_s"]["mean"]
                    row["gap_own_link"] = (row["sim_own_link"] - b["tpot_s"]) / b["tpot_s"]
                if b.get("fresh_profile"):
                    fp = pathlib.Path(b["fresh_profile"])
                    row["fresh_beta"] = json.loads(fp.read_text())["link"]["beta_bytes_per_s"]
                    row["sim_fresh"] = simulate_tpot(self.fmoe, b["trace"], fp, p, n,
                                                     extra)["tpot_s"]["mean"]
                    row["gap_fresh"] = (row["sim_fresh"] - b["tpot_s"]) / b["tpot_s"]
                if plan:
                    row["sim_plan"] = simulate_tpot(self.fmoe, plan, self.profile, p, n,
                                                    extra)["tpot_s"]["mean"]
                aw = b.get("awaited_decode_bytes_per_token")
                if aw is not None and res_tpot:
                    # the disk as measured seconds before the run, where it was (a shared
                    # disk drifts: a bound from an hour-old rate says little)
                    beta, alpha = self.beta, self.alpha
                    if b.get("fresh_profile"):
                        fl = json.loads(pathlib.Path(b["fresh_profile"]).read_text())["link"]
                        beta, alpha = fl["beta_bytes_per_s"], fl["alpha_s"]
                    row["bound_beta"] = beta
                    row["bound"] = res_tpot + aw / beta
                    row["live_over_bound"] = b["tpot_s"] / row["bound"]
                    if "decode_misses_per_token" in row:
                        # plus the measured latency of each read a decode token waited for
                        row["bound_alpha"] = row["bound"] + alpha * row["decode_misses_per_token"]
                        row["live_over_bound_alpha"] = b["tpot_s"] / row["bound_alpha"]
                if llama and llama["status"] == "ok":
                    row["decode_ratio"] = b["decode_tok_s"] / llama["decode_tok_s"]
                    row["prefill_ratio"] = b["prefill_tok_s"] / llama["prefill_tok_s"]
            u = self.best(f"fmoe {p}", "unheld")
            if u is not None and u["status"] == "ok":
                row["unheld_tpot_s"] = u["tpot_s"]
            rows.append(row)
        ok_rows = [r for r in rows if r["run"]["status"] == "ok"]
        live_best = min(ok_rows, key=lambda r: r["run"]["tpot_s"])["policy"] if ok_rows else None
        sim_rows = [r for r in ok_rows if "sim_plan" in r]
        sim_best = min(sim_rows, key=lambda r: r["sim_plan"])["policy"] if sim_rows else None
        res.update({"ceiling_fmoe": ceil_f, "ceiling_llama": ceil_l, "llama_mmap": llama,
                    "llama_no_mmap": nommap, "rows": rows, "resident_tpot_s": res_tpot,
                    "resident_tpot_source": res_src, "resident_tpot_sim_s": res_sim,
                    "live_best": live_best, "sim_best": sim_best})
        return res


# ---------------------------------------------------------------- the report

def fmt(v, spec=".1f", none="-"):
    return none if v is None else format(v, spec)


def mib(b):
    return fmt(b / MIB if b is not None else None, ".0f")


def report(a, results, env):
    out = []
    p = out.append
    p(f"# fmoe against llama.cpp, bigger than RAM{' (--small)' if a.small else ''}")
    p("")
    p(f"{env['machine']}; {a.threads} threads; prompt {len(PROMPT)} characters, "
      f"{a.tokens} generated tokens (greedy, EOS ignored); best decode of {a.repeat} "
      f"interleaved rounds; page cache dropped with {env['drop_method']} before each "
      f"budget run; memory holder oom_score_adj {env['holder_adj']}, programs "
      f"{env['program_adj']}. fmoe {env['fmoe_version']}; llama.cpp {env['llama_version']}.")
    for r in results:
        L = r["layout"]
        p("")
        p(f"## {r['shape']}{' (small)' if r['small'] else ''}, {r['type'].upper()}")
        p("")
        eb = L["expert_bytes"]
        p(f"{L['layers']} MoE layers x {L['experts']} experts, top-{L['top_k']}; one expert "
          f"{min(eb) / MIB:.2f}-{max(eb) / MIB:.2f} MiB by layer; routed experts "
          f"{L['experts_total'] / MIB:.0f} MiB, the rest {L['non_expert_bytes'] / MIB:.0f} MiB; "
          f"file {r['file_bytes'] / MIB:.0f} MiB ({', '.join(f'{k} {v}' for k, v in sorted(L['types'].items()))} tensors). "
          f"Budget {r['budget_bytes'] / MIB:.0f} MiB = a third of the file"
          + (f" + {a.budget_extra_mib} MiB" if a.budget_extra_mib else "") + ". "
          + (f"Disk (calibrate --link-decode-gb: a decode's O_DIRECT reads of the file, the "
             f"runs' slots and threads): {r['link_beta_bytes_per_s'] / GIB:.2f} GiB/s"
             + (f"; reads on an idle CPU {r['link_idle_beta_bytes_per_s'] / GIB:.2f} GiB/s"
                if r.get("link_idle_beta_bytes_per_s") else "")
             if r["link_alpha_s"] == 0 and r.get("link_idle_beta_bytes_per_s") else
             f"Disk (calibrate, O_DIRECT reads of the file): "
             f"{r['link_beta_bytes_per_s'] / GIB:.2f} GiB/s, {r['link_alpha_s'] * 1e6:.0f} us "
             f"per read")
          + f". Context {r['ctx']} positions.")
        p("")
        c = r["capacity"]
        if c:
            if c["slack"]:
                p(f"The budget as held (--budget-mode capacity): MemAvailable "
                  f"{c['available'] / MIB:.0f} MiB before each run, the budget less the "
                  f"{c['slack'] / MIB:.0f} MiB more than MemAvailable that the kernel lets a "
                  f"program under pressure have; a program that grows until the OOM killer "
                  f"stops it held {c['probes'][-1] / MIB:.0f} MiB before the runs and "
                  f"{c['after'] / MIB:.0f} MiB after them.")
            else:
                p(f"The budget as held: MemAvailable = the budget before each run; a program "
                  f"that grows until the OOM killer stops it held "
                  f"{c['probes'][-1] / MIB:.0f} MiB before the runs and "
                  f"{c['after'] / MIB:.0f} MiB after them (the kernel's reserves above its "
                  f"min watermark, and other processes' page cache, come on top of "
                  f"MemAvailable).")
            p("")
        p(f"fmoe's `--cache-gb`: {r['sizing']}.")
        for n in r["notes"]:
            p(f"- {n}")
        p("")
        p("| program | memory | status | prefill tok/s | decode tok/s | prefill vs llama.cpp "
          "| decode vs llama.cpp | peak RSS MiB | MemAvailable at start MiB | major faults "
          "| decode tok/s, every round (disturbed) |")
        p("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
        llama = r["llama_mmap"]
        lok = llama is not None and llama["status"] == "ok"

        def line(name, mem, b, ratios=True, ref=None):
            ref = ref or llama
            rok = ref is not None and ref["status"] == "ok"
            if b is None:
                return
            st = b["status"] if len(b.get("statuses", [b["status"]])) == 1 else \
                "/".join(b["statuses"])
            ok = b["status"] == "ok"
            pr = dr = "-"
            if ratios and ok and rok:
                pr = f"{b['prefill_tok_s'] / ref['prefill_tok_s']:.2f}x"
                dr = f"{b['decode_tok_s'] / ref['decode_tok_s']:.2f}x"
            p(f"| {name} | {mem} | {st} | {fmt(b.get('prefill_tok_s'))} | "
              f"{fmt(b.get('decode_tok_s'), '.2f')} | {pr} | {dr} | "
              f"{mib(b.get('peak_rss_max', b['peak_rss']))} | "
              f"{mib(b.get('available_min_at_start', b.get('available_at_start')))} | "
              f"{b.get('major_faults', '-')} | "
              + ", ".join(fmt(x, ".2f") for x in b.get("decode_all", []))
              + (f" ({b['disturbed_rounds']} of {b['rounds']})" if b.get("disturbed_rounds")
                 else "") + " |")

        bud = f"budget {r['budget_bytes'] / MIB:.0f} MiB"
        for row in r["rows"]:
            line(f"fmoe {row['policy']} ({row.get('slots', r['cache_slots'])} slots)", bud,
                 row["run"])
        line("llama.cpp, mmap", bud, llama, ratios=False)
        line("llama.cpp, no mmap", bud, r["llama_no_mmap"], ratios=False)
        cf = r["ceiling_fmoe"]
        line("fmoe " + ("all resident" if (r["resident_tpot_source"] or "").startswith("measured")
                        else "lru, whole RAM"), "whole RAM", cf, ref=r["ceiling_llama"])
        line("llama.cpp, mmap", "whole RAM", r["ceiling_llama"], ratios=False)
        p("")
        p("(Ratios: fmoe / llama.cpp under the same memory: the budget rows against llama.cpp "
          "with mmap under the budget, the whole-RAM row against llama.cpp with the whole "
          "RAM.)")
        p("")
        p(f"fmoe offloaded against its bound and the simulator (all-resident decode "
          f"{fmt(r['resident_tpot_s'] and r['resident_tpot_s'] * 1e3, '.2f')} ms/token, "
          f"{r['resident_tpot_source']}):")
        p("")
        p("| policy | slots | hits | awaited MiB / token | misses / token | live TPOT ms "
          "| bound ms | live / bound | bound + reads' latency ms | live / that "
          "| simulated ms (own trace) | gap | gap, link measured just before | gap, own link "
          "| simulated ms (ceiling trace) | live TPOT ms, same slots, no holder |")
        p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")

        def ms(v):
            return fmt(v and v * 1e3, ".2f")

        for row in r["rows"]:
            b = row["run"]
            nh = ms(row.get("unheld_tpot_s"))
            if b["status"] != "ok":
                p(f"| {row['policy']} | - | - | - | - | {b['status']} | - | - | - | - | - | - "
                  f"| - | - | - | {nh} |")
                continue
            aw = b.get("awaited_decode_bytes_per_token")
            go = row.get("gap_own_link")
            gf = row.get("gap_fresh")
            gf = "-" if gf is None else \
                f"{gf * 100:+.1f}% ({row['fresh_beta'] / GIB:.2f} GiB/s)"
            p(f"| {row['policy']} | {row['slots']} | {fmt(b.get('hit_pct'))}% | "
              f"{fmt(aw and aw / MIB, '.2f')} | {fmt(row.get('decode_misses_per_token'))} | "
              f"{b['tpot_s'] * 1e3:.2f} | {ms(row.get('bound'))} | "
              f"{fmt(row.get('live_over_bound'), '.2f')} | {ms(row.get('bound_alpha'))} | "
              f"{fmt(row.get('live_over_bound_alpha'), '.2f')} | {row['sim_own'] * 1e3:.2f} | "
              f"{row['gap'] * 100:+.1f}% | {gf} | {'-' if go is None else f'{go * 100:+.1f}%'} | "
              f"{ms(row.get('sim_plan'))} | {nh} |")
        p("")
        p("(bound: the all-resident decode time plus the awaited bytes per token over the "
          "disk bandwidth measured just before the run (else the calibrated one); + reads' "
          "latency: plus that measurement's per-read latency "
          "for each miss of a decode token, which weighs where experts are small. gap: "
          "simulated against live with the calibrated profile; link measured just before: "
          "with that profile's link measured again (`fmoe calibrate --base`) under the "
          "holder seconds before the run, its rate in brackets; own link: with the link "
          "the run's own copy engine measured in decode instead, its bytes over its busy "
          "seconds.)")
        p("")
        p("Targets:")
        p("")
        for t in targets(r):
            p(f"- {t}")
    p("")
    p("Commands (the first of each kind; every run of a kind differs only in policy, "
      "slots and output file):")
    p("")
    for k, v in COMMANDS.items():
        p(f"    # {k}")
        p(f"    {shlex.join(v)}")
    return "\n".join(out)


def targets(r):
    out = []
    ok = [row for row in r["rows"] if row["run"]["status"] == "ok"]
    llama = r["llama_mmap"]
    if llama is None:
        out.append("decode >= 3x, prefill >= 1x llama.cpp: not measured (no --llama-cpp)")
    elif llama["status"] != "ok":
        out.append(f"decode >= 3x, prefill >= 1x llama.cpp: llama.cpp under the budget: "
                   f"{llama['status']}")
    elif ok:
        best = max(ok, key=lambda row: row["run"]["decode_tok_s"])
        d = [row["decode_ratio"] for row in ok]
        pf = [row["prefill_ratio"] for row in ok]
        out.append(f"decode >= 3x llama.cpp (mmap): best policy {best['policy']} "
                   f"{best['decode_ratio']:.2f}x ({'met' if best['decode_ratio'] >= 3 else 'NOT met'}); "
                   f"met by {sum(x >= 3 for x in d)} of {len(d)} policies "
                   f"({min(d):.2f}-{max(d):.2f}x)")
        out.append(f"prefill >= 1x llama.cpp: met by {sum(x >= 1 for x in pf)} of {len(pf)} "
                   f"policies ({min(pf):.2f}-{max(pf):.2f}x)")
    lb = [row["live_over_bound"] for row in ok if "live_over_bound" in row]
    if lb:
        out.append(f"decode time within 1.2x of the bound: {sum(x <= 1.2 for x in lb)} of "
                   f"{len(lb)} policies ({min(lb):.2f}-{max(lb):.2f}); of the bound with "
                   f"the reads' latency: "
                   + ", ".join(fmt(row.get("live_over_bound_alpha"), ".2f") for row in ok))
    rss = [(f"fmoe {row['policy']}", row["run"].get("peak_rss_max", row["run"]["peak_rss"]))
           for row in r["rows"]]
    over = [f"{n} {v / MIB:.0f} MiB" for n, v in rss if v > r["budget_bytes"]]
    if rss:
        out.append(f"fmoe's peak RSS <= budget {r['budget_bytes'] / MIB:.0f} MiB: "
                   + (f"met by every policy (at most {max(v for _, v in rss) / MIB:.0f} MiB)"
                      if not over else "NOT met: " + ", ".join(over)))
    if llama:
        v = llama.get("peak_rss_max", llama["peak_rss"])
        out.append(f"llama.cpp's peak RSS (mmap): {v / MIB:.0f} MiB, "
                   + ("within the budget" if v <= r["budget_bytes"] else
                      "over the budget: mapped pages of the file the kernel let it keep "
                      "beyond MemAvailable"))
    gaps = [row["gap"] for row in ok]
    if gaps:
        out.append(f"simulated TPOT within 15% of live: {sum(abs(g) <= 0.15 for g in gaps)} "
                   f"of {len(gaps)} policies (gaps {min(gaps) * 100:+.1f}% to "
                   f"{max(gaps) * 100:+.1f}%)")
    gf = [row["gap_fresh"] for row in ok if "gap_fresh" in row]
    if gf:
        out.append(f"the same with the link measured just before each run (calibrate --base): "
                   f"{sum(abs(g) <= 0.15 for g in gf)} of {len(gf)} ({min(gf) * 100:+.1f}% to "
                   f"{max(gf) * 100:+.1f}%)")
    go = [row["gap_own_link"] for row in ok if "gap_own_link" in row]
    if go:
        out.append(f"the same with the link each run measured: {sum(abs(g) <= 0.15 for g in go)} "
                   f"of {len(go)} ({min(go) * 100:+.1f}% to {max(go) * 100:+.1f}%)")
    if r["live_best"]:
        same = r["live_best"] == r["sim_best"]
        line = (f"best policy live {r['live_best']}, simulated (ceiling trace) "
                f"{r['sim_best']}: {'the same' if same else 'NOT the same'}")
        by = {row["policy"]: row["run"] for row in ok}
        if not same and r["sim_best"] in by:
            # how far apart the two are live, against how far one policy's own rounds are
            # apart: a ranking finer than the rounds' spread is not one the runs can show
            lb, sb = by[r["live_best"]], by[r["sim_best"]]
            apart = sb["tpot_s"] / lb["tpot_s"] - 1
            spreads = [max(d) / min(d) - 1 for d in
                       ([x for x in b.get("decode_all", []) if x] for b in by.values())
                       if len(d) > 1]
            if spreads:
                line += (f"; live, {r['sim_best']} is {apart * 100:.1f}% slower than "
                         f"{r['live_best']}, where one policy's rounds differ by up to "
                         f"{max(spreads) * 100:.1f}%")
        out.append(line)
    nm = r["llama_no_mmap"]
    if nm:
        out.append(f"llama.cpp without mmap under the budget: {nm['status']}, peak RSS "
                   f"{nm['peak_rss'] / MIB:.0f} MiB")
    return out


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.split("\n")[1:]))
    ap.add_argument("--small", action="store_true",
                    help="the generator's small variants, 24 layers (about 450 MB each): the whole "
                         "comparison in a few minutes")
    ap.add_argument("--llama-cpp", metavar="DIR",
                    default="/tmp/lcpp/llama.cpp" if pathlib.Path(
                        "/tmp/lcpp/llama.cpp/build/bin/llama-completion").exists() else None,
                    help="llama.cpp source tree with build/bin/llama-completion (or that bin "
                         "folder) (default: /tmp/lcpp/llama.cpp where built)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--tokens", type=int, default=32, help="tokens generated per run")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds")
    ap.add_argument("--json", metavar="OUT")
    ap.add_argument("--work", default="/tmp/fmoe-bigger-than-ram",
                    help="where the models and traces go (outside the repository)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the work folder (models included) afterwards")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--policies", default=POLICIES)
    ap.add_argument("--type", default="q4_k_m", choices=["q4_k_m", "q4_k"],
                    help="the generator's type mix (default q4_k_m)")
    ap.add_argument("--seed", type=int, default=0, help="the generator's seed")
    ap.add_argument("--skew", type=float, help="the generator's routing skew (its default: 1)")
    ap.add_argument("--layers", type=int, help="the generator's layer count instead of the "
                                               "shape's (default 24 with --small)")
    ap.add_argument("--budget-frac", type=float, default=1 / 3,
                    help="the budget as a share of the file (default a third)")
    ap.add_argument("--budget-extra-mib", type=int,
                    help="added to the budget (default 96 with --small, else 0)")
    ap.add_argument("--budget-mode", choices=["memavailable", "capacity"],
                    default="memavailable",
                    help="memavailable: MemAvailable = the budget before each run (default); "
                         "capacity: MemAvailable lowered until a probe that grows until the "
                         "OOM killer stops it holds the budget (exact on an idle machine; "
                         "on a shared one, the other processes' working sets are then "
                         "squeezed out and everything thrashes)")
    ap.add_argument("--ubatch", type=int, default=128, help="llama.cpp's -b and -ub")
    ap.add_argument("--store-prompts", type=int, default=8,
                    help="prompts recorded for fmoe's store")
    ap.add_argument("--run-timeout", type=int, help="seconds per run before it is killed "
                    "(default 300 with --small, 3600 without)")
    ap.add_argument("--build", default=str(REPO / "build"))
    a = ap.parse_args()
    a.policies = [p for p in a.policies.split(",") if p]
    shapes = [s for s in a.shapes.split(",") if s]
    for s in shapes:
        if s not in SHAPES:
            ap.error(f"--shapes: unknown shape {s} ({', '.join(SHAPES)})")
    if a.budget_extra_mib is None:
        a.budget_extra_mib = 96 if a.small else 0
    if a.small and a.layers is None:
        a.layers = 24
    if a.run_timeout is None:
        a.run_timeout = 300 if a.small else 3600
    work = pathlib.Path(a.work).resolve()
    if REPO in work.parents or work == REPO:
        ap.error(f"--work {work}: inside the repository; give a folder outside it")
    work.mkdir(parents=True, exist_ok=True)
    fmoe = pathlib.Path(a.build) / "cmd" / "fmoe"
    if not fmoe.is_file():
        sys.exit(f"{PROG}: {fmoe} not built")
    if not GENERATOR.is_file():
        sys.exit(f"{PROG}: {GENERATOR} is missing")
    bins = llama_bins(a.llama_cpp)
    if bins is None:
        log("no llama.cpp (--llama-cpp DIR): fmoe's side only")
    mi = meminfo()
    env = {"machine": f"{os.uname().machine}, {os.cpu_count()} cores, "
                      f"{mi['MemTotal'] / GIB:.1f} GiB RAM, swap {mi.get('SwapTotal', 0) / GIB:.0f} GiB, "
                      f"load {' '.join(open('/proc/loadavg').read().split()[:3])}",
           "fmoe_version": subprocess.run([str(fmoe), "--version"], capture_output=True,
                                          text=True).stdout.strip().splitlines()[0]
           + f" ({subprocess.run(['git', '-C', str(REPO), 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True).stdout.strip()})",
           "llama_version": llama_version(bins) if bins else "not run",
           "drop_method": drop_caches()}
    results = []
    holder = Holder(log=log)
    try:
        for s in shapes:
            sh = Shape(a, s, fmoe, bins)
            sh.prepare()
            sh.ceiling()
            sh.unheld()
            holder.start() if not holder.alive() else None
            env["holder_adj"] = holder.adj
            env["program_adj"] = holder.program_oom_adj
            try:
                sh.budget_runs(holder)
            finally:
                holder.release()
            results.append(sh.analyse())
            if holder.restarts:
                sh.note(f"the memory holder died and was restarted {holder.restarts} times "
                        f"(another process needed the memory)")
            if not a.keep:
                shutil.rmtree(sh.work, ignore_errors=True)
                sh.model.unlink(missing_ok=True)
    finally:
        holder.close()
    env.setdefault("holder_adj", "-")
    env.setdefault("program_adj", "-")
    text = report(a, results, env)
    print(text)
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(
            {"env": env, "args": {k: v for k, v in vars(a).items()}, "results": results,
             "commands": COMMANDS, "report": text}, indent=1, default=str))
    if not a.keep:
        try:
            work.rmdir()
        except OSError:
            pass


if __name__ == "__main__":
    main()
