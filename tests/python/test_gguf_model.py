"""GGUF models in the forward pass (runtime/model/load.c, docs/quantization.md).

- Float GGUF = the checkpoint: every tiny family of make_tiny_models.py written as GGUF by
  gguf-py here (its GGUFWriter, with llama.cpp's names and q/k row permutation as
  test_quantize.py writes them out independently of the C code), in the checkpoint's own
  dtypes, runs to exactly the logits, experts and greedy tokens of the HF directory: the
  loader must undo the permutation row for row and slice the stacked experts right, and
  then the arithmetic is the same.
- fmoe-tiny (qwen3_moe, h = 256, its own tokenizer): a BF16 GGUF records the same trace
  (routing, geometry, fingerprint) as the directory; Q8_0 logits stay within a stated
  fraction of the logit spread of the bf16 model's, and the greedy continuations are
  compared; `--experts-only` Q4_K records its experts' stored bytes and type in the trace;
  live offloading of a Q8_0 model makes the decisions `fmoe simulate` makes on its trace.
- Bad input: a GGUF missing a tensor, a GGUF --model without --tokenizer: one line,
  non-zero exit. A Q8_0 model on the CUDA backend without a device fails in one line that
  names the missing device, not the weights' type (the backend has their kernels).
"""
import json
import pathlib
import subprocess

import numpy as np
import pytest

import make_tiny_models as tiny
from conftest import run_fmoe
from test_quantize import ARCH, expected_tensors, read_checkpoint

import gguf  # noqa: E402  (tests/python/requirements.txt)

h5py = pytest.importorskip("h5py")
import hdf5plugin  # noqa: F401,E402

REPO = pathlib.Path(__file__).resolve().parents[2]
TINY = REPO / "datasets" / "fmoe-tiny"
PROMPTS = REPO / "datasets" / "samples" / "prompts_100.txt"

# Q8_0 against bf16, in units of the logits' standard deviation over the vocabulary. Q8_0
# rounds each weight to 1/254 of its block's largest magnitude (relative RMS error ~0.4%,
# test_quant.c); through 6 layers and a quantized tied embedding/head that moved logits by
# 0.45-0.68% RMS and 4.3-7.8% at the worst of 24 x 4096 logits on three token draws
# (fmoe-tiny). The bounds leave 3x and 2x of room. A wrong block offset, scale or row
# order moves logits by the order of their spread; the exact check of the arithmetic is
# test_q8_0_equals_its_dequantisation.
Q8_RMS_TOL = 0.02
Q8_MAX_TOL = 0.15


def family_of(name):
    return "deepseek" if name == "deepseek" else tiny.HF_MODELS[name][0]


def rewrite_gguf(reader, out, arch, skip=()):
    """A copy of the GGUF file `reader` reads, as architecture `arch`, by gguf-py: every
    key but GGUF.* and those in `skip`, every tensor as stored."""
    w = gguf.GGUFWriter(str(out), arch)
    for f in reader.fields.values():
        if not f.name.startswith("GGUF.") and f.name not in skip:
            w.add_key_value(f.name, f.contents(), f.types[0])
    for t in reader.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def write_gguf(model_dir, family, out, drop=(), hf_config=True):
    """The checkpoint as a GGUF file in its own dtypes (F32, F16, BF16), by gguf-py."""
    cfg_text = (pathlib.Path(model_dir) / "config.json").read_text()
    cfg = json.loads(cfg_text)
    want = expected_tensors(family, cfg, read_checkpoint(model_dir))
    w = gguf.GGUFWriter(str(out), ARCH[family])
    if hf_config:
        w.add_string("fmoe.hf_config", cfg_text)
    for name, (a, dtype, _kind) in want.items():
        if name in drop:
            continue
        if dtype == "BF16":
            bits = (np.ascontiguousarray(a, np.float32).view(np.uint32) >> 16).astype(np.uint16)
            w.add_tensor(name, bits, raw_dtype=gguf.GGMLQuantizationType.BF16)
        elif dtype == "F16":
            w.add_tensor(name, np.ascontiguousarray(a, np.float16))
        else:
            w.add_tensor(name, np.ascontiguousarray(a, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny.maker(tmp_path_factory.mktemp("tiny-models"))


def drive(driver, model, tokens, generate, tmp_path, tag, *extra, check=True):
    logits_path, routes_path = tmp_path / f"{tag}.f32", tmp_path / f"{tag}.json"
    p = subprocess.run([str(driver), str(model), "--tokens", ",".join(map(str, tokens)),
                        "--generate", str(generate), "--logits", str(logits_path),
                        "--routes", str(routes_path), *map(str, extra)],
                       capture_output=True, text=True, timeout=300)
    if not check:
        return p
    assert p.returncode == 0, p.stderr
    return np.fromfile(logits_path, dtype="<f4"), json.loads(routes_path.read_text())


@pytest.mark.parametrize("name", tiny.ALL)
def test_float_gguf_runs_exactly_as_the_checkpoint(name, models, driver, tmp_path):
    d = models(name)
    ref = dict(np.load(d / "reference.npz"))
    f = write_gguf(d, family_of(name), tmp_path / "m.gguf")
    tokens, n = ref["tokens"].tolist(), len(ref["generated"])
    l1, r1 = drive(driver, d, tokens, n, tmp_path, "dir")
    l2, r2 = drive(driver, f, tokens, n, tmp_path, "gguf")
    assert np.array_equal(l1, l2), f"{name}: max |diff| {np.abs(l1 - l2).max()}"
    assert r1 == r2
    assert r2["generated"] == ref["generated"].tolist()


# ---- fmoe-tiny: tokenizer, traces, offloading ------------------------------------------

@pytest.fixture(scope="module")
def tiny_ggufs(tmp_path_factory, fmoe_bin):
    d = tmp_path_factory.mktemp("tiny-gguf")
    out = {"bf16": write_gguf(TINY, "qwen3_moe", d / "tiny-bf16.gguf")}
    for tag, args in (("q8_0", ["--type", "q8_0"]), ("q4_k", ["--type", "q4_k"]),
                      ("q4_k_experts", ["--type", "q4_k", "--experts-only"])):
        out[tag] = d / f"tiny-{tag}.gguf"
        run_fmoe(fmoe_bin, "quantize", *args, TINY, "-o", out[tag], "--quiet")
    prompts = d / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS.read_text().splitlines()[:6]) + "\n")
    out["prompts"] = prompts
    out["dir"] = d
    return out


def record(fmoe_bin, model, prompts, out, *extra):
    tok = ["--tokenizer", TINY] if str(model).endswith(".gguf") else []
    run_fmoe(fmoe_bin, "record", "--model", model, *tok, "--dataset", prompts,
             "--max-new-tokens", 8, "--temperature", 0, "--probs-f32", "-o", out, "--quiet",
             *extra)
    return h5py.File(out, "r")


def test_bf16_gguf_records_the_checkpoints_trace(fmoe_bin, tiny_ggufs, tmp_path):
    a = record(fmoe_bin, TINY, tiny_ggufs["prompts"], tmp_path / "dir.h5")
    b = record(fmoe_bin, tiny_ggufs["bf16"], tiny_ggufs["prompts"], tmp_path / "gguf.h5")
    for key in ("model_fingerprint", "num_layers", "num_experts", "top_k", "hidden_size",
                "expert_bytes", "dtype"):
        assert a.attrs[key] == b.attrs[key], key
    assert a.attrs["dtype"] == "bf16"
    for ds in ("tokens/token_id", "tokens/experts", "tokens/probs", "tokens/semantic"):
        assert np.array_equal(a[ds][()], b[ds][()]), ds


def test_q8_0_logits_close_to_bf16(tiny_ggufs, driver, tmp_path, capsys):
    tokens = [int(x) for x in np.random.default_rng(1).integers(3, 4096, 24)]
    ref, rr = drive(driver, TINY, tokens, 32, tmp_path, "bf16")
    q8, rq = drive(driver, tiny_ggufs["q8_0"], tokens, 32, tmp_path, "q8")
    ref, q8 = ref.reshape(len(tokens), -1), q8.reshape(len(tokens), -1)
    d = np.abs(q8 - ref)
    rms, worst = float(np.sqrt((d ** 2).mean()) / ref.std()), float(d.max() / ref.std())
    top1 = float((q8.argmax(-1) == ref.argmax(-1)).mean())
    same = next((i for i, (x, y) in enumerate(zip(rr["generated"], rq["generated"])) if x != y),
                len(rr["generated"]))
    with capsys.disabled():
        print(f"\nq8_0 vs bf16 (fmoe-tiny, {len(tokens)} tokens): |diff| / std: RMS {rms:.4f}, "
              f"max {worst:.4f}; top-1 agreement {top1:.3f}; greedy continuations agree for "
              f"{same} of 32 tokens")
    assert 0 < rms < Q8_RMS_TOL  # > 0: the weights really were quantized
    assert worst < Q8_MAX_TOL
    assert top1 >= 0.9


def dequantised_copy(src, dst):
    """The GGUF file src with every tensor dequantised by gguf-py and written as F32."""
    r = gguf.GGUFReader(str(src))
    a = r.fields["general.architecture"]
    w = gguf.GGUFWriter(str(dst), bytes(a.parts[a.data[0]]).decode())
    f = r.fields["fmoe.hf_config"]
    w.add_string("fmoe.hf_config", bytes(f.parts[f.data[0]]).decode())
    kinds = set()
    for t in r.tensors:
        kinds.add(t.tensor_type.name)
        y = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
        w.add_tensor(t.name, y.reshape([int(x) for x in t.shape[::-1]]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return kinds


@pytest.mark.parametrize("qtype,model", [("q8_0", "tiny"), ("q4_k", "tiny"), ("q5_k", "tiny"),
                                         ("q6_k", "tiny"), ("q8_0", "mixtral"),
                                         ("q8_0", "deepseek"), ("iq3_s", "tiny")])
def test_quantized_equals_its_dequantisation(fmoe_bin, driver, models, tmp_path, qtype, model):
    """The quantized matmuls compute what the weights say: a quantized file against the
    same file dequantised by gguf-py and written as F32 (OpenBLAS's f32 path), to float
    rounding (the bar of test_forward.py). Mixtral and DeepSeek: q/k rows permuted in the
    file, un-permuted whole (blocks and all) by the loader."""
    d = TINY if model == "tiny" else models(model)
    src = tmp_path / f"{qtype}.gguf"
    run_fmoe(fmoe_bin, "quantize", "--type", qtype, d, "-o", src, "--quiet")
    assert qtype.upper() in dequantised_copy(src, tmp_path / "deq.gguf")
    V = json.loads((pathlib.Path(d) / "config.json").read_text())["vocab_size"]
    tokens = [int(x) for x in np.random.default_rng(2).integers(3, V, 16)]
    q8, rq = drive(driver, src, tokens, 16, tmp_path, "q")
    f32, rf = drive(driver, tmp_path / "deq.gguf", tokens, 16, tmp_path, "f32")
    diff = float(np.abs(q8 - f32).max())
    print(f"{model} {qtype} vs its f32 dequantisation: max |logit diff| {diff:.3g}")
    assert diff <= 1e-3
    assert rq["generated"] == rf["generated"] and rq["experts"] == rf["experts"]


def test_experts_only_q4_k_trace_has_quantized_expert_bytes(fmoe_bin, tiny_ggufs, tmp_path):
    t = record(fmoe_bin, tiny_ggufs["q4_k_experts"], tiny_ggufs["prompts"], tmp_path / "q4.h5")
    cfg = json.loads((TINY / "config.json").read_text())
    h, inter = cfg["hidden_size"], cfg["moe_intermediate_size"]  # 256, 176

    def row_bytes(qtype, cols, fallback):
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        if cols % block == 0:
            return cols // block * size
        if cols % 32 == 0:  # quantize's fallback for Q4_K, as llama-quantize's
            return row_bytes(gguf.GGMLQuantizationType.Q5_0, cols, fallback)
        return cols * fallback  # kept in the checkpoint's dtype (bf16)
    Q4K = gguf.GGMLQuantizationType.Q4_K
    want = 2 * inter * row_bytes(Q4K, h, 2) + h * row_bytes(Q4K, inter, 2)
    assert t.attrs["dtype"] == "q4_k"
    assert int(t.attrs["expert_bytes"]) == want
    assert want < 3 * h * inter * 2  # fewer bytes than the bf16 expert
    r = gguf.GGUFReader(str(tiny_ggufs["q4_k_experts"]))
    types = {x.name: x.tensor_type.name for x in r.tensors}
    assert types["blk.0.ffn_gate_exps.weight"] == "Q4_K"
    assert types["blk.0.attn_q.weight"] == "BF16"  # --experts-only


def test_live_offloading_q8_0_matches_simulate(fmoe_bin, tiny_ggufs, tmp_path):
    from test_offload_live import ZERO_LINK, decisions, read_log
    zero = tmp_path / "zero.json"
    zero.write_text(json.dumps(ZERO_LINK))
    live, sim, trace = tmp_path / "live.jsonl", tmp_path / "sim.jsonl", tmp_path / "t.h5"
    t = record(fmoe_bin, tiny_ggufs["q8_0"], tiny_ggufs["prompts"], trace, "--policy", "lru",
               "--cache-experts", 6, "--prefetch-distance", 1, "--sync-transfers",
               "--sync-predictions", "--decision-log", live)
    assert t.attrs["dtype"] == "q8_0"
    run_fmoe(fmoe_bin, "simulate", "--trace", trace, "--policy", "lru", "--cache-experts", 6,
             "--prefetch-distance", 1, "--profile", zero, "--decision-log", sim, "--quiet")
    _, lrec = read_log(live)
    _, srec = read_log(sim)
    misses = sum(r["event"] == "access" and r["result"] == "miss" for r in lrec)
    assert misses > 0
    a, b = decisions(lrec), decisions(srec)
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    assert first is None and len(a) == len(b), (first, a[first] if first is not None else None,
                                                 b[first] if first is not None else None)
    # --model-config takes the GGUF file itself (fmoe_geometry_load), to the same decisions
    sim2 = tmp_path / "sim2.jsonl"
    run_fmoe(fmoe_bin, "simulate", "--trace", trace, "--model-config", tiny_ggufs["q8_0"],
             "--policy", "lru", "--cache-experts", 6, "--prefetch-distance", 1, "--profile",
             zero, "--decision-log", sim2, "--quiet")
    assert decisions(read_log(sim2)[1]) == b


def test_llama_cpp_style_file_without_hf_config(tiny_ggufs, driver, tmp_path):
    """A file with only llama.cpp's metadata keys (fmoe quantize's file less fmoe.hf_config,
    copied by gguf-py): the config built from those keys runs the model as the checkpoint's
    own config.json does (rms_norm_eps is the file's float32 9.9999997e-07 instead of 1e-6,
    hence a tolerance)."""
    r = gguf.GGUFReader(str(tiny_ggufs["q8_0"]))
    rewrite_gguf(r, tmp_path / "llama.gguf", "qwen3moe",
                 skip=("general.architecture", "fmoe.hf_config"))
    tokens = [int(x) for x in np.random.default_rng(3).integers(3, 4096, 12)]
    a, ra = drive(driver, tiny_ggufs["q8_0"], tokens, 12, tmp_path, "own")
    b, rb = drive(driver, tmp_path / "llama.gguf", tokens, 12, tmp_path, "built")
    assert float(np.abs(a - b).max()) <= 1e-4
    assert ra["generated"] == rb["generated"] and ra["experts"] == rb["experts"]


def test_generate_q8_0_with_tokenizer(fmoe_bin, tiny_ggufs):
    p = run_fmoe(fmoe_bin, "generate", "--model", tiny_ggufs["q8_0"], "--tokenizer", TINY,
                 "--prompt", "What is a context manager?", "--max-new-tokens", 8,
                 "--temperature", 0, "--json")
    j = json.loads(p.stdout)
    assert len(j["generated_ids"]) == 8


@pytest.mark.parametrize("tier", [["--tier", "host"], ["--tier", "file"],
                                  ["--tier", "file", "--direct-io"]])
def test_offloaded_q4_k_generates_the_resident_tokens(fmoe_bin, tiny_ggufs, tier):
    """Q4_K gate/up with BF16 down (176 values: no whole blocks): the tier keeps each
    matrix's type, reads the blocks from the GGUF file, and the tokens do not change."""
    q4 = tiny_ggufs["q4_k"]
    common = ["generate", "--model", q4, "--tokenizer", TINY, "--prompt",
              "What is a context manager?", "--max-new-tokens", 12, "--temperature", 0, "--json"]
    resident = json.loads(run_fmoe(fmoe_bin, *common).stdout)["generated_ids"]
    p = run_fmoe(fmoe_bin, *common, "--policy", "lru", "--cache-experts", 6, *tier)
    assert json.loads(p.stdout)["generated_ids"] == resident


def test_embedded_tokenizer_is_the_folders(fmoe_bin, tiny_ggufs):
    """fmoe quantize embeds tokenizer.json, tokenizer_config.json and
    generation_config.json byte for byte (read back by gguf-py); generate then needs no
    --tokenizer and gives the same ids, chat template included."""
    r = gguf.GGUFReader(str(tiny_ggufs["q8_0"]))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        f = r.fields[f"fmoe.file.{name}"]
        assert bytes(f.parts[f.data[0]]) == (TINY / name).read_bytes(), name
    for extra in ([], ["--chat"]):
        args = ["generate", "--model", tiny_ggufs["q8_0"], "--prompt", "What is a context manager?",
                "--max-new-tokens", 8, "--temperature", 0, "--json", *extra]
        a = json.loads(run_fmoe(fmoe_bin, *args).stdout)
        b = json.loads(run_fmoe(fmoe_bin, *args, "--tokenizer", TINY).stdout)
        assert (a["prompt_ids"], a["generated_ids"], a["text"]) == \
            (b["prompt_ids"], b["generated_ids"], b["text"])


# ---- bad input ---------------------------------------------------------------------

def one_line(p, code):
    assert p.returncode == code, (p.returncode, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    return lines[0]


def test_gguf_missing_a_tensor_is_one_line(fmoe_bin, tmp_path):
    bad = write_gguf(TINY, "qwen3_moe", tmp_path / "bad.gguf", drop={"blk.3.ffn_up_exps.weight"})
    p = run_fmoe(fmoe_bin, "generate", "--model", bad, "--tokenizer", TINY, "--prompt", "hi",
                 check=False)
    line = one_line(p, 1)
    assert "bad.gguf" in line and "blk.3.ffn_up_exps.weight" in line


def test_model_file_that_is_not_gguf_is_one_line(fmoe_bin, tmp_path):
    f = tmp_path / "model.bin"
    f.write_bytes(b"GGML" + bytes(60))
    p = run_fmoe(fmoe_bin, "generate", "--model", f, "--tokenizer", TINY, "--prompt", "hi",
                 check=False)
    assert "neither a model directory nor a GGUF file" in one_line(p, 1)


def test_gguf_without_tokenizer_is_a_usage_error(fmoe_bin, tiny_ggufs):
    """gguf-py's file embeds no tokenizer.json (fmoe quantize's does)."""
    p = run_fmoe(fmoe_bin, "generate", "--model", tiny_ggufs["bf16"], "--prompt", "hi",
                 check=False)
    assert "--tokenizer" in one_line(p, 2)


def test_quantized_model_is_not_refused_by_cuda(driver, tiny_ggufs, tmp_path):
    """The CUDA backend has kernels for every block type the loader takes
    (runtime/cuda/cuda_quant.cu; tests/gpu checks them on a device): a Q8_0 file on the
    CUDA backend runs where there is a device, and elsewhere fails in one line for want of
    one, not of its type. (The 32-value types: test_gguf_q32_model.py; the i-quants:
    test_gguf_iquant_model.py.)"""
    p = drive(driver, tiny_ggufs["q8_0"], [1, 2, 3], 0, tmp_path, "cuda", "--session-backend",
              "cuda", check=False)
    if p.returncode == 0:
        return
    line = one_line(p, 1)
    assert "CUDA backend unavailable" in line and "Q8_0" not in line, line
