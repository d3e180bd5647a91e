"""fmoe traces read by independent HDF5 readers: h5py (with our libh5zstd.so plugin, or with
PyPI's hdf5plugin) and h5dump.

tests/trace/write_sample writes the deterministic trace described in
tests/trace/sample_trace.h; the expected values are recomputed here from the same formulas,
not copied from fmoe's output.

h5py reads HDF5_PLUGIN_PATH once, when its HDF5 initialises, and hdf5plugin registers its
filters process-wide on import, so every read runs in a fresh Python subprocess with exactly
the environment under test.
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent

# --- the sample, recomputed (see tests/trace/sample_trace.h) -------------------------------
L, J, K, H, S = 3, 8, 2, 4, 2
PROMPT = [3, 1, 4]
OUTPUT = [2, 3, 0]
R = len(PROMPT)
T = sum(PROMPT) + sum(OUTPUT)
CONFIG_JSON = '{"model_type": "sample", "note": "na\u00efve \u2713"}'


def expected():
    import numpy as np

    g = np.arange(T)
    offsets = np.concatenate([[0], np.cumsum(np.array(PROMPT) + np.array(OUTPUT))])
    phase = np.concatenate([[0] * p + [1] * o for p, o in zip(PROMPT, OUTPUT)])
    gl = g[:, None]
    ll = np.arange(L)[None, :]
    experts = np.stack([(gl + 3 * ll + 5 * k) % J for k in range(K)], axis=-1)
    jj = np.arange(J)
    probs = ((g[:, None, None] + 2 * np.arange(L)[None, :, None] + 3 * jj[None, None, :]) % 8) / 16
    semantic = (g[:, None] - 2 * np.arange(H)[None, :]) / 4
    spec = ((g[:, None, None, None] + np.arange(L)[None, :, None, None]
             + 2 * np.arange(S)[None, None, :, None] + jj[None, None, None, :]) % 4) / 8
    return {
        "id": 100 + 7 * np.arange(R),
        "arrival_s": 0.5 * np.arange(R),
        "prompt_tokens": np.array(PROMPT),
        "output_tokens": np.array(OUTPUT),
        "token_offset": offsets,
        "token_id": np.where(g % 5 == 4, -1, 1000 + 3 * g),
        "phase": phase,
        "experts": experts,
        "probs": probs,
        "semantic": semantic,
        "speculative": spec,
    }


def check_sample(path, half):
    """Runs inside the subprocess: opens `path` with h5py and checks everything."""
    import h5py
    import numpy as np

    want = expected()
    gate = np.float16 if half else np.float32
    with h5py.File(path, "r") as f:
        a = f.attrs
        strings = {
            "format": "fmoe-trace",
            "model_name": "sample-moe \u03bc",
            "model_fingerprint": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "dtype": "bf16",
            "dataset": "sample",
            "created": "2024-01-02T03:04:05Z",
            "recorded_on": "test:sample",
            "probs_kind": "full",
            "semantic_kind": "projection",
            "activations": "q8",
        }
        for name, value in strings.items():
            assert isinstance(a[name], str), (name, type(a[name]))
            assert a[name] == value, (name, a[name])
        assert isinstance(a["fmoe_version"], str) and a["fmoe_version"]
        ints = {"version": 1, "num_layers": L, "num_experts": J, "top_k": K, "hidden_size": 16,
                "shared_experts": 1, "expert_bytes": 5000000000, "semantic_dim": H,
                "speculative_depth": S}
        for name, value in ints.items():
            assert np.issubdtype(np.asarray(a[name]).dtype, np.integer), name
            assert int(a[name]) == value, (name, a[name])
        assert np.asarray(a["version"]).dtype == np.int32
        assert np.asarray(a["expert_bytes"]).dtype == np.int64

        config = f["model/config_json"].asstr()[()]
        assert config == CONFIG_JSON
        assert json.loads(config)["model_type"] == "sample"

        dtypes = {
            "requests/id": np.int64, "requests/arrival_s": np.float64,
            "requests/prompt_tokens": np.int32, "requests/output_tokens": np.int32,
            "requests/token_offset": np.int64, "tokens/token_id": np.int32,
            "tokens/phase": np.uint8, "tokens/experts": np.uint16, "tokens/probs": gate,
            "tokens/semantic": np.float32, "tokens/speculative": gate,
        }
        shapes = {
            "requests/id": (R,), "requests/arrival_s": (R,), "requests/prompt_tokens": (R,),
            "requests/output_tokens": (R,), "requests/token_offset": (R + 1,),
            "tokens/token_id": (T,), "tokens/phase": (T,), "tokens/experts": (T, L, K),
            "tokens/probs": (T, L, J), "tokens/semantic": (T, H),
            "tokens/speculative": (T, L, S, J),
        }
        for name, dt in dtypes.items():
            d = f[name]
            assert d.dtype == np.dtype(dt), (name, d.dtype)
            assert d.shape == shapes[name], (name, d.shape)
            assert d.chunks is not None and d.maxshape[0] is None, name  # extendible
            got = d[()]
            ref = want[name.split("/")[1]]
            # Every sample value is exact in float16, so equality is exact for all types.
            assert np.array_equal(got, np.asarray(ref).astype(dt)), (name, got, ref)
        assert f["tokens/probs"].dtype.itemsize == (2 if half else 4)
        # The filter pipeline of each dataset, as (filter id, cd_values) pairs.
        pipelines = {}
        for name in dtypes:
            dcpl = f[name].id.get_create_plist()
            pipelines[name] = [[int(flt[0]), [int(v) for v in flt[2]]]
                               for flt in (dcpl.get_filter(i) for i in range(dcpl.get_nfilters()))]
        return pipelines


def run_check(path, half, env_mode, plugin_dir=None):
    """Checks `path` in a fresh interpreter. env_mode: 'plugin' (HDF5_PLUGIN_PATH = our
    plugin), 'hdf5plugin' (import hdf5plugin, no plugin path) or 'bare' (neither)."""
    env = {k: v for k, v in os.environ.items() if k != "HDF5_PLUGIN_PATH"}
    pre = ""
    if env_mode == "plugin":
        env["HDF5_PLUGIN_PATH"] = str(plugin_dir)
    elif env_mode == "hdf5plugin":
        pre = "import hdf5plugin; "
    code = (f"import sys, json; sys.path.insert(0, {str(HERE)!r}); {pre}"
            f"import test_trace_h5py as t; "
            f"print(json.dumps(t.check_sample({str(path)!r}, {bool(half)!r})))")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="session")
def write_sample(build_dir):
    exe = build_dir / "tests" / "trace" / "write_sample"
    if not exe.exists():
        pytest.fail(f"{exe} not built")

    def write(path, compression="zstd", probs="f16"):
        p = subprocess.run([str(exe), str(path), compression, probs], capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert path.exists()
        return path
    return write


def test_plugin_links_no_hdf5(plugin_dir):
    """libh5zstd.so must not drag a second HDF5 into h5py's process."""
    if shutil.which("ldd") is None:
        pytest.skip("ldd not available")
    out = subprocess.run(["ldd", str(plugin_dir / "libh5zstd.so")], capture_output=True,
                         text=True, check=True).stdout
    assert "libhdf5" not in out, out
    assert "libzstd" in out, out


@pytest.mark.parametrize("probs", ["f16", "f32"])
@pytest.mark.parametrize("env_mode", ["plugin", "hdf5plugin"])
def test_zstd_trace_in_h5py(tmp_path, write_sample, plugin_dir, env_mode, probs):
    path = write_sample(tmp_path / f"sample-{probs}.h5", "zstd", probs)
    p = run_check(path, probs == "f16", env_mode, plugin_dir)
    assert p.returncode == 0, p.stdout + p.stderr
    pipelines = json.loads(p.stdout.strip().splitlines()[-1])
    for name, pipeline in pipelines.items():
        # shuffle (2) where elements are wider than a byte, then zstd (32015) at level 3.
        assert pipeline[-1] == [32015, [3]], (name, pipeline)


def test_zstd_trace_needs_a_filter(tmp_path, write_sample):
    """Negative control: the zstd file really uses filter 32015, so h5py with neither our
    plugin nor hdf5plugin cannot read the compressed datasets."""
    path = write_sample(tmp_path / "sample.h5", "zstd", "f16")
    p = run_check(path, True, "bare")
    assert p.returncode != 0
    assert "OSError" in p.stderr, p.stderr


@pytest.mark.parametrize("compression", ["deflate", "none"])
def test_builtin_compressions_need_no_plugin(tmp_path, write_sample, compression):
    path = write_sample(tmp_path / f"sample-{compression}.h5", compression, "f16")
    p = run_check(path, True, "bare")
    assert p.returncode == 0, p.stdout + p.stderr


def test_h5dump_reads_zstd_trace(tmp_path, write_sample, plugin_dir):
    h5dump = shutil.which("h5dump")
    if h5dump is None:
        pytest.skip("h5dump not installed")
    path = write_sample(tmp_path / "sample.h5", "zstd", "f32")
    env = dict(os.environ, HDF5_PLUGIN_PATH=str(plugin_dir))
    p = subprocess.run([h5dump, "-d", "/tokens/experts", "-d", "/tokens/probs", str(path)],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "DATA {" in p.stdout
    want = expected()
    # h5dump prints the first token's [L][K] experts as "(0,l,0): e0, e1" rows.
    first = want["experts"][0]
    for l in range(L):
        assert f"(0,{l},0): {first[l][0]}, {first[l][1]}" in p.stdout, p.stdout[:2000]
    assert "0.0625" in p.stdout  # 1/16, one of the sample's probabilities

    # Without the plugin, h5dump cannot decode the chunks (the data really is zstd).
    env.pop("HDF5_PLUGIN_PATH")
    q = subprocess.run([h5dump, "-d", "/tokens/experts", str(path)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert f"(0,0,0): {first[0][0]}, {first[0][1]}" not in q.stdout


REWRITE = r"""
import sys
import h5py
import hdf5plugin
import numpy as np

src, dst, chunk_rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
with h5py.File(src, "r") as fi, h5py.File(dst, "w") as fo:
    for k, v in fi.attrs.items():
        fo.attrs[k] = v
    fo.create_dataset("model/config_json", data=fi["model/config_json"].asstr()[()],
                      dtype=h5py.string_dtype())
    for group in ("requests", "tokens"):
        for name, d in fi[group].items():
            data = d[()]
            fo.create_dataset(f"{group}/{name}", data=data,
                              chunks=(min(chunk_rows, max(len(data), 1)),) + data.shape[1:],
                              maxshape=(None,) + data.shape[1:],
                              **hdf5plugin.Zstd(clevel=7))
"""


@pytest.mark.parametrize("probs", ["f16", "f32"])
def test_fmoe_reads_hdf5plugin_zstd(tmp_path, build_dir, write_sample, probs):
    """A trace rewritten by h5py with PyPI hdf5plugin's zstd filter (its frames, its
    chunking) reads back in fmoe's own reader as exactly the sample."""
    src = write_sample(tmp_path / "sample.h5", "none", probs)
    dst = tmp_path / "rewritten.h5"
    env = {k: v for k, v in os.environ.items() if k != "HDF5_PLUGIN_PATH"}
    p = subprocess.run([sys.executable, "-c", REWRITE, str(src), str(dst), "4"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    exe = build_dir / "tests" / "trace" / "write_sample"
    v = subprocess.run([str(exe), "--verify", str(dst), probs], capture_output=True,
                       text=True, timeout=120)
    assert v.returncode == 0, v.stderr

    # The rewrite really is hdf5plugin's zstd: our reader sees filter 32015 chunks.
    check = ("import h5py, sys; d = h5py.File(sys.argv[1])['tokens/probs'];"
             "p = d.id.get_create_plist();"
             "print([p.get_filter(i)[0] for i in range(p.get_nfilters())])")
    q = subprocess.run([sys.executable, "-c", check, str(dst)], env=env, capture_output=True,
                       text=True, timeout=120)
    assert "32015" in q.stdout, q.stdout + q.stderr
