"""tests/bench/reuse_bounds.py, the ceilings of docs/results.md ("Where the rest of the gap
is"), checked where something independent says what they must be:

- ahead-k with a window past the end of the replay knows every next use: its hits equal
  Belady's as tests/python/reference_cache.py replays it, on random traces.
- rate-online is predicted-reuse's estimate=rate without the guard, ranked in plain Python:
  its hits equal what `fmoe simulate` gets with `--policy-opt estimate=rate guard=none`.
- read_requests keeps exactly the requests a store held out.
"""
import pathlib
import random
import sys

import h5py
import numpy as np

from reference_cache import hits, sequence
from test_simulate_reference import random_requests, simulate, write_trace

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "bench"))
import reuse_bounds  # noqa: E402


def random_trace(tmp_path, seed):
    rng = random.Random(200 + seed)
    L, J = rng.randint(1, 3), rng.randint(6, 16)
    K = rng.randint(1, min(3, J))
    reqs = random_requests(rng, rng.randint(4, 10), L, J, K)
    trace = tmp_path / f"b{seed}.h5"
    write_trace(trace, reqs, L, J, K)
    seq, iters, rq = sequence(reqs)
    return (trace, [l * J + j for l, j in seq], iters, rq, sorted({K, L * J // 4 or K, L * J // 2}),
            J)


def test_full_lookahead_is_belady(tmp_path):
    for seed in range(4):
        _, seq, iters, rq, caches, _ = random_trace(tmp_path, seed)
        for c in caches:
            assert reuse_bounds.bounded_hits(seq, iters, rq, c, "ahead-100000") == \
                hits(seq, c, "belady"), (seed, c)


def test_rate_online_is_the_simulators_rate(fmoe, tmp_path):
    differs = 0
    for seed in range(4):
        trace, seq, iters, rq, caches, J = random_trace(tmp_path, seed)
        got = simulate(fmoe, trace, caches, ["predicted-reuse"],
                       ["--policy-opt", "estimate=rate", "--policy-opt", "guard=none"])
        for c in caches:
            want = reuse_bounds.bounded_hits(seq, iters, rq, c, "rate-online", None, J)
            assert got[("predicted-reuse", c)]["hits"] == want, (seed, c)
            differs += want != hits(seq, c, "lru")
    assert differs > 0


def test_store_selects_held_out_requests(tmp_path):
    trace, *_ = random_trace(tmp_path, 0)
    store = tmp_path / "s.h5"
    with h5py.File(store, "w") as s:
        s.create_dataset("requests/held_out_id", data=np.array([1, 3], dtype=np.int64))
        s.create_dataset("requests/used_id", data=np.array([0, 2], dtype=np.int64))
    _, _, every = reuse_bounds.read_requests(trace)
    _, _, held = reuse_bounds.read_requests(trace, store)
    _, _, used = reuse_bounds.read_requests(trace, store, "used_id")
    assert held == [every[1], every[3]] and used == [every[0], every[2]]
