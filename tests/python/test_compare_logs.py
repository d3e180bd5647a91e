"""`fmoe compare-logs` on decision logs written here by hand (json.dumps, not fmoe's
writer), and fmoe's own writer checked with Python's json module.

The expected divergences and totals are computed in Python from the decisions the test
made, following the format in docs/formats/decision-log.md.
"""
import json
import os
import random
import subprocess

import pytest

EVENTS = ["access", "prefetch", "dropped", "cancel", "evict", "host", "promote", "landed"]
KEY_ORDER = ["event", "iteration", "layer", "expert", "slot", "victim", "result", "priority",
             "t"]
TOTAL_KEYS = ["lines"] + EVENTS + ["hits", "late", "misses"]
HEADER = {"fmoe_decision_log": 1, "source": "simulate", "meta": {"policy": "lru"}}


def decision(event, iteration, layer, expert, slot, t, victim=None, result=None,
             priority=None):
    d = {"event": event, "iteration": iteration, "layer": layer, "expert": expert,
         "slot": slot}
    if victim is not None:
        d["victim"] = victim
    if result is not None:
        d["result"] = result
    if priority is not None:
        d["priority"] = priority
    d["t"] = t
    return d


def line(d):
    return json.dumps(d, separators=(",", ":"))


def write_log(path, decisions, header=HEADER):
    with open(path, "w") as f:
        f.write(line(header) + "\n")
        for d in decisions:
            f.write(line(d) + "\n")
    return path


def random_decisions(rng, n):
    """n decisions of every kind, with the fields each kind carries."""
    out = []
    for i in range(n):
        event = rng.choice(EVENTS)
        d = decision(event, i // 20, rng.randrange(4), rng.randrange(8), rng.randrange(-1, 6),
                     round(i * 0.001 + rng.random() * 1e-4, 9),
                     victim=rng.randrange(32) if event in ("prefetch", "evict") and rng.random() < .7
                     else None,
                     result=rng.choice(["hit", "late", "miss"]) if event == "access" else None,
                     priority=rng.choice([0.5, 1.0 / 3.0, -2.0, 1e-300, 12345.678])
                     if event in ("prefetch", "promote") else None)
        out.append(d)
    return out


def totals(decisions):
    t = {k: 0 for k in TOTAL_KEYS}
    for d in decisions:
        t["lines"] += 1
        t[d["event"]] += 1
        if d["event"] == "access":
            t[{"hit": "hits", "late": "late", "miss": "misses"}[d["result"]]] += 1
    return t


def first_divergence(a, b, late_is_hit=False):
    """(index, line_a, line_b) by the format's rule, or None: landed lines are skipped, 't'
    is ignored, and with late_is_hit an access 'late' is a 'hit'."""
    def compared(ds):
        for n, d in enumerate(ds):
            if d["event"] != "landed":
                yield n + 2, d  # line 1 is the header

    def key(d):
        k = {x: d.get(x) for x in KEY_ORDER if x != "t"}
        if late_is_hit and k["result"] == "late":
            k["result"] = "hit"
        return k

    ca, cb = list(compared(a)), list(compared(b))
    for i in range(max(len(ca), len(cb))):
        la, da = ca[i] if i < len(ca) else (0, None)
        lb, db = cb[i] if i < len(cb) else (0, None)
        if da is None or db is None or key(da) != key(db):
            return i, la, lb
    return None


def compare(fmoe, a, b, *flags):
    p = fmoe("compare-logs", a, b, "--json", *flags, check=False)
    assert p.returncode in (0, 1), p.stderr
    return p.returncode, json.loads(p.stdout)


def test_identical_logs_exit_0(fmoe, tmp_path):
    ds = random_decisions(random.Random(1), 300)
    a = write_log(tmp_path / "a.jsonl", ds)
    b = write_log(tmp_path / "b.jsonl", ds)
    p = fmoe("compare-logs", a, b, check=False)
    assert p.returncode == 0, p.stderr
    assert "identical" in p.stdout
    rc, doc = compare(fmoe, a, b)
    assert rc == 0
    assert doc["identical"] is True
    assert doc["first_divergence"] is None
    assert doc["totals"]["a"] == totals(ds)
    assert doc["totals"]["b"] == totals(ds)
    assert list(doc["totals"]["a"]) == TOTAL_KEYS


def test_one_changed_slot(fmoe, tmp_path):
    ds = [decision("access", 0, 0, j, j, 0.1 * j, result="hit") for j in range(6)]
    other = [dict(d) for d in ds]
    other[3]["slot"] = 5
    other.insert(1, decision("landed", 0, 0, 9, 2, 0.05))  # B's lines shift by one
    a = write_log(tmp_path / "a.jsonl", ds)
    b = write_log(tmp_path / "b.jsonl", other)
    rc, doc = compare(fmoe, a, b)
    assert rc == 1
    assert doc["identical"] is False
    assert doc["first_divergence"] == {"index": 3, "line_a": 5, "line_b": 6,
                                       "a": line(ds[3]), "b": line(other[4])}
    assert doc["totals"]["b"]["landed"] == 1
    assert doc["totals"]["b"]["lines"] == 7

    p = fmoe("compare-logs", a, b, check=False)
    assert p.returncode == 1
    assert line(ds[3]) in p.stdout and line(other[4]) in p.stdout


@pytest.mark.parametrize("seed", [2, 3, 4])
def test_random_logs_against_python(fmoe, tmp_path, seed):
    """Random decisions, B's times jittered and landed lines added, one field changed at a
    random place: fmoe finds the divergence where Python does, with the same totals."""
    rng = random.Random(seed)
    ds = random_decisions(rng, 2000)
    other = []
    for d in ds:
        d = dict(d, t=d["t"] + rng.random())
        if rng.random() < 0.1:
            other.append(decision("landed", d["iteration"], 1, 1, 0, d["t"]))
        other.append(d)
    a = write_log(tmp_path / "a.jsonl", ds)
    b = write_log(tmp_path / "b.jsonl", other)
    rc, doc = compare(fmoe, a, b)
    assert first_divergence(ds, other) is None
    assert rc == 0 and doc["identical"] is True

    compared = [i for i, d in enumerate(other) if d["event"] != "landed"]
    k = compared[rng.randrange(len(compared) // 2, len(compared))]
    field = rng.choice(["iteration", "layer", "expert", "slot"])
    other[k] = dict(other[k], **{field: other[k][field] + 1})
    write_log(b, other)
    want = first_divergence(ds, other)
    assert want is not None
    rc, doc = compare(fmoe, a, b)
    assert rc == 1
    fd = doc["first_divergence"]
    assert (fd["index"], fd["line_a"], fd["line_b"]) == want
    assert json.loads(fd["b"]) == other[want[2] - 2]
    assert doc["totals"]["a"] == totals(ds)
    assert doc["totals"]["b"] == totals(other)


def test_timestamps_and_landed_lines_do_not_count(fmoe, tmp_path):
    ds = [decision("prefetch", 1, 2, 3, 4, 0.5, victim=7, priority=0.25),
          decision("access", 2, 2, 3, 4, 0.75, result="late")]
    other = [dict(ds[0], t=9.0), decision("landed", 1, 2, 3, 4, 0.6), dict(ds[1], t=1e-9),
             decision("landed", 2, 0, 0, 1, 2.0)]
    rc, doc = compare(fmoe, write_log(tmp_path / "a.jsonl", ds),
                      write_log(tmp_path / "b.jsonl", other))
    assert rc == 0
    assert doc["totals"]["a"]["landed"] == 0
    assert doc["totals"]["b"]["landed"] == 2


def test_priority_compared_exactly(fmoe, tmp_path):
    ds = [decision("prefetch", 0, 0, 1, 0, 0.0, priority=0.1 + 0.2)]
    a = write_log(tmp_path / "a.jsonl", ds)
    rc, _ = compare(fmoe, a, write_log(tmp_path / "b.jsonl", [dict(ds[0], priority=0.3)]))
    assert rc == 1
    # the same double, written another way
    (tmp_path / "c.jsonl").write_text(line(HEADER) + "\n" + line(ds[0]).replace(
        "0.30000000000000004", "3.0000000000000004e-1") + "\n")
    rc, _ = compare(fmoe, a, tmp_path / "c.jsonl")
    assert rc == 0


def test_late_is_hit(fmoe, tmp_path):
    ds = [decision("access", 0, 0, 1, 0, 0.0, result="hit"),
          decision("access", 0, 1, 1, 0, 0.1, result="late")]
    other = [ds[0], dict(ds[1], result="hit")]
    a = write_log(tmp_path / "a.jsonl", ds)
    b = write_log(tmp_path / "b.jsonl", other)
    rc, doc = compare(fmoe, a, b)
    assert rc == 1
    assert doc["first_divergence"]["index"] == 1
    assert doc["totals"]["a"]["late"] == 1 and doc["totals"]["b"]["hits"] == 2
    rc, doc = compare(fmoe, a, b, "--late-is-hit")
    assert rc == 0 and doc["first_divergence"] is None
    # a miss stays a miss
    rc, _ = compare(fmoe, a, write_log(tmp_path / "c.jsonl", [ds[0], dict(ds[1], result="miss")]),
                    "--late-is-hit")
    assert rc == 1


def test_one_log_ends_early(fmoe, tmp_path):
    ds = [decision("host", 0, 0, j, -1, 0.0) for j in range(5)]
    a = write_log(tmp_path / "a.jsonl", ds)
    b = write_log(tmp_path / "b.jsonl", ds[:3])
    rc, doc = compare(fmoe, a, b)
    assert rc == 1
    assert doc["first_divergence"] == {"index": 3, "line_a": 5, "line_b": 0, "a": line(ds[3]),
                                       "b": ""}
    assert doc["totals"]["a"]["lines"] == 5 and doc["totals"]["b"]["lines"] == 3
    rc, doc = compare(fmoe, b, a)
    assert (doc["first_divergence"]["line_a"], doc["first_divergence"]["a"]) == (0, "")


def test_quiet_prints_nothing(fmoe, tmp_path):
    ds = [decision("cancel", 0, 0, 1, 2, 0.0)]
    a = write_log(tmp_path / "a.jsonl", ds)
    b = write_log(tmp_path / "b.jsonl", [dict(ds[0], expert=2)])
    for other, want in ((a, 0), (b, 1)):
        p = fmoe("compare-logs", "--quiet", a, other, check=False)
        assert p.returncode == want
        assert p.stdout == "" and p.stderr == ""


@pytest.mark.parametrize("bad_line", [
    '{"event":"access","iteration":0,"layer":0,"expert":1,"slot":0,"t":0}',  # no result
    '{"event":"cancel","iteration":0,"layer":0,"expert":1,"slot":0,"t":0,"extra":1}',
    '{"event":"cancel","iteration":0,"layer":0,"expert":1,"slot":0,"t":0',
    '{"event":"teleport","iteration":0,"layer":0,"expert":1,"slot":0,"t":0}',
    'not json at all',
])
def test_malformed_line_exits_2(fmoe, tmp_path, bad_line):
    good = [decision("cancel", 0, 0, j, 0, 0.0) for j in range(3)]
    a = write_log(tmp_path / "a.jsonl", good)
    b = tmp_path / "b.jsonl"
    b.write_text(line(HEADER) + "\n" + line(good[0]) + "\n" + bad_line + "\n")
    for args in ((a, b), (b, a), (b, a, "--json")):
        p = fmoe("compare-logs", *args, check=False)
        assert p.returncode == 2
        assert p.stdout == ""
        err = p.stderr.strip().splitlines()
        assert len(err) == 1
        assert f"{b}:3: " in err[0]


def test_bad_header_exits_2(fmoe, tmp_path):
    a = write_log(tmp_path / "a.jsonl", [])
    for text in ["", line(decision("host", 0, 0, 1, -1, 0.0)) + "\n",
                 line(dict(HEADER, fmoe_decision_log=2)) + "\n"]:
        b = tmp_path / "b.jsonl"
        b.write_text(text)
        p = fmoe("compare-logs", a, b, check=False)
        assert p.returncode == 2
        assert f"{b}:1: " in p.stderr


def test_usage_and_missing_files_exit_2(fmoe, tmp_path):
    a = write_log(tmp_path / "a.jsonl", [])
    missing = tmp_path / "missing.jsonl"
    p = fmoe("compare-logs", a, missing, check=False)
    assert p.returncode == 2
    assert str(missing) in p.stderr and len(p.stderr.strip().splitlines()) == 1
    for args in ((), (a,), (a, a, a), (a, a, "--no-such-option"), (a, a, "--json", "--quiet")):
        p = fmoe("compare-logs", *args, check=False)
        assert p.returncode == 2, args
        assert p.stderr.startswith("fmoe compare-logs: ")
    # two empty logs are identical
    p = fmoe("compare-logs", a, a, check=False)
    assert p.returncode == 0


def test_help(fmoe):
    out = fmoe("compare-logs", "--help").stdout
    assert out.startswith("usage: fmoe compare-logs")
    for opt in ("--late-is-hit", "--json", "--quiet"):
        assert opt in out
    assert fmoe("help", "compare-logs").stdout == out
    assert "\n  compare-logs " in fmoe("--help").stdout


def test_c_writer_lines_are_json(build_dir, tmp_path):
    """The C test writes logs through fmoe_decision_log_* into FMOE_TEST_DLOG_OUT; every
    line must be JSON that Python reads, keys in the format's order, each kind with the
    keys it carries."""
    exe = build_dir / "tests" / "lib" / "test_decision_log"
    if not exe.exists():
        pytest.fail(f"{exe} not built")
    env = dict(os.environ, FMOE_TEST_DLOG_OUT=str(tmp_path))
    p = subprocess.run([str(exe), "writer_log_for_python"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    logs = sorted(tmp_path.glob("*.jsonl"))
    assert logs, "the C test wrote no log"
    seen = set()
    for path in logs:
        rows = path.read_text().splitlines()
        header = json.loads(rows[0])
        assert list(header)[:2] == ["fmoe_decision_log", "source"]
        assert header["fmoe_decision_log"] == 1
        assert isinstance(header.get("meta", {}), dict)
        for row in rows[1:]:
            d = json.loads(row)
            keys = list(d)
            assert keys == [k for k in KEY_ORDER if k in d], row
            assert {"event", "iteration", "layer", "expert", "slot", "t"} <= set(keys), row
            ev = d["event"]
            seen.add(ev)
            assert ("result" in d) == (ev == "access"), row
            assert ("priority" in d) == (ev in ("prefetch", "promote")), row
            if "victim" in d:
                assert ev in ("prefetch", "evict") and d["victim"] >= 0, row
            if ev == "access":
                assert d["result"] in ("hit", "late", "miss")
    assert seen == set(EVENTS)
