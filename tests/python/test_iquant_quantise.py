"""fmoe's i-quant quantisers (lib/quant_iq_quantize.c: IQ3_XXS, IQ3_S, IQ2_S) against
llama.cpp's own: the blocks libggml-base's ggml_quantize_chunk wrote for fixed rows
(tests/fixtures/iquants, made by its make_iquants.py) must come out of fmoe byte for byte,
through the test driver tests/lib/quant_tool.c.

One documented exception (lib/quant_iq_quantize.c's head comment): ggml's IQ3_S does not
move its index and sign pointers past an all-zero 32-value sub-block, so in such a block
every later sub-block sits one slot early in llama.cpp's bytes. The fixture's last row has
one; the test checks that this shift is the whole difference, and that gguf-py decodes
our block closer to the input than llama.cpp's.
"""
import pathlib
import subprocess

import numpy as np
import pytest

import gguf  # noqa: E402  (tests/python/requirements.txt)
from gguf import GGMLQuantizationType as Q  # noqa: E402

FIX = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "iquants"
SIZES = {"IQ3_XXS": 98, "IQ3_S": 110, "IQ2_S": 82}


@pytest.fixture(scope="module")
def quantised(build_dir, tmp_path_factory):
    """Our blocks of the fixture's rows, per type."""
    tool = build_dir / "tests" / "lib" / "quant_tool"
    if not tool.exists():
        pytest.fail(f"{tool} not built")
    out = {}
    d = tmp_path_factory.mktemp("iq")
    for name in SIZES:
        p = subprocess.run([str(tool), "quant", name, str(FIX / "input.f32"), str(d / name)],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        out[name] = np.fromfile(d / name, dtype=np.uint8).reshape(-1, SIZES[name])
    return out


def theirs(name):
    return np.fromfile(FIX / f"{name.lower()}.bin", dtype=np.uint8).reshape(-1, SIZES[name])


@pytest.mark.parametrize("name", ["IQ3_XXS", "IQ2_S"])
def test_quantise_equals_llama_cpp(quantised, name):
    ours, ref = quantised[name], theirs(name)
    assert ours.shape == ref.shape == (31, SIZES[name])
    bad = np.flatnonzero((ours != ref).any(axis=1))
    assert bad.size == 0, f"{name}: blocks {bad.tolist()} differ from llama.cpp's"


def test_iq3_s_equals_llama_cpp_but_its_zero_sub_block_shift(quantised):
    ours, ref = quantised["IQ3_S"], theirs("IQ3_S")
    assert ours.shape == ref.shape == (31, 110)
    bad = np.flatnonzero((ours != ref).any(axis=1))
    assert bad.tolist() == [30], f"blocks {bad.tolist()} differ from llama.cpp's"
    # block 30: its values 32..63 are zero. d, qh (indexed by sub-block in ggml too) and
    # the scales agree; llama.cpp's indices and signs of sub-blocks 2..7 sit at 1..6.
    o, t = ours[30], ref[30]
    assert (o[:2] == t[:2]).all() and (o[66:74] == t[66:74]).all() and (o[106:] == t[106:]).all()
    qs_o, qs_t = o[2:66].reshape(8, 8), t[2:66].reshape(8, 8)
    sg_o, sg_t = o[74:106].reshape(8, 4), t[74:106].reshape(8, 4)
    assert (qs_o[0] == qs_t[0]).all() and (sg_o[0] == sg_t[0]).all()
    assert (qs_o[2:] == qs_t[1:7]).all() and (sg_o[2:] == sg_t[1:7]).all()
    assert (qs_o[1] == 0).all() and (sg_o[1] == 0).all() and (qs_t[7] == 0).all()
    x = np.fromfile(FIX / "input.f32", dtype=np.float32).reshape(-1, 256)[30]
    err_o = np.abs(gguf.quants.dequantize(o, Q.IQ3_S).reshape(-1) - x)
    err_t = np.abs(gguf.quants.dequantize(t, Q.IQ3_S).reshape(-1) - x)
    assert err_o[64:].max() < err_t[64:].max() and err_o.sum() < err_t.sum()


@pytest.mark.parametrize("name", list(SIZES))
def test_zero_row_is_zero_and_rows_decode_near(quantised, name):
    """Independent of llama.cpp: gguf-py decodes the all-zero row (row 21) to zeros and the
    Gaussian rows to within the format's error (relative RMS as llama.cpp's own: 0.21,
    0.17, 0.26 on a million Gaussian values)."""
    x = np.fromfile(FIX / "input.f32", dtype=np.float32).reshape(-1, 256)
    y = gguf.quants.dequantize(quantised[name].reshape(-1), Q[name]).reshape(-1, 256)
    assert (y[21] == 0).all()
    g = slice(0, 12)
    rel = np.sqrt(((y[g] - x[g]) ** 2).sum() / (x[g] ** 2).sum())
    assert rel < {"IQ3_XXS": 0.25, "IQ3_S": 0.2, "IQ2_S": 0.3}[name], rel
