"""`fmoe trace recover` over a journal that lost bytes: nothing lost, nothing silent.

A real recorder (fmoe-tiny) is stopped by SIGTERM right after its 12th request (the fault
hook FMOE_FAULT_SIGNAL), which leaves a whole `t.h5.partial` of 12 requests and its
journal. The journal is then cut or one bit of it flipped, as the issue "Nothing lost,
nothing silent" reported:

- cut to its header record, or at a record boundary: it reads clean (no torn tail, no
  damage), but the .partial lists requests it lacks, which no kill can do (each request is
  journalled before the .partial gets it). Before: 0 (or 5) of 12 recovered, exit 0, the
  .partial deleted.
- one bit of the last record's length field flipped: the record's CRC field shows it was
  whole, yet it was taken for a torn tail ("dropped the bytes of a request the kill cut
  short"), exit 0, the request gone, the journal and the .partial deleted.

Now each is exit 1 with one line on stderr naming the journal and the byte offset, the
trace is the .partial's copy with all 12 requests, and both leftovers are unchanged byte for
byte. Journal framing (docs/formats/trace.md): a 16-byte file header, then records of a
16-byte head (u32 kind, u32 CRC-32C, u64 length) and the payload.
"""
import json
import os
import pathlib
import signal
import subprocess

import pytest

from conftest import REPO

h5py = pytest.importorskip("h5py")
import hdf5plugin  # noqa: F401,E402  (registers the zstd filter with h5py)

TINY = REPO / "datasets" / "fmoe-tiny"
PROMPTS = REPO / "datasets" / "samples" / "prompts_100.txt"
REQUESTS = 12


@pytest.fixture(scope="module")
def stopped(fmoe_bin, tmp_path_factory):
    """(the .partial's bytes, the journal's bytes, the 12 request ids) of a recorder stopped
    by SIGTERM after its 12th request."""
    d = tmp_path_factory.mktemp("stopped")
    env = dict(os.environ, FMOE_FAULT_SIGNAL=f"trace-request#{REQUESTS}:{int(signal.SIGTERM)}")
    p = subprocess.run([str(fmoe_bin), "record", "--model", str(TINY), "--dataset", str(PROMPTS),
                        "--max-requests", "20", "--max-new-tokens", "2", "--threads", "1", "-q",
                        "-o", str(d / "t.h5")], capture_output=True, text=True, env=env,
                       timeout=300)
    assert p.returncode == 128 + signal.SIGTERM, p.stderr
    assert f"stopped after {REQUESTS} requests" in p.stderr, p.stderr
    with h5py.File(d / "t.h5.partial", "r") as f:
        ids = list(f["requests/id"][()])
    assert len(ids) == REQUESTS
    return (d / "t.h5.partial").read_bytes(), (d / "t.h5.partial.journal").read_bytes(), ids


def records(journal):
    """(start, end) of each record, the header record first."""
    at, out = 16, []
    while at + 16 <= len(journal):
        n = int.from_bytes(journal[at + 8:at + 16], "little")
        out.append((at, at + 16 + n))
        at += 16 + n
    return out


def recover(fmoe_bin, d, partial, journal):
    """Lays out the leftovers in the new folder d and runs recover --json on them."""
    d.mkdir()
    if partial is not None:
        (d / "t.h5.partial").write_bytes(partial)
    (d / "t.h5.partial.journal").write_bytes(journal)
    return subprocess.run([str(fmoe_bin), "trace", "recover", str(d / "t.h5.partial"), "--json"],
                          capture_output=True, text=True, timeout=120)


def check_kept(p, d, partial, journal, ids, offset):
    """Exit 1, one line naming the journal and the offset, the trace of every request, and
    both leftovers byte for byte."""
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert "t.h5.partial.journal" in lines[0] and f"at byte {offset}" in lines[0], lines[0]
    rep = json.loads(p.stdout)
    assert rep["damaged"] and rep["kept"] and rep["damaged_at"] == offset, rep
    assert rep["source"] == "partial" and rep["requests"] == REQUESTS, rep
    assert rep["dropped_bytes"] == 0, rep
    with h5py.File(d / "t.h5", "r") as f:
        assert list(f["requests/id"][()]) == ids
    assert (d / "t.h5.partial").read_bytes() == partial
    assert (d / "t.h5.partial.journal").read_bytes() == journal
    assert not (d / "t.h5.recovering").exists()


@pytest.mark.parametrize("whole", [0, 5, REQUESTS - 1])
def test_journal_cut_at_a_record_boundary_keeps_the_partial(fmoe_bin, stopped, tmp_path, whole):
    """The journal cut to its header record (0 requests left) or after `whole` requests."""
    partial, journal, ids = stopped
    rec = records(journal)
    assert len(rec) == 1 + REQUESTS and rec[-1][1] == len(journal)
    cut = rec[whole][1]
    d = tmp_path / "run"
    p = recover(fmoe_bin, d, partial, journal[:cut])
    check_kept(p, d, partial, journal[:cut], ids, cut)
    assert "cut short" in p.stderr and json.loads(p.stdout)["journal_requests"] == whole


@pytest.mark.parametrize("bit", [18, 0, 63])
def test_last_record_length_flip_is_damage(fmoe_bin, stopped, tmp_path, bit):
    """One bit of the last record's length field (bit 18 made it run past the end of the
    file: the reported case; bit 0 one byte longer; bit 63 absurdly long)."""
    partial, journal, ids = stopped
    last = records(journal)[-1][0]
    bad = bytearray(journal)
    bad[last + 8 + bit // 8] ^= 1 << (bit % 8)
    bad = bytes(bad)
    d = tmp_path / "both"
    p = recover(fmoe_bin, d, partial, bad)
    check_kept(p, d, partial, bad, ids, last)
    assert "cut short" not in p.stderr
    # without --json: no "dropped the bytes of a request the kill cut short"
    (d / "t.h5").unlink()
    q = subprocess.run([str(fmoe_bin), "trace", "recover", str(d / "t.h5.partial")],
                       capture_output=True, text=True, timeout=120)
    assert q.returncode == 1 and "kill cut short" not in q.stdout + q.stderr, q.stdout
    assert "removed nothing" in q.stdout, q.stdout
    # the journal alone: every other request, exit 1, the journal kept as it was
    d = tmp_path / "alone"
    p = recover(fmoe_bin, d, None, bad)
    assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert f"damaged at byte {last}" in p.stderr, p.stderr
    with h5py.File(d / "t.h5", "r") as f:
        assert list(f["requests/id"][()]) == ids[:-1]
    assert (d / "t.h5.partial.journal").read_bytes() == bad


def test_whole_journal_and_partial_still_go(fmoe_bin, stopped, tmp_path):
    """The leftovers as the stop left them: the trace from the journal, exit 0, both removed
    (the trace holds everything they did)."""
    partial, journal, ids = stopped
    d = tmp_path / "clean"
    p = recover(fmoe_bin, d, partial, journal)
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["source"] == "journal" and not rep["damaged"] and rep["requests"] == REQUESTS
    with h5py.File(d / "t.h5", "r") as f:
        assert list(f["requests/id"][()]) == ids
    assert sorted(x.name for x in d.iterdir()) == ["t.h5"]
