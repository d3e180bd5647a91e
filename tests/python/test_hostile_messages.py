"""Hostile inputs: damaged HDF5 files, the messages bad input gets, and garbage that must not
be read silently.

Each test runs the fmoe binary on a file made in a temporary folder (or on an input kept in
tests/fuzz/crashes/) and checks the exit status and the one line it prints. Calls carry a
timeout and a memory limit, so a regression (a hang in libhdf5, a 5 TB allocation) fails
instead of stalling the run.
"""
import json
import os
import pathlib
import resource
import shutil
import signal
import struct
import subprocess
import time

import pytest

from memory_limit import limit_address_space, run_peak_rss

REPO = pathlib.Path(__file__).resolve().parents[2]
TINY = REPO / "datasets" / "fmoe-tiny"
CRASHES = REPO / "tests" / "fuzz" / "crashes"
GEOMETRY = ("--layers", "2", "--experts", "4", "--top-k", "2")


_limit_memory = limit_address_space(4 << 30)


def run(fmoe_bin, *args, timeout=60, preexec=_limit_memory, cwd=None):
    return subprocess.run([str(fmoe_bin), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, preexec_fn=preexec, cwd=cwd)


def one_line(p, rc, *fragments):
    """Exit status rc and exactly one stderr line holding every fragment."""
    lines = p.stderr.strip().splitlines()
    assert p.returncode == rc, (p.returncode, p.stderr)
    assert len(lines) == 1, p.stderr
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


# --------------------------------------------------------------------------- damaged HDF5

DAMAGED = sorted(p for d in ("trace", "store", "predictor") for p in (CRASHES / d).glob("*"))


@pytest.mark.parametrize("path", DAMAGED, ids=[f"{p.parent.name}/{p.name[:14]}" for p in DAMAGED])
def test_damaged_hdf5_is_one_line(fmoe_bin, path, tmp_path):
    """Bit-flipped traces, stores and predictors that crashed, hung or allocated terabytes
    inside libhdf5 1.10.8 (SEGV in H5HG_read, an endless heap-collection decode, H5Fopen's
    5 TB object header chunk, an attribute message copied past its chunk) give one line
    naming the file, exit 1."""
    p = tmp_path / ("damaged.h5")
    shutil.copy(path, p)
    r = run(fmoe_bin, "inspect", p, timeout=30)
    line = one_line(r, 1, str(p))
    assert "HDF5-DIAG" not in r.stderr


def _string_attr_trace(fmoe, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(
        '{"request": 1, "token": 0, "phase": "prefill", "layer": 0, "experts": [0, 1]}\n'
        '{"request": 1, "token": 0, "phase": "prefill", "layer": 1, "experts": [2, 3]}\n')
    out = tmp_path / "t.h5"
    fmoe("trace", "import", *GEOMETRY, src, "-o", out, "--quiet")
    return out


@pytest.mark.parametrize("field", [0, 1, 2])
def test_forged_attribute_message_sizes_are_refused(fmoe, fmoe_bin, tmp_path, field):
    """An attribute message of the root group whose name, datatype or dataspace size runs
    past the message: libhdf5 1.10.8 would copy the value from beyond its chunk buffer
    (H5O__attr_decode). Refused before H5Fopen, naming the file and the header."""
    t = _string_attr_trace(fmoe, tmp_path)
    data = bytearray(t.read_bytes())
    at = data.find(b"format\0")  # the root's 'format' attribute: its name
    assert at > 16
    # version-1 attribute message: version 1, reserved, name/datatype/dataspace sizes (u16)
    head = at - 8
    assert data[head] == 1 and struct.unpack_from("<H", data, head + 2)[0] == 7
    struct.pack_into("<H", data, head + 2 + 2 * field, 0xFFF0)
    t.write_bytes(bytes(data))
    r = run(fmoe_bin, "inspect", t, timeout=30)
    one_line(r, 1, str(t), "attribute message", "root group")


@pytest.mark.parametrize("forge", ["chunk", "message", "vlen_base", "local_heap"])
def test_forged_dataset_object_header_is_refused(fmoe, fmoe_bin, tmp_path, forge):
    """The object header of a dataset opened after H5Fopen (/tokens/phase, /model/config_json)
    is checked before libhdf5 loads it: a chunk claiming 2 GB (libhdf5 1.10.8 allocates it
    before comparing with the file's end; a fuzzed file asked for 17 GB), a message running
    past its chunk, and a variable-length string whose base type claims 4 GB per character
    (H5T__conv_vlen cleared gigabytes) are one line naming the object."""
    h5py = pytest.importorskip("h5py")
    t = _string_attr_trace(fmoe, tmp_path)
    name = {"vlen_base": "model/config_json", "local_heap": "tokens"}.get(forge, "tokens/phase")
    with h5py.File(t, "r") as f:
        addr = h5py.h5g.get_objinfo(f.id, name.encode()).objno[0]
    data = bytearray(t.read_bytes())
    assert data[addr] == 1  # a version-1 object header: 16-byte prefix, then messages
    if forge == "chunk":
        struct.pack_into("<I", data, addr + 8, 0x7FFFFFF0)
        want = "claims a 2147483632-byte chunk"
    elif forge == "message":
        struct.pack_into("<H", data, addr + 16 + 2, 0xFFF0)
        want = "claims 65520 bytes past its chunk"
    else:
        # message type 3 (a variable-length string's datatype: base size at +12) or 0x11
        # (the group's symbol table: B-tree and local heap addresses)
        kind = 3 if forge == "vlen_base" else 0x11
        at, end = addr + 16, addr + 16 + struct.unpack_from("<I", data, addr + 8)[0]
        while at < end and struct.unpack_from("<H", data, at)[0] != kind:
            at += 8 + struct.unpack_from("<H", data, at + 2)[0]
        assert at < end
        if kind == 3:
            assert data[at + 8] & 0x0F == 9
            struct.pack_into("<I", data, at + 8 + 12, 0xFFFF0001)
            want = "forged"  # the base (a one-byte character) of a forged size
        else:  # the heap: "HEAP", version, 3 reserved, data segment size (8 bytes), ...
            heap = struct.unpack_from("<Q", data, at + 8 + 8)[0]
            assert data[heap:heap + 4] == b"HEAP"
            struct.pack_into("<Q", data, heap + 8, 1 << 40)
            want = "data segment runs past the end of the file"
    t.write_bytes(bytes(data))
    r = run(fmoe_bin, "inspect", t, timeout=30)
    one_line(r, 1, str(t), "damaged HDF5 file", "/" + name, want)


def _h5py_copy(h5py, src, dst, **file_kw):
    """The trace src rewritten by h5py into dst with File(**file_kw): same objects and
    attributes, another layout of the same data."""
    with h5py.File(src, "r") as a, h5py.File(dst, "w", **file_kw) as b:
        for k, v in a.attrs.items():
            b.attrs[k] = v
        for k in a:
            a.copy(a[k], b, name=k)


@pytest.mark.parametrize("variant", ["latest", "userblock", "vlen_sequence_attr"])
def test_valid_rewrites_are_not_refused(fmoe, fmoe_bin, tmp_path, variant):
    """Valid files the guards must let through: version-2 object headers (h5py's
    libver='latest'; chunk 0's checksum lies outside its length), a 512-byte user block
    before the superblock (addresses relative to it), a variable-length sequence of a
    24-byte compound as an attribute."""
    h5py = pytest.importorskip("h5py")
    np = pytest.importorskip("numpy")
    t = _string_attr_trace(fmoe, tmp_path)
    out = tmp_path / "rewritten.h5"
    if variant == "latest":
        _h5py_copy(h5py, t, out, libver="latest")
    elif variant == "userblock":
        _h5py_copy(h5py, t, out, userblock_size=512)
    else:
        shutil.copy(t, out)
        with h5py.File(out, "r+") as f:
            base = np.dtype([("x", "f8"), ("y", "f8"), ("z", "f8")])
            dt = h5py.vlen_dtype(base)
            arr = np.empty(1, dtype=dt)
            arr[0] = np.zeros(2, dtype=base)
            f.attrs.create("notes", arr, dtype=dt)
    r = run(fmoe_bin, "inspect", out, timeout=30)
    assert r.returncode == 0, r.stderr


def test_forged_committed_datatype_is_refused(fmoe, fmoe_bin, tmp_path):
    """A dataset whose datatype is committed (a named type: its datatype message is a
    reference) makes libhdf5 load that type's own object header: it is checked like any
    other. The trace's /model/config_json is rewritten with a committed string type (still
    valid), then the type's header chunk forged to 2 GB."""
    h5py = pytest.importorskip("h5py")
    t = _string_attr_trace(fmoe, tmp_path)
    with h5py.File(t, "r+") as f:
        value = f["model/config_json"][()]
        del f["model/config_json"]
        f["model/string_t"] = h5py.string_dtype()
        f["model"].create_dataset("config_json", data=value, dtype=f["model/string_t"])
    r = run(fmoe_bin, "inspect", t, timeout=30)
    assert r.returncode == 0, r.stderr  # valid as written
    with h5py.File(t, "r") as f:
        addr = h5py.h5g.get_objinfo(f.id, b"model/string_t").objno[0]
    data = bytearray(t.read_bytes())
    assert data[addr] == 1
    struct.pack_into("<I", data, addr + 8, 0x7FFFFFF0)
    t.write_bytes(bytes(data))
    r = run(fmoe_bin, "inspect", t, timeout=30)
    one_line(r, 1, str(t), "committed datatype", "2147483632-byte chunk")


def test_soft_link_is_refused(fmoe, fmoe_bin, tmp_path):
    """A soft link on the way to a dataset would make libhdf5 load an object the guards did
    not check: fmoe's files hold hard links only."""
    h5py = pytest.importorskip("h5py")
    t = _string_attr_trace(fmoe, tmp_path)
    with h5py.File(t, "r+") as f:
        f.move("tokens", "real_tokens")
        f["tokens"] = h5py.SoftLink("/real_tokens")
    r = run(fmoe_bin, "inspect", t, timeout=30)
    one_line(r, 1, str(t), "soft link")


def test_forged_filter_mask_is_refused(fmoe, fmoe_bin, tmp_path):
    """A chunk whose filter mask says every filter was skipped but whose stored size is the
    compressed one: libhdf5 1.10.8 would copy a whole chunk out of the shorter buffer
    (heap overflow in H5VM_memcpyvv). The chunk index's leaf is forged by hand."""
    h5py = pytest.importorskip("h5py")
    t = _string_attr_trace(fmoe, tmp_path)
    with h5py.File(t, "r") as f:
        d = f["tokens/experts"]
        info, ndim = d.id.get_chunk_info(0), d.ndim
        nfilters = d.id.get_create_plist().get_nfilters()
        assert nfilters > 0
    data = bytearray(t.read_bytes())
    # the leaf key before the chunk's address: size (4), filter mask (4), offsets
    addr = struct.pack("<Q", info.byte_offset)
    at = data.find(addr)
    while at >= 0:
        # the key sits just before the child address: size, mask, offsets (8 x (rank + 1))
        key = at - 8 * (ndim + 1) - 8
        if key >= 0 and struct.unpack_from("<I", data, key)[0] == info.size:
            break
        at = data.find(addr, at + 1)
    assert at >= 0
    struct.pack_into("<I", data, key + 4, (1 << nfilters) - 1)  # every filter skipped
    t.write_bytes(bytes(data))
    r = run(fmoe_bin, "inspect", t, timeout=30)
    one_line(r, 1, str(t), "/tokens/experts", "stored size is not the chunk's")


def test_compact_data_shorter_than_its_dataset_is_refused(fmoe, fmoe_bin, tmp_path):
    """A compact dataset (its data inside its layout message) whose stated size is less than
    its elements x element size: libhdf5 1.10.8 would copy the whole dataset out of the
    message. The trace's /model/config_json is rewritten compact by h5py, then its size
    field halved: refused before the dataset is opened, naming it."""
    h5py = pytest.importorskip("h5py")
    t = _string_attr_trace(fmoe, tmp_path)
    with h5py.File(t, "r+") as f:
        old = f["model/config_json"]
        value, dtype = old[()], old.dtype
        del f["model/config_json"]
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_layout(h5py.h5d.COMPACT)
        d = h5py.h5d.create(f["model"].id, b"config_json", h5py.h5t.py_create(dtype, logical=True),
                            h5py.h5s.create(h5py.h5s.SCALAR), dcpl=dcpl)
        h5py.Dataset(d)[()] = value
    run(fmoe_bin, "inspect", t, timeout=30).check_returncode()  # valid as written
    with h5py.File(t, "r") as f:
        addr = h5py.h5g.get_objinfo(f.id, b"model/config_json").objno[0]
    data = bytearray(t.read_bytes())
    assert data[addr] == 1
    at, end = addr + 16, addr + 16 + struct.unpack_from("<I", data, addr + 8)[0]
    while at < end and struct.unpack_from("<H", data, at)[0] != 8:  # the layout message
        at += 8 + struct.unpack_from("<H", data, at + 2)[0]
    assert at < end and data[at + 8] == 3 and data[at + 9] == 0  # version 3, compact
    size = struct.unpack_from("<H", data, at + 10)[0]
    struct.pack_into("<H", data, at + 10, size // 2)
    t.write_bytes(bytes(data))
    r = run(fmoe_bin, "inspect", t, timeout=30)
    one_line(r, 1, str(t), "/model/config_json", "bytes of compact data")


def test_forged_string_heap_object_is_refused(fmoe, fmoe_bin, tmp_path):
    """The heap object of a variable-length string attribute claims more bytes than its
    collection holds (the overrun H5HG_read would copy): refused, naming the attribute."""
    t = _string_attr_trace(fmoe, tmp_path)
    data = bytearray(t.read_bytes())
    at = data.find(b"fmoe-trace")  # the 'format' attribute's heap object
    assert at > 16
    # the object's header precedes it: index u16, refs u16, reserved u32, size u64
    size_at = at - 8
    assert struct.unpack_from("<Q", data, size_at)[0] == len(b"fmoe-trace")
    struct.pack_into("<Q", data, size_at, 1 << 40)
    t.write_bytes(bytes(data))
    r = run(fmoe_bin, "inspect", t, timeout=30)
    one_line(r, 1, str(t), "attribute 'format'", "damaged string")


# ------------------------------------------------------------------ messages: fmoe inspect

GGUF_HEAD = b"GGUF" + struct.pack("<IQQ", 3, 0, 0)  # a whole GGUF file: no keys, no tensors


@pytest.mark.parametrize("name,data,says", [
    # a bad GGUF magic said "not an HDF5 file (no HDF5 signature)"
    ("bad-magic.gguf", b"GGUX" + GGUF_HEAD[4:],
     "offset 0: not a GGUF file: magic 47 47 55 58 (\"GGUX\"), expected 47 47 55 46"),
    ("bad-magic.bin", b"GGUX" + GGUF_HEAD[4:], "offset 0: not a GGUF file: magic 47 47 55 58"),
    ("lower.bin", b"gguf" + GGUF_HEAD[4:],
     "offset 0: not a GGUF file: magic 67 67 75 66 (\"gguf\")"),
    ("zeros.gguf", bytes(24), "offset 0: not a GGUF file: magic 00 00 00 00 (\"....\")"),
    ("short.gguf", b"GG", "offset 0: not a GGUF file: 2 bytes, shorter than the magic"),
    ("model.safetensors", struct.pack("<Q", 2) + b"{}", "a safetensors file (a 2-byte JSON "
     "header), not a GGUF or HDF5 file; fmoe inspect reads GGUF files and fmoe's HDF5"),
    ("archive.zip", b"PK\x03\x04" + bytes(20), "not a GGUF file (magic \"GGUF\") nor an HDF5 "
     "file (no HDF5 signature): it starts with 50 4b 03 04 00 00 00 00 (\"PK......\")"),
    ("empty.h5", b"", "an empty file; fmoe inspect reads GGUF files"),
])
def test_inspect_names_what_a_file_is(fmoe_bin, tmp_path, name, data, says):
    f = tmp_path / name
    f.write_bytes(data)
    line = one_line(run(fmoe_bin, "inspect", f, timeout=30), 1, f"{f}: {says}")
    assert "HDF5 file (no HDF5 signature), expected" not in line
    (tmp_path / "ok.gguf").write_bytes(GGUF_HEAD)  # and the magic itself is read as GGUF
    assert run(fmoe_bin, "inspect", tmp_path / "ok.gguf", timeout=30).returncode == 0


# ------------------------------------------------------------------- messages, garbage: import

def test_import_probability_error_names_input_and_line(fmoe_bin, tmp_path):
    src = tmp_path / "a.jsonl"
    src.write_text(
        '{"request": 1, "token": 0, "phase": "prefill", "layer": 0, "experts": [0, 1], '
        '"probs": [0.6, 0.4]}\n'
        '{"request": 1, "token": 0, "phase": "prefill", "layer": 1, "experts": [2, 3], '
        '"probs": [1.5, 0.4]}\n')
    r = run(fmoe_bin, "trace", "import", *GEOMETRY, src, "-o", tmp_path / "out.h5", "--quiet")
    line = one_line(r, 1, f"{src}:2: probs[0] = 1.5")
    assert "out.h5" not in line
    assert not (tmp_path / "out.h5").exists()


def test_import_full_distribution_must_sum_to_one(fmoe_bin, tmp_path):
    src = tmp_path / "c.jsonl"
    src.write_text(
        '{"request": 1, "token": 0, "phase": "prefill", "layer": 0, "experts": [0, 1], '
        '"probs": [0.9, 0.9, 0.9, 0.9]}\n'
        '{"request": 1, "token": 0, "phase": "prefill", "layer": 1, "experts": [2, 3], '
        '"probs": [0.1, 0.2, 0.3, 0.4]}\n')
    r = run(fmoe_bin, "trace", "import", *GEOMETRY, src, "-o", tmp_path / "out.h5", "--quiet")
    one_line(r, 1, f"{src}:1:", "sum to 3.6", "full distribution")


def test_import_full_distribution_rounded_is_accepted(fmoe_bin, tmp_path):
    """Probabilities printed with two digits sum to 1 only roughly: still accepted."""
    src = tmp_path / "ok.jsonl"
    src.write_text(
        '{"request": 1, "token": 0, "phase": "prefill", "layer": 0, "experts": [0, 1], '
        '"probs": [0.34, 0.34, 0.17, 0.17]}\n'
        '{"request": 1, "token": 0, "phase": "prefill", "layer": 1, "experts": [2, 3], '
        '"probs": [0.1, 0.2, 0.33, 0.33]}\n')
    r = run(fmoe_bin, "trace", "import", *GEOMETRY, src, "-o", tmp_path / "out.h5", "--quiet")
    assert r.returncode == 0, r.stderr


def test_import_dense_csv_row_summing_past_one(fmoe_bin, tmp_path):
    head = "layer_id,token_id,expert_0,expert_1,expert_2,expert_3\n"
    l0, l1 = tmp_path / "l0.csv", tmp_path / "l1.csv"
    l0.write_text(head + "0,5,0.9,0.9,0,0\n")
    l1.write_text(head + "1,5,0.5,0.4,0,0\n")
    r = run(fmoe_bin, "trace", "import", *GEOMETRY, l0, l1, "-o", tmp_path / "out.h5",
            "--quiet")
    one_line(r, 1, f"{l0}:2:", "sum to 1.8")


# --------------------------------------------------------------------------- messages: calibrate

def test_calibrate_bad_output_fails_before_measuring(fmoe_bin, tmp_path):
    out = tmp_path / "no" / "such" / "p.json"
    t0 = time.monotonic()
    r = run(fmoe_bin, "calibrate", "--quick", "-o", out, timeout=60)
    one_line(r, 1, "No such file or directory")
    assert "measured" not in r.stderr
    assert time.monotonic() - t0 < 5


def _small_file_limit():
    _limit_memory()
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))


def test_calibrate_write_error_names_the_reason(fmoe_bin, tmp_path):
    """A write that fails part-way (a full disk; here a 64-byte file size limit) names its
    reason: it was reported with a stale errno ("No such file or directory") because the
    first short write sets none. Nothing is left behind."""
    out = tmp_path / "p.json"
    r = run(fmoe_bin, "calibrate", "--quick", "--quiet", "--file-dir", tmp_path, "-o", out,
            preexec=_small_file_limit, timeout=60)
    one_line(r, 1, "scratch data", os.strerror(27))  # EFBIG: File too large
    assert "No such file" not in r.stderr
    assert sorted(os.listdir(tmp_path)) == []


# --------------------------------------------------------------------------- garbage: models

@pytest.fixture
def model(tmp_path):
    d = tmp_path / "model"
    shutil.copytree(TINY, d)
    return d


def _edit_config(model, **kv):
    cfg = json.loads((model / "config.json").read_text())
    cfg.update(kv)
    (model / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("key,value", [("rms_norm_eps", -1), ("rms_norm_eps", 0),
                                       ("rope_theta", 0), ("rope_theta", -10000)])
def test_config_value_out_of_range_is_refused(fmoe_bin, model, key, value):
    _edit_config(model, **{key: value})
    r = run(fmoe_bin, "generate", "--model", model, "--prompt", "hi", "--max-new-tokens", "2",
            timeout=120)
    one_line(r, 1, "config.json", f"{key} = {value:g}", "positive")


def test_generate_nan_weights_is_one_line(fmoe_bin, model):
    st = model / "model.safetensors"
    data = bytearray(st.read_bytes())
    n = struct.unpack_from("<Q", data)[0]
    header = json.loads(data[8:8 + n])
    t = header["model.norm.weight"]
    nan = {"F32": struct.pack("<f", float("nan")), "BF16": b"\xc0\x7f",
           "F16": b"\x00\x7e"}[t["dtype"]]
    b, e = t["data_offsets"]
    for o in range(8 + n + b, 8 + n + e, len(nan)):
        data[o:o + len(nan)] = nan
    st.write_bytes(bytes(data))
    r = run(fmoe_bin, "generate", "--model", model, "--prompt", "hi", "--max-new-tokens", "4",
            timeout=120)
    # refused at load now (tests/python/test_nonfinite_weights.py), before any logit
    one_line(r, 1, "the final norm holds a non-finite weight", "nan")
    assert r.stdout.strip() == ""


def test_safetensors_trailing_bytes_are_refused(fmoe_bin, model):
    """A safetensors file with 10 GB after its last tensor's data (sparse: nothing written)
    was accepted, mapped whole; the format allows no byte there. No address-space limit
    here: the old binary mapped the 10 GB and ran."""
    st = model / "model.safetensors"
    end = st.stat().st_size
    os.truncate(st, end + (10 << 30))
    r = run(fmoe_bin, "generate", "--model", model, "--prompt", "hi", "--max-new-tokens", "2",
            timeout=120, preexec=None)
    one_line(r, 1, f"{st}: {10 << 30} bytes after the last tensor's data, from byte {end}")
    assert r.stdout.strip() == ""


def test_tokenizer_json_trailing_bytes_are_refused(fmoe_bin, model):
    """tokenizer.json followed by 500 MB of NUL bytes (sparse) was read whole (683 MB of
    RSS) and accepted: cJSON stopped at the object's end. Now its end is looked at first:
    one line naming the file and the byte, and the file is not read."""
    tj = model / "tokenizer.json"
    end = tj.stat().st_size
    os.truncate(tj, end + 500_000_000)
    size = end + 500_000_000
    r, peak = run_peak_rss([fmoe_bin, "tokenize", "--tokenizer", model, "--text", "hi"], 4 << 30)
    one_line(r, 1, f"{tj}: its last byte that is not whitespace, byte {size - 1} of {size}, "
                   "is 0x00")
    assert peak < 200 << 20, f"peak RSS {peak >> 20} MiB"
    # and junk that itself ends in '}' is refused where it starts, after the whole read
    tj.write_bytes(tj.read_bytes()[:end] + b"\n{}")
    r = run(fmoe_bin, "tokenize", "--tokenizer", model, "--text", "hi")
    one_line(r, 1, f"{tj}: bytes after the JSON value, from byte {end + 1}")


# --------------------------------------------------------------------------- garbage: datasets

def test_malformed_json_dataset_is_refused(fmoe_bin, tmp_path):
    d = tmp_path / "prompts.json"
    d.write_text('{"prompt": "hello"\n')
    r = run(fmoe_bin, "record", "--dataset", d, "-o", tmp_path / "r.h5", "--max-new-tokens",
            "2", timeout=120)
    one_line(r, 1, f"{d}:1: malformed JSON")
    assert not (tmp_path / "r.h5").exists()
