"""Live offloading against the simulator, decision for decision (docs/design.md §9).

A live greedy run of the bundled model fmoe-tiny over 20 bundled prompts with a policy and
a bounded cache (`fmoe record --policy P --cache-experts N --decision-log live.jsonl`)
and `fmoe simulate` of the trace that run recorded (`--decision-log sim.jsonl`) must make
the same decisions: every access resolved the same way (miss or not, the same slot), the
same prefetches into the same slots with the same victims, the same cancellations and
evictions. `fmoe compare-logs` checks it, and this file also checks the logs itself.

What is timing-dependent is held fixed on both sides, as docs/offloading.md explains: the live
run waits for every transfer at the two points where completions become visible
(`--sync-transfers`), and the simulator replays with a profile whose transfers take no
time; hit versus late hit (data there or still in flight when the compute starts) is then
compared as one outcome ("found") by `--late-is-hit`, since no policy decides on it.
The fmoe policy's matcher runs inline (`--sync-predictions`) as in the simulator; on its
thread (the live default) its prefetches come when its searches finish
(test_predict_thread.py). The recordings keep the default float16 gate probabilities: the
live policy is handed them rounded as the trace stores them, so no `--probs-f32` is needed
for the identity (it once was: fmoe at 12 slots diverged within 8 requests without it).

Also: the measured outcomes `record` writes beside the routing; belady refused live; a
cache larger than every expert clamped with one note; a store for another model refused.
"""
import json
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
TINY = REPO / "datasets" / "fmoe-tiny"
PROMPTS = REPO / "datasets" / "samples" / "prompts_100.txt"

h5py = pytest.importorskip("h5py")
import hdf5plugin  # noqa: F401,E402
from conftest import run_fmoe  # noqa: E402

POLICIES = ["lru", "lfu", "ondemand", "least-stale", "mixtral-offload", "moe-infinity",
            "moe-infinity-fb", "fmoe", "predicted-reuse"]
CACHES = [6, 16, 32]  # of 6 x 8 = 48 routed experts

ZERO_LINK = {
    "format": "fmoe-hardware", "version": 1, "name": "zero-link",
    "source": "test: transfers take no time (the simulated side of --sync-transfers)",
    "link": {"alpha_s": 0.0, "beta_bytes_per_s": 1e30},
    "compute": {"attention_s": {"base": 1e-4, "per_token": 1e-6, "per_token_context": 0.0},
                "expert_s": {"base": 1e-5, "per_token": 1e-6}},
}


run = run_fmoe  # conftest's


@pytest.fixture(scope="module")
def work(tmp_path_factory, fmoe_bin):
    d = tmp_path_factory.mktemp("live")
    prompts = d / "prompts20.txt"
    prompts.write_text("\n".join(PROMPTS.read_text().splitlines()[:20]) + "\n")
    (d / "zero.json").write_text(json.dumps(ZERO_LINK))
    # a store for the fmoe policy, from an all-resident recording of other prompts
    other = d / "other.txt"
    other.write_text("\n".join(PROMPTS.read_text().splitlines()[40:80]) + "\n")
    run(fmoe_bin, "record", "--model", TINY, "--dataset", other, "--max-new-tokens", 16,
        "--temperature", 0, "-o", d / "store-src.h5", "--quiet")
    run(fmoe_bin, "build-store", "--trace", d / "store-src.h5", "-o", d / "store.h5",
        "--prefetch-distance", 1, "--quiet")
    return d


@pytest.fixture(scope="module")
def live_run(work, fmoe_bin):
    """live_run(policy, n) -> (trace, live log, simulated log): `fmoe record` of the 20
    prompts with the policy and a cache of n experts, and `fmoe simulate` of its trace. Each
    (policy, n) is run once per module, by whichever test needs it first, so every test that
    reads these files makes them itself when it runs alone."""
    done = {}

    def get(policy, n):
        if (policy, n) in done:
            return done[policy, n]
        store = ["--store", work / "store.h5"] if policy == "fmoe" else []
        spec = ["--speculative", 1] if policy == "mixtral-offload" else []
        trace = work / f"{policy}-{n}.h5"
        live, sim = work / f"{policy}-{n}-live.jsonl", work / f"{policy}-{n}-sim.jsonl"
        run(fmoe_bin, "record", "--model", TINY, "--dataset", work / "prompts20.txt",
            "--max-new-tokens", 12, "--temperature", 0, *spec,
            "--policy", policy, "--cache-experts", n, "--prefetch-distance", 1, *store,
            "--sync-transfers", "--sync-predictions", "--decision-log", live, "-o", trace,
            "--quiet")
        run(fmoe_bin, "simulate", "--trace", trace, "--policy", policy, "--cache-experts", n,
            "--prefetch-distance", 1, *store, "--profile", work / "zero.json",
            "--decision-log", sim, "--quiet")
        done[policy, n] = trace, live, sim
        return done[policy, n]
    return get


def read_log(path):
    lines = pathlib.Path(path).read_text().splitlines()
    head = json.loads(lines[0])
    assert head["fmoe_decision_log"] == 1
    return head, [json.loads(x) for x in lines[1:]]


def decisions(records):
    """The log without what is timing: timestamps; hit and late as one outcome."""
    out = []
    for r in records:
        if r["event"] == "landed":  # a transfer's completion: timing, never compared
            continue
        r = {k: v for k, v in r.items() if k != "t"}
        if r["event"] == "access" and r["result"] in ("hit", "late"):
            r["result"] = "found"
        out.append(r)
    return out


@pytest.mark.parametrize("policy", POLICIES)
def test_live_and_simulated_decisions_are_identical(live_run, fmoe_bin, policy):
    for n in CACHES:
        _, live, sim = live_run(policy, n)
        lh, lrec = read_log(live)
        sh, srec = read_log(sim)
        assert lh["source"] == "record" and sh["source"] == "simulate"
        accesses = sum(r["event"] == "access" for r in lrec)
        assert accesses > 500  # 20 requests x ~13 iterations x 6 layers x >= 1 expert
        misses = sum(r["event"] == "access" and r["result"] == "miss" for r in lrec)
        assert misses > 0 and (n < 16 or misses < accesses)  # 6 slots < a layer's experts
        if policy in ("mixtral-offload", "moe-infinity", "fmoe") and n < 32:
            assert any(r["event"] == "prefetch" for r in lrec), f"{policy} made no prefetch"
        a, b = decisions(lrec), decisions(srec)
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        assert first is None and len(a) == len(b), (
            f"{policy} N={n}: first divergence at record {first}: live {a[first] if first is not None else None} "
            f"sim {b[first] if first is not None else None}; lengths {len(a)} {len(b)}")
        p = run(fmoe_bin, "compare-logs", live, sim, "--late-is-hit", "--json")
        assert json.loads(p.stdout)["identical"] is True


@pytest.mark.parametrize("probs", ["float16", "float32"])
def test_fmoe_identity_holds_with_either_probability_storage(work, fmoe_bin, probs):
    """The reported case: fmoe, 8 requests, 12 slots, recorded with the defaults (float16
    gate probabilities in the trace). The live policy used to see the float32 values while
    simulate replayed the float16 ones the trace holds, and compare-logs found the logs
    different (here at decision 13; 251 in the report); with --probs-f32 both see float32."""
    p8 = work / "prompts8.txt"
    p8.write_text("\n".join(PROMPTS.read_text().splitlines()[:8]) + "\n")
    flag = ["--probs-f32"] if probs == "float32" else []
    trace, live, sim = (work / f"fmoe12-{probs}.h5", work / f"fmoe12-{probs}-live.jsonl",
                        work / f"fmoe12-{probs}-sim.jsonl")
    common = ["--policy", "fmoe", "--cache-experts", 12, "--prefetch-distance", 1,
              "--store", work / "store.h5"]
    run(fmoe_bin, "record", "--model", TINY, "--dataset", p8, "--max-new-tokens", 12,
        "--temperature", 0, *flag, *common, "--sync-transfers", "--sync-predictions",
        "--decision-log", live, "-o", trace, "--quiet")
    with h5py.File(trace, "r") as f:
        assert f["/tokens/probs"].dtype == ("float32" if flag else "float16")
    run(fmoe_bin, "simulate", "--trace", trace, *common, "--profile", work / "zero.json",
        "--decision-log", sim, "--quiet")
    _, lrec = read_log(live)
    assert sum(r["event"] == "prefetch" for r in lrec) > 100
    p = run(fmoe_bin, "compare-logs", live, sim, "--late-is-hit", "--json", check=False)
    got = json.loads(p.stdout)
    assert p.returncode == 0 and got["identical"] is True, got.get("first_divergence")


def test_compare_logs_finds_a_changed_victim(work, live_run, fmoe_bin):
    trace, live, _ = live_run("lru", 6)
    head, recs = read_log(live)
    i = next((i for i, r in enumerate(recs) if r["event"] == "evict"), None)
    assert i is not None, "6 slots for 48 experts and no eviction in the live log"
    recs[i]["victim"] = (recs[i]["victim"] + 1) % 48
    bad = work / "changed.jsonl"
    bad.write_text("\n".join(json.dumps(x) for x in [head, *recs]) + "\n")
    p = run(fmoe_bin, "compare-logs", live, bad, "--late-is-hit", "--json", check=False)
    assert p.returncode == 1
    first = json.loads(p.stdout)["first_divergence"]
    assert first["line_a"] == first["line_b"] == i + 2  # the header is line 1
    assert trace.exists()


def test_record_writes_measured_outcomes(live_run):
    trace, live, _ = live_run("lru", 16)
    _, recs = read_log(live)
    want = [{"hit": 1, "late": 2, "miss": 0, "host": 3}[r["result"]]
            for r in recs if r["event"] == "access"]
    with h5py.File(trace, "r") as f:
        got = f["/timing/access_outcome"][:].tolist()
        assert f.attrs["offload_policy"] in (b"lru", "lru")
        assert int(f.attrs["offload_cache_experts"]) == 16
        assert f["/timing/iteration_s"].shape[0] > 0
    assert got == want


def test_belady_is_refused_live(fmoe_bin, tmp_path):
    p = run(fmoe_bin, "generate", "--model", TINY, "--prompt", "hello", "--policy", "belady",
            "--cache-experts", 8, check=False)
    assert p.returncode != 0
    assert "belady" in p.stderr and "simulate" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_cache_larger_than_the_experts_is_clamped_once(fmoe_bin):
    p = run(fmoe_bin, "generate", "--model", TINY, "--prompt", "hello", "--max-new-tokens", 4,
            "--temperature", 0, "--policy", "lru", "--cache-experts", 1000)
    assert p.stderr.count("clamped") == 1 and "48" in p.stderr
    q = run(fmoe_bin, "generate", "--model", TINY, "--prompt", "hello", "--max-new-tokens", 4,
            "--temperature", 0)
    assert p.stdout == q.stdout  # offloading never changes the tokens


def direct_io_works(path):
    """O_DIRECT opens on this filesystem (not on tmpfs, some overlays)."""
    import os
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
    except OSError:
        return False
    os.close(fd)
    return hasattr(os, "O_DIRECT")


def test_offloaded_generation_equals_all_resident(fmoe_bin):
    base = run(fmoe_bin, "generate", "--model", TINY, "--prompt",
               "The dictionary type maps keys to values, and", "--max-new-tokens", 24,
               "--temperature", 0, "--json")
    direct = ["--direct-io"] if direct_io_works(TINY / "model.safetensors") else []
    for policy, n, tier in (("lru", 3, ["--tier", "file", "--read-depth", 1]),
                            ("mixtral-offload", 8, ["--tier", "host"]),
                            ("lfu", 1, ["--tier", "file", *direct, "--read-depth", 8]),
                            ("least-stale", 5, ["--tier", "file", *direct,
                                                  "--copy-chunks", 3])):
        got = run(fmoe_bin, "generate", "--model", TINY, "--prompt",
                  "The dictionary type maps keys to values, and", "--max-new-tokens", 24,
                  "--temperature", 0, "--json", "--policy", policy, "--cache-experts", n,
                  *tier)
        assert json.loads(got.stdout)["generated_ids"] == json.loads(base.stdout)["generated_ids"]


def test_the_link_of_decode_is_measured_apart(fmoe_bin):
    """The summary's link: the copy engine's bytes over its busy seconds, in all and for
    the copies started in decode steps. A run that never decodes has no decode copies
    (0.00); one whose decode misses (3 slots of 48 experts, 24 tokens) has a positive
    rate."""
    import re
    rates = {}
    for new in (1, 24):
        p = run(fmoe_bin, "generate", "--model", TINY, "--prompt",
                "The dictionary type maps keys to values, and", "--max-new-tokens", new,
                "--temperature", 0, "--policy", "lru", "--cache-experts", 3,
                "--tier", "file")
        m = re.search(r"link ([0-9.]+) GiB/s measured \(decode ([0-9.]+)\)", p.stderr)
        assert m, p.stderr
        rates[new] = float(m.group(1)), float(m.group(2))
        # --json's counts: the decode copies are some of all the copies
        j = json.loads(run(fmoe_bin, "generate", "--model", TINY, "--prompt",
                           "The dictionary type maps keys to values, and", "--max-new-tokens",
                           new, "--temperature", 0, "--policy", "lru", "--cache-experts", 3,
                           "--tier", "file", "--json").stdout)["offload"]
        assert 0 < j["io_bytes"] and 0 < j["io_busy_s"]
        assert j["io_bytes"] == j["bytes_loaded"]  # lru: every copy is a miss's expert
        assert 0 <= j["io_bytes_decode"] < j["io_bytes"]
        assert 0 <= j["io_busy_s_decode"] < j["io_busy_s"]
        assert (j["io_bytes_decode"] > 0) == (new > 1)
    assert rates[1][0] > 0 and rates[1][1] == 0
    assert rates[24][0] > 0 and rates[24][1] > 0
    # untimed copies measure nothing, and the line says so rather than "0.00 GiB/s"
    p = run(fmoe_bin, "generate", "--model", TINY, "--prompt", "x", "--max-new-tokens", 4,
            "--temperature", 0, "--policy", "lru", "--tier", "file", "--cache-experts", 3,
            "--sync-transfers")
    assert "link not measured (--sync-transfers)" in p.stderr, p.stderr
    assert "GiB/s" not in p.stderr, p.stderr


def test_read_depth_needs_the_file_tier(fmoe_bin):
    """--read-depth sets the file tier's reads: without offloading, with --tier host, or
    out of [1, 64] it is a usage error on one line."""
    for extra in ([], ["--cache-experts", 4, "--tier", "host"],
                  ["--cache-experts", 4, "--tier", "file"]):
        depth = 0 if extra and extra[-1] == "file" else 4
        p = run(fmoe_bin, "generate", "--model", TINY, "--prompt", "x", "--read-depth", depth,
                *extra, check=False)
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
        assert "--read-depth" in p.stderr


def test_cache_zero_and_bad_store_are_one_line_errors(work, fmoe_bin):
    p = run(fmoe_bin, "generate", "--model", TINY, "--prompt", "x", "--policy", "lru",
            "--cache-experts", 0, check=False)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
    assert "--cache-experts" in p.stderr


def test_long_prompts_run_in_chunks_on_both_sides(work, fmoe_bin):
    """Prompts longer than the 64-token prefill chunk: each chunk is its own iteration live,
    the trace says so (prefill_chunk), and the replay splits the prefill the same way."""
    lines = PROMPTS.read_text().splitlines()
    long = work / "long.txt"
    long.write_text("\n".join(" ".join(lines[i:i + 6]) for i in range(0, 30, 6)) + "\n")
    for policy in ("lru", "fmoe"):
        store = ["--store", work / "store.h5"] if policy == "fmoe" else []
        trace, live, sim = (work / f"long-{policy}.h5", work / f"long-{policy}-live.jsonl",
                            work / f"long-{policy}-sim.jsonl")
        run(fmoe_bin, "record", "--model", TINY, "--dataset", long, "--max-new-tokens", 6,
            "--temperature", 0, "--policy", policy, "--cache-experts", 16,
            "--prefetch-distance", 1, *store, "--sync-transfers", "--sync-predictions",
            "--decision-log", live, "-o", trace, "--quiet")
        with h5py.File(trace, "r") as f:
            assert int(f.attrs["prefill_chunk"]) == 64
            prompts = f["/requests/prompt_tokens"][:]
            outputs = f["/requests/output_tokens"][:]
            assert (prompts > 64).any()
            chunks = sum(-(-int(p) // 64) for p in prompts)
            assert f["/timing/iteration_s"].shape[0] == chunks + int(outputs.sum())
        _, lrec = read_log(live)
        assert max(r["iteration"] for r in lrec) + 1 == chunks + int(outputs.sum())
        run(fmoe_bin, "simulate", "--trace", trace, "--policy", policy, "--cache-experts", 16,
            "--prefetch-distance", 1, *store, "--profile", work / "zero.json",
            "--decision-log", sim, "--quiet")
        _, srec = read_log(sim)
        assert decisions(lrec) == decisions(srec)
    # a store built from another model's routing (4 layers x 16 experts, not 6 x 8)
    src = work / "other-model.jsonl"
    with open(src, "w") as f:
        for r in range(3):
            for tok in range(6):
                for layer in range(4):
                    f.write(json.dumps({"request": r, "token": tok,
                                        "phase": "prefill" if tok < 2 else "decode",
                                        "layer": layer, "experts": [(tok + layer) % 16, 15],
                                        "probs": [1 / 16] * 16}) + "\n")
    run(fmoe_bin, "trace", "import", "--layers", 4, "--experts", 16, "--top-k", 2,
        "--expert-bytes", 1000, src, "-o", work / "other-model.h5", "--quiet")
    run(fmoe_bin, "build-store", "--trace", work / "other-model.h5", "-o",
        work / "other-store.h5", "--prefetch-distance", 1, "--quiet")
    p = run(fmoe_bin, "generate", "--model", TINY, "--prompt", "x", "--policy", "fmoe",
            "--cache-experts", 8, "--store", work / "other-store.h5", check=False)
    assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "store" in p.stderr


def test_a_failing_read_during_a_run_names_the_file_and_keeps_the_trace(work, fmoe_bin):
    """The slow tier's disk fails mid-run (fault injected after 300 reads): one line naming
    the file, a non-zero exit, and the requests recorded before it in a valid .partial."""
    import os
    import subprocess
    out = work / "failing.h5"
    env = dict(os.environ, FMOE_FAULT_READ_EIO_AFTER="300")
    p = subprocess.run([str(fmoe_bin), "record", "--model", str(TINY), "--dataset",
                        str(work / "prompts20.txt"), "--max-new-tokens", "8", "--temperature",
                        "0", "--policy", "lru", "--cache-experts", "8", "--tier", "file",
                        "-o", str(out), "--quiet"], capture_output=True, text=True, env=env)
    assert p.returncode == 1
    assert "model.safetensors: read at" in p.stderr and "Input/output error" in p.stderr
    assert not out.exists()
    partial = pathlib.Path(str(out) + ".partial")
    with h5py.File(partial, "r") as f:
        n = f["/requests/id"].shape[0]
        assert 0 < n < 20
        assert f["/timing/access_outcome"].shape[0] > 0


def test_store_updated_online_is_written_out_and_matches_the_simulator(work, fmoe_bin):
    """--store-mode offline-update live: the same decisions as simulate's offline-update
    replay, and --store-out writes the store as the run left it (more entries, or entries
    the run changed), readable by h5py; the input store is untouched."""
    import hashlib
    store = work / "store.h5"
    before = hashlib.sha256(store.read_bytes()).hexdigest()
    trace, live, sim, out = (work / "upd.h5", work / "upd-live.jsonl", work / "upd-sim.jsonl",
                             work / "store-updated.h5")
    run(fmoe_bin, "record", "--model", TINY, "--dataset", work / "prompts20.txt",
        "--max-new-tokens", 8, "--temperature", 0, "--policy", "fmoe",
        "--cache-experts", 16, "--prefetch-distance", 1, "--store", store,
        "--store-mode", "offline-update", "--store-out", out, "--sync-transfers",
        "--sync-predictions", "--decision-log", live, "-o", trace, "--quiet")
    run(fmoe_bin, "simulate", "--trace", trace, "--policy", "fmoe", "--cache-experts", 16,
        "--prefetch-distance", 1, "--store", store, "--store-mode", "offline-update",
        "--profile", work / "zero.json", "--decision-log", sim, "--quiet")
    _, lrec = read_log(live)
    _, srec = read_log(sim)
    assert decisions(lrec) == decisions(srec)
    assert hashlib.sha256(store.read_bytes()).hexdigest() == before
    with h5py.File(store, "r") as a, h5py.File(out, "r") as b:
        ma, mb = a["maps"][:], b["maps"][:]
        assert mb.shape[1:] == ma.shape[1:]
        n = min(len(ma), len(mb))
        assert len(mb) > len(ma) or (ma[:n] != mb[:n]).any()
    p = run(fmoe_bin, "record", "--model", TINY, "--dataset", work / "prompts20.txt",
            "--policy", "fmoe", "--cache-experts", 16, "--store", store, "--store-out",
            work / "never.h5", "-o", work / "never-trace.h5", check=False)
    assert p.returncode == 2 and "offline-update" in p.stderr
    assert not (work / "never.h5").exists()
