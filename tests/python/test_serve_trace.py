"""`fmoe serve --trace-out`: production traces of served traffic.

The served requests' routing is checked against `fmoe record` of the same prompts (an
independent run of the same model, one request at a time, no batching), the trace's
shapes with h5py, and the trace is used: build-store and simulate take it. A server killed
with SIGKILL leaves a .partial trace that opens and holds every request finished before.
"""
import concurrent.futures
import json
import signal
import time

import numpy as np
import pytest

h5py = pytest.importorskip("h5py")
import hdf5plugin  # noqa: F401,E402  (registers the zstd filter with h5py)

from conftest import REPO
from serve_util import Server
from test_serve_engine import PROMPTS, metric_value

TINY = REPO / "datasets" / "fmoe-tiny"


def test_trace_out_holds_the_served_requests(fmoe, tmp_path):
    trace = tmp_path / "served.h5"
    s = Server(tmp_path, "--parallel", 4, "--trace-out", trace)
    lengths = [8, 12, 16, 20, 24, 9]
    try:
        with concurrent.futures.ThreadPoolExecutor(6) as ex:
            res = list(ex.map(lambda pm: s.complete(pm[0], max_tokens=pm[1], ignore_eos=True),
                              zip(PROMPTS, lengths)))
    finally:
        rc, err = s.stop()
    assert rc == 0, err
    assert trace.exists() and not (tmp_path / "served.h5.partial").exists()

    with h5py.File(trace) as f:
        L, J, K, h = (int(f.attrs[k]) for k in ("num_layers", "num_experts", "top_k",
                                                  "hidden_size"))
        R = f["requests/id"].shape[0]
        assert R == 6
        off = f["requests/token_offset"][:]
        pt, ot = f["requests/prompt_tokens"][:], f["requests/output_tokens"][:]
        T = f["tokens/token_id"].shape[0]
        assert off[-1] == T and (off[1:] - off[:-1] == pt + ot).all()
        assert f["tokens/experts"].shape == (T, L, K)
        assert f["tokens/probs"].shape == (T, L, J)
        assert f["tokens/semantic"].shape == (T, h)
        np.testing.assert_allclose(f["tokens/probs"][:].astype(np.float32).sum(-1), 1, atol=1e-2)
        arrival = f["requests/arrival_s"][:]
        assert (arrival >= 0).all() and arrival.max() < 60
        # every request: its prompt, then each generated token fed back but the last
        by_prompt = {}
        for r in range(R):
            ids = f["tokens/token_id"][off[r]:off[r + 1]]
            ph = f["tokens/phase"][off[r]:off[r + 1]]
            assert (ph[:pt[r]] == 0).all() and (ph[pt[r]:] == 1).all()
            by_prompt[int(pt[r]), tuple(ids[:pt[r]].tolist())] = r
        for rsp, n in zip(res, lengths):
            assert rsp["usage"]["completion_tokens"] == n
        assert sorted(ot.tolist()) == sorted(n - 1 for n in lengths)
        experts = f["tokens/experts"][:]
        ids_all = f["tokens/token_id"][:]
        # the batch composition: each token's pass, and the pass's time
        assert int(f.attrs["served"]) == 1
        it, secs = f["tokens/served_iteration"][:], f["tokens/served_s"][:]
        owner = np.repeat(np.arange(R), off[1:] - off[:-1])
        passes = {}
        for t in range(T):
            passes.setdefault(int(it[t]), []).append(t)
        for rows in passes.values():
            assert len(rows) <= 64  # an iteration's token budget
            assert len(set(secs[rows].tolist())) == 1 and secs[rows[0]] > 0
        assert max(len(set(owner[rows].tolist())) for rows in passes.values()) >= 2
        for r in range(R):
            dec = it[off[r] + pt[r]:off[r + 1]]
            assert (np.diff(dec) > 0).all()  # one decode token per pass
            assert it[off[r]:off[r] + pt[r]].max() < (dec.min() if len(dec) else 1 << 62)

    # the same prompts through `fmoe record`, one at a time: the same tokens and routing
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS[:6]) + "\n")
    rec = tmp_path / "rec.h5"
    fmoe("record", "--model", TINY, "--dataset", prompts, "--max-new-tokens", "24",
         "--ignore-eos", "-q", "-o", rec)
    with h5py.File(rec) as g:
        goff = g["requests/token_offset"][:]
        gpt = g["requests/prompt_tokens"][:]
        for q in range(6):
            gids = g["tokens/token_id"][goff[q]:goff[q + 1]]
            r = by_prompt[int(gpt[q]), tuple(gids[:gpt[q]].tolist())]
            n = off[r + 1] - off[r]
            np.testing.assert_array_equal(ids_all[off[r]:off[r + 1]], gids[:n])
            np.testing.assert_array_equal(experts[off[r]:off[r + 1]],
                                          g["tokens/experts"][goff[q]:goff[q] + n])

    # the trace is one to replay
    store = tmp_path / "s.h5"
    fmoe("build-store", "--trace", trace, "-o", store)
    p = fmoe("simulate", "--trace", trace, "--store", store, "--policy", "lru,fmoe",
             "--cache-experts", "24", "--json")
    lru, fm = json.loads(p.stdout)["results"]
    assert lru["policy"] == "lru" and fm["policy"] == "fmoe"
    # the replay touches each token's experts: at least one access per token and layer
    assert lru["accesses"] >= T * L // 4 and lru["accesses"] == fm["accesses"]


def test_sigkill_leaves_a_partial_trace_of_the_finished_requests(tmp_path):
    trace = tmp_path / "killed.h5"
    s = Server(tmp_path, "--parallel", 1, "--trace-out", trace)
    try:
        for p in PROMPTS[:3]:
            s.complete(p, max_tokens=8)
        time.sleep(0.2)
    finally:
        s.proc.send_signal(signal.SIGKILL)
        s.proc.wait()
    partial = tmp_path / "killed.h5.partial"
    assert not trace.exists() and partial.exists()
    with h5py.File(partial) as f:
        assert f["requests/id"].shape[0] == 3
        assert (f["requests/output_tokens"][:] == 7).all()


def test_sigterm_with_requests_in_flight_saves_trace_and_store(fmoe, tmp_path):
    """SIGTERM while requests run: they finish within the grace period, and the trace and
    the updated store (--store-mode offline-update --store-out) are written, open, and hold
    them. The signal goes once /metrics shows two requests running and the third queued
    behind them, so all three are in flight whatever the machine's speed; the grace period
    is long enough for any machine to finish them (it once ran out under ASan on a loaded
    runner when it was 30 s and the test only slept before signalling)."""
    prompts = tmp_path / "train.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    rec, store = tmp_path / "train.h5", tmp_path / "store.h5"
    fmoe("record", "--model", TINY, "--dataset", prompts, "--max-new-tokens", "8", "-q",
         "-o", rec)
    fmoe("build-store", "--trace", rec, "-o", store)
    trace, out = tmp_path / "served.h5", tmp_path / "store-out.h5"
    s = Server(tmp_path, "--parallel", 2, "--grace", 600, "--policy", "fmoe",
               "--cache-experts", 24, "--store", store, "--store-mode", "offline-update",
               "--store-out", out, "--trace-out", trace)
    tokens = 400  # the first two run for a quarter of a second even on a fast machine
    with concurrent.futures.ThreadPoolExecutor(3) as ex:
        fut = [ex.submit(s.post, "/v1/completions",
                         {"prompt": p, "max_tokens": tokens, "temperature": 0,
                          "ignore_eos": True}, 600)
               for p in ("A new prompt about the sea", "Another one about mountains",
                         "A third about rivers")]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            m = s.metrics_text()
            if (metric_value(m, "fmoe_requests_running"),
                    metric_value(m, "fmoe_requests_waiting")) == (2, 1):
                break
            time.sleep(0.01)
        else:
            raise AssertionError("the three requests were never in flight together: " + m)
        s.proc.send_signal(signal.SIGTERM)
        results = [f.result() for f in fut]
    rc, err = s.stop(timeout=600)
    assert rc == 0, err
    done = [json.loads(b) for st, _, b in results if st == 200]
    assert len(done) == 3, results  # all finished within the grace period
    with h5py.File(trace) as f:
        assert f["requests/id"].shape[0] == 3
        assert sorted(f["requests/output_tokens"][:].tolist()) == [tokens - 1] * 3
    with h5py.File(store) as a, h5py.File(out) as b:
        assert b["maps"].shape[0] > a["maps"].shape[0]  # the served tokens were added
