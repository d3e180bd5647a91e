"""The ggml block formats and the GGUF reader (lib/quant*.c, lib/gguf.c) against the gguf
Python package (gguf-py, llama.cpp's own Python reader and writer), through the test
driver tests/lib/quant_tool.c:

- dequantisation of random blocks of every type fmoe computes with equals
  gguf.quants.dequantize bit for bit;
- Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and MXFP4 quantisation equals gguf.quants.quantize byte
  for byte
  (gguf-py has no quantiser for the K-quants and IQ4_NL: ours are checked by their
  round-trip error, dequantised by gguf-py);
- blocks with extreme scales (zero, negative, the largest f16, subnormal, infinite) of the
  32-value types dequantise as gguf-py's do;
- dot products (AVX2 path and plain reference) agree with a float64 dot of gguf-py's
  dequantised row within the bound of tests/lib/test_quant.c;
- a file written by gguf.GGUFWriter (every value type, arrays, tensors of every supported
  type, a custom alignment) reads back: metadata, extents, offsets and values.
"""
import json
import pathlib
import subprocess

import numpy as np
import pytest

import gguf  # noqa: E402  (tests/python/requirements.txt)
from gguf import GGMLQuantizationType as Q  # noqa: E402

TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_K", "Q5_K", "Q6_K",
         "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "Q2_K", "Q3_K", "IQ4_XS", "MXFP4"]
# the 32-value types whose f16 fields are d (offset 0) and, for the "_1" ones, m (offset 2)
Q32 = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL"]
# the low-bit K-quants of part 2 and where their f16 fields are: d (and Q2_K's dmin)
KX = {"Q2_K": (80, 82), "Q3_K": (108,), "IQ4_XS": (0,)}


@pytest.fixture(scope="session")
def tool(build_dir):
    exe = build_dir / "tests" / "lib" / "quant_tool"
    if not exe.exists():
        pytest.fail(f"{exe} not built")
    return exe


def run_tool(tool, *args, check=True):
    p = subprocess.run([str(tool), *map(str, args)], capture_output=True, text=True, timeout=120)
    if check and p.returncode != 0:
        raise AssertionError(f"quant_tool {' '.join(map(str, args))} exited {p.returncode}: {p.stderr}")
    return p


def finite_half(rng, n, scale=1.0):
    """n random finite f16 values as their bytes (uint8 pairs)."""
    return (rng.uniform(-scale, scale, n).astype(np.float16)).view(np.uint8).reshape(n, 2)


def random_blocks(rng, qtype, nblocks):
    """Random bytes for nblocks blocks of qtype; the f16 scale fields are finite (random
    bits would make NaN and infinity, which compare unequal to themselves)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, (nblocks, size), dtype=np.uint8)
    if qtype == Q.F32:
        b = rng.standard_normal(nblocks).astype(np.float32).view(np.uint8).reshape(nblocks, 4)
    elif qtype == Q.F16:
        b = finite_half(rng, nblocks, 60000)
    elif qtype == Q.BF16:
        # every bf16 pattern but NaN (exponent all ones with a mantissa)
        v = rng.integers(0, 1 << 16, nblocks, dtype=np.uint32)
        v = np.where((v & 0x7F80) == 0x7F80, v & 0x807F, v).astype(np.uint16)
        b = v.view(np.uint8).reshape(nblocks, 2)
    elif qtype in (Q.Q8_0, Q.Q4_0, Q.Q5_0, Q.IQ4_NL):
        b[:, 0:2] = finite_half(rng, nblocks, 2.0)
    elif qtype in (Q.Q4_1, Q.Q5_1):
        b[:, 0:2] = finite_half(rng, nblocks, 2.0)
        b[:, 2:4] = finite_half(rng, nblocks, 2.0)
    elif qtype in (Q.Q4_K, Q.Q5_K):
        b[:, 0:2] = finite_half(rng, nblocks, 2.0)
        b[:, 2:4] = finite_half(rng, nblocks, 2.0)
    elif qtype == Q.Q6_K:
        b[:, 208:210] = finite_half(rng, nblocks, 2.0)
    elif qtype.name in KX:
        for at in KX[qtype.name]:
            b[:, at:at + 2] = finite_half(rng, nblocks, 2.0)
    elif qtype == Q.MXFP4:  # E8M0 scales 2^-12 .. 2^3: every value finite, sums too
        b[:, 0] = rng.integers(116, 132, nblocks)
    return b


@pytest.mark.parametrize("name", TYPES)
def test_dequantise_equals_gguf_py(tool, tmp_path, name):
    qtype = Q[name]
    rng = np.random.default_rng(1000 + int(qtype))
    block, _ = gguf.GGML_QUANT_SIZES[qtype]
    nblocks = 4096 // block * 8
    raw = random_blocks(rng, qtype, nblocks)
    # a few special blocks: all-zero bytes, and subnormal f16 scales
    raw[0] = 0
    if qtype in (Q.Q8_0, Q.Q4_K, Q.Q5_K) or name in Q32:
        raw[1, 0:2] = np.array([0x01, 0x00], dtype=np.uint8)  # smallest subnormal d
    if name in KX:
        raw[1, KX[name][0]:KX[name][0] + 2] = np.array([0x01, 0x00], dtype=np.uint8)
    if name == "MXFP4":  # the subnormal scales 2^-128 and 2^-127 (ggml's e < 2 branch)
        raw[1, 0], raw[2, 0] = 0, 1
    (tmp_path / "in.bin").write_bytes(raw.tobytes())
    run_tool(tool, "dequant", name, tmp_path / "in.bin", tmp_path / "out.f32")
    ours = np.fromfile(tmp_path / "out.f32", dtype=np.float32)
    theirs = gguf.quants.dequantize(raw.reshape(-1), qtype).astype(np.float32).reshape(-1)
    assert ours.shape == theirs.shape
    assert not np.isnan(theirs).any()
    bad = np.flatnonzero(ours.view(np.uint32) != theirs.view(np.uint32))
    assert bad.size == 0, (f"{name}: {bad.size} values differ, first at {bad[0]}: "
                           f"ours {ours[bad[0]]!r}, gguf-py {theirs[bad[0]]!r}")


def test_q8_0_quantise_equals_gguf_py(tool, tmp_path):
    rng = np.random.default_rng(7)
    x = rng.standard_normal(32 * 4096).astype(np.float32)
    x[:32] = 0                                   # an all-zero block
    x[32:64] *= 1e-6                             # d in the f16 subnormal range
    x[64:96] = np.arange(32) - 15.5              # values on the rounding midpoints
    x[96:128] = rng.integers(-127, 128, 32)      # exact multiples of d
    x[128:160] *= 1e4
    (tmp_path / "x.f32").write_bytes(x.tobytes())
    run_tool(tool, "quant", "Q8_0", tmp_path / "x.f32", tmp_path / "q.bin")
    ours = np.fromfile(tmp_path / "q.bin", dtype=np.uint8)
    theirs = gguf.quants.quantize(x.reshape(-1, 32 * 64), Q.Q8_0).reshape(-1)
    bad = np.flatnonzero(ours != theirs)
    assert bad.size == 0, f"{bad.size} bytes differ, first in block {bad[0] // 34}"


@pytest.mark.parametrize("name", Q32)
def test_q32_extreme_blocks_dequantise_as_gguf_py(tool, tmp_path, name):
    """Scales at the ends of f16: zero, -0, negative, +-65504, the smallest subnormal, and
    infinite (d and, for Q4_1/Q5_1, m): every value equals gguf-py's, NaN where it has NaN
    (inf times a zero code)."""
    qtype = Q[name]
    rng = np.random.default_rng(77 + int(qtype))
    specials = np.array([0.0, -0.0, -1.5, 65504.0, -65504.0, 6e-8, np.inf, -np.inf],
                        dtype=np.float16).view(np.uint8).reshape(-1, 2)
    affine = name in ("Q4_1", "Q5_1")
    rows = []
    for d in specials:
        for m in (specials if affine else specials[:1]):
            b = random_blocks(rng, qtype, 2)
            b[:, 0:2] = d
            if affine:
                b[:, 2:4] = m
            b[1, 2 + 2 * affine:] = 0xFF  # every code at its top (and 5th bits set)
            rows.append(b)
    raw = np.concatenate(rows)
    (tmp_path / "in.bin").write_bytes(raw.tobytes())
    run_tool(tool, "dequant", name, tmp_path / "in.bin", tmp_path / "out.f32")
    ours = np.fromfile(tmp_path / "out.f32", dtype=np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        theirs = gguf.quants.dequantize(raw.reshape(-1), qtype).astype(np.float32).reshape(-1)
    nan = np.isnan(theirs)
    assert (np.isnan(ours) == nan).all()
    assert np.isinf(theirs).any()  # the infinite scales reached the values
    bad = np.flatnonzero(ours.view(np.uint32)[~nan] != theirs.view(np.uint32)[~nan])
    assert bad.size == 0, f"{name}: {bad.size} values differ"


def test_mxfp4_every_scale_dequantises_as_gguf_py(tool, tmp_path):
    """MXFP4 with each of the 256 E8M0 scales (subnormal, normal, 2^127 where 12·2^126
    overflows to infinity) and every code: each value equals gguf-py's bit for bit, NaN
    where it has NaN."""
    rng = np.random.default_rng(39)
    raw = random_blocks(rng, Q.MXFP4, 512)
    raw[:, 0] = np.arange(512) % 256
    raw[256:, 1:] = np.arange(16, dtype=np.uint8) * 17  # codes q, q (both nibbles)
    (tmp_path / "in.bin").write_bytes(raw.tobytes())
    run_tool(tool, "dequant", "MXFP4", tmp_path / "in.bin", tmp_path / "out.f32")
    ours = np.fromfile(tmp_path / "out.f32", dtype=np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        theirs = gguf.quants.dequantize(raw.reshape(-1), Q.MXFP4).astype(np.float32).reshape(-1)
    nan = np.isnan(theirs)
    assert (np.isnan(ours) == nan).all()
    assert np.isinf(theirs).any() and (theirs[theirs != 0] != 0).all()
    bad = np.flatnonzero(ours.view(np.uint32)[~nan] != theirs.view(np.uint32)[~nan])
    assert bad.size == 0, f"MXFP4: {bad.size} values differ"


@pytest.mark.parametrize("name", list(KX))
def test_kx_extreme_blocks_dequantise_as_gguf_py(tool, tmp_path, name):
    """Q2_K, Q3_K, IQ4_XS with d (and Q2_K's dmin) at the ends of f16, the codes and
    scales all zero bits or all one bits: every value equals gguf-py's, NaN where it has
    NaN (an infinite scale times a zero code)."""
    qtype = Q[name]
    rng = np.random.default_rng(99 + int(qtype))
    specials = np.array([0.0, -0.0, -1.5, 65504.0, -65504.0, 6e-8, np.inf, -np.inf],
                        dtype=np.float16).view(np.uint8).reshape(-1, 2)
    at = KX[name]
    rows = []
    for d in specials:
        for m in (specials if len(at) > 1 else specials[:1]):
            b = random_blocks(rng, qtype, 3)
            for k in range(3):
                keep = {a: (d if i == 0 else m) for i, a in enumerate(at)}
                if k:  # every other byte all zeros, then all ones
                    b[k, :] = 0 if k == 1 else 0xFF
                for a, v in keep.items():
                    b[k, a:a + 2] = v
            rows.append(b)
    raw = np.concatenate(rows)
    (tmp_path / "in.bin").write_bytes(raw.tobytes())
    run_tool(tool, "dequant", name, tmp_path / "in.bin", tmp_path / "out.f32")
    ours = np.fromfile(tmp_path / "out.f32", dtype=np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        theirs = gguf.quants.dequantize(raw.reshape(-1), qtype).astype(np.float32).reshape(-1)
    nan = np.isnan(theirs)
    assert (np.isnan(ours) == nan).all()
    assert np.isinf(theirs).any()
    bad = np.flatnonzero(ours.view(np.uint32)[~nan] != theirs.view(np.uint32)[~nan])
    assert bad.size == 0, f"{name}: {bad.size} values differ"


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1"])
def test_q32_quantise_equals_gguf_py(tool, tmp_path, name):
    """gguf-py's quantisers for these are bit-exact ports of ggml's reference ones."""
    rng = np.random.default_rng(11 + int(Q[name]))
    x = rng.standard_normal(32 * 4096).astype(np.float32)
    x[:32] = 0                          # an all-zero block
    x[32:64] *= 1e-6                    # d in the f16 subnormal range
    x[64:96] = np.arange(32) - 15.5     # evenly spaced: codes on their rounding edges
    x[96:128] = -np.abs(x[96:128])      # one sign only
    x[128:160] *= 1e4
    x[160:192] = 3.0                    # a constant block (Q4_1/Q5_1: d = 0)
    (tmp_path / "x.f32").write_bytes(x.tobytes())
    run_tool(tool, "quant", name, tmp_path / "x.f32", tmp_path / "q.bin")
    ours = np.fromfile(tmp_path / "q.bin", dtype=np.uint8)
    theirs = gguf.quants.quantize(x.reshape(-1, 32 * 64), Q[name]).reshape(-1)
    size = gguf.GGML_QUANT_SIZES[Q[name]][1]
    bad = np.flatnonzero(ours != theirs)
    assert bad.size == 0, f"{bad.size} bytes differ, first in block {bad[0] // size}"


def test_mxfp4_quantise_equals_gguf_py(tool, tmp_path):
    """Ours (lib/quant_mxfp4.c) and gguf-py's MXFP4.quantize_blocks are both ggml's
    quantize_row_mxfp4_ref; blocks on the exponent's edges (powers of two, values just
    under them) and on the levels' midpoints (ties: the first level, +0 before -0)."""
    rng = np.random.default_rng(39)
    x = rng.standard_normal(32 * 2048).astype(np.float32)
    x[:32] = 0                                          # e = 0
    x[32:64] = np.ldexp(1.0, rng.integers(-20, 20, 32))  # powers of two: amax exactly 2^k
    x[64:96] = np.nextafter(np.float32(4.0), np.float32(0)) * np.sign(x[64:96])
    x[96:128] = (np.arange(32) % 8 - 3.5) * 0.25        # midpoints of the levels at scale 1/4
    x[128:160] *= 1e-30                                 # small normal exponents
    x[160:192] *= 1e30
    x[192:224] = -np.abs(x[192:224])
    (tmp_path / "x.f32").write_bytes(x.tobytes())
    run_tool(tool, "quant", "MXFP4", tmp_path / "x.f32", tmp_path / "q.bin")
    ours = np.fromfile(tmp_path / "q.bin", dtype=np.uint8)
    theirs = gguf.quants.quantize(x.reshape(-1, 32 * 64), Q.MXFP4).reshape(-1)
    bad = np.flatnonzero(ours != theirs)
    assert bad.size == 0, f"{bad.size} bytes differ, first in block {bad[0] // 17}"


def test_iq4_nl_quantise_round_trip_by_gguf_py(tool, tmp_path):
    """Our IQ4_NL quantiser is simpler than ggml's search (lib/quant_ref32.c): its blocks
    dequantised by gguf-py come within half the grid's widest gap (24/127 of the block's
    max at d = max/127) of the input, and the RMS error is that of a 4-bit format."""
    rng = np.random.default_rng(20)
    x = (rng.standard_normal(32 * 2048) * 0.02).astype(np.float32)
    x[:32] = 0
    x[100] = 1.0
    (tmp_path / "x.f32").write_bytes(x.tobytes())
    run_tool(tool, "quant", "IQ4_NL", tmp_path / "x.f32", tmp_path / "q.bin")
    q = np.fromfile(tmp_path / "q.bin", dtype=np.uint8)
    assert q.size == 2048 * 18
    y = gguf.quants.dequantize(q, Q.IQ4_NL).reshape(-1)
    assert (y[:32] == 0).all()
    bx, by = x.reshape(-1, 32), y.reshape(-1, 32)
    amax = np.abs(bx).max(axis=1, keepdims=True)
    assert (np.abs(by - bx) <= 0.15 * amax + 1e-7).all()
    rel = np.sqrt(((y - x) ** 2).sum() / (x ** 2).sum())
    assert rel < 0.12, rel


@pytest.mark.parametrize("name,bits", [("Q4_K", 4), ("Q5_K", 5), ("Q6_K", 6)])
def test_k_quantise_round_trip_by_gguf_py(tool, tmp_path, name, bits):
    """Ours quantises, gguf-py dequantises: each value within its sub-block's step and the
    relative RMS error about 2^-bits of the range (the same bounds as test_quant.c)."""
    rng = np.random.default_rng(bits)
    x = (rng.standard_normal(256 * 512) * 0.02).astype(np.float32)
    x[:256] = 0
    x[1000] = 1.0  # an outlier in one block
    (tmp_path / "x.f32").write_bytes(x.tobytes())
    run_tool(tool, "quant", name, tmp_path / "x.f32", tmp_path / "q.bin")
    q = np.fromfile(tmp_path / "q.bin", dtype=np.uint8)
    assert q.size == 512 * gguf.GGML_QUANT_SIZES[Q[name]][1]
    y = gguf.quants.dequantize(q, Q[name]).reshape(-1)
    assert (y[:256] == 0).all()
    blocks_x, blocks_y = x.reshape(-1, 256), y.reshape(-1, 256)
    amax = np.abs(blocks_x).max(axis=1, keepdims=True)
    levels = {4: 15, 5: 31, 6: 32}[bits]
    assert (np.abs(blocks_y - blocks_x) <= 2.0 / levels * amax + 1e-7).all()
    rel = np.sqrt(((y - x) ** 2).sum() / (x ** 2).sum())
    assert rel < {4: 0.12, 5: 0.06, 6: 0.03}[bits], rel


@pytest.mark.parametrize("name,step,rms", [("Q2_K", 0.75, 0.45), ("Q3_K", 0.35, 0.2),
                                           ("IQ4_XS", 0.2, 0.12)])
def test_kx_quantise_round_trip_by_gguf_py(tool, tmp_path, name, step, rms):
    """Ours quantises Q2_K, Q3_K and IQ4_XS (lib/quant_refk.c, lib/quant_ref32.c), gguf-py
    dequantises: each value within `step` of its block's largest magnitude, and the
    relative RMS error that of a 2-, 3- or 4-bit format (llama.cpp's own blocks measure
    about 0.33, 0.17 and 0.09 on Gaussian data)."""
    rng = np.random.default_rng(30 + int(Q[name]))
    x = (rng.standard_normal(256 * 512) * 0.02).astype(np.float32)
    x[:256] = 0
    x[1000] = 1.0  # an outlier in one block
    (tmp_path / "x.f32").write_bytes(x.tobytes())
    run_tool(tool, "quant", name, tmp_path / "x.f32", tmp_path / "q.bin")
    q = np.fromfile(tmp_path / "q.bin", dtype=np.uint8)
    assert q.size == 512 * gguf.GGML_QUANT_SIZES[Q[name]][1]
    y = gguf.quants.dequantize(q, Q[name]).reshape(-1)
    assert (y[:256] == 0).all()
    bx, by = x.reshape(-1, 256), y.reshape(-1, 256)
    amax = np.abs(bx).max(axis=1, keepdims=True)
    assert (np.abs(by - bx) <= step * amax + 1e-7).all()
    rel = np.sqrt(((y[256:] - x[256:]) ** 2).sum() / (x[256:] ** 2).sum())
    assert rel < rms, rel


@pytest.mark.parametrize("name", TYPES)
def test_dot_matches_float64_reference(tool, tmp_path, name):
    qtype = Q[name]
    rng = np.random.default_rng(50 + int(qtype))
    n, rows = 1024, 16
    block, _ = gguf.GGML_QUANT_SIZES[qtype]
    raw = random_blocks(rng, qtype, rows * n // block)
    if qtype == Q.F16:
        raw = finite_half(rng, rows * n, 1.0)
    elif qtype == Q.BF16:  # random bits reach 3e38, where f32 sums overflow
        raw = gguf.quants.quantize(rng.standard_normal(rows * n).astype(np.float32), Q.BF16)
    x = rng.uniform(-1, 1, n).astype(np.float32)
    (tmp_path / "rows.bin").write_bytes(raw.tobytes())
    (tmp_path / "x.f32").write_bytes(x.tobytes())
    run_tool(tool, "dot", name, tmp_path / "rows.bin", tmp_path / "x.f32", tmp_path / "y.f32")
    got = np.fromfile(tmp_path / "y.f32", dtype=np.float32).reshape(rows, 2)
    w = gguf.quants.dequantize(raw.reshape(-1), qtype).astype(np.float64).reshape(rows, n)
    want = w @ x.astype(np.float64)
    bound = 4 * 1.2e-7 * np.sqrt(n) * (np.abs(w) @ np.abs(x.astype(np.float64))) + 1e-6
    for col, what in ((0, "fmoe_quant_dot"), (1, "fmoe_quant_dot_ref")):
        err = np.abs(got[:, col] - want)
        assert (err <= bound).all(), f"{what} {name}: max error {err.max()} > {bound[err.argmax()]}"


# ------------------------------------------------------------------ files by GGUFWriter


def write_sample(path, alignment=None):
    """A GGUF file with every value type and a tensor of every supported type; returns the
    metadata and the tensors as written."""
    rng = np.random.default_rng(3)
    w = gguf.GGUFWriter(str(path), arch="qwen2moe")
    if alignment:
        w.add_custom_alignment(alignment)
    meta = {
        "test.u8": (w.add_uint8, 200), "test.i8": (w.add_int8, -100),
        "test.u16": (w.add_uint16, 60000), "test.i16": (w.add_int16, -30000),
        "test.u32": (w.add_uint32, 4000000000), "test.i32": (w.add_int32, -2000000000),
        "test.f32": (w.add_float32, 0.25), "test.u64": (w.add_uint64, 1 << 50),
        "test.i64": (w.add_int64, -(1 << 50)), "test.f64": (w.add_float64, 1e-300),
        "test.bool": (w.add_bool, True), "test.str": (w.add_string, "héllo, wörld"),
        "test.strs": (w.add_array, ["a", "", "ünïcode", "x" * 300]),
        "test.ints": (w.add_array, [1, -2, 3]),
        "test.floats": (w.add_array, [0.5, -1.5]),
    }
    for key, (fn, value) in meta.items():
        fn(key, value)
    tensors = {}
    tensors["f32.weight"] = (rng.standard_normal((3, 64)).astype(np.float32), None)
    tensors["f16.weight"] = (rng.standard_normal((2, 5, 32)).astype(np.float16), None)
    tensors["bf16.weight"] = (gguf.quants.quantize(rng.standard_normal((4, 32)).astype(np.float32), Q.BF16), Q.BF16)
    tensors["q8_0.weight"] = (gguf.quants.quantize(rng.standard_normal((2, 64)).astype(np.float32), Q.Q8_0), Q.Q8_0)
    for name in ("Q4_K", "Q5_K", "Q6_K"):
        raw = random_blocks(rng, Q[name], 6).reshape(3, -1)  # 3 rows of 512 values
        tensors[name.lower() + ".weight"] = (raw, Q[name])
    for name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1"):  # 2 rows of 96 values: 3 blocks each
        tensors[name.lower() + ".weight"] = (
            gguf.quants.quantize(rng.standard_normal((2, 96)).astype(np.float32), Q[name]), Q[name])
    tensors["iq4_nl.weight"] = (random_blocks(rng, Q.IQ4_NL, 6).reshape(2, -1), Q.IQ4_NL)
    for name in KX:  # 2 rows of 512 values
        tensors[name.lower() + ".weight"] = (random_blocks(rng, Q[name], 4).reshape(2, -1), Q[name])
    tensors["mxfp4.weight"] = (random_blocks(rng, Q.MXFP4, 6).reshape(2, -1), Q.MXFP4)
    tensors["tq2_0.weight"] = (rng.integers(0, 256, (1, 66), dtype=np.uint8), Q.TQ2_0)
    tensors["i32.weight"] = (np.arange(8, dtype=np.int32), None)
    for name, (data, raw_dtype) in tensors.items():
        w.add_tensor(name, data, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return meta, tensors


@pytest.mark.parametrize("alignment", [None, 64])
def test_reads_file_written_by_gguf_py(tool, tmp_path, alignment):
    path = tmp_path / "sample.gguf"
    meta, tensors = write_sample(path, alignment)
    out = tmp_path / "dump"
    out.mkdir()
    run_tool(tool, "dump", path, out)
    got = json.loads((out / "meta.json").read_text())
    reader = gguf.GGUFReader(str(path))
    assert got["version"] == 3
    assert got["alignment"] == (alignment or 32)
    assert got["data_offset"] == reader.data_offset

    kv = {k["key"]: k for k in got["kv"]}
    assert set(kv) == {k for k in reader.fields if not k.startswith("GGUF.")}
    assert kv["general.architecture"]["values"] == ["qwen2moe"]
    for key, (_, value) in meta.items():
        values = kv[key]["values"]
        if isinstance(value, list):
            assert kv[key]["type"] == "ARRAY"
            assert values == pytest.approx(value) if not isinstance(value[0], str) else values == value
        elif isinstance(value, str):
            assert values == [value]
        elif key == "test.f32":
            assert values == [np.float32(value)]
        else:
            assert values == [pytest.approx(float(value), rel=1e-15)]
        assert kv[key]["type"] == reader.fields[key].types[0].name

    by_name = {t["name"]: t for t in got["tensors"]}
    assert [t["name"] for t in got["tensors"]] == [t.name for t in reader.tensors]
    for t in reader.tensors:
        mine = by_name[t.name]
        assert mine["type"] == t.tensor_type.name
        assert mine["ne"] == [int(v) for v in t.shape]
        assert mine["offset"] == t.data_offset
        assert mine["nbytes"] == t.n_bytes
        f = out / (t.name + ".f32")
        if t.tensor_type.name not in TYPES:
            assert not f.exists()  # listed, not computed with (TQ2_0, I32)
            continue
        ours = np.fromfile(f, dtype=np.float32)
        theirs = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32).reshape(-1)
        assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32)), t.name


def test_bad_files_one_line(tool, tmp_path):
    path = tmp_path / "sample.gguf"
    write_sample(path)
    data = path.read_bytes()
    (tmp_path / "out").mkdir()
    cases = {
        "truncated": data[: len(data) - 100],
        "header only": data[:40],
        "bad magic": b"GGUX" + data[4:],
        "version 1": data[:4] + (1).to_bytes(4, "little") + data[8:],
    }
    for what, blob in cases.items():
        p = tmp_path / "bad.gguf"
        p.write_bytes(blob)
        r = run_tool(tool, "dump", p, tmp_path / "out", check=False)
        assert r.returncode == 1, what
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(str(p) + ": "), (what, r.stderr)
