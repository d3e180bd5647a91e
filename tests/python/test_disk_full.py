"""A full disk while writing: `trace import` (dense CSV
and JSON Lines), `build-store`, `record`, `simulate --csv` and `train-predictor` (both
kinds) must each fail with one line
naming the output and the reason ("out.h5.partial: cannot close: No space left on
device"), exit 1, leave no .partial (nor a journal), leave an earlier complete output as it
was, and never crash (it used to: SEGV in H5F__close_cb at library shutdown, exit 139) or
print HDF5's raw error stack.

Two ways to fill the disk: a small tmpfs, filled up to a few KB (needs root and a mount;
skipped with the reason where it cannot be made), and RLIMIT_FSIZE (`ulimit -f`) with
SIGXFSZ ignored, so write(2) fails with EFBIG "File too large" (works anywhere). Each at
several sizes, so the failure lands in different places: creating the file, an append or
flush, the close.
"""
import json
import re
import os
import pathlib
import resource
import shutil
import signal
import subprocess

import pytest

from conftest import REPO

SAMPLES = REPO / "datasets" / "samples"
FLAME = [SAMPLES / "flame-moe-290m" / f"layer{i:02d}.csv" for i in range(2, 10)]
TINY = REPO / "datasets" / "fmoe-tiny"
PREVIOUS = b"a previous complete output, which a failed run must leave alone\n"


@pytest.fixture(scope="module")
def inputs(fmoe_bin, tmp_path_factory):
    """A trace (for build-store and simulate) and a JSON Lines routing log."""
    d = tmp_path_factory.mktemp("in")
    trace = d / "flame.h5"
    p = subprocess.run([str(fmoe_bin), "trace", "import", "--format", "dense-csv", "--layers", "8",
                        "--experts", "64", "--top-k", "6", "--expert-bytes", "1000000",
                        "--tokens-per-request", "64", *map(str, FLAME), "-o", str(trace),
                        "--quiet"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    jsonl = d / "routes.jsonl"
    with open(jsonl, "w") as f:
        for r in range(40):
            for t in range(24):
                for layer in range(4):
                    e = [(r + t + layer) % 16, (r * 7 + t + layer + 1) % 16]
                    if e[0] == e[1]:
                        e[1] = (e[1] + 1) % 16
                    f.write(json.dumps({"request": r, "token": t, "layer": layer,
                                        "phase": "prefill" if t < 16 else "decode",
                                        "experts": e, "probs": [0.7, 0.3]}) + "\n")
    # fmoe-tiny with gate inputs, for train-predictor (both kinds train on it)
    hidden = d / "hidden.h5"
    p = subprocess.run([str(fmoe_bin), "record", "--model", str(TINY), "--dataset",
                        str(SAMPLES / "prompts_100.txt"), "--max-requests", "6",
                        "--max-new-tokens", "4", "--hidden", "--threads", "1", "-q", "-o",
                        str(hidden)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return trace, jsonl, hidden


def commands(inputs):
    """(name, output file name, argv after 'fmoe' with OUT for the output)."""
    trace, jsonl, hidden = inputs
    return [
        ("import-dense-csv", "out.h5",
         ["trace", "import", "--format", "dense-csv", "--layers", "8", "--experts", "64",
          "--top-k", "6", "--tokens-per-request", "64", *FLAME, "-o", "OUT", "--quiet"]),
        ("import-jsonl", "out.h5",
         ["trace", "import", "--layers", "4", "--experts", "16", "--top-k", "2", jsonl,
          "-o", "OUT", "--quiet"]),
        ("build-store", "store.h5", ["build-store", "--trace", trace, "-o", "OUT", "--quiet"]),
        ("record", "rec.h5",
         ["record", "--model", TINY, "--dataset", SAMPLES / "prompts_100.txt", "--max-requests",
          "8", "--max-new-tokens", "4", "--threads", "1", "-q", "-o", "OUT"]),
        ("simulate-csv", "sim.csv",
         ["simulate", "--trace", trace, "--policy", "lru,lfu,belady", "--cache-experts",
          "8,16,32,64,128,256", "--quiet", "--csv", "OUT"]),
        # the reason once read "HDF5 call failed": the error stack was cleared first
        ("train-promoe", "p.h5",
         ["train-predictor", "--kind", "promoe", "--trace", hidden, "--epochs", "2", "-q",
          "-o", "OUT"]),
        ("train-duoserve", "d.h5",
         ["train-predictor", "--kind", "duoserve", "--trace", hidden, "--epochs", "2", "-q",
          "-o", "OUT"]),
    ]


def run(fmoe_bin, argv, out, preexec=None):
    args = [str(out) if a == "OUT" else str(a) for a in argv]
    return subprocess.run([str(fmoe_bin), *args], capture_output=True, text=True, timeout=300,
                          preexec_fn=preexec, cwd=out.parent)


def check_failed(p, out, reason):
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert len(lines) == 1, f"expected one line:\n{p.stderr}"
    assert out.name in lines[0] and reason in lines[0], lines[0]
    assert "HDF5" not in p.stderr and "#000" not in p.stderr
    # errno must not be clobbered on the way up (it once said "No such file or directory")
    assert "No such file" not in p.stderr
    left = sorted(x.name for x in out.parent.iterdir() if ".partial" in x.name)
    assert not left, f"left behind: {left}"
    assert out.read_bytes() == PREVIOUS, "the previous output was touched"


# ---------------------------------------------------------------------------------------
# RLIMIT_FSIZE: write(2) past the limit fails with EFBIG
# ---------------------------------------------------------------------------------------

def limit_file_size(limit):
    def preexec():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of death by SIGXFSZ
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return preexec


@pytest.mark.parametrize("limit", [1024, 16 << 10, 96 << 10])
def test_file_size_limit(fmoe_bin, inputs, tmp_path, limit):
    ran = 0
    for name, out_name, argv in commands(inputs):
        d = tmp_path / name
        d.mkdir()
        out = d / out_name
        out.write_bytes(PREVIOUS)
        p = run(fmoe_bin, argv, out, limit_file_size(limit))
        if p.returncode == 0:
            # the whole output fits under this limit (the CSV does at 16 KB): then it must
            # be complete and in place, with nothing left over
            assert out.stat().st_size <= limit and out.read_bytes() != PREVIOUS
            assert not [x for x in d.iterdir() if ".partial" in x.name]
            continue
        ran += 1
        check_failed(p, out, "File too large")
    assert ran >= 3


# ---------------------------------------------------------------------------------------
# A small tmpfs, filled: ENOSPC
# ---------------------------------------------------------------------------------------

@pytest.fixture
def small_fs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (the RLIMIT_FSIZE cases still ran)")
    mnt = tmp_path / "fs"
    mnt.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k,mode=0777", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {p.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill(d, leave):
    """Fills the file system of d up to `leave` free bytes (a filler file)."""
    st = os.statvfs(d)
    free = st.f_bavail * st.f_frsize
    with open(d / "filler", "wb") as f:
        f.write(b"\0" * max(0, free - leave))


@pytest.mark.parametrize("leave", [0, 8 << 10, 64 << 10])
def test_no_space_left(fmoe_bin, inputs, small_fs, leave):
    ran = 0
    for name, out_name, argv in commands(inputs):
        d = small_fs / name
        d.mkdir()
        out = d / out_name
        out.write_bytes(PREVIOUS)
        fill(d, leave)
        p = run(fmoe_bin, argv, out)
        (d / "filler").unlink()
        if p.returncode == 0:  # it fitted (the CSV in 8 KB): complete, nothing left over
            assert out.read_bytes() != PREVIOUS
            assert not [x for x in d.iterdir() if ".partial" in x.name]
        else:
            ran += 1
            check_failed(p, out, "No space left on device")
        shutil.rmtree(d)
    assert ran >= 3


# ---------------------------------------------------------------------------------------
# fmoe serve --trace-out: a request is answered only once it is in the trace
# ---------------------------------------------------------------------------------------

def serve_until_full(fmoe_bin, tmp_path, out, preexec, make_room=lambda: None):
    """Serves greedy requests one at a time until one is not 200 (at most 60). Checks what a
    full disk must do: that request fails with 507 (or 503) naming the trace, the error is
    logged at once, /health says degraded, the next request is refused, the metric counts
    them; at SIGTERM exit 1 with nothing removed, and once there is room again (make_room)
    `fmoe trace recover` gives a trace of every request answered 200, and at most the one
    that failed besides (its journal record was written; the HDF5 append after it was not).
    The .partial stays beside the journal even when the HDF5 close fails (with a few tens
    of KB free it does; it used to delete the .partial). Returns how many were answered."""
    import select

    import h5py
    import hdf5plugin  # noqa: F401
    from serve_util import Server

    srv = Server(tmp_path, "--model", TINY, "--trace-out", out, preexec=preexec)
    answered = []
    try:
        for i in range(60):
            st, _, body = srv.post("/v1/completions", {"model": "m", "prompt": f"request {i}",
                                                       "max_tokens": 8, "temperature": 0})
            if st != 200:
                break
            answered.append(i)
        else:
            pytest.fail("the trace never filled the disk")
        assert st in (503, 507), (st, body)
        err = json.loads(body)["error"]
        assert err["code"] == "trace_write_failed" and out.name in err["message"], err
        # logged at once, not at shutdown
        fd = srv.proc.stderr.fileno()
        os.set_blocking(fd, False)
        logged = b""
        for _ in range(40):
            if b"trace cannot be written" in logged:
                break
            select.select([fd], [], [], 0.05)
            logged += os.read(fd, 65536) if select.select([fd], [], [], 0)[0] else b""
        assert b"trace cannot be written" in logged, logged
        st, _, body = srv.request("GET", "/health")
        assert st == 503 and json.loads(body)["status"] == "degraded", body
        st, _, body = srv.post("/v1/completions", {"model": "m", "prompt": "after",
                                                   "max_tokens": 4})
        assert st == 503 and "trace" in json.loads(body)["error"]["message"], body
        failures = re.search(r"^fmoe_trace_write_failures_total (\d+)$", srv.metrics_text(),
                             re.M)
        assert failures and int(failures.group(1)) >= 2, srv.metrics_text()
    finally:
        os.set_blocking(srv.proc.stderr.fileno(), True)
        rc, stderr = srv.stop()
    assert rc == 1, stderr
    assert "fmoe trace recover" in stderr, stderr
    assert "slist" not in stderr, stderr  # libhdf5's own words for a close after a failure
    journal = out.parent / f"{out.name}.partial.journal"
    partial = out.parent / f"{out.name}.partial"
    # nothing removed: a failed HDF5 close once deleted the .partial
    assert journal.exists() and partial.exists(), sorted(p.name for p in out.parent.iterdir())
    make_room()
    p = subprocess.run([str(fmoe_bin), "trace", "recover", f"{out}.partial", "--json"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    with h5py.File(out, "r") as f:
        assert f["requests/id"].shape[0] in (len(answered), len(answered) + 1)
        assert list(f["requests/id"][:len(answered)]) == answered  # admission order
    return len(answered)


@pytest.mark.parametrize("limit", [48 << 10, 160 << 10])
def test_serve_trace_out_file_size_limit(fmoe_bin, tmp_path, limit):
    assert serve_until_full(fmoe_bin, tmp_path, tmp_path / "served.h5",
                            limit_file_size(limit)) >= 1


# 48 KB free: the flush after the first request fails, and then the HDF5 close
@pytest.mark.parametrize("leave", [48 << 10, 96 << 10])
def test_serve_trace_out_no_space_left(fmoe_bin, small_fs, leave):
    d = small_fs / "serve"
    d.mkdir()
    fill(d, leave)
    serve_until_full(fmoe_bin, d, d / "served.h5", None, (d / "filler").unlink)


# ---------------------------------------------------------------------------------------
# --decision-log: a write that fails surfaces while running, not at exit
# ---------------------------------------------------------------------------------------

def check_whole_lines(partial):
    """A decision log .partial left by a failure: a header and whole decision lines only."""
    text = partial.read_bytes()
    assert text.endswith(b"\n"), f"torn last line: {text[-80:]!r}"
    lines = text.decode().splitlines()
    assert json.loads(lines[0])["fmoe_decision_log"] == 1
    for line in lines[1:]:
        json.loads(line)
    return len(lines) - 1


def serve_decision_log_until_full(fmoe_bin, tmp_path, log, preexec):
    """The reported case: serve --decision-log on a full disk answered every request 200,
    /health said ok, nothing was written until exit 1, and the .partial ended in a torn
    line. Now the request whose decisions cannot be written fails with 507 naming the log,
    the error is logged at once, /health says degraded, the next request is refused with
    503, and at SIGTERM exit 1 leaves a .partial of whole lines."""
    import select

    from serve_util import Server

    srv = Server(tmp_path, "--model", TINY, "--policy", "lru", "--cache-experts", 12,
                 "--decision-log", log, preexec=preexec)
    answered = 0
    try:
        for i in range(200):
            st, _, body = srv.post("/v1/completions", {"model": "m", "prompt": f"request {i}",
                                                       "max_tokens": 8, "temperature": 0})
            if st != 200:
                break
            answered += 1
        else:
            pytest.fail("the decision log never filled the disk")
        assert st == 507, (st, body)
        err = json.loads(body)["error"]
        assert "decision log" in err["message"] and log.name in err["message"], err
        fd = srv.proc.stderr.fileno()
        os.set_blocking(fd, False)
        logged = b""
        for _ in range(40):
            if b"decision log cannot be written" in logged:
                break
            select.select([fd], [], [], 0.05)
            logged += os.read(fd, 65536) if select.select([fd], [], [], 0)[0] else b""
        assert b"decision log cannot be written" in logged, logged
        st, _, body = srv.request("GET", "/health")
        assert st == 503 and json.loads(body)["status"] == "degraded", body
        st, _, body = srv.post("/v1/completions", {"model": "m", "prompt": "after",
                                                   "max_tokens": 4})
        assert st == 503 and "decision log" in json.loads(body)["error"]["message"], body
    finally:
        os.set_blocking(srv.proc.stderr.fileno(), True)
        rc, stderr = srv.stop()
    assert rc == 1, stderr
    assert f"{log.name}.partial" in stderr, stderr
    assert not log.exists()
    assert check_whole_lines(log.parent / f"{log.name}.partial") > 0
    return answered


@pytest.mark.parametrize("limit", [16 << 10, 64 << 10])
def test_serve_decision_log_file_size_limit(fmoe_bin, tmp_path, limit):
    serve_decision_log_until_full(fmoe_bin, tmp_path, tmp_path / "live.jsonl",
                                  limit_file_size(limit))


@pytest.mark.parametrize("leave", [16 << 10, 64 << 10])
def test_serve_decision_log_no_space_left(fmoe_bin, small_fs, leave):
    d = small_fs / "serve"
    d.mkdir()
    fill(d, leave)
    serve_decision_log_until_full(fmoe_bin, d, d / "live.jsonl", None)


def test_record_decision_log_no_space_left(fmoe_bin, small_fs, tmp_path):
    """record --decision-log whose log cannot be written (the log on the full tmpfs, the
    trace beside the test, since under RLIMIT_FSIZE the trace's journal fills first): it
    used to record every request and fail only at close, leaving a torn .partial; now it
    stops at the first request whose decisions cannot be written, with one line naming the
    log, exit 1, and nothing left (the full-disk promise of every output)."""
    d = small_fs / "rec"
    d.mkdir()
    log, out = d / "live.jsonl", tmp_path / "rec.h5"
    log.write_bytes(PREVIOUS)
    fill(d, 32 << 10)
    argv = ["record", "--model", TINY, "--dataset", SAMPLES / "prompts_100.txt",
            "--max-requests", "40", "--max-new-tokens", "8", "--threads", "1", "-q",
            "--policy", "lru", "--cache-experts", "12", "--log-requests",
            "--decision-log", log, "-o", "OUT"]
    p = run(fmoe_bin, argv, out)
    assert p.returncode == 1, p.stderr
    lines = [x for x in p.stderr.strip().splitlines() if "recorded (" not in x]
    assert len(lines) == 1, p.stderr
    assert f"{log.name}.partial" in lines[0] and "No space left on device" in lines[0], lines[0]
    assert p.stderr.count("recorded (") < 40, "every request was recorded before it failed"
    assert log.read_bytes() == PREVIOUS
    assert not out.exists()
    left = [x.name for x in [*d.iterdir(), *tmp_path.iterdir()] if ".partial" in x.name]
    assert not left, left
