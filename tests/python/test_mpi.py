"""fmoe under mpirun (docs/scaling-out.md): `mpirun --oversubscribe -n 3` on this machine.

- A sweep over 3 ranks (one thread each, so all three work) prints the single-process
  result, cell for cell, as JSON and as CSV, with several traces and presets too.
- A rank killed mid-sweep (FMOE_FAULT_RANK_KILL=2:2: rank 2 kills itself as its second
  cell arrives, so rank 0 holds that cell as rank 2's) is declared dead after
  --rank-timeout; rank 0 reports its cells missing and writes no result; --resume (over 3
  ranks again) completes the sweep to the single-process result. The grid is the FLAME-MoE
  sample's, about 100 cells and a few seconds of work, so that rank 2 gets two cells
  however late it starts on a loaded machine.
- `mpirun -n 3 fmoe record` writes OUT.rank-{0,1,2}.h5, rank r every 3rd request; merged,
  they equal a single-process greedy recording of the same requests dataset for dataset
  (the measured /timing aside), and build-store on the shards equals build-store on the
  merged trace.

Skipped when mpirun is missing or fmoe was built without MPI (it then refuses to run
under mpirun, saying so). As root, Open MPI needs OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM).
"""
import json
import os
import pathlib
import shutil
import subprocess

import numpy as np
import pytest

from conftest import run_fmoe

h5py = pytest.importorskip("h5py")
import hdf5plugin  # noqa: F401,E402

REPO = pathlib.Path(__file__).resolve().parents[2]
TINY = REPO / "datasets" / "fmoe-tiny"
PROMPTS = REPO / "datasets" / "samples" / "prompts_100.txt"
GRID = ["--policy", "lru,lfu,belady,fmoe,moe-infinity", "--cache-experts", "2,4,8,16",
        "--prefetch-distance", "1,2", "--quiet"]


def mpi_env():
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    if "ASAN_OPTIONS" in env:  # the ASan build: Open MPI's own leaks suppressed (see the file)
        env["ASAN_OPTIONS"] += ":fast_unwind_on_malloc=0"
        supp = f"suppressions={pathlib.Path(__file__).parent / 'lsan-openmpi.supp'}"
        env["LSAN_OPTIONS"] = ":".join(x for x in (env.get("LSAN_OPTIONS"), supp) if x)
    return env


def mpirun(fmoe_bin, *args, n=3, extra=(), env=None, check=True):
    env = env or mpi_env()
    forward = [a for v in ("ASAN_OPTIONS", "LSAN_OPTIONS", "FMOE_FAULT_RANK_KILL") if v in env
               for a in ("-x", v)]
    cmd = ["mpirun", "--oversubscribe", *forward, *extra, "-n", str(n), str(fmoe_bin),
           *map(str, args)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p


@pytest.fixture(scope="module")
def mpi(fmoe_bin, tmp_path_factory):
    if not shutil.which("mpirun"):
        pytest.skip("mpirun is not installed (tests/install-deps.sh installs openmpi-bin)")
    if "mpi: not compiled" in run_fmoe(fmoe_bin, "version").stdout:
        pytest.skip("fmoe was built without MPI (meson -Dmpi=enabled with libopenmpi-dev)")
    d = tmp_path_factory.mktemp("mpi")
    lines = PROMPTS.read_text().splitlines()
    (d / "p12.txt").write_text("\n".join(lines[:12]) + "\n")
    (d / "q6.txt").write_text("\n".join(lines[40:46]) + "\n")
    csvs = [REPO / "datasets/samples/flame-moe-290m" / f"layer0{i}.csv" for i in range(2, 10)]
    run_fmoe(fmoe_bin, "trace", "import", "--format", "dense-csv", "--layers", "8", "--experts",
             "64", "--top-k", "6", "--tokens-per-request", "64", "--expert-bytes", "6291456",
             *csvs, "-o", d / "flame.h5", "--quiet")
    for name in ("p12", "q6"):
        run_fmoe(fmoe_bin, "record", "--model", TINY, "--dataset", d / f"{name}.txt",
                 "--max-new-tokens", "6", "--threads", "1", "--quiet", "-o", d / f"{name}.h5")
    p = mpirun(fmoe_bin, "simulate", "--trace", d / "q6.h5", "--cache-experts", "2", "--quiet",
               n=2, check=False)
    if "built without MPI" in p.stderr:
        pytest.skip("fmoe was built without MPI (meson -Dmpi=enabled with libopenmpi-dev)")
    assert p.returncode == 0, p.stderr
    return d


def test_sweep_over_ranks_equals_one_process(fmoe, fmoe_bin, mpi):
    t = mpi / "p12.h5"
    one = fmoe("simulate", "--trace", t, *GRID, "--json").stdout
    ranks = mpirun(fmoe_bin, "simulate", "--trace", t, *GRID, "--json", "--threads", "1").stdout
    assert len(json.loads(one)["results"]) >= 25
    assert ranks == one
    csv1 = fmoe("simulate", "--trace", t, *GRID, "--csv", "-").stdout
    csv3 = mpirun(fmoe_bin, "simulate", "--trace", t, *GRID, "--csv", "-", "--threads",
                  "1").stdout
    assert csv3 == csv1
    many = ["--trace", t, "--trace", mpi / "q6.h5", "--hardware", "rtx3090-pcie4,h100-pcie5"]
    assert (mpirun(fmoe_bin, "simulate", *many, *GRID, "--json", "--threads", "1").stdout ==
            fmoe("simulate", *many, *GRID, "--json").stdout)


FLAME_GRID = ["--policy", "lru,belady,oracle,moe-infinity,fmoe,fmoe-lru",
              "--cache-experts", "8,16,32,64,96,128,192", "--prefetch-distance", "1,2,3",
              "--quiet"]


def test_dead_rank_cells_missing_then_resumed(fmoe, fmoe_bin, mpi, tmp_path):
    t = mpi / "flame.h5"
    GRID = FLAME_GRID
    one = fmoe("simulate", "--trace", t, *GRID, "--json").stdout
    n = len(json.loads(one)["results"])
    assert n >= 90
    out = tmp_path / "s.jsonl"
    env = dict(mpi_env(), FMOE_FAULT_RANK_KILL="2:2")
    p = mpirun(fmoe_bin, "simulate", "--trace", t, *GRID, "--json", "--threads", "1",
               "--sweep-out", out, "--rank-timeout", "2",
               extra=["--enable-recovery"], env=env, check=False)
    assert p.stdout == ""  # no half result
    assert "cells missing: rank 2 stopped answering" in p.stderr, p.stderr
    missing = int(p.stderr.split(" of ")[0].split()[-1])
    assert missing >= 1
    done = len(out.read_text().splitlines()) - 1
    assert done == n - missing
    p = mpirun(fmoe_bin, "simulate", "--trace", t, *GRID, "--json", "--threads", "1",
               "--sweep-out", out, "--resume")
    assert p.stdout == one
    assert len(out.read_text().splitlines()) == 1 + n


def datasets(path):
    out = {}
    with h5py.File(path) as f:
        f.visititems(lambda k, o: out.__setitem__(k, o[()]) if isinstance(o, h5py.Dataset)
                     else None)
    return out


def test_record_shards_merge_to_one_recording(fmoe, fmoe_bin, mpi, tmp_path):
    args = ["record", "--model", TINY, "--dataset", mpi / "p12.txt", "--max-new-tokens", "5",
            "--temperature", "0", "--speculative", "1", "--threads", "1", "--quiet"]
    fmoe(*args, "-o", tmp_path / "one.h5")
    mpirun(fmoe_bin, *args, "-o", tmp_path / "run.h5")
    shards = [tmp_path / f"run.rank-{r}.h5" for r in range(3)]
    for r, s in enumerate(shards):
        with h5py.File(s) as f:
            assert list(f["requests/id"][()]) == list(range(r, 12, 3))
    fmoe("trace", "merge", *shards, "-o", tmp_path / "merged.h5")
    a, b = datasets(tmp_path / "one.h5"), datasets(tmp_path / "merged.h5")
    assert sorted(a) == sorted(b)
    for k in a:
        if k.startswith("timing/"):
            assert a[k].shape == b[k].shape, k  # measured: the same rows, other values
            continue
        if isinstance(a[k], np.ndarray):
            assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k
    # build-store on the shards = build-store on the merged trace
    fmoe("build-store", *sum((["--trace", s] for s in shards), []), "-o", tmp_path / "s3.h5",
         "--quiet")
    fmoe("build-store", "--trace", tmp_path / "merged.h5", "-o", tmp_path / "s1.h5", "--quiet")
    s3, s1 = datasets(tmp_path / "s3.h5"), datasets(tmp_path / "s1.h5")
    # the entries; the source lists name the files each was built from
    entries = [k for k in s1 if not k.startswith(("requests/", "sources/"))]
    assert "maps" in entries
    for k in entries:
        assert np.array_equal(s1[k], s3[k]), k


def test_record_ranks_take_the_listed_gpus_round_robin(fmoe_bin, mpi, tmp_path):
    # Each rank narrows CUDA_VISIBLE_DEVICES to entry (local rank) mod count before any CUDA
    # call; the run goes on with the CPU backend here, which has no device to use.
    env = dict(mpi_env(), CUDA_VISIBLE_DEVICES="5,7")
    p = mpirun(fmoe_bin, "record", "--model", TINY, "--dataset", mpi / "q6.txt",
               "--max-new-tokens", "1", "--threads", "1", "--backend", "cpu",
               "-o", tmp_path / "g.h5", extra=("-x", "CUDA_VISIBLE_DEVICES"), env=env)
    picks = sorted(line.split("rank ", 1)[1] for line in p.stderr.splitlines()
                   if "CUDA_VISIBLE_DEVICES=" in line)
    assert picks == ["0 of 3: CUDA_VISIBLE_DEVICES=5", "1 of 3: CUDA_VISIBLE_DEVICES=7",
                     "2 of 3: CUDA_VISIBLE_DEVICES=5"], p.stderr
