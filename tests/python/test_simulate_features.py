"""`fmoe simulate` beyond hit counts: prefetching policies end to end (mixtral-offload from
speculative rows, moe-infinity, oracle), the prefetch metrics, `--miss`, `--arrivals`, and
the one-line refusals. Traces are written with h5py (tests/python/test_simulate_reference).
"""
import json
import math
import random

import numpy as np
import pytest

from test_simulate_reference import random_requests, simulate, write_trace


def run_json(fmoe, *args):
    p = fmoe("simulate", *map(str, args), "--json", "--quiet")
    return json.loads(p.stdout)


def speculative_for(reqs, L, J, right):
    """[T][L][1][J] rows predicting layer l+1's first choice with probability `right`."""
    rng = random.Random(7)
    rows = []
    for _, ex in reqs:
        for tok in ex:
            t = np.zeros((L, 1, J), dtype=np.float32)
            for l in range(L):
                t[l, 0, :] = [rng.random() * 0.1 for _ in range(J)]
                if l + 1 < L and rng.random() < right:
                    t[l, 0, tok[l + 1][0]] = 0.9
            rows.append(t)
    return np.stack(rows)


def test_mixtral_offload_from_speculative_rows(fmoe, tmp_path):
    rng = random.Random(3)
    L, J, K = 4, 8, 1
    reqs = random_requests(rng, 6, L, J, K)
    trace = tmp_path / "spec.h5"
    write_trace(trace, reqs, L, J, K, speculative=speculative_for(reqs, L, J, 1.0))
    out = run_json(fmoe, "--trace", trace, "--policy", "mixtral-offload,lru",
                   "--cache-experts", 8)
    mo, lru = out["results"]
    assert mo["policy"] == "mixtral-offload" and mo["prefetch_distance"] == 1
    assert mo["prefetches"] > 0
    # Perfect speculation: every prefetch is used, and decode misses are rare.
    assert mo["prefetch_precision"] > 0.9
    assert mo["prefetch_recall"] > 0.5
    assert 0 <= mo["goodpred"] <= mo["prefetch_recall"]
    assert mo["stall_s"] < lru["stall_s"]
    assert lru["prefetch_precision"] is None and lru["goodpred"] == 0
    # Wrong speculation wastes bytes.
    write_trace(trace, reqs, L, J, K, speculative=speculative_for(reqs, L, J, 0.0))
    bad = run_json(fmoe, "--trace", trace, "--policy", "mixtral-offload",
                   "--cache-experts", 8)["results"][0]
    assert bad["wasted_prefetch_bytes"] > 0
    assert bad["prefetch_precision"] < mo["prefetch_precision"]
    # Distance beyond the rows: refused.
    p = fmoe("simulate", "--trace", trace, "--policy", "mixtral-offload", "--cache-experts",
             "8", "--prefetch-distance", "2", check=False)
    assert p.returncode == 1 and "reach 1 layer ahead" in p.stderr


def test_policy_needing_speculative_rows_refuses_in_one_line(fmoe, tmp_path):
    trace = tmp_path / "plain.h5"
    write_trace(trace, random_requests(random.Random(1), 2, 2, 4, 1), 2, 4, 1)
    p = fmoe("simulate", "--trace", trace, "--policy", "lru,mixtral-offload",
             "--cache-experts", "2", check=False)
    assert p.returncode == 1
    assert len(p.stderr.strip().splitlines()) == 1
    assert "policy mixtral-offload needs speculative gate rows" in p.stderr
    assert "the trace lacks them" in p.stderr and str(trace) in p.stderr


def test_oracle_and_moe_infinity_metrics(fmoe, tmp_path):
    rng = random.Random(11)
    L, J, K = 4, 8, 2
    reqs = random_requests(rng, 10, L, J, K)
    trace = tmp_path / "t.h5"
    write_trace(trace, reqs, L, J, K)
    out = run_json(fmoe, "--trace", trace, "--policy", "oracle,moe-infinity,belady,lru",
                   "--cache-experts", 12, "--prefetch-distance", "1,2")["results"]
    # Policies that do not prefetch run once (d reported as 0), the others per distance.
    assert len(out) == 6
    res = {(r["policy"], r["prefetch_distance"]): r for r in out}
    for d in (1, 2):
        o = res[("oracle", d)]
        assert o["wasted_prefetch_bytes"] == 0 and o["prefetch_precision"] == 1
        for other in (("moe-infinity", d), ("belady", 0), ("lru", 0)):
            assert o["stall_s"] <= res[other]["stall_s"] + 1e-12
        mi = res[("moe-infinity", d)]
        used = mi["hits"] + mi["late_hits"]
        assert 0 <= mi["goodpred"] <= mi["prefetch_recall"] <= 1
        assert sum(x["prefetches"] for x in mi["per_layer"]) == mi["prefetches"]
        assert sum(x["wasted_prefetch_bytes"] for x in mi["per_layer"]) == \
            mi["wasted_prefetch_bytes"]
        assert used <= mi["accesses"]
        ph = mi["per_phase"]
        assert ph["prefill"]["accesses"] + ph["decode"]["accesses"] == mi["accesses"]
        assert ph["prefill"]["hits"] + ph["decode"]["hits"] == mi["hits"]
        assert ph["prefill"]["stall_s"] + ph["decode"]["stall_s"] == pytest.approx(mi["stall_s"])


def write_profile(path, host=True):
    prof = {"format": "fmoe-hardware", "version": 1, "name": "test-box",
            "link": {"alpha_s": 1e-4, "beta_bytes_per_s": 1e9},
            "compute": {"attention_s": {"base": 1e-4, "per_token": 0},
                        "expert_s": {"base": 1e-4, "per_token": 0}}}
    if host:
        prof["host"] = {"expert_s": {"base": 5e-4, "per_token": 0}}
    path.write_text(json.dumps(prof))


def test_miss_cpu_and_auto(fmoe, tmp_path):
    rng = random.Random(5)
    reqs = random_requests(rng, 4, 2, 8, 2)
    trace = tmp_path / "t.h5"
    write_trace(trace, reqs, 2, 8, 2)
    prof = tmp_path / "p.json"
    write_profile(prof)
    load, cpu, auto = (run_json(fmoe, "--trace", trace, "--policy", "lru", "--cache-experts",
                                4, "--profile", prof, "--miss", m)["results"][0]
                       for m in ("load", "cpu", "auto"))
    assert load["miss"] == "load" and load["host_misses"] == 0
    # cpu: nothing is ever loaded (lru makes no prefetch), every access is a host miss.
    assert cpu["bytes_loaded"] == 0 and cpu["host_misses"] == cpu["accesses"] == cpu["misses"]
    assert cpu["host_busy_s"] == pytest.approx(cpu["accesses"] * 5e-4)
    # auto: per miss, whichever ends first: the host (0.5 ms, one at a time) or a load
    # (1.1 ms) + GPU compute; some of each here.
    assert 0 < auto["host_misses"] < cpu["host_misses"]
    assert auto["e2e_s"]["mean"] <= max(cpu["e2e_s"]["mean"], load["e2e_s"]["mean"])
    table = fmoe("simulate", "--trace", trace, "--cache-experts", "4", "--profile", prof,
                 "--miss", "cpu", "--quiet").stdout
    assert "on host" in table and "misses: cpu" in table
    write_profile(prof, host=False)
    p = fmoe("simulate", "--trace", trace, "--cache-experts", "4", "--profile", prof,
             "--miss", "cpu", check=False)
    assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1
    assert "--miss cpu needs host compute figures" in p.stderr
    p = fmoe("simulate", "--trace", trace, "--cache-experts", "4", "--miss", "gpu",
             check=False)
    assert p.returncode == 2 and "--miss must be load, cpu or auto" in p.stderr


def test_arrivals_queueing(fmoe, tmp_path):
    rng = random.Random(9)
    reqs = random_requests(rng, 5, 2, 8, 2)
    trace = tmp_path / "t.h5"
    write_trace(trace, reqs, 2, 8, 2, arrivals=[0, 0, 0, 0, 100])
    csv = tmp_path / "azure.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                   "2023-11-16 18:15:46.0000000,374,44\n"
                   "2023-11-16 18:15:46.0000000,396,109\n"
                   "2023-11-16 18:15:46.0000000,879,20\n"
                   "2023-11-16 18:15:46.5000000,91,11\n"
                   "2023-11-16 18:17:46.0000000,91,11\n"
                   "2023-11-16 18:17:47.0000000,91,11\n")
    base = run_json(fmoe, "--trace", trace, "--cache-experts", 4)["results"][0]
    burst = run_json(fmoe, "--trace", trace, "--cache-experts", 4, "--arrivals", csv)
    assert burst["arrivals"] == str(csv)
    r = burst["results"][0]
    # Three requests arrive together: the 2nd and 3rd queue.
    assert r["queue_s"]["p99"] > 0 and r["queue_s"]["p50"] >= 0
    assert r["e2e_s"]["mean"] >= base["e2e_s"]["mean"]
    assert base["queue_s"]["mean"] == 0
    # Starting at row 1 with the rows far apart (speed 1): request 4 arrives 2 min later.
    far = run_json(fmoe, "--trace", trace, "--cache-experts", 4, "--arrivals", csv,
                   "--arrivals-start", 1)["results"][0]
    assert far["total_s"] > 120
    # The trace's own arrival times.
    own = run_json(fmoe, "--trace", trace, "--cache-experts", 4, "--arrivals", "trace")
    assert own["results"][0]["total_s"] > 100
    # Too few rows: one line, exit 1.
    p = fmoe("simulate", "--trace", trace, "--cache-experts", "4", "--arrivals", csv,
             "--arrivals-start", "3", check=False)
    assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1
    assert "3 arrivals from row 3, but the trace has 5 requests" in p.stderr
    p = fmoe("simulate", "--trace", trace, "--cache-experts", "4", "--arrivals-start", "1",
             check=False)
    assert p.returncode == 2


def test_csv_has_new_columns(fmoe, tmp_path):
    rng = random.Random(2)
    reqs = random_requests(rng, 3, 2, 4, 1)
    trace = tmp_path / "t.h5"
    write_trace(trace, reqs, 2, 4, 1)
    out = tmp_path / "r.csv"
    fmoe("simulate", "--trace", trace, "--policy", "lru,oracle", "--cache-experts", "2",
         "--csv", out, "--quiet")
    lines = out.read_text().splitlines()
    head = lines[0].split(",")
    for col in ("prefetch_precision", "prefetch_recall", "goodpred", "miss", "queue_p99_s"):
        assert col in head
    rows = [dict(zip(head, ln.split(","))) for ln in lines[1:]]
    assert rows[0]["prefetch_precision"] == ""  # lru: undefined
    assert math.isclose(float(rows[1]["prefetch_precision"]), 1.0)
