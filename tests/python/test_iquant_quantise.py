"""fmoe's i-quant quantisers (lib/quant_iq_quantize.c: IQ3_XXS, IQ3_S, IQ2_S) against
llama.cpp's own: the blocks libggml-base's ggml_quantize_chunk wrote for fixed rows
(tests/fixtures/iquants, made by its make_iquants.py), without and with an importance
matrix, must come out of fmoe byte for byte, through the test driver
tests/lib/quant_tool.c.

One documented exception (lib/quant_iq_quantize.c's head comment): ggml's IQ3_S does not
move its index and sign pointers past an all-zero 32-value sub-block, so in such a block
every later sub-block sits one slot early in llama.cpp's bytes. The fixture's last row has
one; the test checks that this shift is the whole difference, and that gguf-py decodes
our block closer to the input than llama.cpp's.
"""
import json
import pathlib
import subprocess

import numpy as np
import pytest

import gguf  # noqa: E402  (tests/python/requirements.txt)
from gguf import GGMLQuantizationType as Q  # noqa: E402

FIX = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "iquants"
SIZES = {"IQ3_XXS": 98, "IQ3_S": 110, "IQ2_S": 82}
# llama.cpp's quantiser requires one (IQ1_M: llama-quantize does)
NEEDS_IMATRIX = {"IQ2_XXS": 66, "IQ2_XS": 74, "IQ1_S": 50, "IQ1_M": 56}


@pytest.fixture(scope="module")
def quantised(build_dir, tmp_path_factory):
    """Our blocks of the fixture's rows, per type, without ("") and with (".imatrix") the
    fixture's importance entries (one per column: repeated for every row)."""
    tool = build_dir / "tests" / "lib" / "quant_tool"
    if not tool.exists():
        pytest.fail(f"{tool} not built")
    out = {}
    d = tmp_path_factory.mktemp("iq")
    rows = np.fromfile(FIX / "input.f32", dtype=np.float32).size // 256
    imat = np.tile(np.fromfile(FIX / "importance.f32", dtype=np.float32), rows)
    imat.tofile(d / "imat.f32")
    for name, size in {**SIZES, **NEEDS_IMATRIX}.items():
        for w in ("", ".imatrix") if name in SIZES else (".imatrix",):
            p = subprocess.run([str(tool), "quant", name, str(FIX / "input.f32"), str(d / name),
                                *([str(d / "imat.f32")] if w else [])],
                               capture_output=True, text=True, timeout=60)
            assert p.returncode == 0, p.stderr
            out[name + w] = np.fromfile(d / name, dtype=np.uint8).reshape(-1, size)
    return out


def theirs(name, w=""):
    size = {**SIZES, **NEEDS_IMATRIX}[name]
    return np.fromfile(FIX / f"{name.lower()}{w}.bin", dtype=np.uint8).reshape(-1, size)


@pytest.mark.parametrize("name,w", [("IQ3_XXS", ""), ("IQ3_XXS", ".imatrix"), ("IQ2_S", ""),
                                    ("IQ2_S", ".imatrix"), ("IQ2_XXS", ".imatrix"),
                                    ("IQ2_XS", ".imatrix"), ("IQ1_S", ".imatrix"),
                                    ("IQ1_M", ".imatrix")])
def test_quantise_equals_llama_cpp(quantised, name, w):
    ours, ref = quantised[name + w], theirs(name, w)
    assert ours.shape == ref.shape == (31, {**SIZES, **NEEDS_IMATRIX}[name])
    bad = np.flatnonzero((ours != ref).any(axis=1))
    assert bad.size == 0, f"{name}{w}: blocks {bad.tolist()} differ from llama.cpp's"


def test_importance_changes_the_blocks(quantised):
    """The matrix is used: most blocks differ from the unweighted ones (llama.cpp's too)."""
    for name in SIZES:
        assert (quantised[name] != quantised[name + ".imatrix"]).any(axis=1).mean() > 0.5


@pytest.mark.parametrize("w", ["", ".imatrix"])
def test_iq3_s_equals_llama_cpp_but_its_zero_sub_block_shift(quantised, w):
    ours, ref = quantised["IQ3_S" + w], theirs("IQ3_S", w)
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


# ---- fmoe quantize: the experts in an i-quant, the rest Q4_K ----------------------------

@pytest.fixture(scope="module")
def tiny_iq_experts(fmoe_bin, tmp_path_factory):
    """fmoe-tiny with --type q4_k --experts-type iq2_s, and its gguf-py dequantisation to
    F32 (written by test_gguf_model's dequantised_copy)."""
    from conftest import run_fmoe
    from test_gguf_model import TINY, dequantised_copy
    d = tmp_path_factory.mktemp("tiny-iq")
    q, deq = d / "q.gguf", d / "deq.gguf"
    p = run_fmoe(fmoe_bin, "quantize", "--type", "q4_k", "--experts-type", "iq2_s", TINY,
                 "-o", q, "--quiet")
    kinds = dequantised_copy(q, deq)
    return q, deq, p, kinds


def test_experts_type_iq2_s_file(fmoe_bin, tiny_iq_experts):
    """The types as asked (gguf-py reads them; fmoe inspect shows them), the fallback of
    the 176-wide down projections (no whole block of 32: BF16, as for every type), and the
    one-line note that llama-quantize wants an importance matrix for IQ2_S."""
    from conftest import run_fmoe
    q, _, p, kinds = tiny_iq_experts
    r = gguf.GGUFReader(str(q))
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert types["blk.0.ffn_gate_exps.weight"] == "IQ2_S"
    assert types["blk.5.ffn_up_exps.weight"] == "IQ2_S"
    assert types["blk.0.ffn_down_exps.weight"] == "BF16"
    assert types["blk.0.attn_q.weight"] == "Q4_K"
    assert {"IQ2_S", "Q4_K"} <= kinds
    notes = [x for x in p.stderr.splitlines() if x]
    assert len(notes) == 1 and "llama-quantize refuses IQ2_S" in notes[0], p.stderr
    info = json.loads(run_fmoe(fmoe_bin, "inspect", q, "--json").stdout)
    assert info["model"]["expert_types"] == {"ffn_gate_exps": "IQ2_S", "ffn_up_exps": "IQ2_S",
                                             "ffn_down_exps": "BF16"}
    assert info["types"]["IQ2_S"]["tensors"] == 12 and info["types"]["IQ2_S"]["supported"]


def test_experts_type_iq2_s_generates_as_its_dequantisation(fmoe_bin, tiny_iq_experts, tmp_path):
    """fmoe generate on the file, f32 activations: the logits of the same file dequantised by
    gguf-py to F32, to float rounding (the bar of test_gguf_model.py), and the same tokens."""
    from test_gguf_iquant_model import generate
    q, deq, _, _ = tiny_iq_experts
    got, lq = generate(fmoe_bin, q, tmp_path, "iq")
    want, lf = generate(fmoe_bin, deq, tmp_path, "deq")
    assert got["generated_ids"] == want["generated_ids"] and len(got["generated_ids"]) == 8
    assert lq.shape == lf.shape and float(np.abs(lq - lf).max()) <= 1e-3


@pytest.mark.parametrize("flag,name,needle", [
    ("--type", "iq2_xxs", "--type IQ2_XXS: written only for the routed experts"),
    ("--experts-type", "iq1_m", "--experts-type IQ1_M needs --imatrix FILE"),
    ("--type", "iq1_s", "--type IQ1_S: written only for the routed experts"),
    ("--experts-type", "iq2_xs", "--experts-type IQ2_XS needs --imatrix FILE")])
def test_imatrix_types_refused_in_one_line(fmoe_bin, tmp_path, flag, name, needle):
    from conftest import run_fmoe
    from test_gguf_model import TINY
    out = tmp_path / "m.gguf"
    args = ["--type", "q4_k"] if flag == "--experts-type" else []
    p = run_fmoe(fmoe_bin, "quantize", *args, flag, name, TINY, "-o", out, check=False)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert needle in lines[0], lines
    assert not out.exists() and not (tmp_path / "m.gguf.partial").exists()


# ---- --imatrix: llama.cpp's importance matrix ------------------------------------------

def write_imatrix(path, entries, meta=True):
    """An importance-matrix GGUF as llama-imatrix writes it: NAME.in_sum2 [n_mat][cols] and
    NAME.counts [n_mat][1], both F32, and the three imatrix.* keys (meta=True)."""
    w = gguf.GGUFWriter(str(path), "imatrix")
    if meta:
        w.add_array("imatrix.datasets", ["test.txt"])
        w.add_uint32("imatrix.chunk_count", 10)
        w.add_uint32("imatrix.chunk_size", 512)
    for name, (sums, counts) in entries.items():
        w.add_tensor(name + ".in_sum2", sums.astype(np.float32))
        w.add_tensor(name + ".counts", counts.astype(np.float32).reshape(-1, 1))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny_imatrix(tmp_path_factory):
    """Entries for fmoe-tiny's expert gate and up projections (8 experts x 256 columns;
    expert 3's count 0: llama-quantize then uses 1s) and its attention query projections
    (Q4_K below: a type whose quantiser here takes none)."""
    rng = np.random.default_rng(9)
    entries = {}
    for layer in range(6):
        for kind in ("gate", "up"):
            counts = rng.integers(1, 400, 8).astype(np.float64) + 0.3  # rounded on load
            counts[3] = 0
            sums = np.exp(rng.standard_normal((8, 256))) * counts[:, None]
            entries[f"blk.{layer}.ffn_{kind}_exps.weight"] = (sums, counts)
        entries[f"blk.{layer}.attn_q.weight"] = (np.ones((1, 256)), np.ones(1))
    d = tmp_path_factory.mktemp("imatrix")
    return write_imatrix(d / "tiny.imatrix.gguf", entries), entries


@pytest.mark.parametrize("qtype", ["iq3_xxs", "iq1_m"])
def test_imatrix_weighs_the_experts_as_llama_quantize(fmoe_bin, build_dir, tiny_imatrix, tmp_path,
                                                      qtype):
    """fmoe quantize --imatrix: each expert's rows are quantised with that expert's entry,
    normalised as llama-quantize normalises it (sums / round(count), 1s for a count of 0):
    the file's blocks equal those quant_tool makes of the checkpoint's rows with the
    entry computed here (quant_tool's blocks are llama.cpp's: the tests above; that the
    entries change the blocks, test_importance_changes_the_blocks). No note on stderr; the
    report counts the tensors. The IQ1_M file also runs in fmoe generate (f32 activations)
    to the logits of its gguf-py dequantisation within 1e-3, with the same tokens."""
    from conftest import run_fmoe
    from test_gguf_model import TINY
    from test_quantize import read_checkpoint
    path, entries = tiny_imatrix
    out = tmp_path / "q.gguf"
    p = run_fmoe(fmoe_bin, "quantize", "--type", "q4_k", "--experts-type", qtype,
                 "--imatrix", path, TINY, "-o", out, "--quiet")
    assert p.stderr.strip() == "", p.stderr
    assert "imatrix    12 tensors weighed by it, 6 quantized without it" in p.stdout, p.stdout
    r = gguf.GGUFReader(str(out))
    t = next(x for x in r.tensors if x.name == "blk.4.ffn_up_exps.weight")
    assert t.tensor_type.name == qtype.upper()
    blocks = np.asarray(t.data).reshape(8, -1)  # [expert][rows · row bytes]
    ck = read_checkpoint(TINY)
    sums, counts = entries["blk.4.ffn_up_exps.weight"]
    tool = build_dir / "tests" / "lib" / "quant_tool"
    for e in (0, 3, 7):
        w = ck[f"model.layers.4.mlp.experts.{e}.up_proj.weight"][0]  # [176][256]
        c = np.float32(np.round(counts[e]))
        imp = (sums[e].astype(np.float32) / c) if c > 0 else np.ones(256, np.float32)
        w.astype(np.float32).tofile(tmp_path / "x.f32")
        np.tile(imp.astype(np.float32), w.shape[0]).tofile(tmp_path / "w.f32")
        subprocess.run([str(tool), "quant", qtype, str(tmp_path / "x.f32"),
                        str(tmp_path / "q.bin"), str(tmp_path / "w.f32")], check=True)
        want = np.fromfile(tmp_path / "q.bin", dtype=np.uint8)
        assert (blocks[e] == want).all(), f"expert {e}"
    if qtype == "iq1_m":  # and the file runs: fmoe generate as its gguf-py dequantisation
        from test_gguf_iquant_model import generate
        from test_gguf_model import dequantised_copy
        assert "IQ1_M" in dequantised_copy(out, tmp_path / "deq.gguf")
        got, lq = generate(fmoe_bin, out, tmp_path, "iq")
        want, lf = generate(fmoe_bin, tmp_path / "deq.gguf", tmp_path, "deq")
        assert got["generated_ids"] == want["generated_ids"]
        assert float(np.abs(lq - lf).max()) <= 1e-3


def test_bad_imatrix_one_line(fmoe_bin, tiny_imatrix, tmp_path):
    from conftest import run_fmoe
    from test_gguf_model import TINY
    _, entries = tiny_imatrix
    small = {"blk.0.ffn_gate_exps.weight": (np.ones((8, 128)), np.ones(8))}
    dat = tmp_path / "old.dat"
    dat.write_bytes(b"\x01\x00\x00\x00" + b"\x00" * 60)
    partial = {k: v for k, v in entries.items() if not k.startswith("blk.0.")}
    cases = [
        (write_imatrix(tmp_path / "small.gguf", small), "has 1024 values; the tensor has 256 "
         "columns x 8 experts"),
        (write_imatrix(tmp_path / "partial.gguf", partial), "no importance for tensor "
         "blk.0.ffn_gate_exps.weight, which is IQ2_XS: its quantizer needs one"),
        (write_imatrix(tmp_path / "nometa.gguf", small, meta=False), "no key imatrix.datasets"),
        (dat, "legacy .dat format is not read"),
    ]
    for path, needle in cases:
        out = tmp_path / "m.gguf"
        p = run_fmoe(fmoe_bin, "quantize", "--type", "q8_0", "--experts-type", "iq2_xs",
                     "--imatrix", path, TINY, "-o", out, check=False)
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 1 and len(lines) == 1 and needle in lines[0], (path, p.stderr)
        assert not out.exists() and not (tmp_path / "m.gguf.partial").exists()
