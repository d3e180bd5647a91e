"""GGUF models holding ggml's 32-value block types Q4_0, Q4_1, Q5_0, Q5_1 and IQ4_NL in the
forward pass, `fmoe quantize`'s llama-quantize fallback, traces and offloading of their
experts, and their bad input (docs/quantization.md).

- A file whose blocks gguf-py's quantisers wrote, mixing Q4_0, Q4_1, Q5_0 and Q5_1, and
  each type written by `fmoe quantize --type T` (fmoe-tiny: every 256-wide row in T), and
  the K-quant requests that fall back to them on a model whose rows are 32 or 64 wide
  (tiny DeepSeek: Q4_K -> Q5_0, Q5_K -> Q5_1): the logits equal those of the same file
  dequantised by gguf-py and written as F32, to float rounding (f32 activations, the bar
  of test_gguf_model.py), and with the CPU's default 8-bit activations within a stated
  fraction of the logits' spread.
- The fallback rule, file by file as gguf-py reads it: every quantized tensor in the
  requested type where its rows are whole blocks, else in llama.cpp's fallback where they
  are whole blocks of 32, else (only then) in the checkpoint's BF16.
- fmoe-tiny's experts: record's trace carries the bytes of the types the file holds; the
  offloading tiers read the blocks and give the resident tokens.
- Bad input: a NaN or infinite block scale, a truncated tensor, the CUDA backend asked to
  run such a model: one line each, non-zero exit.
"""
import json
import pathlib

import numpy as np
import pytest

import make_tiny_models as tiny
from conftest import run_fmoe
from test_gguf_model import TINY, dequantised_copy, drive, one_line  # noqa: F401

import gguf  # noqa: E402  (tests/python/requirements.txt)

Q = gguf.GGMLQuantizationType

# 8-bit activations against the f32 dequantised model, in units of the logits' standard
# deviation over the vocabulary: each product's input moves by at most half a step of
# its 32-value block (1/254 of the block's largest magnitude); measured on these models
# 0.3-0.7% RMS and 1-4% at the worst logit. The bounds leave about 3x of room; a wrong
# code, scale or min moves logits by the order of their spread.
# The tiny DeepSeek (h = 64, random weights) amplifies any perturbation: Q8_0 weights
# there, a path older than these types, measure 4.6% RMS and 48% at the worst logit with
# 8-bit activations; its Q5_0 file 7.9% and 76%. Its bounds are set from that, 3x of room
# on the RMS; the exact check of its arithmetic is the f32 one.
Q8ACT_TOL = {"tiny": (0.02, 0.12), "deepseek": (0.25, 2.0)}

# llama.cpp's fallback for a K-quant whose rows are not whole super-blocks of 256
# (src/llama-quant.cpp, tensor_type_fallback), as gguf-py names the types
FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


def expected_type(requested, cols):
    if cols % gguf.GGML_QUANT_SIZES[Q[requested]][0] == 0:
        return requested
    f = FALLBACK.get(requested)
    return f if f and cols % 32 == 0 else "BF16"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny.maker(tmp_path_factory.mktemp("tiny-models"))


@pytest.fixture(scope="module")
def q32_files(tmp_path_factory, fmoe_bin, models):
    """(type requested, model) -> the file fmoe quantize writes."""
    d = tmp_path_factory.mktemp("q32")
    cache = {}

    def get(qtype, model):
        if (qtype, model) not in cache:
            src = TINY if model == "tiny" else models(model)
            out = d / f"{model}-{qtype}.gguf"
            run_fmoe(fmoe_bin, "quantize", "--type", qtype, src, "-o", out, "--quiet")
            cache[(qtype, model)] = out
        return cache[(qtype, model)]
    return get


CASES = [("q4_0", "tiny", "Q4_0"), ("q4_1", "tiny", "Q4_1"), ("q5_0", "tiny", "Q5_0"),
         ("q5_1", "tiny", "Q5_1"), ("iq4_nl", "tiny", "IQ4_NL"),
         ("q4_k", "deepseek", "Q5_0"), ("q5_k", "deepseek", "Q5_1")]


@pytest.mark.parametrize("qtype,model,holds", CASES)
def test_q32_model_equals_its_dequantisation(q32_files, models, driver, tmp_path, qtype, model,
                                             holds):
    src = q32_files(qtype, model)
    assert holds in dequantised_copy(src, tmp_path / "deq.gguf")
    d = TINY if model == "tiny" else models(model)
    V = json.loads((pathlib.Path(d) / "config.json").read_text())["vocab_size"]
    tokens = [int(x) for x in np.random.default_rng(5).integers(3, V, 16)]
    f32, rf = drive(driver, tmp_path / "deq.gguf", tokens, 12, tmp_path, "f32")
    q, rq = drive(driver, src, tokens, 12, tmp_path, "q")
    diff = float(np.abs(q - f32).max())
    print(f"{model} {qtype} ({holds}) vs its f32 dequantisation: max |logit diff| {diff:.3g}")
    assert diff <= 1e-3
    assert rq["generated"] == rf["generated"] and rq["experts"] == rf["experts"]
    # the CPU's default for quantized weights: inputs quantised to 8 bits (Q8_0 blocks)
    q8, _ = drive(driver, src, tokens, 0, tmp_path, "q8", "--activations", "q8")
    n = len(tokens)
    ref, q8 = f32.reshape(-1, V)[:n], q8.reshape(-1, V)[:n]
    dd = np.abs(q8 - ref)
    rms, worst = float(np.sqrt((dd ** 2).mean()) / ref.std()), float(dd.max() / ref.std())
    print(f"  activations q8: |diff| / std: RMS {rms:.4f}, max {worst:.4f}")
    rms_tol, max_tol = Q8ACT_TOL[model]
    assert 0 < rms < rms_tol and worst < max_tol


def gguf_py_mix(src, dst, cycle=("Q4_0", "Q4_1", "Q5_0", "Q5_1")):
    """src (a GGUF file) with its 2-D weights requantised by gguf-py's own quantisers, the
    types taken in turn (Q4_0, Q4_1, Q5_0, Q5_1) so that one file mixes them in experts,
    attention and embeddings alike; routers and rows that are not whole blocks as they
    were. Written by gguf-py's GGUFWriter: no fmoe code makes the blocks."""
    r = gguf.GGUFReader(str(src))
    a = r.fields["general.architecture"]
    w = gguf.GGUFWriter(str(dst), bytes(a.parts[a.data[0]]).decode())
    for f in r.fields.values():
        if not f.name.startswith("GGUF.") and f.name != "general.architecture":
            w.add_key_value(f.name, f.contents(), f.types[0])
    i, kinds = 0, set()
    for t in r.tensors:
        shape = [int(x) for x in t.shape[::-1]]
        if len(shape) >= 2 and shape[-1] % 32 == 0 and "gate_inp" not in t.name:
            qt = Q[cycle[i % len(cycle)]]
            i += 1
            x = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
            w.add_tensor(t.name, gguf.quants.quantize(x.reshape(shape), qt), raw_dtype=qt)
            kinds.add(qt.name)
        else:
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return kinds


def test_gguf_py_quantized_mix_equals_its_dequantisation(q32_files, driver, tmp_path):
    """A file whose Q4_0/Q4_1/Q5_0/Q5_1 blocks gguf-py wrote (from fmoe-tiny's Q8_0 file):
    its logits equal those of its F32 dequantisation by gguf-py, to float rounding."""
    mix = tmp_path / "mix.gguf"
    assert gguf_py_mix(q32_files("q8_0", "tiny"), mix) == {"Q4_0", "Q4_1", "Q5_0", "Q5_1"}
    dequantised_copy(mix, tmp_path / "deq.gguf")
    tokens = [int(x) for x in np.random.default_rng(9).integers(3, 4096, 12)]
    f32, rf = drive(driver, tmp_path / "deq.gguf", tokens, 8, tmp_path, "f32")
    q, rq = drive(driver, mix, tokens, 8, tmp_path, "q")
    assert float(np.abs(q - f32).max()) <= 1e-3
    assert rq["generated"] == rf["generated"] and rq["experts"] == rf["experts"]


def f16_nan_first_bytes(path):
    """How many MXFP4 blocks of the file's non-expert tensors would read as a NaN if their
    first two bytes (the E8M0 scale, then values 0 and 16) were taken for an f16 scale."""
    n = 0
    for t in gguf.GGUFReader(str(path)).tensors:
        if t.tensor_type == Q.MXFP4 and "_exps" not in t.name:
            b = np.asarray(t.data).reshape(-1, 17)[:, :2].copy().view(np.float16)
            n += int(np.isnan(b).sum())
    return n


def test_mxfp4_everywhere_equals_its_dequantisation(q32_files, driver, tmp_path):
    """MXFP4 in every 2-D weight, embeddings and attention too, as llama-quantize --pure
    MXFP4_MOE writes it (gguf-py's quantiser here): loads, and its logits equal its F32
    dequantisation's. Such files were refused as "non-finite" when the load-time check
    read an f16 scale where MXFP4 has one E8M0 byte; the file is checked to hold blocks
    that reading turns into NaNs."""
    mix = tmp_path / "mxfp4.gguf"
    assert gguf_py_mix(q32_files("q8_0", "tiny"), mix, ("MXFP4",)) == {"MXFP4"}
    assert f16_nan_first_bytes(mix) > 0
    dequantised_copy(mix, tmp_path / "deq.gguf")
    tokens = [int(x) for x in np.random.default_rng(11).integers(3, 4096, 12)]
    f32, rf = drive(driver, tmp_path / "deq.gguf", tokens, 8, tmp_path, "f32")
    q, rq = drive(driver, mix, tokens, 8, tmp_path, "q")
    assert float(np.abs(q - f32).max()) <= 1e-3
    assert rq["generated"] == rf["generated"] and rq["experts"] == rf["experts"]


@pytest.mark.parametrize("qtype,model", [("q4_k", "tiny"), ("q4_k", "deepseek"),
                                         ("q5_k", "deepseek"), ("q6_k", "deepseek"),
                                         ("q4_k", "qwen2_moe"), ("q4_k", "mixtral")])
def test_fallback_is_llama_quantizes(q32_files, qtype, model):
    """Every quantized tensor as gguf-py reads it: the requested type, llama.cpp's fallback,
    or BF16 only where no 32-value block fits (F32: norms and routers, never quantized)."""
    if model not in tiny.ALL and model != "tiny":
        pytest.skip(model)
    r = gguf.GGUFReader(str(q32_files(qtype, model)))
    seen = set()
    for t in r.tensors:
        name = t.tensor_type.name
        if name == "F32":
            continue
        cols = int(t.shape[0])
        assert name == expected_type(qtype.upper(), cols), (t.name, cols, name)
        seen.add(name)
    if model == "deepseek":  # rows of 32 and 64 values: everything falls back
        assert seen == {FALLBACK[qtype.upper()]}, seen


def file_expert_bytes(path, layer=0):
    """One routed expert's bytes as the file stores layer `layer`'s (gguf-py)."""
    r = gguf.GGUFReader(str(path))
    exps = [t for t in r.tensors if t.name.startswith(f"blk.{layer}.ffn_") and "_exps" in t.name]
    return sum(int(t.n_bytes) for t in exps) // int(exps[0].shape[-1]), \
        {t.name.split(".")[2]: t.tensor_type.name for t in exps}


def record_attrs(fmoe_bin, model, tmp_path):
    h5py = pytest.importorskip("h5py")
    import hdf5plugin  # noqa: F401
    prompts = tmp_path / "p.txt"
    prompts.write_text("What is a context manager?\nName three colours.\n")
    run_fmoe(fmoe_bin, "record", "--model", model, "--dataset", prompts, "--max-new-tokens", 4,
             "--temperature", 0, "-o", tmp_path / "t.h5", "--quiet")
    with h5py.File(tmp_path / "t.h5", "r") as t:
        return dict(t.attrs)


@pytest.mark.parametrize("qtype", ["q4_k", "q4_0"])
def test_tiny_expert_bytes_in_the_trace_are_the_files(fmoe_bin, q32_files, tmp_path, qtype):
    """fmoe-tiny: h = 256, I = 176. Gate/up rows (256 values) are in the requested type;
    the down projection's rows of 176 values are no whole blocks of 32 (176 = 5.5 x 32), so
    no block type fits them and they stay BF16, as llama-quantize keeps such rows at 16
    bits (F16). So the --type q4_k expert is 1.9x smaller than bf16, not the 3x+ that Q5_0
    downs would give: they cannot exist here (test_q32_experts_3x_smaller has a model
    where they do). record's trace carries the type and the file's bytes."""
    f = q32_files(qtype, "tiny")
    cfg = json.loads((TINY / "config.json").read_text())
    h, inter = cfg["hidden_size"], cfg["moe_intermediate_size"]
    got, types = file_expert_bytes(f)
    assert types == {"ffn_gate_exps": qtype.upper(), "ffn_up_exps": qtype.upper(),
                     "ffn_down_exps": "BF16"}
    block, size = gguf.GGML_QUANT_SIZES[Q[qtype.upper()]]
    assert got == 2 * inter * (h // block * size) + h * inter * 2
    a = record_attrs(fmoe_bin, f, tmp_path)
    assert a["dtype"] == qtype
    assert int(a["expert_bytes"]) == got


def test_q32_experts_3x_smaller(q32_files, models):
    """Tiny DeepSeek (h = 64, I = 32): --type q4_k writes every expert row as Q5_0 (22
    bytes per 32 values): 2.9x smaller than bf16 (16 / 5.5 bits), where the old rule's
    Q8_0 gave 1.9x. (With Q4_K gate/up rows, a real model's 1408-wide Q5_0 downs give
    3.3x.)"""
    f = q32_files("q4_k", "deepseek")
    cfg = json.loads((models("deepseek") / "config.json").read_text())
    h, inter = cfg["hidden_size"], cfg["moe_intermediate_size"]
    got, types = file_expert_bytes(f, layer=1)
    assert set(types.values()) == {"Q5_0"}, types
    assert got == 3 * h * inter // 32 * 22
    assert got * 2.9 < 3 * h * inter * 2


@pytest.mark.parametrize("tier", [["--tier", "host"], ["--tier", "file"]])
def test_offloaded_q4_0_generates_the_resident_tokens(fmoe_bin, q32_files, tier):
    f = q32_files("q4_0", "tiny")
    common = ["generate", "--model", f, "--prompt", "What is a context manager?",
              "--max-new-tokens", 10, "--temperature", 0, "--json"]
    resident = json.loads(run_fmoe(fmoe_bin, *common).stdout)["generated_ids"]
    p = run_fmoe(fmoe_bin, *common, "--policy", "lru", "--cache-experts", 6, *tier)
    assert json.loads(p.stdout)["generated_ids"] == resident


# ---- bad input ---------------------------------------------------------------------

def corrupt_first_block(src, dst, tensor, value, at=0):
    """A copy of src with the f16 at byte `at` of tensor's first block set to value."""
    r = gguf.GGUFReader(str(src))
    t = next(t for t in r.tensors if t.name == tensor)
    data = bytearray(pathlib.Path(src).read_bytes())
    off = int(t.data_offset) + at  # gguf-py's offset is the file's, data section included
    data[off:off + 2] = np.array([value], dtype=np.float16).tobytes()
    pathlib.Path(dst).write_bytes(bytes(data))
    return t.tensor_type.name


@pytest.mark.parametrize("qtype,at,value", [("q4_1", 0, np.nan), ("q4_1", 2, np.inf),
                                            ("q5_0", 0, -np.inf), ("iq4_nl", 0, np.nan)])
def test_bad_block_scale_is_one_line(fmoe_bin, q32_files, tmp_path, qtype, at, value):
    bad = tmp_path / "bad.gguf"
    assert corrupt_first_block(q32_files(qtype, "tiny"), bad, "blk.1.attn_q.weight", value,
                               at) == qtype.upper()
    p = run_fmoe(fmoe_bin, "generate", "--model", bad, "--prompt", "hi",
                 "--max-new-tokens", 2, check=False)
    line = one_line(p, 1)
    assert "non-finite" in line and "bad.gguf" in line, line


def test_bad_expert_block_scale_is_one_line(fmoe_bin, q32_files, tmp_path):
    """Expert weights are not scanned at load (they may live on a tier); a NaN scale in
    every expert's first Q5_1 block of one layer reaches the routed output, where the
    forward pass's finite check stops the run in one line."""
    bad = nan_expert_scales(q32_files("q5_1", "tiny"), tmp_path, "Q5_1", 0)
    p = run_fmoe(fmoe_bin, "generate", "--model", bad, "--prompt", "hi",
                 "--max-new-tokens", 2, check=False)
    assert "not finite" in one_line(p, 1)


def nan_expert_scales(src, tmp_path, type_name, scale_at):
    """A copy of src (tmp_path/bad.gguf) whose blk.1 gate experts, of type type_name, each
    have their first block's f16 scale at byte scale_at set to NaN."""
    r = gguf.GGUFReader(str(src))
    t = next(t for t in r.tensors if t.name == "blk.1.ffn_gate_exps.weight")
    assert t.tensor_type.name == type_name
    data = bytearray(pathlib.Path(src).read_bytes())
    E = int(t.shape[-1])
    for e in range(E):
        off = int(t.data_offset) + e * (int(t.n_bytes) // E) + scale_at
        data[off:off + 2] = np.array([np.nan], dtype=np.float16).tobytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    return bad


def truncated(src, tmp_path):
    """A copy of src (tmp_path/cut.gguf) without its last 1000 bytes."""
    data = pathlib.Path(src).read_bytes()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[: len(data) - 1000])
    return bad


def test_truncated_q5_0_file_is_one_line(fmoe_bin, q32_files, tmp_path):
    bad = truncated(q32_files("q5_0", "tiny"), tmp_path)
    p = run_fmoe(fmoe_bin, "generate", "--model", bad, "--prompt", "hi", check=False)
    assert "cut.gguf" in one_line(p, 1)


def test_cuda_takes_q5_0(driver, q32_files, tmp_path):
    """The CUDA backend has kernels for the 32-value types: the session is not refused
    for its tensor types. Without a device (or a CUDA build) it fails later, at the
    backend, in a line that names no tensor type; on a device it runs
    (tests/gpu/test_gpu_e2e.py compares its tokens with the CPU's)."""
    p = drive(driver, q32_files("q5_0", "tiny"), [1, 2, 3], 0, tmp_path, "cuda",
              "--session-backend", "cuda", check=False)
    if p.returncode == 0:
        return
    line = one_line(p, 1)
    assert "CUDA backend unavailable" in line and "Q5_0" not in line, line
