"""The `fmoe` command line: help, version, exit codes, demo and inspect.

`fmoe inspect --json` statistics are recomputed here independently from the trace with
h5py (+ hdf5plugin for zstd), following the fMoE paper ("fMoE: Fine-Grained Expert
Offloading for Large Mixture-of-Experts Serving", §2.4): entropy of expert activation
counts per layer, aggregated per request (coarse) or per iteration (fine).
"""
import json
import math

import numpy as np
import pytest

MISSION = ["record", "build-store", "simulate", "serve"]


def test_help_lists_every_command(fmoe):
    out = fmoe("--help").stdout
    for name in MISSION + ["inspect", "trace", "demo"]:
        assert f"\n  {name} " in out, name
    assert "not yet available" not in out  # every command of the list has landed


def test_version(fmoe):
    out = fmoe("--version").stdout
    assert out.startswith("fmoe ")
    assert "cuda:" in out
    assert "\nmpi: " in out


def test_no_arguments_is_usage_error(fmoe):
    p = fmoe(check=False)
    assert p.returncode == 2
    assert "usage: fmoe" in p.stderr


def test_unknown_command_exits_2(fmoe):
    p = fmoe("frobnicate", check=False)
    assert p.returncode == 2
    assert p.stderr.strip() == "fmoe: unknown command 'frobnicate' (see 'fmoe --help')"


@pytest.mark.parametrize("name", ["inspect", "trace", "demo", "simulate", "serve"])
def test_command_help(fmoe, name):
    out = fmoe(name, "--help").stdout
    assert out.startswith(f"usage: fmoe {name}")
    assert "--help" in out
    assert fmoe("help", name).stdout == out


def test_unknown_option_exits_2(fmoe):
    p = fmoe("inspect", "--no-such-option", "x.h5", check=False)
    assert p.returncode == 2
    assert p.stderr.startswith("fmoe inspect: ")
    assert len(p.stderr.strip().splitlines()) == 1


def test_inspect_missing_file_is_one_line(fmoe, tmp_path):
    p = fmoe("inspect", tmp_path / "missing.h5", check=False)
    assert p.returncode == 1
    assert len(p.stderr.strip().splitlines()) == 1
    assert "missing.h5" in p.stderr


def test_inspect_not_hdf5(fmoe, tmp_path):
    bad = tmp_path / "notes.txt"
    bad.write_text("hello\n")
    p = fmoe("inspect", bad, check=False)
    assert p.returncode == 1
    assert "notes.txt" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_plugin_path_holds_the_plugin(fmoe, build_dir):
    out = fmoe("inspect", "--plugin-path").stdout.strip()
    assert out == str(build_dir / "trace")
    assert (build_dir / "trace" / "libh5zstd.so").exists()


@pytest.fixture(scope="module")
def demo_trace(fmoe, tmp_path_factory):
    d = tmp_path_factory.mktemp("demo")
    out = fmoe("demo", "--output-dir", d, "--quiet", "--quick").stdout
    assert "flame-moe-290m.h5" in out
    assert "predictability" in out
    # part 2 (record -> build-store -> simulate -> serve live on the bundled model) is
    # tested in test_demo.py; here: its files and the held-out table, every policy listed
    for f in ("fmoe-tiny.h5", "fmoe-tiny-store.h5", "fmoe-tiny-heldout.h5"):
        assert (d / f).exists(), f
    table = out[out.index("$ fmoe simulate --trace " + str(d / "fmoe-tiny-heldout.h5")):]
    for policy in ("fmoe", "lru", "lfu", "moe-infinity", "mixtral-offload"):
        assert any(line.startswith(policy + " ") for line in table.splitlines()), policy
    return d / "flame-moe-290m.h5"


def entropy_bits(counts):
    total = counts.sum()
    if total == 0:
        return 0.0
    p = counts[counts > 0] / total
    return float(-(p * np.log2(p)).sum())


def test_demo_and_inspect_json_match_independent_analysis(fmoe, demo_trace):
    import h5py
    import hdf5plugin  # noqa: F401  (registers the ecosystem's zstd filter)

    report = json.loads(fmoe("inspect", demo_trace, "--json", "--quiet").stdout)
    with h5py.File(demo_trace, "r") as f:
        experts = f["tokens/experts"][...]
        phase = f["tokens/phase"][...]
        offsets = f["requests/token_offset"][...]
        L = int(f.attrs["num_layers"])
        J = int(f.attrs["num_experts"])
    assert report["num_layers"] == L == 8
    assert report["num_experts"] == J == 64
    assert report["top_k"] == 6
    assert report["requests"] == len(offsets) - 1 == 8
    assert report["tokens"] == experts.shape[0] == 512
    assert report["prefill_tokens"] == int((phase == 0).sum())

    coarse = np.zeros(L)
    fine = np.zeros(L)
    iterations = 0
    for r in range(len(offsets) - 1):
        tok = experts[offsets[r]:offsets[r + 1]]
        ph = phase[offsets[r]:offsets[r + 1]]
        # iterations: the run of prefill tokens, then one per decode token
        its = []
        n_pre = int((ph == 0).sum())
        if n_pre:
            its.append(tok[:n_pre])
        its += [tok[i:i + 1] for i in range(n_pre, len(tok))]
        iterations += len(its)
        for l in range(L):
            coarse[l] += entropy_bits(np.bincount(tok[:, l, :].ravel(), minlength=J))
            for it in its:
                fine[l] += entropy_bits(np.bincount(it[:, l, :].ravel(), minlength=J))
    coarse /= len(offsets) - 1
    fine /= iterations
    assert report["iterations"] == iterations
    for l, layer in enumerate(report["layers"]):
        counts = np.bincount(experts[:, l, :].ravel(), minlength=J)
        assert layer["expert_counts"] == counts.tolist()
        assert layer["top_expert"] == int(np.argmax(counts))
        assert math.isclose(layer["coarse_entropy_bits"], coarse[l], rel_tol=1e-9)
        assert math.isclose(layer["fine_entropy_bits"], fine[l], rel_tol=1e-9)


# ---- bad input: one line on stderr naming the file and what is wrong, exit 1 -------------

def one_line_error(p, cmd):
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert p.stdout == ""
    assert p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith(f"fmoe {cmd}: "), p.stderr


def test_inspect_truncated_trace(fmoe, demo_trace, tmp_path):
    data = demo_trace.read_bytes()
    cut = tmp_path / "cut.h5"
    cut.write_bytes(data[: len(data) // 2])
    p = fmoe("inspect", cut, check=False)
    one_line_error(p, "inspect")
    assert "cut.h5" in p.stderr


def copy_with(h5py, src, dst, edit):
    """Copies a trace with h5py and applies edit(f) to the copy."""
    import hdf5plugin  # noqa: F401
    with h5py.File(src, "r") as fin, h5py.File(dst, "w") as fout:
        for k, v in fin.attrs.items():
            fout.attrs[k] = v
        for name in fin:
            fin.copy(name, fout)
        edit(fout)


def test_inspect_wrong_format_attribute(fmoe, demo_trace, tmp_path):
    import h5py
    bad = tmp_path / "wrongformat.h5"
    copy_with(h5py, demo_trace, bad, lambda f: f.attrs.__setitem__("format", "not-fmoe"))
    p = fmoe("inspect", bad, check=False)
    one_line_error(p, "inspect")
    assert "wrongformat.h5" in p.stderr and "not-fmoe" in p.stderr


def test_inspect_wrong_shape(fmoe, demo_trace, tmp_path):
    import h5py

    def edit(f):
        experts = f["tokens/experts"][...]
        del f["tokens/experts"]
        f["tokens/experts"] = experts[:, :, :5]  # K = 6 in the attributes

    bad = tmp_path / "wrongshape.h5"
    copy_with(h5py, demo_trace, bad, edit)
    p = fmoe("inspect", bad, check=False)
    one_line_error(p, "inspect")
    assert "wrongshape.h5" in p.stderr and "/tokens/experts" in p.stderr


def test_inspect_expert_out_of_range(fmoe, demo_trace, tmp_path):
    import h5py

    def edit(f):
        experts = f["tokens/experts"][...]
        experts[3, 2, 1] = 64  # J = 64
        del f["tokens/experts"]
        f["tokens/experts"] = experts

    bad = tmp_path / "range.h5"
    copy_with(h5py, demo_trace, bad, edit)
    p = fmoe("inspect", bad, check=False)
    one_line_error(p, "inspect")
    assert "range.h5" in p.stderr and "64" in p.stderr


def test_import_unknown_model_type(fmoe, fixtures_dir, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text('{"model_type": "frobnicator", "num_hidden_layers": 2}')
    out = tmp_path / "out.h5"
    p = fmoe("trace", "import", "--model-config", cfg,
             fixtures_dir / "datasets" / "routing_small.jsonl", "-o", out, check=False)
    one_line_error(p, "trace import")
    assert "frobnicator" in p.stderr and "mixtral" in p.stderr and "qwen3_moe" in p.stderr
    assert not out.exists() and not (tmp_path / "out.h5.partial").exists()


@pytest.fixture(scope="module")
def recorded_trace(fmoe, tmp_path_factory):
    """A small trace of real inference with every optional part (hidden, timing)."""
    d = tmp_path_factory.mktemp("rec")
    out = d / "rec.h5"
    prompts = d / "p.txt"
    prompts.write_text("The list type\nA dictionary maps\n")
    fmoe("record", "--dataset", prompts, "--max-new-tokens", "3", "--ignore-eos",
         "--hidden", "--speculative", "1", "-o", out, "-q")
    return out


def test_inspect_shows_optional_parts(fmoe, recorded_trace):
    import h5py
    import hdf5plugin  # noqa: F401
    report = json.loads(fmoe("inspect", recorded_trace, "--json", "--quiet").stdout)
    with h5py.File(recorded_trace, "r") as f:
        assert report["hidden_dim"] == f["tokens/hidden"].shape[2] == f.attrs["hidden_dim"]
        assert report["timing_layers"] == f["timing/layer_s"].shape[1]
        assert f["timing/iteration_s"].shape[0] == report["iterations"]
        assert report["speculative_depth"] == f["tokens/speculative"].shape[2] == 1


def test_inspect_wrong_timing_shape(fmoe, recorded_trace, tmp_path):
    import h5py

    def edit(f):
        it = f["timing/iteration_s"][...]
        del f["timing/iteration_s"]
        f["timing/iteration_s"] = it[:-1]  # one row short of the iterations

    bad = tmp_path / "timing.h5"
    copy_with(h5py, recorded_trace, bad, edit)
    p = fmoe("inspect", bad, check=False)
    one_line_error(p, "inspect")
    assert "timing.h5" in p.stderr and "/timing/iteration_s" in p.stderr
