"""Crash safety of the trace writer: `fmoe record` killed with SIGKILL at 50 (quick
tier: 20) seeded instants, and `fmoe serve --trace-out` killed under traffic; each time
`fmoe trace recover` must give a trace that h5py opens and that holds every request
finished before the kill, identical to the same requests of an uninterrupted run.

What "finished" means: `fmoe record --log-requests` prints "request P recorded" on stderr
after the request's append returned (the writer journals it before that), and `fmoe serve`
answers a request only after its trace append. The kill instants are drawn from a seeded
generator over the whole run (start-up, prefill, decode, appends, the close): after a
random number of finished requests, plus a random share of a request's time; so some land
before the first request and a few after the end; the test requires most mid-run.
"""
import json
import os
import pathlib
import random
import re
import signal
import subprocess
import threading
import time

import numpy as np
import pytest

from conftest import FULL_TIER, REPO

h5py = pytest.importorskip("h5py")
import hdf5plugin  # noqa: F401,E402  (registers the zstd filter with h5py)

TINY = pathlib.Path(os.environ.get("FMOE_TEST_TINY", REPO / "datasets" / "fmoe-tiny"))
PROMPTS = REPO / "datasets" / "samples" / "prompts_100.txt"
# 50 kills in the full tier, 20 in the quick one: the spread of instants is the same
KILLS = 50 if FULL_TIER else 20
# Short prompts, a few decode tokens, every optional dataset (hidden states, speculative
# gates, /timing): each request is a handful of HDF5 extends and journal writes, so the
# instants fall inside appends often. --threads 1: the same tokens in every run.
RECORD_ARGS = ["--model", TINY, "--dataset", PROMPTS, "--max-requests", "16",
               "--max-new-tokens", "6", "--hidden", "--speculative", "2", "--threads", "1",
               "--log-requests"]
RECORDED = re.compile(r"^fmoe record: request (\d+) recorded", re.M)


def record_cmd(fmoe_bin, out):
    return [str(fmoe_bin), "record", *map(str, RECORD_ARGS), "-o", str(out)]


@pytest.fixture(scope="module")
def reference(fmoe_bin, tmp_path_factory):
    """An uninterrupted run: its trace and its wall time."""
    d = tmp_path_factory.mktemp("ref")
    out = d / "ref.h5"
    t = time.monotonic()
    p = subprocess.run(record_cmd(fmoe_bin, out), capture_output=True, text=True, timeout=300)
    elapsed = time.monotonic() - t
    assert p.returncode == 0, p.stderr
    assert not (d / "ref.h5.partial.journal").exists(), "the journal outlived the close"
    with h5py.File(out, "r") as f:
        ref = {k: f[k][()] for k in ("requests/id", "requests/token_offset", "tokens/token_id",
                                     "tokens/experts", "tokens/probs", "tokens/hidden",
                                     "tokens/speculative")}
    return ref, elapsed


def check_prefix(path, ref, at_least):
    """The trace at `path` opens in h5py, holds >= at_least requests, and its requests are
    the reference's first ones, token for token."""
    with h5py.File(path, "r") as f:
        assert f.attrs["format"] == "fmoe-trace"
        ids = f["requests/id"][()]
        R = len(ids)
        assert R >= at_least, f"{path}: {R} requests, {at_least} were finished before the kill"
        assert list(ids) == list(ref["requests/id"][:R])
        off = f["requests/token_offset"][()]
        assert list(off) == list(ref["requests/token_offset"][:R + 1])
        T = int(off[-1])
        for k in ("tokens/token_id", "tokens/experts", "tokens/probs", "tokens/hidden",
                  "tokens/speculative"):
            got = f[k][()]
            assert got.shape[0] == T, (k, got.shape, T)
            np.testing.assert_array_equal(got, ref[k][:T], err_msg=k)
        # every per-iteration and per-token table is as long as the requests say
        assert f["timing/iteration_s"].shape[0] == f["timing/layer_s"].shape[0]
        return R


def test_record_killed_at_random_instants(fmoe_bin, fmoe, reference, tmp_path):
    ref, elapsed = reference
    n_ref = len(ref["requests/id"])
    per_request = elapsed / (n_ref + 1)  # the start-up counted as about one request
    rng = random.Random(20240915)
    mid_run = recovered_total = completed = torn = 0
    for i in range(KILLS):
        d = tmp_path / f"k{i}"
        d.mkdir()
        out = d / "t.h5"
        partial = d / "t.h5.partial"
        journal = d / "t.h5.partial.journal"
        # The instant: after k requests were reported (k uniform in 0..n-1; 0 = from the
        # start), then a uniform share of up to 1.5 requests' time. Anchoring on progress
        # rather than on the clock keeps the spread the same on a loaded machine.
        k = rng.randrange(0, n_ref)
        extra = rng.uniform(0, 1.5 * per_request)
        with open(d / "stderr", "w") as err:
            proc = subprocess.Popen(record_cmd(fmoe_bin, out), stdout=subprocess.DEVNULL,
                                    stderr=err)
            deadline = time.monotonic() + 120
            while (k and len(RECORDED.findall((d / "stderr").read_text())) < k
                   and proc.poll() is None):
                assert time.monotonic() < deadline
                time.sleep(0.002)
            time.sleep(extra)
            proc.send_signal(signal.SIGKILL)
            rc = proc.wait()
        finished = [int(m) for m in RECORDED.findall((d / "stderr").read_text())]
        if rc == 0:  # it finished before the kill: a complete trace, nothing left over
            completed += 1
            assert out.exists() and not partial.exists() and not journal.exists()
            check_prefix(out, ref, len(ref["requests/id"]))
            continue
        assert rc == -signal.SIGKILL
        if out.exists():  # killed after the rename, while freeing the model: complete
            completed += 1
            assert not partial.exists() and not journal.exists()
            check_prefix(out, ref, len(ref["requests/id"]))
            continue
        if finished:
            mid_run += 1
        if not journal.exists() and not partial.exists():
            assert not finished, f"kill {i}: {len(finished)} requests finished, nothing left"
            continue
        journal_before = journal.exists()
        p = fmoe("trace", "recover", partial, "--json", check=False)
        if p.returncode != 0:
            # only a run killed before its first request may have nothing to recover
            assert not finished, f"kill {i}: recover failed: {p.stderr}"
            assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1, p.stderr
            continue
        rep = json.loads(p.stdout)
        torn += rep["dropped_bytes"] > 0  # killed inside a journal append
        # "partial": killed in the close, after the journal went and before the rename
        assert rep["source"] == "journal" or (rep["source"] == "partial" and not journal_before)
        assert not partial.exists() and not journal.exists()
        R = check_prefix(out, ref, len(finished))
        assert rep["requests"] == R
        # the finished ones are the first requests, in order
        assert finished == list(ref["requests/id"][:len(finished)])
        recovered_total += R
    print(f"\n{KILLS} kills: {mid_run} after some requests finished, {completed} after the "
          f"run ended, {torn} inside a journal record; {recovered_total} requests recovered")
    # the instants must have exercised the middle of the run, not only its edges
    assert mid_run >= KILLS // 2, f"only {mid_run} of {KILLS} kills landed mid-run"
    assert recovered_total > 0


def test_recovered_trace_feeds_inspect(fmoe_bin, fmoe, reference, tmp_path):
    """A recovered trace is an ordinary one: inspect and simulate read it."""
    ref, elapsed = reference
    out = tmp_path / "t.h5"
    with open(tmp_path / "stderr", "w") as err:
        proc = subprocess.Popen(record_cmd(fmoe_bin, out), stdout=subprocess.DEVNULL,
                                stderr=err)
        deadline = time.monotonic() + 120
        while len(RECORDED.findall((tmp_path / "stderr").read_text())) < 3:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    # a new run refuses to start over the journal: its requests would be lost
    p = fmoe("record", *RECORD_ARGS, "-o", out, check=False)
    assert p.returncode == 1 and "fmoe trace recover" in p.stderr, p.stderr
    assert (tmp_path / "t.h5.partial.journal").exists()
    p = fmoe("trace", "recover", tmp_path / "t.h5.partial", "-o", tmp_path / "r.h5")
    assert "Recovered" in p.stdout
    R = check_prefix(tmp_path / "r.h5", ref, 3)
    assert not (tmp_path / "t.h5.partial").exists()
    assert re.search(rf"^  requests +{R}$", fmoe("inspect", tmp_path / "r.h5").stdout, re.M)
    fmoe("simulate", "--trace", tmp_path / "r.h5", "--policy", "lru", "--cache-experts", "8",
         "--quiet")
    # recover never replaces a trace
    (tmp_path / "x.h5.partial").write_bytes(b"junk")
    (tmp_path / "x.h5").write_bytes(b"keep")
    p = fmoe("trace", "recover", tmp_path / "x.h5.partial", check=False)
    assert p.returncode == 1 and "exists" in p.stderr
    assert (tmp_path / "x.h5").read_bytes() == b"keep"
    # without a journal a damaged .partial is refused in one line, and kept
    (tmp_path / "x.h5").unlink()
    p = fmoe("trace", "recover", tmp_path / "x.h5.partial", check=False)
    assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "no journal" in p.stderr and (tmp_path / "x.h5.partial").exists()


def test_record_sigterm_keeps_finished_requests(fmoe_bin, fmoe, reference, tmp_path):
    """SIGINT/SIGTERM stop the recorder at the next token: exit 128 + signal, the finished
    requests in a whole .partial (and the journal), which recover turns into the trace."""
    ref, _ = reference
    for sig in (signal.SIGTERM, signal.SIGINT):
        d = tmp_path / sig.name
        d.mkdir()
        out = d / "t.h5"
        with open(d / "stderr", "w") as err:
            proc = subprocess.Popen(record_cmd(fmoe_bin, out), stdout=subprocess.DEVNULL,
                                    stderr=err)
            deadline = time.monotonic() + 120
            while len(RECORDED.findall((d / "stderr").read_text())) < 2:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.01)
            proc.send_signal(sig)
            rc = proc.wait(timeout=60)
        text = (d / "stderr").read_text()
        assert rc == 128 + sig, text
        assert f"{sig.name}: stopped after" in text and "fmoe trace recover" in text
        finished = len(RECORDED.findall(text))
        with h5py.File(d / "t.h5.partial", "r") as f:  # closed cleanly: whole as it is
            assert f["requests/id"].shape[0] == finished
        fmoe("trace", "recover", d / "t.h5.partial")
        assert check_prefix(out, ref, finished) == finished


def journal_records(data):
    """(start, end) of each record of a journal, from its own framing: a 16-byte file
    header, then records of a 16-byte head (u32 kind, u32 crc, u64 length) and the
    payload."""
    at, out = 16, []
    while at + 16 <= len(data):
        n = int.from_bytes(data[at + 8:at + 16], "little")
        out.append((at, at + 16 + n))
        at += 16 + n
    return out


def test_recover_one_flipped_bit(fmoe_bin, fmoe, reference, tmp_path):
    """One bit flipped in the middle of a journal is damage, not a kill: recover exits 1
    naming the damaged record's offset, recovers every other record (and, with the
    .partial beside it, the trace is the .partial's, which holds them all), and removes
    nothing: the journal and the .partial stay byte for byte."""
    ref, _ = reference
    d = tmp_path / "run"
    d.mkdir()
    with open(d / "stderr", "w") as err:
        proc = subprocess.Popen(record_cmd(fmoe_bin, d / "t.h5"), stdout=subprocess.DEVNULL,
                                stderr=err)
        deadline = time.monotonic() + 120
        while len(RECORDED.findall((d / "stderr").read_text())) < 5:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)  # a whole .partial and its journal
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finished = len(RECORDED.findall((d / "stderr").read_text()))
    journal = bytearray((d / "t.h5.partial.journal").read_bytes())
    partial = (d / "t.h5.partial").read_bytes()
    records = journal_records(journal)
    assert len(records) == 1 + finished and records[-1][1] == len(journal)
    flip = len(journal) // 2
    hit = next(i for i, (a, b) in enumerate(records) if a <= flip < b)
    assert 1 <= hit < len(records) - 1, "the middle byte should fall in a middle request"
    journal[flip] ^= 0x20
    for with_partial in (True, False):
        w = tmp_path / ("both" if with_partial else "journal-only")
        w.mkdir()
        (w / "t.h5.partial.journal").write_bytes(journal)
        if with_partial:
            (w / "t.h5.partial").write_bytes(partial)
        p = fmoe("trace", "recover", w / "t.h5.partial", "--json", check=False)
        assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr
        assert f"damaged at byte {records[hit][0]}" in p.stderr, p.stderr
        rep = json.loads(p.stdout)
        assert rep["damaged"] and rep["kept"] and rep["damaged_at"] == records[hit][0]
        assert rep["journal_requests"] == finished - 1
        with h5py.File(w / "t.h5", "r") as f:
            ids = list(f["requests/id"][()])
        if with_partial:
            assert rep["source"] == "partial" and rep["partial_requests"] == finished
            assert check_prefix(w / "t.h5", ref, finished) == finished
        else:
            lost = ref["requests/id"][hit - 1]
            assert ids == [i for i in ref["requests/id"][:finished] if i != lost]
        assert (w / "t.h5.partial.journal").read_bytes() == journal
        if with_partial:
            assert (w / "t.h5.partial").read_bytes() == partial
        assert not (w / "t.h5.recovering").exists()


def test_serve_trace_out_killed(fmoe_bin, fmoe, tmp_path):
    """`fmoe serve --trace-out` killed with SIGKILL while answering requests: every request
    answered before the kill is in the recovered trace (the server answers only after the
    request is appended)."""
    trace = tmp_path / "served.h5"
    from serve_util import Server
    s = Server(tmp_path, "--parallel", 2, "--threads", 1, "--trace-out", trace)
    answered = []
    stop = threading.Event()

    def client(k):
        n = 0
        while not stop.is_set():
            st, _, body = s.post("/v1/completions", {"model": "m", "prompt": f"Hello {k} {n}",
                                                     "max_tokens": 4, "temperature": 0},
                                 timeout=30)
            if st != 200:
                return
            answered.append(json.loads(body)["usage"]["prompt_tokens"])
            n += 1

    threads = [threading.Thread(target=client, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while len(answered) < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    done_before_kill = len(answered)
    s.proc.send_signal(signal.SIGKILL)
    s.proc.wait()
    stop.set()
    for t in threads:
        t.join()
    assert done_before_kill >= 6
    assert not trace.exists()
    fmoe("trace", "recover", tmp_path / "served.h5.partial")
    with h5py.File(trace, "r") as f:
        assert int(f.attrs["served"]) == 1
        assert f["requests/id"].shape[0] >= done_before_kill
        T = int(f["requests/token_offset"][-1])
        assert f["tokens/served_iteration"].shape[0] == T


def import_argv(fmoe_bin):
    """`trace import` of the bundled FLAME-MoE sample (8 layer files), output not given."""
    flame = [REPO / "datasets" / "samples" / "flame-moe-290m" / f"layer{i:02d}.csv"
             for i in range(2, 10)]
    return [str(fmoe_bin), "trace", "import", "--format", "dense-csv", "--layers", "8",
            "--experts", "64", "--top-k", "6", "--tokens-per-request", "64",
            *map(str, flame), "--quiet"]


IMPORT_POINTS = ["trace-request#1", "trace-request#3", "commit-before-rename",
                 "commit-after-rename"]


@pytest.mark.parametrize("point", IMPORT_POINTS)
def test_import_interrupted_leaves_nothing_or_everything(fmoe_bin, tmp_path, point):
    """SIGTERM, SIGINT or SIGHUP during `trace import`: the importer dies of the signal and
    leaves no .partial, and the output is either absent or complete — never a piece of it.
    Absent when the signal lands before the rename that commits the output (an import is
    simply run again); complete when it lands after (the rename is atomic, so the output is
    the finished file). Each dangerous instant is hit exactly, by the fault-injection hook
    FMOE_FAULT_SIGNAL (lib/files.h), not by racing a timer."""
    argv = import_argv(fmoe_bin)
    full = tmp_path / "full.h5"
    p = subprocess.run([*argv, "-o", str(full)], capture_output=True)
    assert p.returncode == 0, p.stderr
    with h5py.File(full, "r") as f:
        assert f["requests/id"].shape[0] >= 4, "the sample must span several requests"
        want = {k: f[k][()] for k in ("requests/id", "requests/token_offset",
                                      "tokens/experts")}
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        out = tmp_path / f"{point.replace('#', '-')}-{sig.name}.h5"
        env = dict(os.environ, FMOE_FAULT_SIGNAL=f"{point}:{int(sig)}")
        p = subprocess.run([*argv, "-o", str(out)], capture_output=True, env=env, timeout=120)
        assert p.returncode == -sig, (point, sig.name, p.returncode, p.stderr)
        assert not pathlib.Path(f"{out}.partial").exists(), (point, sig.name)
        if point != "commit-after-rename":
            assert not out.exists(), (point, sig.name)
            continue
        with h5py.File(out, "r") as f:
            for k, v in want.items():
                assert np.array_equal(f[k][()], v), (point, sig.name, k)


def test_fault_hook_is_inert_when_unset_or_unknown(fmoe_bin, tmp_path):
    """The hook fires only at the named point: an unknown point or a passage that never
    comes leaves the import to finish normally."""
    argv = import_argv(fmoe_bin)
    for i, v in enumerate(("no-such-point", "trace-request#1000000", "")):
        out = tmp_path / f"o{i}.h5"
        env = dict(os.environ, FMOE_FAULT_SIGNAL=v)
        p = subprocess.run([*argv, "-o", str(out)], capture_output=True, env=env, timeout=120)
        assert p.returncode == 0 and out.exists(), (v, p.stderr)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_calibrate_and_dump_logits_interrupted_leave_no_partial(fmoe_bin, tmp_path, sig):
    """`fmoe calibrate -o` and `fmoe generate --dump-logits` killed while their output is
    written (complete in the .partial, not yet renamed: FMOE_FAULT_SIGNAL's
    commit-before-rename) die of the signal and leave neither the output nor its .partial,
    as trace import does."""
    env = dict(os.environ, FMOE_FAULT_SIGNAL=f"commit-before-rename:{int(sig)}")
    prof, npy = tmp_path / "prof.json", tmp_path / "logits.npy"
    runs = {
        prof: [str(fmoe_bin), "calibrate", "--quick", "--quiet", "--file-dir", str(tmp_path),
               "-o", str(prof)],
        npy: [str(fmoe_bin), "generate", "--model", str(TINY), "--prompt", "Hello",
              "--max-new-tokens", "3", "--threads", "1", "--dump-logits", str(npy)],
    }
    for out, argv in runs.items():
        p = subprocess.run(argv, capture_output=True, env=env, timeout=120)
        assert p.returncode == -sig, (argv[1], p.returncode, p.stderr)
        assert not pathlib.Path(f"{out}.partial").exists(), argv[1]
        assert not out.exists(), argv[1]
        # the same run uninterrupted writes the output: the hook, not a failure, stopped it
        p = subprocess.run(argv, capture_output=True, timeout=120)
        assert p.returncode == 0 and out.exists(), (argv[1], p.stderr)
        out.unlink()
