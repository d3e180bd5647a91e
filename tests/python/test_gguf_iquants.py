"""The codebook i-quants IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S and IQ1_M
(lib/quant_iq.c, lib/iq_grids.c) against gguf-py's reference dequantiser (gguf.quants,
llama.cpp's own Python package, whose grids are the independent copy of ggml's tables),
through the test driver tests/lib/quant_tool.c:

- random blocks (every byte random but the f16 scale kept finite) dequantise to gguf-py's
  values bit for bit, as do blocks whose scale is zero, negative, the largest f16, the
  smallest subnormal or infinite, with the other bytes all zeros or all ones;
- the f32 dot (fastest level and plain reference) is within the bound of
  tests/lib/test_quant.c of a float64 dot of gguf-py's dequantised rows;
- the grid tables equal gguf-py's decoded grids entry by entry (a table typo would also
  show in the dequantisation, but only for the entries random blocks happen to hit).
"""
import re
import subprocess

import numpy as np
import pytest

import gguf  # noqa: E402  (tests/python/requirements.txt)
from gguf import GGMLQuantizationType as Q  # noqa: E402

from conftest import REPO

TYPES = ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M"]


@pytest.fixture(scope="session")
def tool(build_dir):
    exe = build_dir / "tests" / "lib" / "quant_tool"
    if not exe.exists():
        pytest.fail(f"{exe} not built")
    return exe


def run_tool(tool, *args):
    p = subprocess.run([str(tool), *map(str, args)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"quant_tool {' '.join(map(str, args))} exited {p.returncode}: {p.stderr}"


def set_d(name, blocks, d16):
    """Writes the f16 scale bits d16 (uint16 per block) into each block: at offset 0, or
    for IQ1_M spread over the top nibbles of its four scale words (bytes 48..55)."""
    d16 = np.asarray(d16, dtype=np.uint16)
    if name != "IQ1_M":
        blocks[:, 0:2] = d16.view(np.uint8).reshape(-1, 2)
        return
    sc = blocks[:, 48:56].copy().view(np.uint16)
    for k in range(4):
        sc[:, k] = (sc[:, k] & 0x0FFF) | (((d16 >> (4 * k)) & 0xF) << 12).astype(np.uint16)
    blocks[:, 48:56] = sc.view(np.uint8)


def random_blocks(rng, name, nblocks, scale=2.0):
    _, size = gguf.GGML_QUANT_SIZES[Q[name]]
    b = rng.integers(0, 256, (nblocks, size), dtype=np.uint8)
    set_d(name, b, rng.uniform(-scale, scale, nblocks).astype(np.float16).view(np.uint16))
    return b


def dequant_both(tool, tmp_path, name, raw):
    (tmp_path / "in.bin").write_bytes(raw.tobytes())
    run_tool(tool, "dequant", name, tmp_path / "in.bin", tmp_path / "out.f32")
    ours = np.fromfile(tmp_path / "out.f32", dtype=np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        theirs = gguf.quants.dequantize(raw.reshape(-1), Q[name]).astype(np.float32).reshape(-1)
    return ours, theirs


@pytest.mark.parametrize("name", TYPES)
def test_dequantise_equals_gguf_py(tool, tmp_path, name):
    rng = np.random.default_rng(2000 + int(Q[name]))
    raw = random_blocks(rng, name, 128)
    raw[0] = 0  # all-zero bytes
    ours, theirs = dequant_both(tool, tmp_path, name, raw)
    assert ours.shape == theirs.shape and not np.isnan(theirs).any()
    bad = np.flatnonzero(ours.view(np.uint32) != theirs.view(np.uint32))
    assert bad.size == 0, (f"{name}: {bad.size} values differ, first at {bad[0]}: "
                           f"ours {ours[bad[0]]!r}, gguf-py {theirs[bad[0]]!r}")


@pytest.mark.parametrize("name", TYPES)
def test_extreme_blocks_dequantise_as_gguf_py(tool, tmp_path, name):
    rng = np.random.default_rng(3000 + int(Q[name]))
    specials = np.array([0.0, -0.0, -1.5, 65504.0, -65504.0, 6e-8, np.inf, -np.inf],
                        dtype=np.float16).view(np.uint16)
    raws = []
    for d in specials:
        b = random_blocks(rng, name, 3)
        b[1, :] = 0
        b[2, :] = 0xFF
        set_d(name, b, np.full(3, d, dtype=np.uint16))
        raws.append(b)
    ours, theirs = dequant_both(tool, tmp_path, name, np.concatenate(raws))
    assert np.isinf(theirs).any()
    nan = np.isnan(theirs)
    assert (np.isnan(ours) == nan).all()
    bad = np.flatnonzero(ours.view(np.uint32)[~nan] != theirs.view(np.uint32)[~nan])
    assert bad.size == 0, f"{name}: {bad.size} values differ"


@pytest.mark.parametrize("name", TYPES)
def test_dot_matches_float64_reference(tool, tmp_path, name):
    rng = np.random.default_rng(4000 + int(Q[name]))
    n, rows = 1024, 16
    raw = random_blocks(rng, name, rows * n // 256, scale=0.01)
    x = rng.uniform(-1, 1, n).astype(np.float32)
    (tmp_path / "rows.bin").write_bytes(raw.tobytes())
    (tmp_path / "x.f32").write_bytes(x.tobytes())
    run_tool(tool, "dot", name, tmp_path / "rows.bin", tmp_path / "x.f32", tmp_path / "y.f32")
    got = np.fromfile(tmp_path / "y.f32", dtype=np.float32).reshape(rows, 2)
    w = gguf.quants.dequantize(raw.reshape(-1), Q[name]).astype(np.float64).reshape(rows, n)
    want = w @ x.astype(np.float64)
    bound = 4 * 1.2e-7 * np.sqrt(n) * (np.abs(w) @ np.abs(x.astype(np.float64))) + 1e-6
    for col, what in ((0, "fmoe_quant_dot"), (1, "fmoe_quant_dot_ref")):
        err = np.abs(got[:, col] - want)
        assert (err <= bound).all(), f"{what} {name}: max error {err.max()} > {bound[err.argmax()]}"


GRIDS = {"IQ2_XXS": "fmoe__iq2xxs_grid", "IQ2_XS": "fmoe__iq2xs_grid", "IQ2_S": "fmoe__iq2s_grid",
         "IQ3_XXS": "fmoe__iq3xxs_grid", "IQ3_S": "fmoe__iq3s_grid", "IQ1_S": "fmoe__iq1s_grid"}


@pytest.mark.parametrize("name", list(GRIDS))
def test_grid_tables_equal_gguf_py(name):
    cls = gguf.quants.__dict__[name]
    cls.init_grid()
    theirs = cls.grid.reshape(cls.grid_shape).astype(np.int64)
    # the one copy of the numbers: lib/iq_grids_data.h's initializers (lib/iq_grids.c and
    # the CUDA kernels' device copies are defined from them)
    text = (REPO / "lib" / "iq_grids_data.h").read_text()
    macro = GRIDS[name].replace("fmoe__", "FMOE__").upper() + "_DATA"
    body = re.search(r"#define " + macro + r" \\\s*\{(.*?)\}", text, re.S).group(1)
    words = [int(w, 16) for w in re.findall(r"0x[0-9a-f]+", body)]
    width = theirs.shape[1]
    ours = np.array([[np.int8(np.uint8((w >> (8 * i)) & 0xFF)) for i in range(width)] for w in words])
    assert ours.shape == theirs.shape
    assert (ours == theirs).all()
