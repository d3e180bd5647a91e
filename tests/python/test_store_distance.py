"""The prefetch distance a store was built for is the fmoe policies' default distance, in
`fmoe simulate` and in live runs (`generate`, `record`, `serve`: cmd/offload_cli.c), and a
--prefetch-distance that differs from it is said in one note (docs/simulating.md).

Before, a store built with `--prefetch-distance 1` was used at the policy's own default, 3,
with no word: its redundancy scores weight the layers for 1, so the run answered for
another configuration than the one the store was made for.
"""
import json
import pathlib

import pytest

from conftest import run_fmoe
from test_build_store import synthetic_trace

REPO = pathlib.Path(__file__).resolve().parents[2]
TINY = REPO / "datasets" / "fmoe-tiny"
PROMPTS = REPO / "datasets" / "samples" / "prompts_100.txt"


def note_lines(stderr):
    return [x for x in stderr.splitlines() if "built for prefetch distance" in x]


def test_simulate_runs_the_fmoe_policies_at_the_stores_distance(fmoe, tmp_path):
    trace = synthetic_trace(fmoe, tmp_path)  # 6 layers: 1 and fmoe's own 3 both fit
    store = tmp_path / "s.h5"
    fmoe("build-store", "--trace", trace, "--capacity", 100, "--prefetch-distance", 1,
         "--split", 0.7, "-o", store, "--quiet")

    def sim(*extra):
        p = fmoe("simulate", "--trace", trace, "--store", store, "--holdout", "--policy",
                 "fmoe,lru", "--cache-experts", 12, "--json", "--quiet", *extra)
        return {r["policy"]: r for r in json.loads(p.stdout)["results"]}, p.stderr

    left, err = sim()
    assert left["fmoe"]["prefetch_distance"] == 1
    assert left["lru"]["prefetch_distance"] == 0
    assert note_lines(err) == []
    given, err = sim("--prefetch-distance", 1)
    assert given == left and note_lines(err) == []
    # a given distance that differs runs as asked, and says so once
    p = fmoe("simulate", "--trace", trace, "--store", store, "--holdout", "--policy", "fmoe",
             "--cache-experts", 12, "--json", "--quiet", "--prefetch-distance", "1,2,3")
    dists = sorted(r["prefetch_distance"] for r in json.loads(p.stdout)["results"])
    assert dists == [1, 2, 3]
    err = p.stderr
    notes = note_lines(err)
    assert len(notes) == 1, err
    assert str(store) in notes[0] and "distance 1" in notes[0] and "2, 3" in notes[0]
    # the policy's own default (0 in the list) is the store's distance too
    zero, err = sim("--prefetch-distance", 0)
    assert zero == left and note_lines(err) == []
    # the decision log's header says the distance the run used
    log = tmp_path / "d.jsonl"
    fmoe("simulate", "--trace", trace, "--store", store, "--holdout", "--policy", "fmoe",
         "--cache-experts", 12, "--quiet", "--decision-log", log)
    assert json.loads(log.read_text().splitlines()[0])["meta"]["prefetch_distance"] == 1


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory, fmoe_bin):
    d = tmp_path_factory.mktemp("store-distance")
    src = d / "src.txt"
    src.write_text("\n".join(PROMPTS.read_text().splitlines()[40:52]) + "\n")
    run_fmoe(fmoe_bin, "record", "--model", TINY, "--dataset", src, "--max-new-tokens", 8,
             "--temperature", 0, "--probs-f32", "-o", d / "src.h5", "--quiet")
    run_fmoe(fmoe_bin, "build-store", "--trace", d / "src.h5", "-o", d / "store.h5",
             "--prefetch-distance", 1, "--quiet")
    return d / "store.h5"


def test_live_runs_use_the_stores_distance(fmoe_bin, tiny_store, tmp_path):
    def gen(log, *extra):
        p = run_fmoe(fmoe_bin, "generate", "--model", TINY, "--prompt", "The quick brown fox",
                     "--max-new-tokens", 8, "--temperature", 0, "--policy", "fmoe",
                     "--cache-experts", 16, "--store", tiny_store, "--sync-transfers",
                     "--sync-predictions", "--decision-log", log, *extra)
        lines = log.read_text().splitlines()
        return json.loads(lines[0]), [json.loads(x) for x in lines[1:]], p.stderr

    head, left, err = gen(tmp_path / "left.jsonl")
    assert head["meta"]["prefetch_distance"] == 1
    assert note_lines(err) == []
    _, given, err = gen(tmp_path / "given.jsonl", "--prefetch-distance", 1)
    strip = lambda recs: [{k: v for k, v in r.items() if k != "t"} for r in recs
                          if r["event"] != "landed"]
    assert strip(left) == strip(given) and note_lines(err) == []
    head, _, err = gen(tmp_path / "other.jsonl", "--prefetch-distance", 2)
    assert head["meta"]["prefetch_distance"] == 2
    notes = note_lines(err)
    assert len(notes) == 1 and str(tiny_store) in notes[0] and "runs at 2" in notes[0], err
