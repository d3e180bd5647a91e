"""What the live-against-simulated tests of the policies with a learned predictor
(test_promoe_live.py, test_duoserve_live.py) share.

A work folder with a predictor trained on an all-resident recording of fmoe-tiny over 30
bundled prompts and 10 other prompts to run live; a live run and the simulation of the
trace it recorded, with timing held fixed as in test_offload_live.py (--sync-transfers
live, a zero-time link simulated), checked decision for decision; an offloaded greedy
generation against the all-resident one; the one-line errors of a missing predictor and of
a predictor whose model fingerprint was changed.
"""
import json
import os
import shutil

import h5py
import hdf5plugin  # noqa: F401  (registers the zstd filter the traces use)
import pytest

from conftest import REPO, run_fmoe
from test_offload_live import ZERO_LINK, decisions, read_log

TINY = REPO / "datasets" / "fmoe-tiny"
PROMPTS = REPO / "datasets" / "samples" / "prompts_100.txt"
PROMPT = "The dictionary type maps keys to values, and"


def work_fixture(name, predictor, *train_args):
    """A module-scoped fixture `work`: a fresh folder `name` filled by make_work."""
    @pytest.fixture(scope="module")
    def work(tmp_path_factory, fmoe_bin):
        return make_work(tmp_path_factory.mktemp(name), fmoe_bin, predictor, *train_args)
    return work


def make_work(d, fmoe_bin, predictor, *train_args):
    """Fills folder d: train.txt (prompts 0-29), live.txt (prompts 50-59), zero.json (the
    zero-time link), train.h5 (their all-resident recording, with --hidden) and the
    predictor `predictor` trained on it with `fmoe train-predictor *train_args`."""
    lines = PROMPTS.read_text().splitlines()
    (d / "train.txt").write_text("\n".join(lines[:30]) + "\n")
    (d / "live.txt").write_text("\n".join(lines[50:60]) + "\n")
    (d / "zero.json").write_text(json.dumps(ZERO_LINK))
    run_fmoe(fmoe_bin, "record", "--model", TINY, "--dataset", d / "train.txt",
             "--max-new-tokens", 16, "--temperature", 0, "--hidden", "-o", d / "train.h5",
             "--quiet")
    run_fmoe(fmoe_bin, "train-predictor", *train_args, "--trace", d / "train.h5",
             "--seed", 3, "-o", d / predictor, "--quiet")
    return d


def live_and_simulated(work, fmoe_bin, policy, predictor, n, live_args=(), sim_args=()):
    """Runs `policy` live on live.txt at n cached experts (writing live-{n}.h5) and simulates
    that trace; checks both logs hold a real run (their sources, > 250 accesses, a miss).
    @return the paths of the two decision logs and their records."""
    trace = work / f"live-{n}.h5"
    live, sim = work / f"live-{n}.jsonl", work / f"sim-{n}.jsonl"
    run_fmoe(fmoe_bin, "record", "--model", TINY, "--dataset", work / "live.txt",
             "--max-new-tokens", 12, "--temperature", 0, "--policy", policy,
             "--predictor", work / predictor, "--cache-experts", n, *live_args,
             "--sync-transfers", "--decision-log", live, "-o", trace, "--quiet")
    run_fmoe(fmoe_bin, "simulate", "--trace", trace, "--policy", policy, "--predictor",
             work / predictor, "--cache-experts", n, *sim_args, "--profile",
             work / "zero.json", "--decision-log", sim, "--quiet",
             env={**os.environ, "OPENBLAS_NUM_THREADS": "2"})  # not the live engine's one thread
    lh, lrec = read_log(live)
    sh, srec = read_log(sim)
    assert lh["source"] == "record" and sh["source"] == "simulate"
    accesses = sum(r["event"] == "access" for r in lrec)
    assert accesses > 250  # 10 requests x ~13 iterations x 6 layers x >= 1 expert
    assert any(r["event"] == "access" and r["result"] == "miss" for r in lrec)
    return live, sim, lrec, srec


def assert_same_decisions(fmoe_bin, n, live, sim, lrec, srec):
    """The two logs decide alike, record for record, and compare-logs agrees."""
    a, b = decisions(lrec), decisions(srec)
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    assert first is None and len(a) == len(b), (
        f"N={n}: first divergence at record {first}: "
        f"live {a[first] if first is not None else None} "
        f"sim {b[first] if first is not None else None}; lengths {len(a)} {len(b)}")
    p = run_fmoe(fmoe_bin, "compare-logs", live, sim, "--late-is-hit", "--json")
    assert json.loads(p.stdout)["identical"] is True


def assert_option_changes_decisions(work, fmoe_bin, policy, predictor, n, srec, sim_args=()):
    """The trace live_and_simulated recorded at n, simulated with `policy`'s defaults (no
    --policy-opt in sim_args), decides otherwise than srec: the option did something."""
    default = work / f"sim-{n}-default.jsonl"
    run_fmoe(fmoe_bin, "simulate", "--trace", work / f"live-{n}.h5", "--policy", policy,
             "--predictor", work / predictor, "--cache-experts", n, *sim_args, "--profile",
             work / "zero.json", "--decision-log", default, "--quiet")
    assert decisions(read_log(default)[1]) != decisions(srec)


def assert_offloaded_generation_equals_all_resident(fmoe_bin, policy, predictor, runs):
    """A greedy generation under `policy` at each (cache experts, tier) of runs gives the
    all-resident generation's tokens."""
    base = run_fmoe(fmoe_bin, "generate", "--model", TINY, "--prompt", PROMPT,
                    "--max-new-tokens", 24, "--temperature", 0, "--json")
    for n, tier in runs:
        got = run_fmoe(fmoe_bin, "generate", "--model", TINY, "--prompt", PROMPT,
                       "--max-new-tokens", 24, "--temperature", 0, "--json", "--policy",
                       policy, "--predictor", predictor, "--cache-experts", n, "--tier", tier)
        assert json.loads(got.stdout)["generated_ids"] == json.loads(base.stdout)["generated_ids"]


def refused(fmoe_bin, status, *args):
    """Runs `fmoe *args`, which must fail with exit status `status` and a one-line message.
    @return the message."""
    p = run_fmoe(fmoe_bin, *args, check=False)
    assert p.returncode == status and len(p.stderr.strip().splitlines()) == 1, p.stderr
    return p.stderr


def refused_without_predictor(fmoe_bin, policy):
    """`policy` without --predictor is a usage error that says so. @return the message."""
    err = refused(fmoe_bin, 2, "generate", "--model", TINY, "--prompt", "x", "--policy", policy,
                  "--cache-experts", 12)
    assert f"policy {policy} needs --predictor P.h5" in err
    return err


def copy_with_other_fingerprint(predictor, tmp_path):
    """A copy of the predictor file claiming another model: (path, its real fingerprint,
    the fake one)."""
    other = tmp_path / "other.h5"
    shutil.copy(predictor, other)
    with h5py.File(other, "r+") as f:
        mine = f.attrs["model_fingerprint"]
        mine = mine.decode() if isinstance(mine, bytes) else str(mine)
        fake = "0" * 64 if mine != "0" * 64 else "1" * 64
        f.attrs["model_fingerprint"] = fake
    return other, mine, fake


def assert_predictor_of_another_model_is_refused(fmoe_bin, policy, predictor, tmp_path):
    """A copy of the predictor with another model fingerprint is a one-line error naming
    both fingerprints."""
    other, mine, fake = copy_with_other_fingerprint(predictor, tmp_path)
    err = refused(fmoe_bin, 1, "generate", "--model", TINY, "--prompt", "x", "--policy", policy,
                  "--predictor", other, "--cache-experts", 12)
    assert fake in err and mine in err
