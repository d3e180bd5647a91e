"""End to end on a GPU: the CUDA backend (`--backend cuda`) against transformers, against
the CPU backend, and against the simulator, through the commands a user runs.

    FMOE_BUILD_DIR=build python3 -m pytest -q tests/gpu          # skips without a device
    FMOE_GPU_TEST_BACKEND=cpu ... pytest -q tests/gpu             # plumbing, CPU as device

1. Logits of every tiny checkpoint of tests/python/make_tiny_models.py (Mixtral, Qwen2-MoE,
   Qwen3-MoE, OLMoE, DeepSeek-MoE V1; float32, and Mixtral bf16 and OLMoE f16) through
   tests/model/forward_driver --backend cuda, against transformers' float32 logits
   (numpy's for DeepSeek) and against --backend cpu on the same tokens.
2. Router top-k of every token (the prompt and 32 greedy tokens fed back), cuda against
   cpu, on the same checkpoints and on fmoe-tiny: identical wherever the gate is decisive.
3. fmoe-tiny's greedy 32-token continuations: `fmoe generate --backend cuda` equals
   `--backend cpu` token for token.
4. Offloaded decisions: `fmoe record --backend cuda` with 12 of 48 slots under lru,
   mixtral-offload and fmoe makes the decisions `fmoe simulate` makes on the trace it
   recorded (`fmoe compare-logs` identical), and the CPU backend's run of the same
   requests makes the same decisions.
5. `fmoe record --backend cuda`: h5py reads the trace; recorded_on "cuda:<device>";
   every layer timing positive.
6. `--miss cpu` on the GPU: misses computed on the host, the rest on the device; the
   greedy tokens equal the CPU backend's.
7. Quantized GGUFs: fmoe-tiny through `fmoe quantize --type q8_0` and `--type q5_0`
   (the few matrices whose rows are not whole blocks kept in bf16, or a fallback type);
   `fmoe generate --backend cuda`, all
   resident and offloaded (lru, 16 device slots), equals `--backend cpu --activations f32`
   token for token (f32 inputs on both sides: the CPU's default, auto, would be q8).
8. The file tier with O_DIRECT: `--tier file --direct-io` (experts read from the
   safetensors file through the pinned staging buffer on each transfer) equals the CPU's
   all-resident greedy tokens.
9. `--miss auto`: with a profile whose link takes a second per copy every miss is
   computed on the host; with a free link and a host taking a second per expert none is;
   both give the CPU's greedy tokens.
10. `fmoe serve --backend cuda` answers a chat request (greedy, at most 8 tokens) and
   lists its backend in /v1/models.
11. The families added later, one tiny float32 checkpoint each (DeepSeek-V2 and V3:
   multi-head latent attention, grouped routing, V3's YaRN with rope pairs; GLM-4.5:
   partial rotary, biased sigmoid routing, q/k norm; Phi-3.5-MoE: LayerNorm, sparsemixer;
   gpt-oss: attention sinks, clamped SwiGLU, MXFP4 experts; Llama 4: chunked and
   temperature-tuned attention, scaled expert inputs) through tests/model/forward_driver:
   the greedy continuation equals the CPU backend's token for token, every decisive
   untainted row routes alike, and the prompt's logits agree within float32's "cpu" bound.
   Written with the CUDA kernels for these families, none of which has run on a GPU yet:
   the first device run is their first check (docs/gpu.md, "New model families").

Tolerances: why they are what they are
---------------------------------------
The CUDA backend (runtime/cuda/cuda_forward.cu) multiplies float32 weights with cuBLAS
SGEMM in default math (no TF32: keep NVIDIA_TF32_OVERRIDE unset) and everything else in
float32 with the CPU's own row functions (lib/rowwise.h, built with --fmad=false). So on a
float32 checkpoint it differs from the CPU only in summation order and expf: ~1e-6
relative. For bf16 and f16 weights it rounds the activations to the weight's type before
each GEMM (cublasGemmEx, float32 accumulation) where the CPU multiplies float32
activations by the widened weights exactly: a relative error of up to 2^-9 (bf16) or
2^-11 (f16) on every GEMM input. The figures below were set by emulating exactly that in
transformers (every F.linear input rounded to bf16/f16, float32 otherwise) on these
checkpoints and on fmoe-tiny, and taking 4-10x the largest change seen:

  weights   logits vs ref   logits vs cpu   gate log-margin   |gate prob diff|
  float32   1e-3            1e-4            1e-3              1e-4
  float16   0.03            0.03            0.05              0.005
  bfloat16  0.3             0.3             0.1               0.02

  (emulated: f16 max |logit diff| 0.006, log-margin change 0.007, |dp| 0.0011; bf16
  0.02-0.08 on logits up to ~7, log-margin change 0.009-0.012, |dp| 0.0018-0.0047.)

float32 was not emulated: SGEMM against the CPU's float32 sums differs by ~1e-6, so its
figures leave ~100x; its "vs ref" bar is test_forward.py's for the CPU backend.

Routing is discrete, so a perturbation can flip a near-tie, and a flipped expert changes
everything downstream of it. So:
- the gate margin of a row (token t, MoE layer l) is log p_k - log p_(k+1) of the CPU's
  gate probabilities sorted (k = top_k; the router-logit gap for a softmax router, which a
  perturbation of the activations moves by about the same amount whatever the
  probabilities: the probability gap would call every row of a confident router, where
  p_2 and p_3 are both small, a near-tie). A row is decisive when its margin is above
  the threshold of the table;
- a row whose top-k differs taints the rows downstream of it: (t', l') with t' >= t (the
  same token and later ones, through attention) and l' > l;
- every decisive, untainted row must choose the same experts (the same set; and the same
  order where every gap among the first k+1 is decisive); its gate probabilities must
  agree within the table's bound. Rows after the first differing greedy token are left
  out (they ran different tokens);
- logits are compared at prompt positions before the first token with a differing top-k.
A differing decisive row fails the test: that is a routing bug, not rounding.

fmoe-tiny (bf16) is trained: its greedy steps include near-ties (top-1 minus top-2 logit
under 0.05 at some step of 33 of the first 40 bundled prompts, under 0.01 for 13). Tests 3
and 6 use prompts whose 32 steps all have a CPU logit margin of at least 0.129 (bundled
prompts 7, 39 and 74), against an emulated bf16 logit change of 0.022 (median over 100
prompts of the largest per-prompt change); they check the margins from the CPU's
--dump-logits first (at least GREEDY_MARGIN = 0.1) and say so if a prompt no longer
qualifies.

Test 7: the CUDA backend multiplies Q8_0 (Q5_0) weights dequantised exactly as the CPU does
(lib/quant_block.h) by float32 activations, and so does the CPU with --activations f32
(asked for explicitly: its default, auto, quantises them to 8 bits on the CPU,
fmoe/quant_act.h, as llama.cpp does, which moves the logits several times more): per-logit
differences well under the bf16 row of the table. It runs bundled prompts in the order of GREEDY_PROMPTS and takes the
first whose 32 CPU greedy steps on the file all keep a margin of GREEDY_MARGIN (on a
CPU without a GPU, 0.169 to 0.236 for the three on the Q8_0 file; on the Q5_0 file 0.068,
0.250, 0.271, so prompt 39), saying so if none does.

Test 4 runs a float32 copy of fmoe-tiny (make_f32_copy): with SGEMM the gate probabilities
agree to ~1e-6, so both backends route alike and the two live runs can be compared
decision for decision. Both live runs use --sync-transfers (every transfer completion
waited for where completions become visible: without it whether a prefetch has landed
depends on the link's speed, so the decisions would too) and --sync-predictions (fmoe's
matcher inline), and compare-logs --late-is-hit, as tests/python/test_offload_live.py.
The CUDA run against the simulator's replay of its own trace must be identical
(compare-logs exit 0) for every policy. Across backends, lru's log must be identical; the
priorities of mixtral-offload and fmoe are gate probabilities (summed probability /
distance, p / distance) that the two backends compute to float32 rounding, and
compare-logs compares priorities as exact doubles. For those two a difference is
accepted when every decision is otherwise the same and the priorities agree within
PRIORITY_RTOL (1e-4 relative), or when the logs part at a priority near-tie: see
check_divergence_at_near_tie for what the log can and cannot show about that.

Traces are read with h5py: /timing and the attributes are stored uncompressed, the rest
with zstd, which needs hdf5plugin or fmoe's own plugin (conftest.h5_open registers the
build's trace/ folder when hdf5plugin is missing). Test 4 records with --compression none.
"""
import json
import math
import signal
import subprocess
import time

import numpy as np
import pytest

from conftest import (COMMAND_TIMEOUT_S, TINY, checkpoint_dtype, h5_open, make_f32_copy,
                      prompt_lines, run, tiny)

TOL = {
    "float32": {"ref": 1e-3, "cpu": 1e-4, "margin": 1e-3, "prob": 1e-4},
    "float16": {"ref": 0.03, "cpu": 0.03, "margin": 0.05, "prob": 0.005},
    "bfloat16": {"ref": 0.3, "cpu": 0.3, "margin": 0.1, "prob": 0.02},
}
GENERATE = 32
GREEDY_PROMPTS = (7, 39, 74)   # lines of prompts_100.txt with decisive greedy steps
GREEDY_MARGIN = 0.1            # CPU top-1 minus top-2 logit every step must keep
PRIORITY_RTOL = 1e-4           # test 4, across backends, float32 copy
TIE_RTOL = 1e-3                # test 4: two priorities this close (relative) are a near-tie


# ---------------------------------------------------------------------------------------
# routing helpers
# ---------------------------------------------------------------------------------------

def log_gaps(probs, k):
    """[..., k] gaps log p_(i) - log p_(i+1), i < k, of the probabilities sorted in
    descending order (inf where i + 1 is past the last expert)."""
    p = -np.sort(-np.asarray(probs, dtype=np.float64), axis=-1)
    lp = np.log(np.maximum(p, 1e-300))
    J = p.shape[-1]
    gaps = np.full(p.shape[:-1] + (k,), np.inf)
    m = min(k, J - 1)
    gaps[..., :m] = lp[..., :m] - lp[..., 1:m + 1]
    return gaps


def taint(differ):
    """Rows downstream of a differing row: (t', l') with t' >= t and l' > l."""
    out = np.zeros_like(differ, dtype=bool)
    for t, l in np.argwhere(differ):
        out[t:, l + 1:] = True
    return out


def compare_routes(dev_experts, ref_experts, cpu_probs, thr):
    """Checks that every decisive untainted row chooses the same experts; returns a summary
    with `clean` (untainted rows), `first_token` (first token with a differing set) and
    counts. Rows are [T][L][K]; cpu_probs [T][L][J] gives the margins."""
    dev, ref = np.asarray(dev_experts), np.asarray(ref_experts)
    assert dev.shape == ref.shape, (dev.shape, ref.shape)
    T, L, K = dev.shape
    gaps = log_gaps(cpu_probs[:T], K)
    margin = gaps[..., K - 1]
    differ = (np.sort(dev, -1) != np.sort(ref, -1)).any(-1)
    clean = ~taint(differ)
    bad = np.argwhere(differ & clean & (margin >= thr))
    assert len(bad) == 0, (
        f"top-k differs at decisive rows (token, layer) {bad[:5].tolist()}: "
        + "; ".join(f"{tuple(r)}: ours {dev[tuple(r)].tolist()} theirs {ref[tuple(r)].tolist()} "
                    f"log-margin {margin[tuple(r)]:.4g}" for r in bad[:3]))
    ordered = clean & (gaps.min(-1) >= thr)
    bad_order = np.argwhere(ordered & (dev != ref).any(-1))
    assert len(bad_order) == 0, f"top-k order differs at decisive rows {bad_order[:5].tolist()}"
    rows = np.argwhere(differ)
    return {"clean": clean, "decisive": int((clean & (margin >= thr)).sum()), "rows": T * L,
            "differing": int(differ.sum()),
            "first_token": int(rows[:, 0].min()) if len(rows) else T}


# ---------------------------------------------------------------------------------------
# 1 and 2: tiny checkpoints through forward_driver
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", tiny.ALL)
def test_logits_against_transformers_and_cpu(name, tiny_models, driver_runs, device):
    d = tiny_models(name)
    ref = dict(np.load(d / "reference.npz"))
    tol = TOL[checkpoint_dtype(name)]
    toks = ref["tokens"]
    dev = driver_runs(d, toks, GENERATE, device)
    cpu = driver_runs(d, toks, GENERATE, "cpu")
    n = len(toks)

    # against the reference: positions before the first token whose top-k differs (at a
    # near-tie: compare_routes fails on any other)
    r = compare_routes(dev["experts"][:n], ref["experts"][:n], cpu["probs"], tol["margin"])
    upto = r["first_token"]
    assert upto >= 1, f"{name}: top-k differs from the reference at the first token"
    diff_ref = float(np.abs(dev["logits"][:upto] - ref["logits"][:upto]).max())
    # against the CPU backend on the same tokens
    c = compare_routes(dev["experts"][:n], cpu["experts"][:n], cpu["probs"], tol["margin"])
    upto_cpu = c["first_token"]
    assert upto_cpu >= 1, f"{name}: top-k differs from the CPU's at the first token"
    diff_cpu = float(np.abs(dev["logits"][:upto_cpu] - cpu["logits"][:upto_cpu]).max())
    print(f"{name} ({checkpoint_dtype(name)}): {device} max |logit diff| vs reference "
          f"{diff_ref:.3g} over {upto} of {n} positions (tol {tol['ref']}), vs cpu "
          f"{diff_cpu:.3g} over {upto_cpu} (tol {tol['cpu']})")
    assert diff_ref <= tol["ref"], \
        f"{name}: max |logit diff| vs reference {diff_ref} > {tol['ref']}"
    assert diff_cpu <= tol["cpu"], f"{name}: max |logit diff| vs cpu {diff_cpu} > {tol['cpu']}"
    if device == "cuda" and checkpoint_dtype(name) != "float32":
        # rounding the activations must show: bit-identical logits would mean the CPU ran
        assert not np.array_equal(dev["logits"], cpu["logits"]), \
            f"{name}: --backend cuda gave the CPU's logits bit for bit: did the CUDA backend run?"


def _routes_case(name, tiny_models, tokenize):
    """(model dir, tokens, dtype) of a test-2 case: a tiny checkpoint, or fmoe-tiny."""
    if name == "fmoe-tiny":
        return TINY, tokenize(prompt_lines()[GREEDY_PROMPTS[0]]), "bfloat16"
    d = tiny_models(name)
    return d, dict(np.load(d / "reference.npz"))["tokens"], checkpoint_dtype(name)


@pytest.mark.parametrize("name", tiny.ALL + ["fmoe-tiny"])
def test_router_topk_matches_cpu(name, tiny_models, tokenize, driver_runs, device):
    d, toks, dtype = _routes_case(name, tiny_models, tokenize)
    tol = TOL[dtype]
    dev = driver_runs(d, toks, GENERATE, device)
    cpu = driver_runs(d, toks, GENERATE, "cpu")
    n = len(toks)
    # the rows that ran the same tokens: the prompt, then each generated token fed back up
    # to the first one that differs
    g = next((i for i, (a, b) in enumerate(zip(dev["generated"], cpu["generated"])) if a != b),
             len(cpu["generated"]))
    if dtype == "float32":
        assert g == len(cpu["generated"]), (
            f"{name}: greedy continuation differs from the CPU's at step {g}:\n"
            f" {device} {dev['generated'].tolist()}\n cpu  {cpu['generated'].tolist()}")
    T = min(n + g, len(cpu["experts"]))
    r = compare_routes(dev["experts"][:T], cpu["experts"][:T], cpu["probs"], tol["margin"])
    clean = r["clean"]
    dp = float(np.abs(dev["probs"][:T] - cpu["probs"][:T])[clean].max())
    print(f"{name} ({dtype}): {r['decisive']} decisive untainted rows of {r['rows']} compared, "
          f"{r['differing']} with another top-k (near-ties, rows downstream), max |gate prob "
          f"diff| {dp:.3g} (tol {tol['prob']}), tokens compared {T} (greedy equal for {g} of "
          f"{len(cpu['generated'])} steps)")
    assert r["decisive"] > 0, f"{name}: no decisive row to compare"
    assert dp <= tol["prob"], f"{name}: max |gate prob diff| {dp} > {tol['prob']}"


# ---------------------------------------------------------------------------------------
# 11: the families added later, greedy against the CPU backend
# ---------------------------------------------------------------------------------------

# One checkpoint per family and per op set (make_tiny_models.py has what each exercises);
# all float32, so the two backends differ by summation order and expf only.
NEW_FAMILIES = ["deepseek_v2", "deepseek_v3_yarn", "glm4_moe_qk_norm", "phimoe",
                "gpt_oss_mxfp4", "llama4"]


@pytest.mark.parametrize("name", NEW_FAMILIES)
def test_new_family_greedy_equals_cpu(name, tiny_models, driver_runs, device):
    d = tiny_models(name)
    toks = dict(np.load(d / "reference.npz"))["tokens"]
    tol = TOL["float32"]
    dev = driver_runs(d, toks, GENERATE, device)
    cpu = driver_runs(d, toks, GENERATE, "cpu")
    n = len(toks)
    k = _first_difference(list(dev["generated"]), list(cpu["generated"]))
    g = len(cpu["generated"])
    assert k is None and len(dev["generated"]) == g, (
        f"{name}: greedy continuation differs from the CPU's at step {k}:\n"
        f" {device} {dev['generated'].tolist()}\n cpu  {cpu['generated'].tolist()}")
    r = compare_routes(dev["experts"], cpu["experts"], cpu["probs"], tol["margin"])
    assert r["decisive"] > 0, f"{name}: no decisive row to compare"
    upto = min(r["first_token"], n)
    assert upto >= 1, f"{name}: top-k differs from the CPU's at the first token"
    diff = float(np.abs(dev["logits"][:upto] - cpu["logits"][:upto]).max())
    print(f"{name}: {device} greedy equals cpu for {g} steps; {r['decisive']} decisive rows "
          f"of {r['rows']}; max |logit diff| vs cpu {diff:.3g} over {upto} of {n} positions "
          f"(tol {tol['cpu']})")
    assert diff <= tol["cpu"], f"{name}: max |logit diff| vs cpu {diff} > {tol['cpu']}"


# ---------------------------------------------------------------------------------------
# 3 and 6: fmoe-tiny greedy, all resident and --miss cpu
# ---------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def cpu_greedy(fmoe_bin, backend_args, tmp_path_factory):
    """prompt -> (generated ids, per-step top-1 minus top-2 logit) of the CPU backend."""
    root = tmp_path_factory.mktemp("greedy")
    cache = {}

    def get(prompt):
        if prompt not in cache:
            dump = root / f"logits{len(cache)}.npy"
            p = run(fmoe_bin, "generate", "--model", TINY, "--prompt", prompt,
                    "--max-new-tokens", GENERATE, "--temperature", 0, "--ignore-eos", "--json",
                    "--dump-logits", dump, *backend_args("generate", "cpu"))
            ids = json.loads(p.stdout)["generated_ids"]
            lg = np.load(dump)
            top2 = -np.sort(-lg, axis=-1)[:, :2]
            cache[prompt] = (ids, top2[:, 0] - top2[:, 1])
        return cache[prompt]
    return get


def _greedy_prompt(i, cpu_greedy):
    prompt = prompt_lines()[i]
    ids, margins = cpu_greedy(prompt)
    assert len(ids) == GENERATE
    low = np.flatnonzero(margins < GREEDY_MARGIN)
    assert len(low) == 0, (
        f"prompt {i} ({prompt!r}) no longer has decisive greedy steps on the CPU (margin "
        f"{margins[low[0]]:.4f} < {GREEDY_MARGIN} at step {low[0]}): pick another prompt")
    return prompt, ids, margins


def _first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


@pytest.mark.parametrize("i", GREEDY_PROMPTS)
def test_fmoe_tiny_greedy_equals_cpu(i, fmoe_bin, backend_args, cpu_greedy, device):
    prompt, want, margins = _greedy_prompt(i, cpu_greedy)
    p = run(fmoe_bin, "generate", "--model", TINY, "--prompt", prompt, "--max-new-tokens",
            GENERATE, "--temperature", 0, "--ignore-eos", "--json",
            *backend_args("generate", device))
    out = json.loads(p.stdout)
    assert out.get("backend", device) == device, out.get("backend")
    got = out["generated_ids"]
    k = _first_difference(got, want)
    assert got == want, (f"prompt {i}: {device} greedy differs from cpu at step {k} (cpu "
                         f"margin there {margins[k]:.3f}):\n {device} {got}\n cpu  {want}")


@pytest.mark.parametrize("policy,n", [("lru", 8), ("mixtral-offload", 16)])
def test_miss_cpu_on_the_device(policy, n, fmoe_bin, backend_args, cpu_greedy, device):
    """--miss cpu: every miss computed on the host from the slow tier, uncached. With lru
    nothing is ever cached (every access is a host miss); mixtral-offload's prefetches fill
    slots, so its hits run on the device and its misses on the host: both paths in one
    pass. The tokens equal the CPU backend's all-resident greedy tokens."""
    i = GREEDY_PROMPTS[0]
    prompt, want, margins = _greedy_prompt(i, cpu_greedy)
    p = run(fmoe_bin, "generate", "--model", TINY, "--prompt", prompt, "--max-new-tokens",
            GENERATE, "--temperature", 0, "--ignore-eos", "--json", "--policy", policy,
            "--cache-experts", n, "--miss", "cpu", *backend_args("generate", device))
    out = json.loads(p.stdout)
    assert out.get("backend", device) == device, out.get("backend")
    off = out["offload"]
    assert off["misses"] > 0 and off["host_misses"] == off["misses"], off
    if policy == "lru":
        assert off["hits"] + off["late_hits"] == 0, off
    else:
        assert off["hits"] + off["late_hits"] > 0 and off["prefetches"] > 0, off
    got = out["generated_ids"]
    k = _first_difference(got, want)
    assert got == want, (f"{policy} --miss cpu on {device}: greedy differs from cpu at step "
                         f"{k} (cpu margin {margins[k]:.3f}):\n got {got}\n cpu {want}")


# ---------------------------------------------------------------------------------------
# 7: Q8_0 and Q5_0 GGUFs of fmoe-tiny
# ---------------------------------------------------------------------------------------

# Q8_0 (blocks of 32, the first kernels), Q5_0 (blocks of 32 with a fifth bit: the fallback
# type of llama.cpp's Q4_K_M files for rows of 1,408 values).
QUANT_TYPES = ["q8_0", "q5_0"]


@pytest.fixture(scope="session")
def tiny_quant(fmoe_bin, tmp_path_factory):
    """qtype -> fmoe-tiny quantized to it (made once per session)."""
    files = {}

    def get(qtype):
        if qtype not in files:
            out = tmp_path_factory.mktemp("gguf") / f"fmoe-tiny-{qtype}.gguf"
            run(fmoe_bin, "quantize", "--type", qtype, TINY, "-o", out, "--quiet")
            files[qtype] = out
        return files[qtype]
    return get


def _generate_quant(fmoe_bin, backend_args, model, qtype, prompt, kind, *extra):
    p = run(fmoe_bin, "generate", "--model", model, "--prompt", prompt, "--max-new-tokens",
            GENERATE, "--temperature", 0, "--ignore-eos", "--json", "--activations", "f32",
            *extra, *backend_args("generate", kind))
    out = json.loads(p.stdout)
    assert out.get("backend", kind) == kind, out.get("backend")
    assert out.get("activations", "f32") == "f32", out.get("activations")
    assert qtype.upper() in out.get("describe", qtype.upper()), out.get("describe")
    return out


@pytest.fixture(scope="session")
def quant_cpu_greedy(fmoe_bin, backend_args, tiny_quant, tmp_path_factory):
    """qtype -> (prompt index, prompt, CPU greedy ids, per-step margins) of the first
    prompt of GREEDY_PROMPTS whose greedy steps on that file are all decisive on the CPU."""
    found = {}

    def get(qtype):
        if qtype in found:
            return found[qtype]
        root = tmp_path_factory.mktemp(qtype)
        lows = []
        for i in GREEDY_PROMPTS:
            prompt = prompt_lines()[i]
            dump = root / f"logits{i}.npy"
            want = _generate_quant(fmoe_bin, backend_args, tiny_quant(qtype), qtype, prompt,
                                   "cpu", "--dump-logits", dump)["generated_ids"]
            top2 = -np.sort(-np.load(dump), axis=-1)[:, :2]
            margins = top2[:, 0] - top2[:, 1]
            if margins.min() >= GREEDY_MARGIN:
                found[qtype] = i, prompt, want, margins
                return found[qtype]
            lows.append(f"{i}: {margins.min():.4f}")
        pytest.fail(f"no prompt of {GREEDY_PROMPTS} has decisive greedy steps on the "
                    f"{qtype} file (least margins {', '.join(lows)} < {GREEDY_MARGIN}): "
                    "pick another prompt")
    return get


@pytest.mark.parametrize("qtype", QUANT_TYPES)
@pytest.mark.parametrize("mode", ["resident", "offloaded"])
def test_quant_gguf_greedy_equals_cpu(qtype, mode, fmoe_bin, backend_args, device, tiny_quant,
                                      quant_cpu_greedy):
    """All resident, and offloaded (lru, 16 of 48 slots: quantized experts written into
    device slots and multiplied there), against the CPU's all-resident tokens."""
    i, prompt, want, margins = quant_cpu_greedy(qtype)
    extra = ["--policy", "lru", "--cache-experts", 16] if mode == "offloaded" else []
    out = _generate_quant(fmoe_bin, backend_args, tiny_quant(qtype), qtype, prompt, device,
                          *extra)
    if mode == "offloaded":
        assert out["offload"]["misses"] > 0, out["offload"]
    got = out["generated_ids"]
    k = _first_difference(got, want)
    assert got == want, (f"{qtype} {mode}, prompt {i}: {device} greedy differs from cpu at "
                         f"step {k} (cpu margin there {margins[k]:.3f}):\n {device} {got}\n "
                         f"cpu  {want}")


# ---------------------------------------------------------------------------------------
# 4: offloaded decisions
# ---------------------------------------------------------------------------------------

OFFLOAD_PROMPTS = 8
OFFLOAD_TOKENS = 12
OFFLOAD_SLOTS = 12  # of fmoe-tiny's 6 x 8 = 48 routed experts
ZERO_LINK = {
    "format": "fmoe-hardware", "version": 1, "name": "zero-link",
    "source": "test: transfers take no time (the simulated side of --sync-transfers)",
    "link": {"alpha_s": 0.0, "beta_bytes_per_s": 1e30},
    "compute": {"attention_s": {"base": 1e-4, "per_token": 1e-6, "per_token_context": 0.0},
                "expert_s": {"base": 1e-5, "per_token": 1e-6}},
}


@pytest.fixture(scope="module")
def offload_work(tmp_path_factory, fmoe_bin, backend_args):
    d = tmp_path_factory.mktemp("offload")
    model = make_f32_copy(TINY, d / "fmoe-tiny-f32")
    lines = prompt_lines()
    (d / "prompts.txt").write_text("\n".join(lines[:OFFLOAD_PROMPTS]) + "\n")
    (d / "other.txt").write_text("\n".join(lines[40:64]) + "\n")
    (d / "zero.json").write_text(json.dumps(ZERO_LINK))
    # the fmoe policy's store: an all-resident CPU recording of other prompts (an input
    # both backends share)
    run(fmoe_bin, "record", "--model", model, "--dataset", d / "other.txt",
        "--max-new-tokens", 12, "--temperature", 0, "--probs-f32", "-o", d / "store-src.h5",
        "--quiet", *backend_args("record", "cpu"))
    run(fmoe_bin, "build-store", "--trace", d / "store-src.h5", "-o", d / "store.h5",
        "--prefetch-distance", 1, "--quiet")
    return {"dir": d, "model": model}


def read_log(path):
    lines = path.read_text().splitlines()
    head = json.loads(lines[0])
    assert head["fmoe_decision_log"] == 1, head
    return head, [json.loads(x) for x in lines[1:]]


def decisions(records):
    """What compare-logs --late-is-hit compares: no landed lines, no t, late as hit."""
    out = []
    for r in records:
        if r["event"] == "landed":
            continue
        r = {k: v for k, v in r.items() if k != "t"}
        if r["event"] == "access" and r["result"] == "late":
            r["result"] = "hit"
        out.append(r)
    return out


def same_but_priority(a, b, rtol):
    """Index of the first decision that differs in anything but a priority within rtol,
    or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        px, py = x.get("priority"), y.get("priority")
        if {k: v for k, v in x.items() if k != "priority"} != \
                {k: v for k, v in y.items() if k != "priority"}:
            return i
        if (px is None) != (py is None):
            return i
        if px is not None and not (px == py or math.isclose(px, py, rel_tol=rtol)):
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@pytest.mark.parametrize("policy", ["lru", "mixtral-offload", "fmoe"])
def test_offloaded_decisions(policy, offload_work, fmoe_bin, backend_args, plugin_dir, device):
    d, model = offload_work["dir"], offload_work["model"]
    store = ["--store", d / "store.h5"] if policy == "fmoe" else []
    spec = ["--speculative", 1] if policy == "mixtral-offload" else []
    common = ["--model", model, "--dataset", d / "prompts.txt", "--max-new-tokens",
              OFFLOAD_TOKENS, "--temperature", 0, "--probs-f32", "--compression", "none",
              *spec, "--policy", policy, "--cache-experts", OFFLOAD_SLOTS,
              "--prefetch-distance", 1, *store, "--sync-transfers", "--sync-predictions",
              "--quiet"]
    logs, traces = {}, {}
    for side in dict.fromkeys([device, "cpu"]):
        logs[side], traces[side] = d / f"{policy}-{side}.jsonl", d / f"{policy}-{side}.h5"
        run(fmoe_bin, "record", *common, *backend_args("record", side),
            "--decision-log", logs[side], "-o", traces[side])
    sim = d / f"{policy}-{device}-sim.jsonl"
    run(fmoe_bin, "simulate", "--trace", traces[device], "--policy", policy, "--cache-experts",
        OFFLOAD_SLOTS, "--prefetch-distance", 1, *store, "--profile", d / "zero.json",
        "--decision-log", sim, "--quiet")

    head, recs = read_log(logs[device])
    assert head["source"] == "record"
    accesses = sum(r["event"] == "access" for r in recs)
    misses = sum(r["event"] == "access" and r["result"] == "miss" for r in recs)
    assert accesses > 200 and 0 < misses < accesses, (accesses, misses)
    if policy != "lru":
        assert any(r["event"] == "prefetch" for r in recs), f"{policy} made no prefetch"

    # (a) the device's live run against the simulator's replay of its own trace
    p = run(fmoe_bin, "compare-logs", logs[device], sim, "--late-is-hit", "--json", check=False)
    assert p.returncode in (0, 1), f"compare-logs failed: {p.stderr}"
    verdict = json.loads(p.stdout)
    assert p.returncode == 0 and verdict["identical"], \
        f"{policy}: {device} live and simulated decisions differ: {verdict['first_divergence']}"

    # (b) the device's run against the CPU backend's, on the same requests: same tokens,
    # same routing (except at near-ties), gate probabilities equal within float32 rounding
    with h5_open(traces[device], plugin_dir) as a, h5_open(traces["cpu"], plugin_dir) as b:
        assert np.array_equal(a["/tokens/token_id"][:], b["/tokens/token_id"][:]), \
            f"{policy}: {device} and cpu ran different tokens"
        ea, eb = a["/tokens/experts"][:], b["/tokens/experts"][:]
        probs_dev = a["/tokens/probs"][:].astype(np.float64)
        probs = b["/tokens/probs"][:].astype(np.float64)
    differ = np.argwhere((np.sort(ea, -1) != np.sort(eb, -1)).any(-1))
    if len(differ):
        t, l = differ[0]
        m = log_gaps(probs[t, l], ea.shape[-1])[-1]
        assert m < TOL["float32"]["margin"], (
            f"{policy}: {device} routes token row {t} layer {l} to {ea[t, l].tolist()}, the "
            f"cpu to {eb[t, l].tolist()}, at log-margin {m:.3g}")
        pytest.skip(f"{policy}: {device} live = simulated passed; routing differs from the "
                    f"cpu's at a near-tie (row {t}, layer {l}, log-margin {m:.2g}), so the two "
                    f"live logs cannot be compared")
    dp = float(np.abs(probs_dev - probs).max())
    assert dp <= TOL["float32"]["prob"], f"{policy}: gate probabilities differ by {dp}"
    p = run(fmoe_bin, "compare-logs", logs["cpu"], logs[device], "--late-is-hit", "--json",
            check=False)
    assert p.returncode in (0, 1), f"compare-logs failed: {p.stderr}"
    verdict = json.loads(p.stdout)
    if policy == "lru" or device == "cpu":
        # decisions that read no probability: equal inputs, equal decisions
        assert p.returncode == 0 and verdict["identical"], \
            f"{policy}: cpu and {device} live decisions differ: {verdict['first_divergence']}"
        return
    # A policy that ranks by probability compares values built from them (fmoe's
    # prefetch admission and victim choice, mixtral-offload's speculative ranking), so two
    # runs whose probabilities differ in the last float32 bits may take another branch at
    # a near-tie, after which the logs part ways. That is not a backend error: (a) showed
    # that each backend's decisions are exactly the policy's on its own inputs, and the
    # inputs agree within float32 rounding (above). Report where they part, if they do.
    if p.returncode == 0:
        return
    a = decisions(read_log(logs["cpu"])[1])
    b = decisions(read_log(logs[device])[1])
    i = same_but_priority(a, b, PRIORITY_RTOL)
    if i is None:
        print(f"{policy}: cpu and {device} decisions equal, priorities within {PRIORITY_RTOL}")
        return
    verdict = check_divergence_at_near_tie(a, b, i)
    print(f"{policy}: cpu and {device} decisions equal up to decision {i} of {len(a)} "
          f"(priorities within {PRIORITY_RTOL} before it); there cpu "
          f"{a[i] if i < len(a) else 'ended'}, {device} {b[i] if i < len(b) else 'ended'}: "
          f"{verdict}")


def _batch(log, i):
    """{expert: priority} of the prefetches and promotions of log[i]'s (iteration,
    layer), from the batch's first decision to its last (the policy issues a layer's
    prefetches together, ranked by priority)."""
    it, layer = log[i]["iteration"], log[i]["layer"]
    lo = i
    while lo > 0 and (log[lo - 1]["iteration"], log[lo - 1]["layer"]) == (it, layer):
        lo -= 1
    out, k = {}, lo
    while k < len(log) and (log[k]["iteration"], log[k]["layer"]) == (it, layer):
        if "priority" in log[k]:
            out.setdefault(log[k]["expert"], log[k]["priority"])
        k += 1
    return out


def _tie(p, q):
    return abs(p - q) <= TIE_RTOL * max(abs(p), abs(q), 1e-300)


def check_divergence_at_near_tie(a, b, i):
    """Asserts that two logs whose decisions agree before index i (priorities within
    PRIORITY_RTOL) part at a priority near-tie, as far as the log can show it; returns
    what was decided.

    A decision log records the priority of each prefetch and promotion, but not the
    values the policy compared them with: the victim's value (fmoe: p * freq of a
    resident expert), the admission threshold, the matcher's similarity scores. So:
    - an access parting first is a failure: the cache held the same experts on both sides
      (every earlier decision equal), so a hit on one side and a miss on the other is a
      bug, not rounding;
    - two prefetches (or promotions) of different experts in the same (iteration, layer),
      where each side's batch also prefetches the other's expert, ranked the same
      candidates in another order: a near-tie when each side's priority for the other's
      expert is within TIE_RTOL of its priority for its own first choice (1e-3
      relative: ten times PRIORITY_RTOL, the agreement the backends' priorities keep
      before the divergence); otherwise a failure (the same inputs ranked differently);
    - anything else turned on a value the log does not carry (a prefetch against a drop,
      a cancel or another victim; batches of different experts, i.e. another matched
      store entry or another cut of the cumulative probability): reported as not
      decidable from the log, and not failed."""
    x = a[i] if i < len(a) else None
    y = b[i] if i < len(b) else None
    if x is None or y is None:
        return "one log ended: not decidable from the log"
    events = {x["event"], y["event"]}
    assert "access" not in events, (
        f"decision {i}: the logs part at an access ({x} against {y}) after equal decisions: "
        f"the caches held the same experts, so this is a bug, not a near-tie")
    ranked = ("prefetch", "promote")
    if x["event"] in ranked and y["event"] in ranked and \
            (x["iteration"], x["layer"]) == (y["iteration"], y["layer"]) and \
            x["expert"] != y["expert"]:
        px, py = x["priority"], y["priority"]
        other_a, other_b = _batch(a, i).get(y["expert"]), _batch(b, i).get(x["expert"])
        if other_a is None or other_b is None:
            return (f"prefetches from different candidates (cpu expert {x['expert']} at "
                    f"{px:.9g}, the device expert {y['expert']} at {py:.9g}, each absent "
                    f"from the other's batch): not decidable from the log")
        assert _tie(px, other_a) and _tie(py, other_b), (
            f"decision {i}: the cpu ranks expert {x['expert']} ({px:.9g}) before expert "
            f"{y['expert']} ({other_a:.9g}), the device {y['expert']} ({py:.9g}) before "
            f"{x['expert']} ({other_b:.9g}): not within {TIE_RTOL}, the same candidates "
            f"ranked differently")
        return (f"a near-tie: the batch's ranking flipped ({x['expert']} at {px:.9g} and "
                f"{other_a:.9g}, {y['expert']} at {py:.9g} and {other_b:.9g})")
    return (f"{x['event']} against {y['event']}: turned on a value the log does not carry "
            f"(a victim's value, an admission threshold or a match score): not decidable "
            f"from the log")


def test_near_tie_rule():
    """check_divergence_at_near_tie on hand-made logs (no device needed, but it runs with
    the rest): it must fail a parting access and a ranking that is not a near-tie, and
    pass the near-ties it can see."""
    def pf(expert, prio, it=3, layer=2):
        return {"event": "prefetch", "iteration": it, "layer": layer, "expert": expert,
                "slot": 0, "priority": prio}
    head = [{"event": "access", "iteration": 3, "layer": 0, "expert": 1, "slot": 0,
             "result": "hit"}]
    # different candidates: the reason is not in the log
    assert "not decidable" in check_divergence_at_near_tie(
        head + [pf(4, 0.4540)], head + [pf(5, 0.4541)], 1)
    # a flipped ranking: each side prefetches both, in the other order, at close priorities
    a = head + [pf(4, 0.50), pf(5, 0.4996)]
    b = head + [pf(5, 0.50), pf(4, 0.4997)]
    assert "ranking flipped" in check_divergence_at_near_tie(a, b, 1)
    # far apart: the same inputs ranked differently
    with pytest.raises(AssertionError, match="ranked differently"):
        check_divergence_at_near_tie(head + [pf(4, 0.5), pf(5, 0.2)],
                                     head + [pf(5, 0.5), pf(4, 0.2)], 1)
    # an access parting after equal decisions
    miss = dict(head[0], result="miss")
    with pytest.raises(AssertionError, match="bug, not a near-tie"):
        check_divergence_at_near_tie(head + head, head + [miss], 1)
    # a prefetch against a drop: the deciding value is not in the log
    drop = {"event": "dropped", "iteration": 3, "layer": 2, "expert": 4, "slot": -1}
    assert "not decidable" in check_divergence_at_near_tie(head + [pf(4, 0.454)],
                                                           head + [drop], 1)


# ---------------------------------------------------------------------------------------
# 5: a recorded trace
# ---------------------------------------------------------------------------------------

def test_record_trace_on_the_device(fmoe_bin, backend_args, plugin_dir, device, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(prompt_lines()[:4]) + "\n")
    out = tmp_path / "t.h5"
    run(fmoe_bin, "record", "--model", TINY, "--dataset", prompts, "--max-new-tokens", 8,
        "--temperature", 0, "-o", out, "--quiet", *backend_args("record", device))
    with h5_open(out, plugin_dir) as f:
        on = f.attrs["recorded_on"]
        on = on.decode() if isinstance(on, bytes) else str(on)
        if device == "cuda":
            assert on.startswith("cuda:") and len(on) > len("cuda:"), on
        else:
            assert on == "cpu", on
        layer_s = f["/timing/layer_s"][:]
        iteration_s = f["/timing/iteration_s"][:]
        prompt_tokens = f["/requests/prompt_tokens"][:]
        output_tokens = f["/requests/output_tokens"][:]
        chunk = int(f.attrs.get("prefill_chunk", 0))
        assert len(prompt_tokens) == 4
        iters = sum(-(-int(p) // chunk) if chunk else 1 for p in prompt_tokens) \
            + int(output_tokens.sum())
        assert layer_s.shape == (iters, int(f.attrs["timing_layers"])), layer_s.shape
        assert iteration_s.shape == (iters,)
        assert np.isfinite(layer_s).all() and (layer_s > 0).all(), layer_s.min()
        assert (iteration_s > 0).all()
        # the layers run inside the iteration
        assert (layer_s.sum(1) <= iteration_s * 1.01 + 1e-5).all(), \
            (layer_s.sum(1) / iteration_s).max()
        try:
            experts = f["/tokens/experts"][:]
        except OSError as e:
            pytest.skip(f"/tokens/experts is zstd-compressed and neither hdf5plugin nor fmoe's "
                        f"plugin ({plugin_dir}) loads in this h5py: {e}")
        T = int((prompt_tokens + output_tokens).sum())
        assert experts.shape[0] == T and experts.shape[2] == 2, experts.shape
        assert experts.max() < int(f.attrs["num_experts"])
    print(f"recorded_on {on!r}; {iters} iterations, layer times {layer_s.min() * 1e6:.0f} us "
          f"to {layer_s.max() * 1e3:.2f} ms")


# ---------------------------------------------------------------------------------------
# 8: the file tier with O_DIRECT
# ---------------------------------------------------------------------------------------

def test_file_tier_direct_io(fmoe_bin, backend_args, cpu_greedy, device):
    """Offloaded (lru, 16 of 48 slots) with the experts read from the safetensors file on
    every transfer with O_DIRECT (through the pinned staging buffer on the device)."""
    i = GREEDY_PROMPTS[0]
    prompt, want, margins = _greedy_prompt(i, cpu_greedy)
    p = run(fmoe_bin, "generate", "--model", TINY, "--prompt", prompt, "--max-new-tokens",
            GENERATE, "--temperature", 0, "--ignore-eos", "--json", "--policy", "lru",
            "--cache-experts", 16, "--tier", "file", "--direct-io",
            *backend_args("generate", device))
    out = json.loads(p.stdout)
    assert out.get("backend", device) == device, out.get("backend")
    assert out["offload"]["misses"] > 0, out["offload"]
    got = out["generated_ids"]
    k = _first_difference(got, want)
    assert got == want, (f"--tier file --direct-io on {device}: greedy differs from cpu at "
                         f"step {k} (cpu margin {margins[k]:.3f}):\n got {got}\n cpu {want}")


# ---------------------------------------------------------------------------------------
# 9: --miss auto
# ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def miss_auto_profiles(fmoe_bin, backend_args, tmp_path_factory):
    """fmoe calibrate --quick's profile (on the host: only its format matters) with the link
    or the host made extreme, so that the choice does not depend on the machine (as
    tests/python/test_miss_auto_live.py)."""
    d = tmp_path_factory.mktemp("miss-auto")
    cal = d / "cal.json"
    run(fmoe_bin, "calibrate", "--quick", "--model-config", TINY / "config.json",
        "--file-dir", d, "--quiet", "-o", cal, *backend_args("calibrate", "cpu"),
        timeout=120)
    base = json.loads(cal.read_text())

    def write(name, link, host_expert=None):
        prof = json.loads(json.dumps(base))
        prof["link"] = link
        if host_expert:
            prof["host"]["expert_s"] = host_expert
        path = d / f"{name}.json"
        path.write_text(json.dumps(prof))
        return path
    return {
        "slow_link": write("slow_link", {"alpha_s": 1.0, "beta_bytes_per_s": 1e3}),
        "slow_host": write("slow_host", {"alpha_s": 0.0, "beta_bytes_per_s": 1e30},
                           {"base": 1.0, "per_token": 1.0}),
    }


@pytest.mark.parametrize("profile", ["slow_link", "slow_host"])
def test_miss_auto_on_the_device(profile, fmoe_bin, backend_args, cpu_greedy, device,
                                 miss_auto_profiles):
    """--miss auto (lru, 8 of 48 slots): a one-second link sends every miss to the host, a
    free link and a slow host none; the tokens are the CPU's either way."""
    i = GREEDY_PROMPTS[0]
    prompt, want, margins = _greedy_prompt(i, cpu_greedy)
    p = run(fmoe_bin, "generate", "--model", TINY, "--prompt", prompt, "--max-new-tokens",
            GENERATE, "--temperature", 0, "--ignore-eos", "--json", "--policy", "lru",
            "--cache-experts", 8, "--miss", "auto", "--profile",
            miss_auto_profiles[profile], *backend_args("generate", device))
    out = json.loads(p.stdout)
    assert out.get("backend", device) == device, out.get("backend")
    off = out["offload"]
    assert off["misses"] > 0, off
    if profile == "slow_link":
        assert off["host_misses"] == off["misses"], off
    else:
        assert off["host_misses"] == 0, off
    got = out["generated_ids"]
    k = _first_difference(got, want)
    assert got == want, (f"--miss auto ({profile}) on {device}: greedy differs from cpu at "
                         f"step {k} (cpu margin {margins[k]:.3f}):\n got {got}\n cpu {want}")


# ---------------------------------------------------------------------------------------
# 10: fmoe serve on the device
# ---------------------------------------------------------------------------------------

def _http(port, method, path, body=None, timeout=COMMAND_TIMEOUT_S):
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, body=None if body is None else json.dumps(body),
                  headers={"Content-Type": "application/json"} if body is not None else {})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def test_serve_answers_a_chat_request(fmoe_bin, backend_args, device, tmp_path):
    port_file = tmp_path / "port"
    proc = subprocess.Popen([str(fmoe_bin), "serve", "--model", str(TINY), "--port", "0",
                             "--port-file", str(port_file),
                             *backend_args("serve", device)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + COMMAND_TIMEOUT_S
        port = None
        while time.monotonic() < deadline and port is None:
            assert proc.poll() is None, f"fmoe serve exited: {proc.stderr.read()}"
            if port_file.exists() and port_file.read_text().strip():
                try:
                    if _http(int(port_file.read_text()), "GET", "/health")[0] == 200:
                        port = int(port_file.read_text())
                except OSError:
                    pass
            time.sleep(0.05)
        assert port is not None, "fmoe serve did not become ready"
        status, raw = _http(port, "GET", "/v1/models")
        assert status == 200, raw
        assert json.loads(raw)["data"][0]["backend"] == device, raw
        status, raw = _http(port, "POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": prompt_lines()[GREEDY_PROMPTS[0]]}],
            "max_tokens": 8, "temperature": 0})
        assert status == 200, raw
        out = json.loads(raw)
        text = out["choices"][0]["message"]["content"]
        assert isinstance(text, str) and text, out
        assert 0 < out["usage"]["completion_tokens"] <= 8, out["usage"]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=COMMAND_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    err = proc.stderr.read()
    assert rc == 0, err
    print(f"serve --backend {device}: {text!r}")
