"""fmoe expert-map store files (docs/design.md §5) read by independent HDF5 readers, and files
written or damaged by h5py read back by fmoe's reader.

tests/expertmap/write_sample_store writes the deterministic store of
tests/expertmap/sample_store.h; the expected values are recomputed here from the same
formulas. Every h5py read runs in a fresh interpreter (h5py reads HDF5_PLUGIN_PATH once).
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent

C, E, L, J, K, H, D = 6, 5, 3, 4, 2, 3, 1
SEED = 2**63 + 5


def expected():
    import numpy as np

    e = np.arange(E)[:, None, None]
    ll = np.arange(L)[None, :, None]
    jj = np.arange(J)[None, None, :]
    return {
        "maps": ((e + 2 * ll + 3 * jj) % 4) / 8,
        "semantic": (np.arange(E)[:, None] - 2 * np.arange(H)[None, :]) / 4,
        "hits": 10 * np.arange(E),
    }


def check_sample(path):
    """Runs inside the subprocess: opens `path` with h5py and checks everything."""
    import h5py
    import numpy as np

    want = expected()
    with h5py.File(path, "r") as f:
        a = f.attrs
        assert a["format"] == "fmoe-store"
        ints = {"version": 1, "capacity": C, "size": E, "num_layers": L, "num_experts": J,
                "top_k": K, "semantic_dim": H, "prefetch_distance": D, "requests_used": 3,
                "requests_held_out": 2, "tokens_used": 77}
        for name, value in ints.items():
            assert np.issubdtype(np.asarray(a[name]).dtype, np.integer), name
            assert int(a[name]) == value, (name, a[name])
        assert int(a["split_seed"]) == SEED and np.asarray(a["split_seed"]).dtype == np.uint64
        assert float(a["split"]) == 0.7
        assert a["model_name"] == "sample-moe"
        assert a["model_fingerprint"] == "0" * 63 + "7"
        assert a["probs_kind"] == "full" and a["semantic_kind"] == "embedding"
        assert a["source_traces"] == "traces/a.h5\nb.h5"
        assert a["fmoe_version"] and a["created"]
        for name, dt, shape in [("maps", np.float32, (E, L, J)),
                                ("semantic", np.float32, (E, H)),
                                ("hits", np.uint32, (E,))]:
            d = f[name]
            assert d.dtype == np.dtype(dt) and d.shape == shape, (name, d.dtype, d.shape)
            assert np.array_equal(d[()], want[name].astype(dt)), name
        assert [s.decode() if isinstance(s, bytes) else s for s in f["sources/path"][()]] == \
            ["traces/a.h5", "b.h5"]
        assert f["sources/dataset"].asstr()[()].tolist() == ["lmsys", "sharegpt \u2713"]
        assert f["sources/num_requests"][()].tolist() == [4, 3]
        assert f["requests/used_source"][()].tolist() == [0, 0, 1]
        assert f["requests/used_id"][()].tolist() == [100, 107, 5]
        assert f["requests/held_out_source"][()].tolist() == [0, 1]
        assert f["requests/held_out_id"][()].tolist() == [114, 6]
        return [int(flt[0]) for flt in (f["maps"].id.get_create_plist().get_filter(i)
                                        for i in range(f["maps"].id.get_create_plist().get_nfilters()))]


def run_py(code, env_mode, plugin_dir=None):
    env = {k: v for k, v in os.environ.items() if k != "HDF5_PLUGIN_PATH"}
    pre = ""
    if env_mode == "plugin":
        env["HDF5_PLUGIN_PATH"] = str(plugin_dir)
    elif env_mode == "hdf5plugin":
        pre = "import hdf5plugin; "
    full = f"import sys, json; sys.path.insert(0, {str(HERE)!r}); {pre}{code}"
    return subprocess.run([sys.executable, "-c", full], env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="session")
def sample_store(build_dir):
    exe = build_dir / "tests" / "expertmap" / "write_sample_store"
    if not exe.exists():
        pytest.fail(f"{exe} not built")

    def write(path, compression="zstd"):
        p = subprocess.run([str(exe), str(path), compression], capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 0, p.stderr
        return path

    def verify(path):
        return subprocess.run([str(exe), "--verify", str(path)], capture_output=True, text=True,
                              timeout=120)
    write.verify = verify
    return write


@pytest.mark.parametrize("env_mode", ["plugin", "hdf5plugin"])
def test_zstd_store_in_h5py(tmp_path, sample_store, plugin_dir, env_mode):
    path = sample_store(tmp_path / "s.h5")
    p = run_py(f"import test_store as t; print(json.dumps(t.check_sample({str(path)!r})))",
               env_mode, plugin_dir)
    assert p.returncode == 0, p.stdout + p.stderr
    assert json.loads(p.stdout.strip().splitlines()[-1])[-1] == 32015  # zstd last


@pytest.mark.parametrize("compression", ["deflate", "none"])
def test_builtin_compression_store_needs_no_plugin(tmp_path, sample_store, compression):
    path = sample_store(tmp_path / f"s-{compression}.h5", compression)
    p = run_py(f"import test_store as t; t.check_sample({str(path)!r})", "bare")
    assert p.returncode == 0, p.stdout + p.stderr


def test_h5dump_reads_store(tmp_path, sample_store, plugin_dir):
    if shutil.which("h5dump") is None:
        pytest.skip("h5dump not installed")
    path = sample_store(tmp_path / "s.h5")
    env = dict(os.environ, HDF5_PLUGIN_PATH=str(plugin_dir))
    p = subprocess.run(["h5dump", "-d", "/hits", str(path)], capture_output=True, text=True,
                       env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "0, 10, 20, 30, 40" in p.stdout


def test_fmoe_reads_store_rewritten_by_h5py(tmp_path, sample_store):
    """h5py copies every object with hdf5plugin's zstd and its own layout; fmoe reads it."""
    src = sample_store(tmp_path / "s.h5", "none")
    dst = tmp_path / "rewritten.h5"
    code = f"""
import h5py, hdf5plugin
with h5py.File({str(src)!r}) as a, h5py.File({str(dst)!r}, "w") as b:
    for k, v in a.attrs.items():
        b.attrs[k] = v
    def copy(name, obj):
        if isinstance(obj, h5py.Dataset):
            kw = dict(compression=hdf5plugin.Zstd(clevel=5)) if obj.dtype.kind != "O" and obj.size else {{}}
            b.create_dataset(name, data=obj[()], dtype=obj.dtype, **kw)
    a.visititems(copy)
"""
    p = run_py(code, "bare")
    assert p.returncode == 0, p.stderr
    v = sample_store.verify(dst)
    assert v.returncode == 0, v.stderr


DAMAGE = [
    ("size > capacity", "f.attrs['size'] = 7", "attribute size = 7, expected 0..6"),
    ("d >= L", "f.attrs['prefetch_distance'] = 3", "prefetch_distance = 3, expected 0..2"),
    ("wrong format", "f.attrs['format'] = 'fmoe-trace'", "this is a trace"),
    ("newer version", "f.attrs['version'] = 2", "version = 2, expected 1"),
    ("map not a probability", "f['maps'][2, 1, 3] = 2.0", "/maps[2][1][3] = 2"),
    ("embedding not finite", "f['semantic'][1, 0] = float('nan')", "/semantic[1][0] = nan"),
    ("maps shape", "del f['maps']; f['maps'] = np.zeros((5, 3, 5), 'f4')",
     "/maps has shape [5,3,5], expected [5,3,4]"),
    ("hits missing", "del f['hits']", "/hits is missing"),
    ("bad source index", "f['requests/used_source'][1] = 9", "/requests/used_source[1] = 9"),
    ("used list short", "del f['requests/used_id']; f['requests/used_id'] = np.zeros(2, 'i8')",
     "/requests/used_id has shape [2], expected [3]"),
]


@pytest.mark.parametrize("what,edit,message", DAMAGE, ids=[d[0] for d in DAMAGE])
def test_damaged_store_refused_with_file_and_dataset(tmp_path, sample_store, what, edit, message):
    path = sample_store(tmp_path / "s.h5", "none")
    p = run_py(f"import h5py, numpy as np\nwith h5py.File({str(path)!r}, 'r+') as f:\n    {edit}",
               "bare")
    assert p.returncode == 0, p.stderr
    v = sample_store.verify(path)
    assert v.returncode == 1
    assert str(path) in v.stderr and message in v.stderr, v.stderr
