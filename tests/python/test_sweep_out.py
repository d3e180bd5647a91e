"""`fmoe simulate` sweeps in one process: --sweep-out and --resume, several traces and
hardware profiles (docs/scaling-out.md; the MPI runs are in test_mpi.py).

The reference is always an uninterrupted plain run of the same grid: a sweep killed at an
exact cell (FMOE_FAULT_SIGNAL=sweep-cell#N:9) and resumed prints the same JSON byte for
byte; the file holds one line per finished cell; a sweep over two traces and two presets
is, unit by unit, the plain run of each trace on each preset.
"""
import json
import os
import pathlib
import shutil
import subprocess

import pytest

from conftest import run_fmoe

REPO = pathlib.Path(__file__).resolve().parents[2]
TINY = REPO / "datasets" / "fmoe-tiny"
PROMPTS = REPO / "datasets" / "samples" / "prompts_100.txt"

GRID = ["--policy", "lru,lfu,belady,fmoe", "--cache-experts", "4,8,16",
        "--prefetch-distance", "1,2", "--quiet"]


@pytest.fixture(scope="module")
def traces(fmoe_bin, tmp_path_factory):
    d = tmp_path_factory.mktemp("sweep")
    lines = PROMPTS.read_text().splitlines()
    out = []
    for name, sl in (("a", slice(0, 10)), ("b", slice(20, 28))):
        (d / f"{name}.txt").write_text("\n".join(lines[sl]) + "\n")
        run_fmoe(fmoe_bin, "record", "--model", TINY, "--dataset", d / f"{name}.txt",
                 "--max-new-tokens", "6", "--threads", "1", "--quiet", "-o", d / f"{name}.h5")
        out.append(d / f"{name}.h5")
    return out


def test_killed_sweep_resumes_to_the_same_result(fmoe, fmoe_bin, traces, tmp_path):
    t = traces[0]
    plain = fmoe("simulate", "--trace", t, *GRID, "--json").stdout
    cells = len(json.loads(plain)["results"])
    out = tmp_path / "s.jsonl"
    env = dict(os.environ, FMOE_FAULT_SIGNAL="sweep-cell#5:9")
    p = subprocess.run([str(fmoe_bin), "simulate", "--trace", str(t), *GRID, "--json",
                        "--threads", "2", "--sweep-out", str(out)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == -9 and p.stdout == ""
    lines = out.read_text().splitlines()
    assert len(lines) == 1 + 5 and json.loads(lines[0])["fmoe_sweep"] == 1
    # a torn last line (a kill mid-write) is cut off
    with open(out, "a") as f:
        f.write('{"cell": {"trace"')
    # without --resume the file is refused (usage), with it the rest runs
    p = fmoe("simulate", "--trace", t, *GRID, "--json", "--sweep-out", out, check=False)
    assert p.returncode == 2 and "--resume" in p.stderr
    p = fmoe("simulate", "--trace", t, *GRID[:-1], "--json", "--sweep-out", out, "--resume")
    assert p.stdout == plain
    assert f"holds 5 of the {cells} cells" in p.stderr
    assert len(out.read_text().splitlines()) == 1 + cells
    # resumed again: nothing to run, the same result
    p = fmoe("simulate", "--trace", t, *GRID, "--json", "--sweep-out", out, "--resume")
    assert p.stdout == plain


def test_sweep_out_refuses_other_settings(fmoe, traces, tmp_path):
    out = tmp_path / "s.jsonl"
    fmoe("simulate", "--trace", traces[0], *GRID, "--sweep-out", out)
    p = fmoe("simulate", "--trace", traces[0], *GRID, "--copy-chunks", "2", "--sweep-out", out,
             "--resume", check=False)
    assert p.returncode == 1 and "other settings" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    p = fmoe("simulate", "--trace", traces[0], *GRID, "--resume", check=False)
    assert p.returncode == 2 and "--sweep-out" in p.stderr


def test_several_traces_and_presets(fmoe, traces, tmp_path):
    hw = ["rtx3090-pcie4", "h100-pcie5"]
    both = json.loads(fmoe("simulate", "--trace", traces[0], "--trace", traces[1],
                           "--hardware", ",".join(hw), *GRID, "--json").stdout)["sweeps"]
    assert len(both) == 4
    k = 0
    for t in traces:
        for h in hw:
            one = json.loads(fmoe("simulate", "--trace", t, "--hardware", h, *GRID,
                                  "--json").stdout)
            assert both[k] == one
            k += 1
    # a glob names both (sorted), the same sweep; with --sweep-out, the same result
    glob = str(traces[0].parent / "*.h5")
    out = tmp_path / "g.jsonl"
    g = json.loads(fmoe("simulate", "--trace", glob, "--hardware", ",".join(hw), *GRID,
                        "--json", "--sweep-out", out).stdout)["sweeps"]
    assert g == both
    csv = fmoe("simulate", "--trace", glob, "--hardware", ",".join(hw), *GRID,
               "--csv", "-").stdout.splitlines()
    assert csv[0].startswith("trace,hardware,policy,")
    assert len(csv) == 1 + sum(len(s["results"]) for s in both)
    p = fmoe("simulate", "--trace", glob, *GRID, "--plot", tmp_path / "x.svg", check=False)
    assert p.returncode == 2 and "--plot" in p.stderr
    p = fmoe("simulate", "--trace", str(traces[0].parent / "nothing-*.h5"), *GRID, check=False)
    assert p.returncode == 1 and "no file matches" in p.stderr


def test_resume_refuses_a_trace_replaced_under_the_same_path(fmoe, fmoe_bin, traces, tmp_path):
    """Cells are keyed by the trace's content, not its path: the file's cells of t.h5 were
    computed on trace a; t.h5 is then replaced by trace b and the sweep resumed. Before, a's
    rows were printed under b's header, exit 0; now it is refused in one line naming both
    identities. The same trace (a copy: same content) resumes as before."""
    t = tmp_path / "t.h5"
    shutil.copy(traces[0], t)
    out = tmp_path / "s.jsonl"
    env = dict(os.environ, FMOE_FAULT_SIGNAL="sweep-cell#3:9")
    p = subprocess.run([str(fmoe_bin), "simulate", "--trace", str(t), *GRID, "--json",
                        "--threads", "1", "--sweep-out", str(out)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == -9
    saved = out.read_bytes()
    shutil.copy(traces[1], t)  # another trace, the same path
    p = fmoe("simulate", "--trace", t, *GRID, "--json", "--sweep-out", out, "--resume",
             check=False)
    assert p.returncode == 1 and p.stdout == "", p.stdout
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "replaced" in lines[0] and str(t) in lines[0], p.stderr
    assert out.read_bytes() == saved  # nothing appended
    ids = {json.loads(x)["cell"]["trace_id"] for x in out.read_text().splitlines()[1:]}
    assert len(ids) == 1 and len(ids.pop()) == 64
    # the trace the file was written for (a copy of it) resumes to the plain result
    shutil.copy(traces[0], t)
    plain = fmoe("simulate", "--trace", t, *GRID, "--json").stdout
    p = fmoe("simulate", "--trace", t, *GRID, "--json", "--sweep-out", out, "--resume")
    assert p.stdout == plain

