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
import pytest

pytest.importorskip("h5py")  # learned_policy_live edits predictor files with it
import learned_policy_live as policy_live  # noqa: E402
from learned_policy_live import TINY  # noqa: E402

work = policy_live.work_fixture("promoe-live", "p.h5", "--kind", "promoe", "--stride", 1)


@pytest.mark.parametrize("n", [12, 24])
def test_live_and_simulated_promoe_decide_alike(work, fmoe_bin, n):
    live, sim, lrec, srec = policy_live.live_and_simulated(
        work, fmoe_bin, "promoe", "p.h5", n,
        live_args=("--hidden", "--prefetch-distance", 1, "--sync-predictions"),
        sim_args=("--prefetch-distance", 1))
    assert sum(r["event"] == "prefetch" for r in lrec) > 10, "promoe made no prefetch"
    policy_live.assert_same_decisions(fmoe_bin, n, live, sim, lrec, srec)


def test_promoe_evict_option_live_equals_simulated(work, fmoe_bin):
    """--policy-opt evict=request-reuse (reuse_evict.h: Belady's rule on the request-level
    estimate among the experts promoe may evict, LRU-guarded): live = simulated, and the
    option changes decisions."""
    opt = ("--policy-opt", "evict=request-reuse")
    live, sim, lrec, srec = policy_live.live_and_simulated(
        work, fmoe_bin, "promoe", "p.h5", 8,
        live_args=("--hidden", "--prefetch-distance", 1, "--sync-predictions", *opt),
        sim_args=("--prefetch-distance", 1, *opt))
    policy_live.assert_same_decisions(fmoe_bin, 8, live, sim, lrec, srec)
    policy_live.assert_option_changes_decisions(work, fmoe_bin, "promoe", "p.h5", 8, srec,
                                                ("--prefetch-distance", 1))


def test_offloaded_promoe_generation_equals_all_resident(work, fmoe_bin):
    # no --prefetch-distance: the predictor's stride is the policy's
    policy_live.assert_offloaded_generation_equals_all_resident(
        fmoe_bin, "promoe", work / "p.h5", ((3, "file"), (12, "host")))


def test_promoe_needs_a_predictor_and_only_promoe_takes_one(work, fmoe_bin):
    policy_live.refused_without_predictor(fmoe_bin, "promoe")
    err = policy_live.refused(fmoe_bin, 2, "record", "--model", TINY, "--dataset",
                              work / "live.txt", "--policy", "lru", "--predictor", work / "p.h5",
                              "--cache-experts", 12, "-o", work / "never.h5")
    assert "--predictor is for policies promoe and duoserve" in err
    assert not (work / "never.h5").exists()
    policy_live.refused(fmoe_bin, 2, "generate", "--model", TINY, "--prompt", "x", "--predictor",
                        work / "p.h5")


def test_predictor_of_another_model_is_refused(work, fmoe_bin, tmp_path):
    policy_live.assert_predictor_of_another_model_is_refused(
        fmoe_bin, "promoe", work / "p.h5", tmp_path)
