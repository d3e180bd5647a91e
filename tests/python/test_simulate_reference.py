"""`fmoe simulate` hit counts against the independent Python reference (docs/design.md §7.1).

Random traces are written with h5py in the layout of docs/design.md §4; real traces come from
the folder FMOE_REAL_DATA names, when it is set. lru / lfu / belady (and least-stale,
moe-infinity-code, which also need no prefetch) hit counts must equal the reference's at several cache sizes, and
belady must never have fewer hits than the others. Also: the CLI's other outputs (prefetch
metrics, arrivals, the host lane) and its one-line errors.
"""
import json
import pathlib
import random
import subprocess
import sys

import h5py
import numpy as np
import pytest

from reference_cache import POLICIES, hits, sequence

REPO = pathlib.Path(__file__).resolve().parents[2]


def write_trace(path, requests, L, J, K, expert_bytes=1 << 20, speculative=None,
                arrivals=None):
    """requests: list of (prompt_tokens, experts[T][L][K]); speculative: [T][L][S][J] over
    all tokens, or None."""
    experts = np.concatenate([np.asarray(e, dtype=np.uint16).reshape(-1, L, K)
                              for _, e in requests])
    T = experts.shape[0]
    phase = np.concatenate([np.array([0] * p + [1] * (len(e) - p), dtype=np.uint8)
                            for p, e in requests])
    offsets = np.cumsum([0] + [len(e) for _, e in requests]).astype(np.int64)
    with h5py.File(path, "w") as f:
        a = f.attrs
        a["format"] = "fmoe-trace"
        a["version"] = np.int32(1)
        a["model_name"] = "random"
        a["model_fingerprint"] = ""
        a["num_layers"] = np.int32(L)
        a["num_experts"] = np.int32(J)
        a["top_k"] = np.int32(K)
        a["hidden_size"] = np.int32(0)
        a["shared_experts"] = np.int32(0)
        a["expert_bytes"] = np.int64(expert_bytes)
        a["dtype"] = "bf16"
        a["dataset"] = "random"
        a["created"] = "2025-01-01T00:00:00Z"
        a["fmoe_version"] = "test"
        a["recorded_on"] = "test:h5py"
        a["probs_kind"] = "none"
        a["semantic_dim"] = np.int32(0)
        a["semantic_kind"] = ""
        a["speculative_depth"] = np.int32(0 if speculative is None else speculative.shape[2])
        f.create_dataset("model/config_json", data="")
        f.create_dataset("requests/id", data=np.arange(len(requests), dtype=np.int64))
        f.create_dataset("requests/arrival_s",
                         data=np.zeros(len(requests)) if arrivals is None else
                         np.asarray(arrivals, dtype=np.float64))
        f.create_dataset("requests/prompt_tokens",
                         data=np.array([p for p, _ in requests], dtype=np.int32))
        f.create_dataset("requests/output_tokens",
                         data=np.array([len(e) - p for p, e in requests], dtype=np.int32))
        f.create_dataset("requests/token_offset", data=offsets)
        f.create_dataset("tokens/token_id", data=np.full(T, -1, dtype=np.int32))
        f.create_dataset("tokens/phase", data=phase)
        f.create_dataset("tokens/experts", data=experts)
        if speculative is not None:
            f.create_dataset("tokens/speculative", data=speculative.astype(np.float32))


def random_requests(rng, R, L, J, K):
    reqs = []
    hot = [rng.sample(range(J), max(K, J // 4)) for _ in range(L)]
    for _ in range(R):
        P, D = rng.randint(0, 12), rng.randint(0, 20)
        if P + D == 0:
            D = 1
        ex = []
        for _ in range(P + D):
            row = []
            for l in range(L):
                pool = hot[l] if rng.random() < 0.6 else list(range(J))
                row.append(rng.sample(pool, K))
            ex.append(row)
        reqs.append((P, ex))
    return reqs


def simulate(fmoe, trace, caches, policies=POLICIES, extra=()):
    p = fmoe("simulate", "--trace", trace, "--policy", ",".join(policies),
             "--cache-experts", ",".join(map(str, caches)), "--json", "--quiet", *extra)
    out = json.loads(p.stdout)
    return {(r["policy"], r["cache_experts"]): r for r in out["results"]}


def registry_policies(fmoe):
    """The policy names `fmoe simulate --help` lists under "policies:", in table order."""
    lines = fmoe("simulate", "--help").stdout.splitlines()
    names = []
    for line in lines[lines.index("policies:") + 1:]:
        if not line.startswith("  "):
            break
        names.append(line.split()[0])
    assert names
    return names


def reference_sequence(requests):
    return sequence(requests)


def check_against_reference(results, ref, caches):
    seq, iters, reqs = ref
    for c in caches:
        for pol in POLICIES:
            r = results[(pol, c)]
            assert r["accesses"] == len(seq)
            assert r["hits"] == hits(seq, c, pol, iters, reqs), (pol, c)
            assert r["hits"] + r["misses"] + r["late_hits"] == r["accesses"]
            assert results[("belady", c)]["hits"] >= r["hits"], (pol, c)


@pytest.mark.parametrize("seed", range(6))
def test_random_traces_match_reference(fmoe, tmp_path, seed):
    rng = random.Random(seed)
    L, J = rng.randint(1, 4), rng.randint(4, 24)
    K = rng.randint(1, min(4, J))
    reqs = random_requests(rng, rng.randint(1, 12), L, J, K)
    trace = tmp_path / "random.h5"
    write_trace(trace, reqs, L, J, K)
    caches = sorted({1, K, max(1, L * J // 4), L * J // 2 + 1, L * J})
    results = simulate(fmoe, trace, caches)
    check_against_reference(results, reference_sequence(reqs), caches)


def test_json_shape_and_timing_fields(fmoe, tmp_path):
    rng = random.Random(99)
    reqs = random_requests(rng, 5, 2, 8, 2)
    trace = tmp_path / "t.h5"
    write_trace(trace, reqs, 2, 8, 2)
    r = simulate(fmoe, trace, [3], policies=("ondemand",))[("ondemand", 3)]
    for key in ("policy", "cache_experts", "prefetch_distance", "accesses", "hits",
                "late_hits", "misses", "hit_rate", "bytes_loaded", "stall_s", "ttft_s",
                "tpot_s", "e2e_s", "per_layer"):
        assert key in r
    assert set(r["ttft_s"]) == {"mean", "p50", "p90", "p99"}
    assert len(r["per_layer"]) == 2
    assert sum(x["hits"] for x in r["per_layer"]) == r["hits"]
    assert r["bytes_loaded"] == r["misses"] * (1 << 20)
    assert 0 < r["ttft_s"]["p50"] <= r["e2e_s"]["p99"]
    assert r["stall_s"] > 0


def test_bad_input_one_line_errors(fmoe, tmp_path):
    trace = tmp_path / "t.h5"
    write_trace(trace, random_requests(random.Random(1), 2, 1, 4, 1), 1, 4, 1)
    p = fmoe("simulate", "--trace", trace, "--policy", "lru,nope", "--cache-experts", "4",
             check=False)
    assert p.returncode == 2
    assert f"unknown policy 'nope' (valid: {', '.join(registry_policies(fmoe))})" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    p = fmoe("simulate", "--trace", trace, "--cache-experts", "0", check=False)
    assert p.returncode == 2 and "--cache-experts must be in" in p.stderr
    prof = tmp_path / "p.json"
    prof.write_text('{"link": {"beta_bytes_per_s": 1e9}, "device": {}}')
    p = fmoe("simulate", "--trace", trace, "--cache-experts", "2", "--profile", prof,
             check=False)
    assert p.returncode == 1
    assert p.stderr.strip() == f"fmoe simulate: {prof}: missing field link.alpha_s"
    p = fmoe("simulate", "--trace", trace, "--cache-experts", "2", "--hardware", "tpu",
             check=False)
    assert p.returncode == 2 and "presets: rtx3090-pcie4" in p.stderr  # usage error
    p = fmoe("simulate", "--trace", tmp_path / "missing.h5", "--cache-experts", "2",
             check=False)
    assert p.returncode == 1 and "missing.h5" in p.stderr


def import_real_traces(fmoe, real_data, tmp_path):
    """fmoe traces of FMOE_REAL_DATA: any .h5 there, plus traces imported here (uncompressed,
    so that h5py reads them without a plugin) from the FLAME-MoE dense CSVs and the
    Qwen1.5-MoE vLLM logs. An import that fails fails the test: the logs are there, so they
    must import."""
    out = sorted(real_data.rglob("*.h5"))[:2]
    flame = sorted((real_data / "flame-moe-290m-dynande").rglob("layer0*.csv"))
    if flame:
        t = tmp_path / "flame.h5"
        fmoe("trace", "import", "--format", "dense-csv", "--layers", len(flame),
             "--experts", 64, "--top-k", 6, "--tokens-per-request", 64,
             "--expert-bytes", 1 << 21, "--compression", "none", *flame, "-o", t)
        out.append(t)
    qwen = real_data / "qwen1.5-moe-a2.7b-vllm-logger"
    conv = REPO / "datasets" / "vllm_logger_to_jsonl.py"
    logs = sorted(qwen.glob("moe_layer*.jsonl"))
    if logs:
        j = tmp_path / "qwen.jsonl"
        r = subprocess.run([sys.executable, str(conv), "--preset", "qwen1.5-moe-a2.7b-gsm8k25",
                            "-o", str(j), *map(str, logs)], capture_output=True, text=True)
        assert r.returncode == 0, f"{conv.name} failed:\n{r.stderr}"
        t = tmp_path / "qwen.h5"
        fmoe("trace", "import", "--layers", len(logs), "--experts", 60, "--top-k", 4,
             "--expert-bytes", 8650752, "--compression", "none", j, "-o", t)
        out.append(t)
    return out


def test_real_traces_match_reference(fmoe, tmp_path, real_data):
    """Real routing from FMOE_REAL_DATA (FLAME-MoE prefill, Qwen1.5-MoE on vLLM)."""
    h5s = import_real_traces(fmoe, real_data, tmp_path)
    assert h5s, f"FMOE_REAL_DATA={real_data} holds no fmoe trace and no routing log to import"
    checked = 0
    for trace in h5s:
        with h5py.File(trace, "r") as f:
            if f.attrs.get("format") not in ("fmoe-trace", b"fmoe-trace"):
                continue
            L, K = int(f.attrs["num_layers"]), int(f.attrs["top_k"])
            J = int(f.attrs["num_experts"])
            off = f["requests/token_offset"][:]
            prompt = f["requests/prompt_tokens"][:]
            ex = f["tokens/experts"][:]
        ref = sequence([(int(prompt[r]), ex[off[r]:off[r + 1]].tolist())
                        for r in range(len(prompt))])
        caches = sorted({K, L * K, L * J // 8 + 1, L * J // 2})
        results = simulate(fmoe, trace, caches)
        check_against_reference(results, ref, caches)
        checked += 1
    assert checked > 0
