"""Traces with expert ids only (probs_kind none), as the largest public routing logs of big
models are: build-store accepts them and the fmoe policies replay them, each chosen expert
taken at 1/K.

Independent check: the same routing imported twice, once without probabilities and once
with explicit rows of 1/K on the chosen experts, must give the same store (maps equal) and
the same simulation (every count equal) — the ids-only path must mean exactly "1/K on the
chosen experts", no more and no less.
"""
import json

import numpy as np
import pytest

h5py = pytest.importorskip("h5py")
import hdf5plugin  # noqa: F401,E402

L, J, K = 4, 12, 2


def write_jsonl(path, with_probs, seed=3, requests=24, tokens=14):
    rng = np.random.default_rng(seed)
    topics = rng.dirichlet(np.full(J, 0.3), size=(4, L))
    with open(path, "w") as f:
        for r in range(requests):
            t0 = r % 4
            for tok in range(tokens):
                for layer in range(L):
                    p = 0.8 * topics[t0, layer] + 0.2 * rng.dirichlet(np.ones(J))
                    ex = np.argsort(-p, kind="stable")[:K].tolist()
                    rec = {"request": r, "token": tok,
                           "phase": "prefill" if tok < 4 else "decode",
                           "layer": layer, "experts": ex}
                    if with_probs:
                        row = [0.0] * J
                        for e in ex:
                            row[e] = 1.0 / K
                        rec["probs"] = row
                    f.write(json.dumps(rec) + "\n")


@pytest.fixture(scope="module")
def traces(tmp_path_factory, fmoe_bin):
    import subprocess
    d = tmp_path_factory.mktemp("ids")
    out = {}
    for name, probs in (("ids", False), ("onek", True)):
        src = d / f"{name}.jsonl"
        write_jsonl(src, probs)
        p = subprocess.run([str(fmoe_bin), "trace", "import", "--layers", str(L), "--experts",
                            str(J), "--top-k", str(K), "--expert-bytes", "1000000", str(src),
                            "-o", str(d / f"{name}.h5"), "--quiet"],
                           capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        out[name] = d / f"{name}.h5"
    with h5py.File(out["ids"], "r") as f:
        assert f.attrs["probs_kind"] in (b"none", "none") and "tokens/probs" not in f
    return d, out


@pytest.fixture(scope="module")
def stores(traces, fmoe):
    """name -> (store built from that trace, build-store's report)."""
    d, t = traces
    out = {}
    for name in ("ids", "onek"):
        s = d / f"{name}-store.h5"
        rep = fmoe("build-store", "--trace", t[name], "-o", s, "--capacity", 64,
                   "--prefetch-distance", 1, "--split", 0.5).stdout
        out[name] = s, rep
    return out


def test_build_store_from_ids_only_equals_one_over_k(stores):
    rep = stores["ids"][1]
    assert "expert ids only" in rep and "1/K" in rep
    stores = {name: s for name, (s, _) in stores.items()}
    with h5py.File(stores["ids"], "r") as a, h5py.File(stores["onek"], "r") as b:
        ma, mb = a["maps"][:], b["maps"][:]
        assert ma.shape == mb.shape and ma.shape[0] > 0
        assert np.array_equal(ma, mb)
        # a map is 1/K on K experts of each layer: sums of 1 per layer at most (dedup
        # averages rows, so values may be other multiples, but each layer sums to 1)
        assert np.allclose(ma.sum(axis=2), 1.0, atol=1e-5)


def test_simulate_fmoe_on_ids_only_equals_one_over_k(traces, stores, fmoe):
    _, t = traces
    res = {}
    for name in ("ids", "onek"):
        p = fmoe("simulate", "--trace", t[name], "--policy", "fmoe,fmoe-hitcount,lru",
                 "--cache-experts", "8,16", "--prefetch-distance", 1, "--store",
                 stores[name][0], "--json")
        if name == "ids":
            assert "expert ids only" in p.stderr and p.stderr.count("1/K") == 1
        res[name] = [{k: r[k] for k in ("policy", "cache_experts", "hits", "late_hits",
                                        "misses", "prefetches", "bytes_loaded")}
                     for r in json.loads(p.stdout)["results"]]
    assert res["ids"] == res["onek"]
    fm = [r for r in res["ids"] if r["policy"] == "fmoe"]
    assert all(r["prefetches"] > 0 for r in fm)
