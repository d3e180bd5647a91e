"""Policy duoserve live against the simulator, decision for decision.

A DuoServe predictor trained (`fmoe train-predictor --kind duoserve`) on an all-resident
recording of fmoe-tiny over 30 bundled prompts drives a live greedy run of 10 other prompts
(`fmoe record --policy duoserve --predictor d.h5`), and `fmoe simulate` of the trace that
run recorded must make the same decisions (`fmoe compare-logs --late-is-hit`), with timing
held fixed as in test_offload_live.py (--sync-transfers live, a zero-time link simulated).
The predictor reads expert ids only, and its inference sums in index order without BLAS
(fmoe_expert_mlp_infer), so both sides predict the same experts whatever the thread count.

Cache sizes: 2 (= K, the paper's k-slot ring: every layer streams its experts), 12 and 24
(a longer ring). Also: an offloaded duoserve generation equals the all-resident one; a
duoserve predictor of another model, duoserve without --predictor, and a predictor of the
other kind (promoe's for duoserve, duoserve's for promoe) are one-line errors.
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
    d = tmp_path_factory.mktemp("duoserve-live")
    lines = PROMPTS.read_text().splitlines()
    (d / "train.txt").write_text("\n".join(lines[:30]) + "\n")
    (d / "live.txt").write_text("\n".join(lines[50:60]) + "\n")
    (d / "zero.json").write_text(json.dumps(ZERO_LINK))
    run(fmoe_bin, "record", "--model", TINY, "--dataset", d / "train.txt",
        "--max-new-tokens", 16, "--temperature", 0, "--hidden", "-o", d / "train.h5",
        "--quiet")
    run(fmoe_bin, "train-predictor", "--kind", "duoserve", "--trace", d / "train.h5",
        "--seed", 3, "-o", d / "d.h5", "--quiet")
    return d


@pytest.mark.parametrize("n", [2, 12, 24])
def test_live_and_simulated_duoserve_decide_alike(work, fmoe_bin, n):
    trace = work / f"live-{n}.h5"
    live, sim = work / f"live-{n}.jsonl", work / f"sim-{n}.jsonl"
    run(fmoe_bin, "record", "--model", TINY, "--dataset", work / "live.txt",
        "--max-new-tokens", 12, "--temperature", 0, "--policy", "duoserve",
        "--predictor", work / "d.h5", "--cache-experts", n, "--sync-transfers",
        "--decision-log", live, "-o", trace, "--quiet")
    run(fmoe_bin, "simulate", "--trace", trace, "--policy", "duoserve", "--predictor",
        work / "d.h5", "--cache-experts", n, "--profile", work / "zero.json",
        "--decision-log", sim, "--quiet",
        env={**os.environ, "OPENBLAS_NUM_THREADS": "2"})  # not the live engine's one thread
    lh, lrec = read_log(live)
    sh, srec = read_log(sim)
    assert lh["source"] == "record" and sh["source"] == "simulate"
    accesses = sum(r["event"] == "access" for r in lrec)
    assert accesses > 250  # 10 requests x ~13 iterations x 6 layers x >= 1 expert
    assert any(r["event"] == "access" and r["result"] == "miss" for r in lrec)
    prefetches = sum(r["event"] == "prefetch" for r in lrec)
    # decode: K predictions for each layer after the first, per token; in a longer ring
    # some are already cached (no transfer, no record)
    assert prefetches > (10 * 11 * 5 if n == 2 else 50), f"duoserve made {prefetches} prefetches"
    assert all(r["layer"] >= 1 for r in lrec if r["event"] == "prefetch")  # none for layer 0
    a, b = decisions(lrec), decisions(srec)
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    assert first is None and len(a) == len(b), (
        f"N={n}: first divergence at record {first}: "
        f"live {a[first] if first is not None else None} "
        f"sim {b[first] if first is not None else None}; lengths {len(a)} {len(b)}")
    p = run(fmoe_bin, "compare-logs", live, sim, "--late-is-hit", "--json")
    assert json.loads(p.stdout)["identical"] is True


def test_offloaded_duoserve_generation_equals_all_resident(work, fmoe_bin):
    base = run(fmoe_bin, "generate", "--model", TINY, "--prompt", PROMPT,
               "--max-new-tokens", 24, "--temperature", 0, "--json")
    for n, tier in ((2, "file"), (12, "host")):
        got = run(fmoe_bin, "generate", "--model", TINY, "--prompt", PROMPT,
                  "--max-new-tokens", 24, "--temperature", 0, "--json", "--policy", "duoserve",
                  "--predictor", work / "d.h5", "--cache-experts", n, "--tier", tier)
        assert json.loads(got.stdout)["generated_ids"] == json.loads(base.stdout)["generated_ids"]


def test_duoserve_needs_its_predictor(work, fmoe_bin):
    p = run(fmoe_bin, "generate", "--model", TINY, "--prompt", "x", "--policy", "duoserve",
            "--cache-experts", 12, check=False)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
    assert "policy duoserve needs --predictor P.h5" in p.stderr
    assert "--kind duoserve" in p.stderr
    # a promoe predictor to duoserve, and duoserve's to promoe
    run(fmoe_bin, "train-predictor", "--kind", "promoe", "--trace", work / "train.h5",
        "--stride", 1, "--epochs", 2, "-o", work / "p.h5", "--quiet")
    for policy, pred, want in (("duoserve", "p.h5", "of kind duoserve, got 'promoe'"),
                               ("promoe", "d.h5", "of kind promoe, got 'duoserve'")):
        p = run(fmoe_bin, "generate", "--model", TINY, "--prompt", "x", "--policy", policy,
                "--predictor", work / pred, "--cache-experts", 12, check=False)
        assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1, p.stderr
        assert want in p.stderr


def test_duoserve_predictor_of_another_model_is_refused(work, fmoe_bin, tmp_path):
    other = tmp_path / "other.h5"
    shutil.copy(work / "d.h5", other)
    with h5py.File(other, "r+") as f:
        mine = f.attrs["model_fingerprint"]
        mine = mine.decode() if isinstance(mine, bytes) else str(mine)
        fake = "0" * 64 if mine != "0" * 64 else "1" * 64
        f.attrs["model_fingerprint"] = fake
    p = run(fmoe_bin, "generate", "--model", TINY, "--prompt", "x", "--policy", "duoserve",
            "--predictor", other, "--cache-experts", 12, check=False)
    assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1
    assert fake in p.stderr and mine in p.stderr
