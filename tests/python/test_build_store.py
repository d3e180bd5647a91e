"""`fmoe build-store`, `fmoe inspect STORE` and `fmoe simulate --store` end to end:
the store file checked with h5py, the split recorded and honoured by
--holdout, and the one-line errors for bad input (capacity 0, d >= L, an empty trace, a
store built for another model).

The traces come from tests/trace/write_sample (3 layers, 8 experts, top-2, 4-dim
embeddings, full probabilities) and from a synthetic JSONL import; h5py edits copies to
make the bad cases.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest


@pytest.fixture(scope="session")
def need_build_store(fmoe):
    p = fmoe("build-store", "--help", check=False)
    if p.returncode != 0 or "usage: fmoe build-store" not in p.stdout:
        pytest.skip("build-store is not registered in this build (cmd/main.c)")


@pytest.fixture
def sample_trace(build_dir, tmp_path):
    exe = build_dir / "tests" / "trace" / "write_sample"
    path = tmp_path / "sample.h5"
    p = subprocess.run([str(exe), str(path), "zstd", "f32"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return path


def synthetic_trace(fmoe, tmp_path, requests=20, layers=6, experts=8, top_k=2, seed=0):
    """A JSONL routing log with full probabilities, imported: each request follows one of
    three topics, so stores built from some requests predict the others."""
    import numpy as np

    rng = np.random.default_rng(seed)
    topics = rng.dirichlet(np.full(experts, 0.2), size=(3, layers))
    src = tmp_path / "syn.jsonl"
    with open(src, "w") as f:
        for r in range(requests):
            t = r % 3
            for tok in range(10):
                for l in range(layers):
                    p = 0.9 * topics[t, l] + 0.1 / experts
                    ex = np.argsort(-p, kind="stable")[:top_k]
                    f.write(json.dumps({"request": r, "token": tok,
                                        "phase": "prefill" if tok < 3 else "decode",
                                        "layer": l, "experts": ex.tolist(),
                                        "probs": p.round(6).tolist()}) + "\n")
    out = tmp_path / "syn.h5"
    fmoe("trace", "import", "--layers", layers, "--experts", experts, "--top-k", top_k,
         "--expert-bytes", 1000000, src, "-o", out, "--quiet")
    return out


def h5(code):
    p = subprocess.run([sys.executable, "-c", "import h5py, hdf5plugin, numpy as np, json\n" + code],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_build_store_writes_what_h5py_reads(fmoe, need_build_store, sample_trace, tmp_path,
                                            plugin_dir):
    store = tmp_path / "s.h5"
    out = fmoe("build-store", "--trace", sample_trace, "--capacity", 4, "--prefetch-distance",
               1, "-o", store, "--quiet", "--compression", "deflate").stdout
    assert "4 of 4 entries from 13 tokens of 3 requests" in out  # 13 tokens: dedup kicks in
    assert "4 appended, 9 placed by deduplication" in out
    assert "4-dim projection" in out
    info = json.loads(h5(f"""
with h5py.File({str(store)!r}) as f:
    a = f.attrs
    print(json.dumps({{"format": a["format"], "capacity": int(a["capacity"]), "size": int(a["size"]),
        "d": int(a["prefetch_distance"]), "h": int(a["semantic_dim"]),
        "maps": list(f["maps"].shape), "sem": list(f["semantic"].shape),
        "rowsum": float(f["maps"][()].sum(axis=2).mean()),
        "sources": [s.decode() if isinstance(s, bytes) else s for s in f["sources/path"][()]],
        "used": f["requests/used_id"][()].tolist(), "held": f["requests/held_out_id"][()].tolist()}}))
"""))
    assert info["format"] == "fmoe-store" and info["capacity"] == 4 and info["size"] == 4
    assert info["d"] == 1 and info["h"] == 4
    assert info["maps"] == [4, 3, 8] and info["sem"] == [4, 4]
    assert info["sources"] == [str(sample_trace)]
    assert info["used"] == [100, 107, 114] and info["held"] == []


def test_split_is_deterministic_and_recorded(fmoe, need_build_store, tmp_path):
    trace = synthetic_trace(fmoe, tmp_path)
    ids = []
    for name in ("a", "b", "c"):
        seed = 7 if name != "c" else 8
        store = tmp_path / f"{name}.h5"
        out = fmoe("build-store", "--trace", trace, "--capacity", 50, "--prefetch-distance", 2,
                   "--split", 0.7, "--seed", seed, "-o", store, "--quiet").stdout
        assert "14 used, 6 held out" in out
        ids.append(json.loads(h5(f"""
with h5py.File({str(store)!r}) as f:
    print(json.dumps([f["requests/used_id"][()].tolist(), f["requests/held_out_id"][()].tolist(),
                      float(f.attrs["split"]), int(f.attrs["split_seed"])]))
""")))
    assert ids[0] == ids[1]  # same seed, same split
    assert ids[0][0] != ids[2][0]  # another seed, another split
    used, held, split, seed = ids[0]
    assert sorted(used + held) == list(range(20)) and not set(used) & set(held)
    assert split == 0.7 and seed == 7


def test_inspect_store(fmoe, need_build_store, tmp_path):
    trace = synthetic_trace(fmoe, tmp_path)
    store = tmp_path / "s.h5"
    fmoe("build-store", "--trace", trace, "--capacity", 30, "--prefetch-distance", 2, "--split",
         0.7, "-o", store, "--quiet")
    text = fmoe("inspect", store).stdout
    assert "fmoe expert-map store" in text
    assert "30 of 30" in text
    assert "map cosine" in text and str(trace) in text
    assert "semantic     none" in text
    j = json.loads(fmoe("inspect", store, "--json").stdout)
    assert j["capacity"] == 30 and j["size"] == 30 and j["requests_held_out"] == 6
    nn = j["nearest_neighbour"]["map"]
    assert 0 <= nn["min"] <= nn["p50"] <= nn["max"] <= 1.0001
    assert sum(nn["histogram_0_to_1"]) == 30


def test_simulate_holdout_replays_only_the_held_out_requests(fmoe, need_build_store, tmp_path):
    trace = synthetic_trace(fmoe, tmp_path)
    store = tmp_path / "s.h5"
    fmoe("build-store", "--trace", trace, "--capacity", 100, "--prefetch-distance", 2,
         "--split", 0.7, "--seed", 3, "-o", store, "--quiet")
    p = fmoe("simulate", "--trace", trace, "--store", store, "--holdout", "--policy",
             "fmoe,fmoe-map-t,fmoe-map-ts,fmoe-hitcount,fmoe-lru,fmoe-lfu,lru",
             "--cache-experts", 12, "--prefetch-distance", 2, "--json", "--quiet")
    j = json.loads(p.stdout)
    assert j["requests"] == 6
    res = {r["policy"]: r for r in j["results"]}
    assert set(res) == {"fmoe", "fmoe-map-t", "fmoe-map-ts", "fmoe-hitcount", "fmoe-lru",
                        "fmoe-lfu", "lru"}
    assert res["fmoe"]["prefetches"] > 0 and res["lru"]["prefetches"] == 0
    assert all(r["accesses"] == res["lru"]["accesses"] for r in res.values())
    # offline-update learns on top of the built store
    p = fmoe("simulate", "--trace", trace, "--store", store, "--holdout", "--store-mode",
             "offline-update", "--policy", "fmoe", "--cache-experts", 12, "--prefetch-distance",
             2, "--json", "--quiet")
    assert json.loads(p.stdout)["results"][0]["prefetches"] > 0
    # online mode needs no store
    p = fmoe("simulate", "--trace", trace, "--policy", "fmoe", "--store-mode", "online",
             "--cache-experts", 12, "--prefetch-distance", 2, "--json", "--quiet")
    assert json.loads(p.stdout)["results"][0]["prefetches"] > 0


def one_line_error(p, code, *parts):
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    for part in parts:
        assert part in lines[0], lines[0]


def test_capacity_is_sized_to_the_tokens(fmoe_bin, fmoe, need_build_store, tmp_path):
    """--capacity beyond the tokens the split keeps allocates only those (not 116 GB for
    100,000,000 entries); run under a 2 GiB address-space limit, so the
    old allocation fails the test. simulate --store-capacity gives offline updates room to
    grow: any capacity that holds every new entry gives the same result."""
    from memory_limit import limit_address_space

    trace = synthetic_trace(fmoe, tmp_path)  # 20 requests x 10 tokens
    store = tmp_path / "s.h5"
    limited = limit_address_space(2 << 30)

    p = subprocess.run([str(fmoe_bin), "build-store", "--trace", str(trace), "--capacity",
                        "100000000", "--prefetch-distance", "2", "--split", "0.7", "-o",
                        str(store), "--quiet"], capture_output=True, text=True, timeout=120,
                       preexec_fn=limited)
    assert p.returncode == 0, p.stderr
    assert "capacity     100000000 asked; sized to the 140 tokens" in p.stdout
    j = json.loads(fmoe("inspect", store, "--json").stdout)
    assert j["capacity"] == 140 and j["size"] == 140
    assert h5(f"""
with h5py.File({str(store)!r}) as f:
    print(int(f.attrs["capacity_asked"]), int(f.attrs["capacity"]))
""").split() == ["100000000", "140"]
    runs = {}
    for cap in ("140", "1000", "5000"):
        p = fmoe("simulate", "--trace", trace, "--store", store, "--holdout", "--store-mode",
                 "offline-update", "--store-capacity", cap, "--policy", "fmoe",
                 "--cache-experts", 12, "--prefetch-distance", 2, "--json", "--quiet")
        r = json.loads(p.stdout)["results"][0]
        runs[cap] = (r["hits"], r["prefetches"], r["accesses"])
    assert runs["1000"] == runs["5000"]  # room for all 60 held-out tokens either way


def test_bad_input_is_one_line(fmoe, need_build_store, sample_trace, tmp_path):
    store = tmp_path / "s.h5"
    one_line_error(fmoe("build-store", "--trace", sample_trace, "--capacity", 0, "-o", store,
                        check=False), 2, "--capacity must be at least 1 entry, got 0")
    one_line_error(fmoe("build-store", "--trace", sample_trace, "--prefetch-distance", 3, "-o",
                        store, check=False), 2, "--prefetch-distance 3", "3 MoE layers",
                   "at most 2")
    assert not store.exists() and not (tmp_path / "s.h5.partial").exists()
    # an empty trace: the sample's datasets cut to zero rows
    empty = tmp_path / "empty.h5"
    shutil.copy(sample_trace, empty)
    h5(f"""
with h5py.File({str(empty)!r}, "r+") as f:
    for name in ["requests/id", "requests/arrival_s", "requests/prompt_tokens",
                 "requests/output_tokens", "tokens/token_id", "tokens/phase", "tokens/experts",
                 "tokens/probs", "tokens/semantic", "tokens/speculative"]:
        d = f[name]
        d.resize(0, axis=0)
    f["requests/token_offset"].resize(1, axis=0)
""")
    one_line_error(fmoe("build-store", "--trace", empty, "-o", store, "--prefetch-distance", 1,
                        check=False), 1, str(empty), "no tokens")
    # a store for another model: both fingerprints named
    fmoe("build-store", "--trace", sample_trace, "--capacity", 4, "--prefetch-distance", 1,
         "-o", store, "--quiet")
    other = tmp_path / "other.h5"
    shutil.copy(sample_trace, other)
    h5(f"""
with h5py.File({str(other)!r}, "r+") as f:
    f.attrs["model_fingerprint"] = "ab" * 32
""")
    one_line_error(fmoe("simulate", "--trace", other, "--store", store, "--policy", "fmoe",
                        "--cache-experts", 4, "--prefetch-distance", 1, "--quiet",
                        "--hardware", "rtx3090-pcie4", check=False), 1,
                   "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
                   "ab" * 32)
    # d >= L in simulate
    one_line_error(fmoe("simulate", "--trace", sample_trace, "--store", store, "--policy",
                        "fmoe", "--cache-experts", 4, "--prefetch-distance", 3, "--quiet",
                        check=False), 2, "--prefetch-distance 3", "at most 2")
    # --holdout of a trace the store was not built from (same model, recorded another time)
    later = tmp_path / "later.h5"
    shutil.copy(sample_trace, later)
    h5(f"""
with h5py.File({str(later)!r}, "r+") as f:
    f.attrs["created"] = "2030-01-01T00:00:00Z"
""")
    one_line_error(fmoe("simulate", "--trace", later, "--store", store, "--holdout",
                        "--policy", "lru", "--cache-experts", 4, "--quiet", check=False), 1,
                   "--holdout", "not one of the traces")


def test_simulate_store_capacity_is_sized_to_the_tokens(fmoe_bin, fmoe, need_build_store,
                                                        tmp_path):
    """simulate --store-capacity 100000000 allocates only what the run can fill (the
    trace's 200 tokens; the whole capacity would be 116 GB), so it runs under a 2 GiB
    address-space limit and gives what a capacity of exactly the tokens gives; likewise an
    offline-update of a store whose build-store --capacity was 100000000."""
    from memory_limit import limit_address_space

    trace = synthetic_trace(fmoe, tmp_path)  # 20 requests x 10 tokens
    store = tmp_path / "s.h5"
    limited = limit_address_space(2 << 30)

    def sim(*args):
        p = subprocess.run([str(fmoe_bin), "simulate", "--trace", str(trace), "--policy",
                            "fmoe", "--cache-experts", "12", "--prefetch-distance", "2",
                            "--json", "--quiet", *map(str, args)],
                           capture_output=True, text=True, timeout=120, preexec_fn=limited)
        assert p.returncode == 0, p.stderr
        r = json.loads(p.stdout)["results"][0]
        return r["hits"], r["prefetches"], r["accesses"]

    online = sim("--store-capacity", 100000000)
    assert online == sim("--store-capacity", 200)
    assert online[0] > 0  # the store learned something: the comparison is not vacuous

    fmoe("build-store", "--trace", trace, "--capacity", 100000000, "--prefetch-distance", 2,
         "--split", 0.5, "-o", store, "--quiet")
    grown = sim("--store", store, "--holdout", "--store-mode", "offline-update")
    assert grown == sim("--store", store, "--holdout", "--store-mode", "offline-update",
                        "--store-capacity", 200)


def test_simulate_eamc_capacity_is_sized_to_the_requests(fmoe_bin, fmoe, tmp_path):
    """MoE-Infinity's collections take one EAM per request and are allocated whole up front:
    --eamc-capacity 10000000 (2 x C x L x J floats, gigabytes) runs under a 2 GiB
    address-space limit and gives what a capacity of exactly the trace's 20 requests gives."""
    from memory_limit import limit_address_space

    trace = synthetic_trace(fmoe, tmp_path)  # 20 requests x 10 tokens
    limited = limit_address_space(2 << 30)

    def sim(capacity):
        p = subprocess.run([str(fmoe_bin), "simulate", "--trace", str(trace), "--policy",
                            "moe-infinity", "--cache-experts", "12", "--prefetch-distance", "2",
                            "--eamc-capacity", str(capacity), "--json", "--quiet"],
                           capture_output=True, text=True, timeout=120, preexec_fn=limited)
        assert p.returncode == 0, p.stderr
        r = json.loads(p.stdout)["results"][0]
        return r["hits"], r["prefetches"], r["accesses"]

    big = sim(10000000)
    assert big == sim(20)
    assert big[1] > 0  # it prefetched from what it collected: the comparison is not vacuous


def test_holdout_of_a_reimported_trace_says_what_differs(fmoe, need_build_store, tmp_path):
    """The trace imported again after the store was built has the store's source's path
    but another creation time: the one line says so, with both times and request counts,
    not "X.h5 is not one of the traces (its sources: X.h5)"."""
    import time
    trace = synthetic_trace(fmoe, tmp_path)
    store = tmp_path / "s.h5"
    fmoe("build-store", "--trace", trace, "--split", 0.7, "-o", store, "--quiet")
    before = h5(f"with h5py.File({str(trace)!r}) as f: print(f.attrs['created'])").strip()
    time.sleep(1.1)  # `created` has seconds
    trace.unlink()
    assert synthetic_trace(fmoe, tmp_path) == trace
    after = h5(f"with h5py.File({str(trace)!r}) as f: print(f.attrs['created'])").strip()
    assert before != after
    p = fmoe("simulate", "--trace", trace, "--store", store, "--holdout", "--policy", "lru",
             "--cache-experts", 4, "--quiet", check=False)
    one_line_error(p, 1, "--holdout", "though it has its name", f"created {before} with 20",
                   f"created {after} with 20", "rebuild the store")
    # another file: the sources are listed with what identifies them
    other = tmp_path / "other.h5"
    shutil.copy(trace, other)
    p = fmoe("simulate", "--trace", other, "--store", store, "--holdout", "--policy", "lru",
             "--cache-experts", 4, "--quiet", check=False)
    one_line_error(p, 1, f"{other} (created {after}, 20 requests) is not one of the traces",
                   f"{trace} (created {before}, 20 requests)")
