"""tests/bench/bench_types_vs_llama.py without llama.cpp: its command line (one-line errors,
exit status 2), the type list, the bits per weight it reads from a GGUF file (against the
block sizes ggml defines, through a file gguf-py writes), and its table (ratios and
medians against numbers worked out here). The llama.cpp runs themselves are the lead's
(docs/quantization.md, "Speed")."""
import pathlib
import subprocess
import sys

import pytest

gguf = pytest.importorskip("gguf")
np = pytest.importorskip("numpy")

REPO = pathlib.Path(__file__).resolve().parents[2]
BENCH = REPO / "tests" / "bench" / "bench_types_vs_llama.py"
sys.path.insert(0, str(BENCH.parent))
import bench_types_vs_llama as btl  # noqa: E402


def bench(*args):
    return subprocess.run([sys.executable, str(BENCH), *map(str, args)], capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("args,what", [
    ([], "--llama-cpp"),
    (["--llama-cpp", "/tmp", "--types", "Q4_0,Q9_K"], "Q9_K: unknown type"),
    (["--llama-cpp", "/tmp", "--types", "mix:Q4_0"], "mix:Q4_0: unknown mix"),
    (["--llama-cpp", "/tmp", "--types", "q4_0,Q4_0"], "Q4_0 given twice"),
    (["--llama-cpp", "/tmp", "--threads", "1,0"], "--threads"),
    (["--llama-cpp", "/tmp", "--rounds", "0"], "--rounds"),
    (["--llama-cpp", "/nonexistent", "--build", "/nonexistent"], "not built"),
])
def test_bad_arguments(args, what, capsys):
    """In-process (the parser's exit), one line on stderr naming what is wrong."""
    with pytest.raises(SystemExit) as e:
        btl.parse_args(args)
    assert e.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and what in lines[0], lines


def test_command_line_exit_status(tmp_path):
    """The script itself: exit status 2 and the one line when llama.cpp's tools are not in
    the folder given."""
    build = tmp_path / "build"
    (build / "tests" / "model").mkdir(parents=True)
    (build / "tests" / "model" / "forward_driver").write_text("")
    p = bench("--llama-cpp", tmp_path, "--build", build)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "no llama-bench and llama-quantize" in lines[0], p.stderr


def test_type_list():
    assert btl.parse_types("q4_0, mix:q4_k_m ,MXFP4") == ["Q4_0", "mix:Q4_K_M", "MXFP4"]
    default = btl.parse_types(btl.DEFAULT_TYPES)
    assert len(default) == 22 and default[-2:] == ["mix:Q4_K_M", "mix:Q2_K"]
    assert btl.parse_threads("1,2") == [1, 2]


def test_wrong_type_file_is_not_timed():
    """A pure type's file mostly of another type is refused, not timed under the wrong name
    (llama-quantize's file type IQ2_S writes IQ2_XS tensors: the IQ2_S row once timed
    such a file); a file of the type, a mix and MXFP4's MoE file are accepted."""
    iq2xs = {"bytes": 1000, "bytes_by_type": {"IQ2_XS": 990, "F32": 10}}
    why = btl.wrong_type("IQ2_S", "m-IQ2_S.gguf", iq2xs)
    assert why and "only 0%" in why and "IQ2_XS" in why and "m-IQ2_S.gguf" in why
    assert btl.wrong_type("IQ2_XS", "m.gguf", iq2xs) is None
    assert btl.wrong_type("Q4_K", "m.gguf", {"bytes": 100, "bytes_by_type": {"Q4_K": 89, "Q6_K": 11}})
    assert btl.wrong_type("Q4_K", "m.gguf", {"bytes": 100, "bytes_by_type": {"Q4_K": 90, "F32": 10}}) is None
    assert btl.wrong_type("mix:Q4_K_M", "m.gguf", {"bytes": 100, "bytes_by_type": {"Q6_K": 100}}) is None
    assert btl.wrong_type("MXFP4", "m.gguf", {"bytes": 100, "bytes_by_type": {"Q8_0": 60, "MXFP4": 40}}) is None


def test_bits_per_weight(tmp_path):
    """Q8_0 is 34 bytes a 32-value block and Q4_K 144 a 256-value one (ggml-common.h), F32 4
    bytes a value: the file's figure is their weighted mean."""
    path = tmp_path / "t.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    q8 = gguf.quants.quantize(np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32),
                              gguf.GGMLQuantizationType.Q8_0)
    # two Q4_K blocks of arbitrary bytes (gguf-py's Q4_K has no quantiser; the size is
    # what matters)
    q4k = np.random.default_rng(1).integers(0, 256, (2, 144), dtype=np.uint8)
    w.add_tensor("a", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("b", q4k, raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    w.add_tensor("n", np.ones(32, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    s = btl.file_summary(path)
    nbytes = 8 * 34 + 2 * 144 + 32 * 4
    assert s["bytes"] == nbytes and s["params"] == 256 + 512 + 32
    assert s["bpw"] == pytest.approx(8 * nbytes / 800)
    assert s["bytes_by_type"] == {"Q8_0": 272, "Q4_K": 288, "F32": 128}


def test_flat_imatrix(tmp_path):
    """The legacy .dat layout llama.cpp's common/imatrix-loader.cpp reads, parsed back here."""
    import struct
    src = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(src), "llama")
    w.add_tensor("blk.0.ffn_up_exps.weight", np.zeros((4, 8, 64), dtype=np.float32))
    w.add_tensor("blk.0.attn_q.weight", np.zeros((8, 64), dtype=np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.zeros(64, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    out = tmp_path / "flat.dat"
    btl.write_flat_imatrix(src, out)
    b = out.read_bytes()
    (n,), pos, got = struct.unpack_from("<i", b), 4, {}
    for _ in range(n):
        (ln,) = struct.unpack_from("<i", b, pos)
        name = b[pos + 4:pos + 4 + ln].decode()
        ncall, nval = struct.unpack_from("<ii", b, pos + 4 + ln)
        vals = struct.unpack_from(f"<{nval}f", b, pos + 12 + ln)
        got[name] = (ncall, nval, set(vals))
        pos += 12 + ln + 4 * nval
    assert pos == len(b)
    # one value per input column, per expert for the 3-D expert tensors
    assert got == {"blk.0.ffn_up_exps.weight": (1, 64 * 4, {1.0}),
                   "blk.0.attn_q.weight": (1, 64, {1.0})}


def test_table():
    runs = {
        "Q4_0": {"bpw": 4.5, "runs": {1: {"fmoe": [{"prefill": 100.0, "decode": 10.0},
                                                   {"prefill": 120.0, "decode": 9.0}],
                                          "llama.cpp": [{"prefill": 200.0, "decode": 8.0}]},
                                      2: {"fmoe": [{"prefill": 150.0, "decode": 30.0}],
                                          "llama.cpp": [{"prefill": 100.0, "decode": 20.0}]}}},
        "Q8_0": {"bpw": 8.5, "runs": {1: {"fmoe": [{"prefill": 50.0, "decode": 5.0}],
                                          "llama.cpp": []}, 2: {}}},
    }
    t = btl.table(runs, [1, 2]).splitlines()
    assert t[2] == "| Q4_0 | 4.50 | 1 | 10.0 | 8.0 | 1.25 | 120.0 | 200.0 | 0.60 |"
    assert t[3] == "| Q4_0 | 4.50 | 2 | 30.0 | 20.0 | 1.50 | 150.0 | 100.0 | 1.50 |"
    assert t[4] == "| Q8_0 | 8.50 | 1 | 5.0 | - | - | 50.0 | - | - |"
    assert t[5] == "| Q8_0 | 8.50 | 2 | - | - | - | - | - | - |"
    m = btl.medians(runs, [1, 2])
    assert m[1] == (1.25, 0.6) and m[2] == (1.5, 1.5)
