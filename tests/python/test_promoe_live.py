"""Policy promoe live against the simulator, decision for decision.

A predictor trained (`fmoe train-predictor --kind promoe --stride 1`) on an all-resident
recording of fmoe-tiny with --hidden over 30 bundled prompts drives a live greedy run of
10 other prompts (`fmoe record --hidden --policy promoe --predictor p.h5`), and `fmoe
simulate` of the trace that run recorded must make the same decisions (`fmoe
compare-logs --late-is-hit`), with timing held fixed as in test_offload_live.py
(--sync-transfers live, a zero-time link simulated), and the predictor inline
(--sync-predictions; on its thread, the live default, test_predict_thread.py).

The simulator hands promoe the trace's /tokens/hidden, stored as float16; the live
executor rounds the gate inputs it hands the policy to float16 and back with the trace
writer's conversion, so the predictor sees the same bits on both sides (and the values it
was trained on); without it the first prefetch's priority already differs.

The policy runs the predictor with fmoe_mlp_infer, which sums in index order without
BLAS: cblas_sgemm gave other bits with another OpenBLAS thread count (the live engine runs
it on one thread, simulate on all cores), so the simulation here runs at the default thread
count on purpose. Also: an offloaded promoe generation equals the all-resident one; a
predictor of another model, promoe without --predictor and --predictor with another
policy are one-line errors.
"""
import json
import os
import pathlib
import shutil

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
TINY = REPO / "datasets" / "fmoe-tiny"
PROMPTS = REPO / "datasets" / "samples" / "prompts_100.txt"

h5py = pytest.importorskip("h5py")
import hdf5plugin  # noqa: F401,E402
from conftest import run_fmoe  # noqa: E402
from test_offload_live import ZERO_LINK, decisions, read_log  # noqa: E402

run = run_fmoe  # conftest's
PROMPT = "The dictionary type maps keys to values, and"


@pytest.fixture(scope="module")
def work(tmp_path_factory, fmoe_bin):
    d = tmp_path_factory.mktemp("promoe-live")
    lines = PROMPTS.read_text().splitlines()
    (d / "train.txt").write_text("\n".join(lines[:30]) + "\n")
    (d / "live.txt").write_text("\n".join(lines[50:60]) + "\n")
    (d / "zero.json").write_text(json.dumps(ZERO_LINK))
    run(fmoe_bin, "record", "--model", TINY, "--dataset", d / "train.txt",
        "--max-new-tokens", 16, "--temperature", 0, "--hidden", "-o", d / "train.h5",
        "--quiet")
    run(fmoe_bin, "train-predictor", "--kind", "promoe", "--trace", d / "train.h5",
        "--stride", 1, "--seed", 3, "-o", d / "p.h5", "--quiet")
    return d


@pytest.mark.parametrize("n", [12, 24])
def test_live_and_simulated_promoe_decide_alike(work, fmoe_bin, n):
    trace = work / f"live-{n}.h5"
    live, sim = work / f"live-{n}.jsonl", work / f"sim-{n}.jsonl"
    run(fmoe_bin, "record", "--model", TINY, "--dataset", work / "live.txt",
        "--max-new-tokens", 12, "--temperature", 0, "--hidden", "--policy", "promoe",
        "--predictor", work / "p.h5", "--cache-experts", n, "--prefetch-distance", 1,
        "--sync-transfers", "--sync-predictions", "--decision-log", live, "-o", trace,
        "--quiet")
    run(fmoe_bin, "simulate", "--trace", trace, "--policy", "promoe", "--predictor",
        work / "p.h5", "--cache-experts", n, "--prefetch-distance", 1,
        "--profile", work / "zero.json", "--decision-log", sim, "--quiet",
        env={**os.environ, "OPENBLAS_NUM_THREADS": "2"})  # not the live engine's one thread
    lh, lrec = read_log(live)
    sh, srec = read_log(sim)
    assert lh["source"] == "record" and sh["source"] == "simulate"
    accesses = sum(r["event"] == "access" for r in lrec)
    assert accesses > 250  # 10 requests x ~13 iterations x 6 layers x >= 1 expert
    assert any(r["event"] == "access" and r["result"] == "miss" for r in lrec)
    assert sum(r["event"] == "prefetch" for r in lrec) > 10, "promoe made no prefetch"
    a, b = decisions(lrec), decisions(srec)
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    assert first is None and len(a) == len(b), (
        f"N={n}: first divergence at record {first}: "
        f"live {a[first] if first is not None else None} "
        f"sim {b[first] if first is not None else None}; lengths {len(a)} {len(b)}")
    p = run(fmoe_bin, "compare-logs", live, sim, "--late-is-hit", "--json")
    assert json.loads(p.stdout)["identical"] is True


def test_offloaded_promoe_generation_equals_all_resident(work, fmoe_bin):
    base = run(fmoe_bin, "generate", "--model", TINY, "--prompt", PROMPT,
               "--max-new-tokens", 24, "--temperature", 0, "--json")
    for n, tier in ((3, "file"), (12, "host")):
        # no --prefetch-distance: the predictor's stride is the policy's
        got = run(fmoe_bin, "generate", "--model", TINY, "--prompt", PROMPT,
                  "--max-new-tokens", 24, "--temperature", 0, "--json", "--policy", "promoe",
                  "--predictor", work / "p.h5", "--cache-experts", n, "--tier", tier)
        assert json.loads(got.stdout)["generated_ids"] == json.loads(base.stdout)["generated_ids"]


def test_promoe_needs_a_predictor_and_only_promoe_takes_one(work, fmoe_bin):
    p = run(fmoe_bin, "generate", "--model", TINY, "--prompt", "x", "--policy", "promoe",
            "--cache-experts", 12, check=False)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
    assert "policy promoe needs --predictor P.h5" in p.stderr
    p = run(fmoe_bin, "record", "--model", TINY, "--dataset", work / "live.txt",
            "--policy", "lru", "--predictor", work / "p.h5", "--cache-experts", 12,
            "-o", work / "never.h5", check=False)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
    assert "--predictor is for policies promoe and duoserve" in p.stderr
    assert not (work / "never.h5").exists()
    p = run(fmoe_bin, "generate", "--model", TINY, "--prompt", "x", "--predictor",
            work / "p.h5", check=False)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1


def test_predictor_of_another_model_is_refused(work, fmoe_bin, tmp_path):
    other = tmp_path / "other.h5"
    shutil.copy(work / "p.h5", other)
    with h5py.File(other, "r+") as f:
        mine = f.attrs["model_fingerprint"]
        mine = mine.decode() if isinstance(mine, bytes) else str(mine)
        fake = "0" * 64 if mine != "0" * 64 else "1" * 64
        f.attrs["model_fingerprint"] = fake
    p = run(fmoe_bin, "generate", "--model", TINY, "--prompt", "x", "--policy", "promoe",
            "--predictor", other, "--cache-experts", 12, check=False)
    assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1
    assert fake in p.stderr and mine in p.stderr
