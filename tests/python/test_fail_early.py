"""A command whose output cannot be written says so before its work, not after it, and
a damaged input is refused, not turned into an output:

- `simulate --csv/--plot` into a folder that does not exist: exit 1, one line, before the
  sweep (nothing on stdout, where the sweep's table goes);
- `train-predictor -o /missing/p.h5`: exit 1, one line, before the training (no report);
- `calibrate -o /dev/full`: exit 2 like every other command given an output that cannot be
  a file, before measuring;
- `build-store` on a trace whose /tokens/experts holds an id >= the expert count, or one
  expert twice in a token's top-k: exit 1, one line naming the dataset, no store.
"""
import pathlib
import shutil
import subprocess

import pytest

from conftest import REPO

h5py = pytest.importorskip("h5py")
import hdf5plugin  # noqa: F401,E402

FLAME = [REPO / "datasets" / "samples" / "flame-moe-290m" / f"layer{i:02d}.csv"
         for i in range(2, 10)]
TINY = REPO / "datasets" / "fmoe-tiny"
PROMPTS = REPO / "datasets" / "samples" / "prompts_100.txt"


def run(fmoe_bin, *args):
    return subprocess.run([str(fmoe_bin), *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def one_line(p, code, *fragments):
    lines = p.stderr.strip().splitlines()
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    assert len(lines) == 1, p.stderr
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    assert p.stdout == "", p.stdout


@pytest.fixture(scope="module")
def flame(fmoe_bin, tmp_path_factory):
    out = tmp_path_factory.mktemp("flame") / "flame.h5"
    p = run(fmoe_bin, "trace", "import", "--format", "dense-csv", "--layers", 8, "--experts",
            64, "--top-k", 6, "--expert-bytes", 1000000, "--tokens-per-request", 64, *FLAME,
            "-o", out, "--quiet")
    assert p.returncode == 0, p.stderr
    return out


def test_simulate_output_folder_checked_before_the_sweep(fmoe_bin, flame, tmp_path):
    """The decision log is written during the sweep: before, a run whose --csv folder was
    missing replayed the whole trace, left a complete decision log behind, then failed."""
    missing = tmp_path / "no" / "such"
    for opt, name in (("--csv", "r.csv"), ("--plot", "r.svg")):
        log = tmp_path / f"decisions{opt}.jsonl"
        p = run(fmoe_bin, "simulate", "--trace", flame, "--policy", "lru", "--cache-experts", 8,
                "--decision-log", log, opt, missing / name)
        one_line(p, 1, str(missing / name), "No such file or directory")
        assert not log.exists() and not pathlib.Path(f"{log}.partial").exists()
    assert not missing.parent.exists()


def test_train_predictor_output_folder_checked_before_training(fmoe_bin, tmp_path):
    trace = tmp_path / "hidden.h5"
    p = run(fmoe_bin, "record", "--model", TINY, "--dataset", PROMPTS, "--max-requests", 6,
            "--max-new-tokens", 4, "--hidden", "--threads", 1, "-o", trace)
    assert p.returncode == 0, p.stderr
    out = tmp_path / "missing" / "p.h5"
    p = run(fmoe_bin, "train-predictor", "--kind", "promoe", "--trace", trace, "-o", out,
            "--epochs", 2)
    one_line(p, 1, str(out), "cannot create", "No such file or directory")
    # checked before anything is read (so before the training): with a trace that does not
    # exist either, the output's folder is what is reported
    p = run(fmoe_bin, "train-predictor", "--kind", "promoe", "--trace", tmp_path / "none.h5",
            "-o", out)
    one_line(p, 1, str(out), "cannot create", "No such file or directory")


def test_calibrate_output_that_cannot_be_a_file_is_a_usage_error(fmoe_bin):
    p = run(fmoe_bin, "calibrate", "-o", "/dev/full", "--quick")
    one_line(p, 2, "/dev/full", "not a regular file")


@pytest.mark.parametrize("damage", ["id-past-the-experts", "repeated-expert"])
def test_build_store_refuses_bad_expert_ids(fmoe_bin, flame, tmp_path, damage):
    bad = tmp_path / "bad.h5"
    shutil.copy(flame, bad)
    with h5py.File(bad, "r+") as f:
        e = f["tokens/experts"]
        row = e[3]
        if damage == "id-past-the-experts":
            row[1][2] = f.attrs["num_experts"]
        else:
            row[1][2] = row[1][0]
        e[3] = row
    out = tmp_path / "store.h5"
    p = run(fmoe_bin, "build-store", "--trace", bad, "-o", out, "--quiet")
    one_line(p, 1, "bad.h5", "/tokens/experts", "token 3 layer 1")
    assert not out.exists() and not pathlib.Path(f"{out}.partial").exists()
