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
import pytest

pytest.importorskip("h5py")  # learned_policy_live edits predictor files with it
import learned_policy_live as policy_live  # noqa: E402
from conftest import run_fmoe  # noqa: E402
from learned_policy_live import TINY  # noqa: E402

# a few epochs: the decisions are compared, not the predictor's accuracy
work = policy_live.work_fixture("duoserve-live", "d.h5", "--kind", "duoserve", "--epochs", "4")


@pytest.mark.parametrize("n", [2, 12, 24])
def test_live_and_simulated_duoserve_decide_alike(work, fmoe_bin, n):
    live, sim, lrec, srec = policy_live.live_and_simulated(work, fmoe_bin, "duoserve", "d.h5", n)
    prefetches = sum(r["event"] == "prefetch" for r in lrec)
    # decode: K predictions for each layer after the first, per token; in a longer ring
    # some are already cached (no transfer, no record)
    assert prefetches > (10 * 11 * 5 if n == 2 else 50), f"duoserve made {prefetches} prefetches"
    assert all(r["layer"] >= 1 for r in lrec if r["event"] == "prefetch")  # none for layer 0
    policy_live.assert_same_decisions(fmoe_bin, n, live, sim, lrec, srec)


def test_duoserve_evict_option_live_equals_simulated(work, fmoe_bin):
    """--policy-opt evict=predicted-reuse (reuse_evict.h: Belady's rule on predicted-reuse's
    per-expert estimate among the experts the ring may evict, LRU-guarded): live =
    simulated, and the option changes decisions."""
    opt = ("--policy-opt", "evict=predicted-reuse")
    live, sim, lrec, srec = policy_live.live_and_simulated(work, fmoe_bin, "duoserve", "d.h5",
                                                           8, opt, opt)
    policy_live.assert_same_decisions(fmoe_bin, 8, live, sim, lrec, srec)
    policy_live.assert_option_changes_decisions(work, fmoe_bin, "duoserve", "d.h5", 8, srec)


def test_offloaded_duoserve_generation_equals_all_resident(work, fmoe_bin):
    policy_live.assert_offloaded_generation_equals_all_resident(
        fmoe_bin, "duoserve", work / "d.h5", ((2, "file"), (12, "host")))


def test_duoserve_needs_its_predictor(work, fmoe_bin):
    assert "--kind duoserve" in policy_live.refused_without_predictor(fmoe_bin, "duoserve")
    # a promoe predictor to duoserve, and duoserve's to promoe
    run_fmoe(fmoe_bin, "train-predictor", "--kind", "promoe", "--trace", work / "train.h5",
             "--stride", 1, "--epochs", 2, "-o", work / "p.h5", "--quiet")
    for policy, pred, want in (("duoserve", "p.h5", "of kind duoserve, got 'promoe'"),
                               ("promoe", "d.h5", "of kind promoe, got 'duoserve'")):
        err = policy_live.refused(fmoe_bin, 1, "generate", "--model", TINY, "--prompt", "x",
                                  "--policy", policy, "--predictor", work / pred,
                                  "--cache-experts", 12)
        assert want in err


def test_duoserve_predictor_of_another_model_is_refused(work, fmoe_bin, tmp_path):
    policy_live.assert_predictor_of_another_model_is_refused(
        fmoe_bin, "duoserve", work / "d.h5", tmp_path)
