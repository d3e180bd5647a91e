"""Hostile inputs: outputs that name an input, device nodes, symlinked partials, FIFOs and
out-of-range values, one test per case.

Each test runs build/cmd/fmoe on files in a temporary folder and checks the exit status, the
one-line message, and that what fmoe must not touch (an input, a device node, a symlink's
target, another name of the same file) is byte for byte and inode for inode as it was.
Calls that used to block or spin carry a timeout (and a memory limit) so a regression fails
instead of hanging. Device nodes are made with mknod in the temporary folder, never the
system's /dev/null, so a regression cannot damage the machine; those tests need root.
"""
import os
import pathlib
import shutil
import stat
import subprocess

import pytest

from memory_limit import limit_address_space

REPO = pathlib.Path(__file__).resolve().parents[2]
TINY = REPO / "datasets" / "fmoe-tiny"
PROMPTS = REPO / "datasets" / "samples" / "prompts_100.txt"
ROUTES = REPO / "tests" / "fixtures" / "datasets" / "routing_small.jsonl"
GEOMETRY = ("--layers", "2", "--experts", "8", "--top-k", "2")


_limit_memory = limit_address_space(4 << 30)


def run(fmoe_bin, *args, timeout=60, cwd=None):
    return subprocess.run([str(fmoe_bin), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, preexec_fn=_limit_memory)


def one_line(p, rc, *fragments):
    """Exit status rc and exactly one stderr line holding every fragment."""
    lines = p.stderr.strip().splitlines()
    assert p.returncode == rc, (p.returncode, p.stderr)
    assert len(lines) == 1, p.stderr
    for f in fragments:
        assert f in lines[0], (f, lines[0])


def snapshot(path):
    """What must not change: type, inode and bytes (not followed through a symlink)."""
    st = os.lstat(path)
    data = None
    if stat.S_ISREG(st.st_mode):
        data = pathlib.Path(path).read_bytes()
    elif stat.S_ISLNK(st.st_mode):
        data = os.readlink(path)
    return (stat.S_IFMT(st.st_mode), st.st_ino, st.st_rdev, data)


@pytest.fixture
def jsonl(tmp_path):
    p = tmp_path / "in.jsonl"
    shutil.copy(ROUTES, p)
    return p


@pytest.fixture
def trace(fmoe, tmp_path, jsonl):
    out = tmp_path / "t.h5"
    fmoe("trace", "import", *GEOMETRY, "--expert-bytes", "1000000", jsonl, "-o", out,
         "--quiet")
    return out


@pytest.fixture
def model(tmp_path):
    """A copy of fmoe-tiny: a regression must not damage the bundled one."""
    d = tmp_path / "model"
    shutil.copytree(TINY, d)
    return d


def need_root_mknod(path, minor):
    """A character device like /dev/null (1, 3) or /dev/full (1, 7) at path."""
    if os.geteuid() != 0:
        pytest.skip("device nodes need root (mknod), and only root can rename over one")
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
    except OSError as e:
        pytest.skip(f"cannot mknod here: {e}")
    return path


# ---- 2. output equals input ---------------------------------------------------------------

def test_import_output_is_input(fmoe_bin, jsonl):
    before = snapshot(jsonl)
    p = run(fmoe_bin, "trace", "import", *GEOMETRY, jsonl, "-o", jsonl)
    one_line(p, 2, "output is an input", str(jsonl))
    assert snapshot(jsonl) == before
    assert not pathlib.Path(f"{jsonl}.partial").exists()


def test_import_output_is_hard_link_of_input(fmoe_bin, jsonl, tmp_path):
    link = tmp_path / "other-name.jsonl"
    os.link(jsonl, link)
    before = snapshot(jsonl)
    p = run(fmoe_bin, "trace", "import", *GEOMETRY, jsonl, "-o", link)
    one_line(p, 2, "output is an input")
    assert snapshot(jsonl) == before


def test_build_store_output_is_trace(fmoe_bin, trace):
    before = snapshot(trace)
    p = run(fmoe_bin, "build-store", "--trace", trace, "-o", trace, "--prefetch-distance", "1",
            "--quiet")
    one_line(p, 2, "output is an input", str(trace))
    assert snapshot(trace) == before


def test_record_output_is_dataset(fmoe_bin, tmp_path, model):
    d = tmp_path / "d.txt"
    shutil.copy(PROMPTS, d)
    before = snapshot(d)
    p = run(fmoe_bin, "record", "--model", model, "--dataset", d, "-o", d, "--quiet")
    one_line(p, 2, "output is an input", str(d))
    assert snapshot(d) == before


def test_simulate_csv_is_trace(fmoe_bin, trace):
    before = snapshot(trace)
    p = run(fmoe_bin, "simulate", "--trace", trace, "--cache-experts", "4", "--csv", trace)
    one_line(p, 2, "output is an input", str(trace))
    assert snapshot(trace) == before


def test_generate_dump_logits_is_model_file(fmoe_bin, model):
    weights = model / "model.safetensors"
    before = snapshot(weights)
    p = run(fmoe_bin, "generate", "--model", model, "--prompt", "hi", "--max-new-tokens", "2",
            "--dump-logits", weights)
    one_line(p, 2, "output is an input", str(weights))
    assert snapshot(weights) == before


# ---- 3. non-regular outputs ---------------------------------------------------------------

def test_output_device_node_is_not_replaced(fmoe_bin, jsonl, tmp_path):
    dev = need_root_mknod(tmp_path / "null", 3)
    before = snapshot(dev)
    p = run(fmoe_bin, "trace", "import", *GEOMETRY, jsonl, "-o", dev)
    one_line(p, 2, str(dev), "not a regular file")
    assert snapshot(dev) == before
    assert not pathlib.Path(f"{dev}.partial").exists()


def test_dump_logits_device_is_not_deleted(fmoe_bin, model, tmp_path):
    dev = need_root_mknod(tmp_path / "full", 7)
    before = snapshot(dev)
    p = run(fmoe_bin, "generate", "--model", model, "--prompt", "hi", "--max-new-tokens", "2",
            "--dump-logits", dev)
    one_line(p, 2, str(dev), "not a regular file")
    assert snapshot(dev) == before


def test_partial_symlink_is_not_followed(fmoe_bin, jsonl, tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    partial = tmp_path / "out.h5.partial"
    os.symlink(victim, partial)
    before, link_before = snapshot(victim), snapshot(partial)
    p = run(fmoe_bin, "trace", "import", *GEOMETRY, jsonl, "-o", tmp_path / "out.h5")
    one_line(p, 1, str(partial), "not a regular file")
    assert snapshot(victim) == before and snapshot(partial) == link_before
    assert not (tmp_path / "out.h5").exists()


def test_csv_partial_symlink_is_not_followed(fmoe_bin, trace, tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    os.symlink(victim, tmp_path / "out.csv.partial")
    before = snapshot(victim)
    p = run(fmoe_bin, "simulate", "--trace", trace, "--cache-experts", "4", "--csv",
            tmp_path / "out.csv")
    one_line(p, 1, "out.csv.partial", "not a regular file")
    assert snapshot(victim) == before


def test_output_directory_is_one_line_and_leaves_nothing(fmoe_bin, jsonl, tmp_path):
    d = tmp_path / "dir"
    d.mkdir()
    p = run(fmoe_bin, "trace", "import", *GEOMETRY, jsonl, "-o", d)
    one_line(p, 2, str(d), "is a directory")
    assert sorted(os.listdir(tmp_path)) == ["dir", "in.jsonl"]
    assert os.listdir(d) == []


def test_csv_is_written_through_a_partial(fmoe_bin, trace, tmp_path):
    """Written in place, the CSV would also change every other name of the old file."""
    keep = tmp_path / "keep.csv"
    keep.write_bytes(b"old results\n")
    out = tmp_path / "out.csv"
    os.link(keep, out)
    p = run(fmoe_bin, "simulate", "--trace", trace, "--cache-experts", "4", "--csv", out)
    assert p.returncode == 0, p.stderr
    assert keep.read_bytes() == b"old results\n"
    assert out.read_text().startswith("policy,cache_experts")
    assert not pathlib.Path(f"{out}.partial").exists()


def test_dump_logits_is_written_through_a_partial(fmoe_bin, model, tmp_path):
    keep = tmp_path / "keep.npy"
    keep.write_bytes(b"old logits\n")
    out = tmp_path / "out.npy"
    os.link(keep, out)
    p = run(fmoe_bin, "generate", "--model", model, "--prompt", "hi", "--max-new-tokens", "2",
            "--dump-logits", out)
    assert p.returncode == 0, p.stderr
    assert keep.read_bytes() == b"old logits\n"
    assert out.read_bytes().startswith(b"\x93NUMPY")
    assert not pathlib.Path(f"{out}.partial").exists()


# ---- 5. special inputs ---------------------------------------------------------------------

@pytest.fixture
def fifo(tmp_path):
    f = tmp_path / "fifo"
    os.mkfifo(f)
    return f


def test_fifo_trace(fmoe_bin, fifo):
    p = run(fmoe_bin, "simulate", "--trace", fifo, "--cache-experts", "4", timeout=20)
    one_line(p, 1, str(fifo), "not a regular file")


def test_fifo_build_store_trace(fmoe_bin, fifo, tmp_path):
    p = run(fmoe_bin, "build-store", "--trace", fifo, "-o", tmp_path / "s.h5", timeout=20)
    one_line(p, 1, str(fifo), "not a regular file")


def test_fifo_dataset(fmoe_bin, fifo, model, tmp_path):
    p = run(fmoe_bin, "record", "--model", model, "--dataset", fifo, "-o", tmp_path / "r.h5",
            timeout=20)
    one_line(p, 1, str(fifo), "not a regular file")
    assert not (tmp_path / "r.h5").exists()


def test_fifo_import_input(fmoe_bin, fifo, tmp_path):
    p = run(fmoe_bin, "trace", "import", *GEOMETRY, "--format", "jsonl", fifo, "-o",
            tmp_path / "o.h5", timeout=20)
    one_line(p, 1, str(fifo), "not a regular file")
    assert not (tmp_path / "o.h5.partial").exists()


def test_dev_zero_import_input(fmoe_bin, tmp_path):
    p = run(fmoe_bin, "trace", "import", *GEOMETRY, "--format", "jsonl", "/dev/zero", "-o",
            tmp_path / "o.h5", timeout=20)
    one_line(p, 1, "/dev/zero", "not a regular file")


def test_dev_zero_tokenize_file(fmoe_bin):
    p = run(fmoe_bin, "tokenize", "--tokenizer", TINY / "tokenizer.json", "--file", "/dev/zero",
            timeout=20)
    one_line(p, 1, "/dev/zero", "not a regular file")


# ---- 6. arithmetic -------------------------------------------------------------------------

@pytest.mark.parametrize("ids", ["[1e20, 5]", "[-1]", "[4096]", "[2.5]"])
def test_tokenize_batch_rejects_ids_outside_the_vocabulary(fmoe_bin, tmp_path, ids):
    """1e20 used to be cast to int32 (undefined) and dropped, with exit 0."""
    f = tmp_path / "b.jsonl"
    f.write_text(ids + "\n")
    p = run(fmoe_bin, "tokenize", "--tokenizer", TINY / "tokenizer.json", "--batch", f)
    one_line(p, 1, "--batch line 1", "is not a token id (vocabulary size 4096)")
    assert p.stdout == ""


def test_import_expert_bytes_out_of_range(fmoe_bin, jsonl, tmp_path):
    p = run(fmoe_bin, "trace", "import", *GEOMETRY, "--expert-bytes", "1000000000000000000",
            jsonl, "-o", tmp_path / "o.h5")
    one_line(p, 2, "--expert-bytes must be in [0, 1099511627776]")
    assert not (tmp_path / "o.h5").exists()


def test_simulate_refuses_an_expert_size_that_overflows(fmoe_bin, trace):
    """A trace made elsewhere with 1e18-byte experts: the int64 byte counters overflowed
    (UBSan in sim/) and printed negative bytes."""
    h5py = pytest.importorskip("h5py")
    import numpy as np
    with h5py.File(trace, "r+") as f:
        f.attrs.modify("expert_bytes", np.int64(10**18))
    p = run(fmoe_bin, "simulate", "--trace", trace, "--cache-experts", "4")
    one_line(p, 1, str(trace), "an expert of 1000000000000000000 bytes", "too large")
    assert p.stdout == ""


def test_simulate_clamps_cache_to_all_experts(fmoe_bin, trace):
    """--cache-experts 100000000 allocated 6.8 GB for a model of L x J = 16 experts."""
    p = run(fmoe_bin, "simulate", "--trace", trace, "--cache-experts", "100000000", "--json")
    one_line(p, 0, "note: a cache of 100000000 experts holds all 16 (L x J); simulating 16")
    import json
    assert [r["cache_experts"] for r in json.loads(p.stdout)["results"]] == [16]
