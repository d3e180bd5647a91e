"""A GGUF model whose experts are the codebook i-quants IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
IQ3_S, IQ1_S and IQ1_M (lib/quant_iq.c) loads and runs (docs/quantization.md).

fmoe writes none of these types and gguf-py has no quantiser for them, so the blocks are
random but valid: fmoe-tiny's Q8_0 file (from `fmoe quantize`) with each layer's expert
gate and up projections (256-wide rows: one block each) replaced by random blocks of the
seven types in turn, every block's f16 scale set so that its RMS is the RMS of the row it
replaces; and layer 1's query projection, a resident (not offloadable) weight, as IQ1_M.
gguf-py's GGUFWriter writes the file; the down projections (176-wide rows, no whole
block of 32 or 256) stay BF16, as `fmoe quantize` left them.

- its logits, with f32 activations, equal those of the same file dequantised by gguf-py
  and written as F32, to float rounding (the bar of test_gguf_model.py), through the
  forward driver and through `fmoe generate` (the same tokens too);
- with the CPU's 8-bit activations (Q8_K blocks against the i-quant rows) they stay within
  a stated fraction of the logits' spread;
- record's trace names the experts' type and carries their bytes as the file stores them;
- a NaN or infinite scale in an i-quant block is refused in one line (a resident weight at
  load; experts, which are not scanned at load, when the routed output is not finite);
- the CUDA backend, which has kernels for these types, does not refuse it for its types.
"""
import json

import numpy as np
import pytest

from conftest import run_fmoe
from test_gguf_model import TINY, dequantised_copy, drive, one_line  # noqa: F401
from test_gguf_iquants import set_d

import gguf  # noqa: E402  (tests/python/requirements.txt)

Q = gguf.GGMLQuantizationType
TYPES = ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M"]

# 8-bit activations against the f32 dequantisation, in units of the logits' standard
# deviation over the vocabulary: each product's input moves by at most half a step of its
# 256-value Q8_K block (1/254 of the block's largest magnitude). Measured on this file:
# 0.9% RMS, 5.7% at the worst logit; the bounds leave about 3x of room. A wrong code, sign
# or scale moves logits by the order of their spread.
Q8ACT_RMS_TOL, Q8ACT_MAX_TOL = 0.03, 0.2


def iq_blocks(rng, name, target_rms):
    """Random blocks of type `name`, one per entry of target_rms (f64), each block's d set
    so that its values' RMS (as gguf-py dequantises them) is that entry."""
    n = target_rms.size
    _, size = gguf.GGML_QUANT_SIZES[Q[name]]
    b = rng.integers(0, 256, (n, size), dtype=np.uint8)
    set_d(name, b, np.full(n, np.float16(1.0).view(np.uint16)))
    unit = gguf.quants.dequantize(b.reshape(-1), Q[name]).astype(np.float64).reshape(n, -1)
    d = target_rms / np.sqrt((unit ** 2).mean(axis=1))
    set_d(name, b, d.astype(np.float16).view(np.uint16))
    return b


def write_iq_model(src, dst, seed=0):
    """src (a GGUF file of fmoe-tiny) with its expert gate/up projections as i-quants, the
    seven types in turn over the layers' tensors, and blk.1.attn_q.weight as IQ1_M;
    returns the set of types written."""
    rng = np.random.default_rng(seed)
    r = gguf.GGUFReader(str(src))
    a = r.fields["general.architecture"]
    w = gguf.GGUFWriter(str(dst), bytes(a.parts[a.data[0]]).decode())
    for f in r.fields.values():
        if not f.name.startswith("GGUF.") and f.name != "general.architecture":
            w.add_key_value(f.name, f.contents(), f.types[0])
    i, kinds = 0, set()
    for t in r.tensors:
        shape = [int(x) for x in t.shape[::-1]]  # [experts, rows, cols]
        expert = "ffn_gate_exps" in t.name or "ffn_up_exps" in t.name
        if (expert or t.name == "blk.1.attn_q.weight") and shape[-1] % 256 == 0:
            name = TYPES[i % len(TYPES)] if expert else "IQ1_M"
            i += expert
            x = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float64)
            rms = np.sqrt((x.reshape(-1, 256) ** 2).mean(axis=1))
            blocks = iq_blocks(rng, name, rms)
            w.add_tensor(t.name, blocks.reshape(*shape[:-1], -1), raw_dtype=Q[name])
            kinds.add(name)
        else:
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return kinds


@pytest.fixture(scope="module")
def iq_model(tmp_path_factory, fmoe_bin):
    d = tmp_path_factory.mktemp("iq-model")
    base = d / "q8_0.gguf"
    run_fmoe(fmoe_bin, "quantize", "--type", "q8_0", TINY, "-o", base, "--quiet")
    iq = d / "iq.gguf"
    assert write_iq_model(base, iq) == set(TYPES)
    deq = d / "deq.gguf"
    kinds = dequantised_copy(iq, deq)
    assert set(TYPES) <= kinds
    return iq, deq


def test_iq_model_equals_its_dequantisation(iq_model, driver, tmp_path):
    iq, deq = iq_model
    tokens = [int(x) for x in np.random.default_rng(5).integers(3, 4096, 16)]
    f32, rf = drive(driver, deq, tokens, 12, tmp_path, "f32")
    q, rq = drive(driver, iq, tokens, 12, tmp_path, "q", "--activations", "f32")
    diff = float(np.abs(q - f32).max())
    print(f"i-quant experts vs their f32 dequantisation: max |logit diff| {diff:.3g}")
    assert diff <= 1e-3
    assert rq["generated"] == rf["generated"] and rq["experts"] == rf["experts"]
    q8, _ = drive(driver, iq, tokens, 0, tmp_path, "q8", "--activations", "q8")
    n, V = len(tokens), 4096
    ref, q8 = f32.reshape(-1, V)[:n], q8.reshape(-1, V)[:n]
    dd = np.abs(q8 - ref)
    rms, worst = float(np.sqrt((dd ** 2).mean()) / ref.std()), float(dd.max() / ref.std())
    print(f"  activations q8: |diff| / std: RMS {rms:.4f}, max {worst:.4f}")
    assert 0 < rms < Q8ACT_RMS_TOL and worst < Q8ACT_MAX_TOL


def generate(fmoe_bin, model, tmp_path, tag):
    logits = tmp_path / f"{tag}.npy"
    p = run_fmoe(fmoe_bin, "generate", "--model", model, "--tokenizer", TINY, "--prompt",
                 "The expert cache", "--max-new-tokens", "8", "--temperature", "0",
                 "--ignore-eos", "--activations", "f32", "--threads", "1", "--json",
                 "--dump-logits", logits)
    return json.loads(p.stdout), np.load(logits)


def test_fmoe_generate_runs_the_iq_model(fmoe_bin, iq_model, tmp_path):
    iq, deq = iq_model
    got, lq = generate(fmoe_bin, iq, tmp_path, "iq")
    want, lf = generate(fmoe_bin, deq, tmp_path, "deq")
    assert got["generated_ids"] == want["generated_ids"] and len(got["generated_ids"]) == 8
    assert lq.shape == lf.shape and float(np.abs(lq - lf).max()) <= 1e-3


def with_bad_scales(src, dst, tensor, value, per_expert):
    """src with the f16 scale of the first block of `tensor` (per_expert: of each expert's
    slice of it) set to `value`; returns the tensor's type."""
    r = gguf.GGUFReader(str(src))
    t = next(t for t in r.tensors if t.name == tensor)
    raw = bytearray(src.read_bytes())
    size = gguf.GGML_QUANT_SIZES[t.tensor_type][1]
    slices = int(t.shape[-1]) if per_expert else 1
    for e in range(slices):
        off = int(t.data_offset) + e * (int(t.n_bytes) // slices)  # the file's offset
        one = np.frombuffer(bytes(raw[off:off + size]), dtype=np.uint8).copy().reshape(1, -1)
        set_d(t.tensor_type.name, one, np.array([np.float16(value).view(np.uint16)]))
        raw[off:off + size] = one.tobytes()
    dst.write_bytes(bytes(raw))
    return t.tensor_type.name


@pytest.mark.parametrize("value", [np.nan, -np.inf])
def test_bad_resident_iq_block_scale_is_one_line(fmoe_bin, iq_model, tmp_path, value):
    bad = tmp_path / "bad.gguf"
    assert with_bad_scales(iq_model[0], bad, "blk.1.attn_q.weight", value, False) == "IQ1_M"
    p = run_fmoe(fmoe_bin, "generate", "--model", bad, "--tokenizer", TINY, "--prompt", "hi",
                 "--max-new-tokens", "1", check=False)
    line = one_line(p, 1)
    assert "non-finite" in line and "bad.gguf" in line, line


@pytest.mark.parametrize("tensor,kind", [("blk.1.ffn_gate_exps.weight", "IQ2_S"),
                                         ("blk.3.ffn_gate_exps.weight", "IQ1_M")])
def test_bad_expert_iq_block_scale_is_one_line(fmoe_bin, iq_model, tmp_path, tensor, kind):
    bad = tmp_path / "bad.gguf"
    assert with_bad_scales(iq_model[0], bad, tensor, np.nan, True) == kind
    p = run_fmoe(fmoe_bin, "generate", "--model", bad, "--tokenizer", TINY, "--prompt", "hi",
                 "--max-new-tokens", "2", check=False)
    assert "not finite" in one_line(p, 1)


def test_cuda_takes_iq_model(driver, iq_model, tmp_path):
    """Not refused for its tensor types when the session is created: without a device (or
    a CUDA build) it fails later, at the backend, in a line that names no tensor type."""
    p = drive(driver, iq_model[0], [5, 6], 0, tmp_path, "cuda", "--session-backend", "cuda",
              check=False)
    if p.returncode == 0:
        return
    line = one_line(p, 1)
    assert "CUDA backend unavailable" in line and "IQ" not in line, line


def test_trace_carries_the_iq_expert_type_and_bytes(fmoe_bin, iq_model, tmp_path):
    """record's trace names the experts' type (layer 0's gate: IQ2_XXS, lib/geometry.c's
    iq2_xxs) and the bytes of the largest expert as the file stores them (gguf-py; the
    layers mix types, so they differ: layer 5's IQ3_XXS/IQ3_S experts are the largest)."""
    from test_gguf_q32_model import file_expert_bytes, record_attrs
    got, types = file_expert_bytes(iq_model[0])
    assert types == {"ffn_gate_exps": "IQ2_XXS", "ffn_up_exps": "IQ2_XS", "ffn_down_exps": "BF16"}
    a = record_attrs(fmoe_bin, iq_model[0], tmp_path)
    assert a["dtype"] == "iq2_xxs"
    assert int(a["expert_bytes"]) == max(file_expert_bytes(iq_model[0], L)[0] for L in range(6))
    assert got < int(a["expert_bytes"])
