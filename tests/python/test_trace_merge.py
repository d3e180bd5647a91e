"""`fmoe trace merge`: traces of one model and options -> one trace in dataset order.

Checked with h5py (independent of fmoe's reader): a merge of one trace copies every dataset
bit for bit (the measured /timing and the offloaded access outcomes included); two traces
of different datasets whose ids do not overlap interleave by request id, each request's
rows unchanged; inputs recorded with other options, holding one dataset's request twice,
or of different datasets whose request ids collide, are refused with one line and leave
nothing. The shards of `mpirun fmoe record` are merged in
test_mpi.py.
"""
import json
import pathlib

import numpy as np
import pytest

from conftest import run_fmoe

h5py = pytest.importorskip("h5py")
import hdf5plugin  # noqa: F401,E402

REPO = pathlib.Path(__file__).resolve().parents[2]
TINY = REPO / "datasets" / "fmoe-tiny"
PROMPTS = REPO / "datasets" / "samples" / "prompts_100.txt"


def datasets(path):
    out = {}
    with h5py.File(path) as f:
        f.visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset)
                     else None)
    return out


def assert_same_datasets(a, b):
    da, db = datasets(a), datasets(b)
    assert sorted(da) == sorted(db)
    for k in da:
        if isinstance(da[k], np.ndarray):
            assert da[k].dtype == db[k].dtype, k
            assert np.array_equal(da[k], db[k]), k
        else:
            assert da[k] == db[k], k


@pytest.fixture(scope="module")
def recorded(fmoe_bin, tmp_path_factory):
    d = tmp_path_factory.mktemp("merge")
    lines = PROMPTS.read_text().splitlines()
    (d / "a.txt").write_text("\n".join(lines[:4]) + "\n")
    (d / "b.txt").write_text("\n".join(lines[10:13]) + "\n")
    common = ["--model", TINY, "--max-new-tokens", "3", "--threads", "1", "--quiet"]
    run_fmoe(fmoe_bin, "record", *common, "--dataset", d / "a.txt", "--speculative", "1",
             "--hidden", "-o", d / "a.h5")
    run_fmoe(fmoe_bin, "record", *common, "--dataset", d / "b.txt", "--speculative", "1",
             "--hidden", "-o", d / "b.h5")
    run_fmoe(fmoe_bin, "record", *common, "--dataset", d / "a.txt", "--cache-experts", "8",
             "-o", d / "off.h5")
    return d


def test_merge_of_one_trace_copies_every_dataset(fmoe, recorded, tmp_path):
    for name in ("a.h5", "off.h5"):
        out = tmp_path / f"m-{name}"
        p = fmoe("trace", "merge", recorded / name, "-o", out)
        assert "Merged" in p.stdout
        assert_same_datasets(recorded / name, out)
    with h5py.File(tmp_path / "m-off.h5") as f:  # the offloaded one has its outcomes
        assert len(f["timing/access_outcome"]) > 0


def import_jsonl(fmoe, path, ids, seed):
    """A trace of requests `ids` (2 layers, 4 experts, top-2), each of 3 tokens whose experts
    follow from (seed, id, token): imported from PATH.jsonl, so its dataset is that name."""
    with open(path.with_suffix(".jsonl"), "w") as f:
        for r in ids:
            for t in range(3):
                for layer in range(2):
                    e = (seed + r + t + layer) % 4
                    f.write(json.dumps({"request": r, "token": t, "layer": layer,
                                        "phase": "prefill" if t < 2 else "decode",
                                        "experts": [e, (e + 1) % 4], "probs": [0.6, 0.4],
                                        "token_id": 100 * r + t}) + "\n")
    fmoe("trace", "import", "--layers", "2", "--experts", "4", "--top-k", "2",
         path.with_suffix(".jsonl"), "-o", path, "--quiet")


def test_merge_interleaves_by_request_id(fmoe, tmp_path):
    """Traces of different datasets whose ids do not overlap interleave by id, each
    request's rows unchanged."""
    import_jsonl(fmoe, tmp_path / "even.h5", [0, 2, 4], seed=0)
    import_jsonl(fmoe, tmp_path / "odd.h5", [1, 3], seed=1)
    out = tmp_path / "merged.h5"
    p = fmoe("trace", "merge", tmp_path / "even.h5", tmp_path / "odd.h5", "-o", out, "--json")
    assert json.loads(p.stdout)["requests"] == 5
    src = {k: datasets(tmp_path / k) for k in ("even.h5", "odd.h5")}
    m = datasets(out)
    assert list(m["requests/id"]) == [0, 1, 2, 3, 4]
    want = [("even.h5", 0), ("odd.h5", 0), ("even.h5", 1), ("odd.h5", 1), ("even.h5", 2)]
    off = m["requests/token_offset"]
    for r, (name, q) in enumerate(want):
        s = src[name]
        so = s["requests/token_offset"]
        for key in ("tokens/experts", "tokens/probs", "tokens/token_id"):
            assert np.array_equal(m[key][off[r]:off[r + 1]], s[key][so[q]:so[q + 1]]), key
    with h5py.File(out) as f:
        assert f.attrs["dataset"] == "merged"


def test_merge_refuses_ids_that_collide_across_datasets(fmoe, recorded, tmp_path):
    """Two recordings of different datasets both number their requests from 0: merged, they
    gave a trace holding ids 0, 0, 1, 1, 2, 2, 3, whose rows no reader could tell apart. A
    merged trace holds each id once: one line naming both inputs and the id, exit 1, and no
    output or .partial."""
    out = tmp_path / "ab.h5"
    p = fmoe("trace", "merge", recorded / "a.h5", recorded / "b.h5", "-o", out, check=False)
    assert p.returncode == 1, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert "request id 0" in lines[0], lines[0]
    assert str(recorded / "a.h5") in lines[0] and str(recorded / "b.h5") in lines[0], lines[0]
    assert "dataset 'a.txt'" in lines[0] and "dataset 'b.txt'" in lines[0], lines[0]
    assert not out.exists() and not pathlib.Path(f"{out}.partial").exists()
    # the same with imports, the collision on one id only (2), named
    import_jsonl(fmoe, tmp_path / "x.h5", [0, 2, 4], seed=0)
    import_jsonl(fmoe, tmp_path / "y.h5", [1, 2], seed=1)
    p = fmoe("trace", "merge", tmp_path / "x.h5", tmp_path / "y.h5", "-o", out, check=False)
    assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "request id 2" in p.stderr and "x.h5" in p.stderr and "y.h5" in p.stderr, p.stderr
    assert not out.exists() and not pathlib.Path(f"{out}.partial").exists()


def test_merge_refuses_mismatch_and_duplicates(fmoe, recorded, tmp_path):
    out = tmp_path / "x.h5"
    p = fmoe("trace", "merge", recorded / "a.h5", recorded / "off.h5", "-o", out, check=False)
    assert p.returncode == 1
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "off.h5" in lines[0] and "a.h5" in lines[0], p.stderr
    assert "speculative depth" in lines[0]
    p = fmoe("trace", "merge", recorded / "a.h5", recorded / "a.h5", "-o", out, check=False)
    assert p.returncode == 1 and "given twice" in p.stderr
    assert not out.exists() and not pathlib.Path(str(out) + ".partial").exists()
    p = fmoe("trace", "merge", "-o", out, check=False)
    assert p.returncode == 2
    p = fmoe("trace", "merge", recorded / "a.h5", check=False)
    assert p.returncode == 2 and "-o" in p.stderr
