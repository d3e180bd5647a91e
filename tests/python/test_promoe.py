"""fmoe simulate --policy promoe --predictor P.h5 on a trace of fmoe-tiny recorded with --hidden.

The predictor comes from fmoe train-predictor --kind promoe on the same trace. Asserted: the
runs complete, promoe replays the accesses LRU replays, it prefetches, its precision is a
ratio; the hit rates and TPOT against LRU are printed (run pytest -s), not asserted: they
depend on the recorded routing. Bad input gets one line and the documented exit status:
promoe without --predictor, a predictor of another model, a trace without gate inputs.
"""
import json

import h5py
import hdf5plugin  # noqa: F401  (registers the zstd filter the trace uses)
import pytest

from learned_policy_live import copy_with_other_fingerprint
from predictor_util import PROMPTS, TINY, trace_fixture, train

trace = trace_fixture("promoe")


@pytest.fixture(scope="module")
def predictor(trace, fmoe):
    return train(fmoe, trace, "promoe", "p.h5", "--stride", 1, "--seed", 3)[0]


def _simulate(fmoe, trace, predictor, *extra):
    p = fmoe("simulate", "--trace", trace, "--policy", "lru,promoe", "--predictor", predictor,
             "--cache-experts", "12,24", "--json", "--quiet", *extra)
    return json.loads(p.stdout)["results"]


@pytest.mark.parametrize("extra", [(), ("--copy-chunks", "3"), ("--batch", "4")],
                         ids=["plain", "chunks3", "batch4"])
def test_promoe_against_lru(trace, predictor, fmoe, extra):
    res = _simulate(fmoe, trace, predictor, *extra)
    by = {(r["policy"], r["cache_experts"]): r for r in res}
    assert set(by) == {(p, c) for p in ("lru", "promoe") for c in (12, 24)}
    for c in (12, 24):
        lru, pm = by[("lru", c)], by[("promoe", c)]
        assert pm["accesses"] == lru["accesses"]
        assert pm["hits"] + pm["late_hits"] + pm["misses"] == pm["accesses"]
        assert pm["prefetch_distance"] == 1  # the predictor's stride
        assert pm["prefetches"] > 0
        assert 0.0 <= pm["prefetch_precision"] <= 1.0
        assert lru["prefetches"] == 0
        print(f"\n{' '.join(extra) or 'plain'} cache {c}/48: hit rate lru "
              f"{lru['hit_rate']:.3f} promoe {pm['hit_rate']:.3f}; TPOT p50 lru "
              f"{1e3 * lru['tpot_s']['p50']:.3f} ms promoe {1e3 * pm['tpot_s']['p50']:.3f} ms; "
              f"promoe precision {pm['prefetch_precision']:.3f} goodpred {pm['goodpred']}")


def test_predictor_is_needed_and_only_for_promoe(trace, predictor, fmoe):
    p = fmoe("simulate", "--trace", trace, "--policy", "lru,promoe", "--cache-experts", 12,
             check=False)
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1
    assert "policy promoe needs --predictor P.h5" in p.stderr

    p = fmoe("simulate", "--trace", trace, "--policy", "lru", "--predictor", predictor,
             "--cache-experts", 12, check=False)
    assert p.returncode == 2
    assert "--predictor is for policies promoe and duoserve" in p.stderr


def test_predictor_of_another_model(trace, predictor, fmoe, tmp_path):
    other, mine, fake = copy_with_other_fingerprint(predictor, tmp_path)
    p = fmoe("simulate", "--trace", trace, "--policy", "promoe", "--predictor", other,
             "--cache-experts", 12, check=False)
    assert p.returncode == 1
    assert len(p.stderr.strip().splitlines()) == 1
    assert fake in p.stderr and mine in p.stderr


def test_trace_without_hidden_states(predictor, fmoe, tmp_path):
    nohid = tmp_path / "nohid.h5"
    fmoe("record", "--model", TINY, "--dataset", PROMPTS, "--max-requests", 2,
         "--max-new-tokens", 2, "--threads", 1, "-q", "-o", nohid)
    p = fmoe("simulate", "--trace", nohid, "--policy", "promoe", "--predictor", predictor,
             "--cache-experts", 12, check=False)
    assert p.returncode == 1
    assert len(p.stderr.strip().splitlines()) == 1
    assert "record the trace with 'fmoe record --hidden'" in p.stderr
