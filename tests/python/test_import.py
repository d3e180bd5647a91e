"""`fmoe trace import` checked against independent Python readings of the inputs.

The expected traces are rebuilt here from the input files with nothing but json/csv and
NumPy (docs/design.md §4.1 read afresh: requests by first appearance, tokens by position,
K probabilities spread into a dense row), and the files fmoe wrote are read with stock
h5py + hdf5plugin. The vLLM-logger logs (real data, not shipped: the folder FMOE_REAL_DATA
names; the test skips without it) go through datasets/vllm_logger_to_jsonl.py; their
per-expert access counts must equal a count over the source logs.
"""
import csv
import json
import pathlib
import subprocess
import sys
from collections import Counter

import h5py
import hdf5plugin  # noqa: F401  (registers the zstd filter with h5py)
import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "datasets"
SAMPLE = REPO / "datasets" / "samples" / "flame-moe-290m"
CONVERTER = REPO / "datasets" / "vllm_logger_to_jsonl.py"


# ---------------------------------------------------------------- independent readers

def expected_from_jsonl(path, L, J, K):
    """The trace docs/design.md §4.1 describes for a JSONL file (no dropping)."""
    order, reqs = [], {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            o = json.loads(line)
            if o.get("type") == "meta":
                continue
            key = (isinstance(o["request"], str), o["request"])
            if key not in reqs:
                reqs[key] = {}
                order.append(key)
            reqs[key].setdefault(o["token"], {})[o["layer"]] = o
    all_int = not any(k[0] for k in order)
    ids, prompt, output, experts, probs, phase, token_id = [], [], [], [], [], [], []
    kinds = set()
    for r, key in enumerate(order):
        ids.append(key[1] if all_int else r)
        toks = reqs[key]
        n_pre = 0
        for t in sorted(toks):
            layers = toks[t]
            assert sorted(layers) == list(range(L))
            ph = layers[0].get("phase", "decode")
            n_pre += ph == "prefill"
            phase.append(0 if ph == "prefill" else 1)
            tid = [x["token_id"] for x in layers.values() if x.get("token_id") is not None]
            token_id.append(tid[0] if tid else -1)
            ex = np.zeros((L, K), np.uint16)
            pr = np.zeros((L, J), np.float32)
            for l in range(L):
                rec = layers[l]
                ex[l] = rec["experts"]
                p = rec.get("probs")
                kinds.add(0 if p is None else len(p))
                if p is not None and len(p) == K:
                    for e, v in zip(rec["experts"], p):
                        pr[l, e] = np.float32(v)
                elif p is not None:
                    pr[l] = np.asarray(p, np.float32)
            experts.append(ex)
            probs.append(pr)
        prompt.append(n_pre)
        output.append(len(toks) - n_pre)
    assert len(kinds) == 1
    return dict(ids=np.array(ids), prompt=np.array(prompt), output=np.array(output),
                experts=np.array(experts), probs=np.array(probs), phase=np.array(phase),
                token_id=np.array(token_id))


def expected_from_dense_csv(files, K, per_request):
    """Chosen experts = non-zero entries by decreasing probability (ties: lower id)."""
    layers = []
    for path in files:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
        header, rows = rows[0], [r for r in rows[1:] if r]
        J = len(header) - 2
        ex = np.zeros((len(rows), K), np.uint16)
        pr = np.zeros((len(rows), J), np.float32)
        for i, row in enumerate(rows):
            vals = [np.float32(float(x)) for x in row[2:]]
            nz = sorted((j for j in range(J) if vals[j] != 0), key=lambda j: (-vals[j], j))
            assert len(nz) == K
            ex[i] = nz
            pr[i] = vals
        layers.append((ex, pr))
    T = layers[0][0].shape[0]
    experts = np.stack([x[0] for x in layers], axis=1)
    probs = np.stack([x[1] for x in layers], axis=1)
    n = per_request if per_request else T
    sizes = [min(n, T - s) for s in range(0, T, n)]
    return dict(experts=experts, probs=probs, sizes=sizes)


def read_trace(path):
    with h5py.File(path, "r") as f:
        out = {k: f[k][()] for k in ["requests/id", "requests/prompt_tokens",
                                     "requests/output_tokens", "requests/token_offset",
                                     "tokens/experts", "tokens/phase", "tokens/token_id"]}
        out["probs"] = f["tokens/probs"][()] if "tokens/probs" in f else None
        out["attrs"] = {k: (v.decode() if isinstance(v, bytes) else v)
                        for k, v in f.attrs.items()}
        out["config_json"] = f["model/config_json"][()] if "model/config_json" in f else None
    return out


def no_output(out):
    return not out.exists() and not pathlib.Path(str(out) + ".partial").exists()


# ---------------------------------------------------------------- JSON Lines

def test_jsonl_fixture_matches_python(fmoe, tmp_path):
    src = FIXTURES / "routing_small.jsonl"
    out = tmp_path / "small.h5"
    p = fmoe("trace", "import", "--layers", "2", "--experts", "8", "--top-k", "2",
             src, "-o", out, "--json", "--quiet")
    summary = json.loads(p.stdout)
    assert summary["requests"] == 3 and summary["tokens"] == 8 and summary["records"] == 16
    assert summary["probs_kind"] == "topk" and summary["dropped_tokens"] == 0

    want = expected_from_jsonl(src, 2, 8, 2)
    got = read_trace(out)
    assert list(got["requests/id"]) == [12, 7, 3] == list(want["ids"])
    assert np.array_equal(got["requests/prompt_tokens"], want["prompt"])
    assert np.array_equal(got["requests/output_tokens"], want["output"])
    assert list(got["requests/token_offset"]) == [0, 2, 5, 8]
    assert np.array_equal(got["tokens/experts"], want["experts"])
    assert np.array_equal(got["tokens/phase"], want["phase"])
    assert np.array_equal(got["tokens/token_id"], want["token_id"])
    assert got["probs"].dtype == np.float32
    assert np.array_equal(got["probs"], want["probs"])
    a = got["attrs"]
    assert a["format"] == "fmoe-trace" and a["probs_kind"] == "topk"
    assert a["recorded_on"] == "import:jsonl" and a["dataset"] == "routing_small.jsonl"
    assert (a["num_layers"], a["num_experts"], a["top_k"]) == (2, 8, 2)


def test_jsonl_text_summary_and_compressions(fmoe, tmp_path):
    src = FIXTURES / "routing_small.jsonl"
    want = expected_from_jsonl(src, 2, 8, 2)
    for comp in ["zstd", "deflate", "none"]:
        out = tmp_path / f"small-{comp}.h5"
        p = fmoe("trace", "import", "--format", "jsonl", "--layers", "2", "--experts", "8",
                 "--top-k", "2", "--compression", comp, src, "-o", out)
        text = p.stdout.strip()
        assert "\n" not in text
        assert "3 requests" in text and "8 tokens" in text and "0 incomplete tokens dropped" in text
        assert "topk" in text and str(out) in text
        assert np.array_equal(read_trace(out)["probs"], want["probs"])


def test_jsonl_model_config(fmoe, tmp_path):
    model = tmp_path / "tiny-mixtral"
    model.mkdir()
    cfg = {"model_type": "mixtral", "num_hidden_layers": 2, "hidden_size": 64,
           "intermediate_size": 128, "num_local_experts": 8, "num_experts_per_tok": 2,
           "torch_dtype": "bfloat16"}
    text = json.dumps(cfg, indent=2)
    (model / "config.json").write_text(text)
    out = tmp_path / "cfg.h5"
    fmoe("trace", "import", "--model-config", model / "config.json",
         FIXTURES / "routing_small.jsonl", "-o", out, "--quiet")
    got = read_trace(out)
    a = got["attrs"]
    assert a["model_name"] == "tiny-mixtral"   # the config's folder
    assert len(a["model_fingerprint"]) == 64
    assert a["expert_bytes"] == 3 * 64 * 128 * 2  # bf16 gate/up/down
    assert a["hidden_size"] == 64
    cj = got["config_json"]
    assert (cj.decode() if isinstance(cj, bytes) else cj) == text


def test_jsonl_drop_incomplete(fmoe, tmp_path):
    lines = [json.loads(x) for x in open(FIXTURES / "routing_small.jsonl") if x.strip()]
    # request 7 token 1 loses layer 1
    lines = [o for o in lines if not (o["request"] == 7 and o["token"] == 1 and o["layer"] == 1)]
    src = tmp_path / "incomplete.jsonl"
    src.write_text("".join(json.dumps(o) + "\n" for o in lines))
    out = tmp_path / "inc.h5"
    args = ["trace", "import", "--layers", "2", "--experts", "8", "--top-k", "2", src,
            "-o", out, "--quiet"]
    p = fmoe(*args, check=False)
    assert p.returncode == 1
    assert p.stderr.count("\n") == 1
    assert p.stderr.startswith("fmoe trace import: ")
    assert "request 7 token 1" in p.stderr and "line" in p.stderr
    assert no_output(out)
    p = fmoe(*args, "--drop-incomplete", "--json")
    s = json.loads(p.stdout)
    assert s["dropped_tokens"] == 1 and s["tokens"] == 7 and s["requests"] == 3
    got = read_trace(out)
    assert list(got["requests/prompt_tokens"]) == [2, 1, 1]


BASE = ('{"request": 1, "token": 0, "layer": 0, "experts": [1, 2], "probs": [0.5, 0.25]}\n'
        '{"request": 1, "token": 0, "layer": 1, "experts": [3, 4], "probs": [0.5, 0.25]}\n')


@pytest.mark.parametrize("name,third,needle", [
    ("range", '{"request": 1, "token": 1, "layer": 0, "experts": [8, 1], "probs": [0.5, 0.2]}',
     ":3: expert 8 out of range (J = 8)"),
    ("klen", '{"request": 1, "token": 1, "layer": 0, "experts": [1], "probs": [0.5]}',
     ":3: \"experts\" has 1 values, expected K = 2"),
    ("plen", '{"request": 1, "token": 1, "layer": 0, "experts": [1, 2], "probs": [0.5, 0.2, 0.1]}',
     ":3: \"probs\" has 3 values"),
    ("json", '{"request": 1, "token": 1, "layer": 0, "experts": [1, 2]',
     ":3: malformed JSON"),
    ("mixed", '{"request": 1, "token": 1, "layer": 0, "experts": [1, 2]}',
     ":3: no probs, but line 1 has K = 2 probs"),
    ("dup", '{"request": 1, "token": 0, "layer": 1, "experts": [5, 6], "probs": [0.5, 0.2]}',
     ":3: request 1 token 0 layer 1 repeats line 2"),
    ("layer", '{"request": 1, "token": 1, "layer": 5, "experts": [1, 2], "probs": [0.5, 0.2]}',
     ":3: layer 5 out of range (L = 2)"),
])
def test_jsonl_bad_inputs_exit_1(fmoe, tmp_path, name, third, needle):
    src = tmp_path / f"bad-{name}.jsonl"
    src.write_text(BASE + third + "\n")
    out = tmp_path / f"bad-{name}.h5"
    p = fmoe("trace", "import", "--layers", "2", "--experts", "8", "--top-k", "2", src,
             "-o", out, check=False)
    assert p.returncode == 1, p.stderr
    assert p.stdout == ""
    assert p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith("fmoe trace import: ")
    assert f"bad-{name}.jsonl{needle}" in p.stderr, p.stderr
    assert no_output(out)


def test_failure_keeps_existing_output(fmoe, tmp_path):
    out = tmp_path / "keep.h5"
    out.write_bytes(b"previous")
    src = tmp_path / "bad.jsonl"
    src.write_text(BASE + "{nope}\n")
    p = fmoe("trace", "import", "--layers", "2", "--experts", "8", "--top-k", "2", src,
             "-o", out, check=False)
    assert p.returncode == 1
    assert out.read_bytes() == b"previous"
    assert not pathlib.Path(str(out) + ".partial").exists()


@pytest.mark.parametrize("args,needle", [
    (["--layers", "2", "--experts", "8", "--top-k", "2", "IN"], "no output file"),
    (["--layers", "2", "--experts", "8", "IN", "-o", "OUT"], "geometry"),
    (["--model-config", "c.json", "--layers", "2", "IN", "-o", "OUT"], "not both"),
    (["--layers", "2", "--experts", "8", "--top-k", "2", "--compression", "lz4", "IN", "-o",
      "OUT"], "--compression"),
    (["--layers", "x", "--experts", "8", "--top-k", "2", "IN", "-o", "OUT"], "--layers"),
    (["--layers", "2", "--experts", "8", "--top-k", "9", "IN", "-o", "OUT"], "--top-k 9"),
    (["--layers", "2", "--experts", "8", "--top-k", "2", "--tokens-per-request", "4", "IN",
      "-o", "OUT"], "--tokens-per-request"),
    (["--layers", "2", "--experts", "8", "--top-k", "2", "--bogus", "IN", "-o", "OUT"],
     "unknown option"),
    (["--format", "dense-csv", "--layers", "2", "--experts", "8", "--top-k", "2", "IN",
      "-o", "OUT"], "one file per MoE layer"),
])
def test_usage_errors_exit_2(fmoe, tmp_path, args, needle):
    src = FIXTURES / "routing_small.jsonl"
    out = tmp_path / "u.h5"
    args = [str(src) if a == "IN" else str(out) if a == "OUT" else a for a in args]
    p = fmoe("trace", "import", *args, check=False)
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and needle in p.stderr, p.stderr
    assert no_output(out)


def test_help_documents_every_option(fmoe):
    text = fmoe("trace", "import", "--help").stdout
    for opt in ["--format", "--model-config", "--layers", "--experts", "--top-k",
                "--hidden-size", "--drop-incomplete", "--tokens-per-request", "--compression",
                "--model-name", "--output", "--json", "--quiet", "--help"]:
        assert opt in text, opt
    assert "default zstd" in text and "default 0" in text
    assert "import" in fmoe("trace", "--help").stdout
    assert fmoe("trace", "export", check=False).returncode == 2


# ---------------------------------------------------------------- dense CSV (FLAME sample)

def test_flame_sample_matches_python(fmoe, tmp_path):
    files = sorted(SAMPLE.glob("layer*.csv"))
    assert [f.name for f in files] == [f"layer{l:02d}.csv" for l in range(2, 10)]
    out = tmp_path / "flame.h5"
    p = fmoe("trace", "import", "--format", "dense-csv", "--layers", "8", "--experts", "64",
             "--top-k", "6", "--tokens-per-request", "64", "--model-name", "FLAME-MoE-290M",
             *files, "-o", out, "--json", "--quiet")
    s = json.loads(p.stdout)
    assert (s["requests"], s["tokens"], s["records"]) == (8, 512, 8 * 512)
    want = expected_from_dense_csv(files, 6, 64)
    got = read_trace(out)
    assert np.array_equal(got["tokens/experts"], want["experts"])
    assert np.array_equal(got["probs"], want["probs"])
    assert list(got["requests/prompt_tokens"]) == want["sizes"] == [64] * 8
    assert list(got["requests/output_tokens"]) == [0] * 8
    assert list(got["requests/id"]) == list(range(8))
    assert (got["tokens/phase"] == 0).all() and (got["tokens/token_id"] == -1).all()
    a = got["attrs"]
    assert a["probs_kind"] == "topk" and a["recorded_on"] == "import:dense-csv"
    assert a["model_name"] == "FLAME-MoE-290M"
    assert a["dataset"] == "flame-moe-290m/layer02.csv..layer09.csv"


def test_dense_csv_bad_row_exit_1(fmoe, tmp_path):
    good = (FIXTURES / "dense" / "layer00.csv").read_text()
    bad = good.replace("0,2,0.0625,0.375,0,0", "0,2,0.0625,0.375,0.1,0")
    (tmp_path / "l1.csv").write_text(bad)
    out = tmp_path / "d.h5"
    p = fmoe("trace", "import", "--layers", "2", "--experts", "4", "--top-k", "2",
             FIXTURES / "dense" / "layer00.csv", tmp_path / "l1.csv", "-o", out, check=False)
    assert p.returncode == 1
    assert p.stderr.count("\n") == 1
    assert "l1.csv:4: 3 non-zero probabilities, expected K = 2" in p.stderr
    assert no_output(out)


# ---------------------------------------------------------------- the converter

def run_converter(*args):
    return subprocess.run([sys.executable, str(CONVERTER), *map(str, args)],
                          capture_output=True, text=True, timeout=600)


def write_log(path, layer, batches, k=2):
    """A synthetic vLLM-logger file: `batches` = list of batch sizes; expert ids encode
    (batch, position) so the test can tell rows apart."""
    lines = [json.dumps({"type": "meta", "model_id": "toy", "top_k": k})]
    for b, size in enumerate(batches):
        for i in range(size):
            e0 = (b * 7 + i + layer) % 16
            lines.append(json.dumps({"type": "route", "req_id": "r1", "token_idx": i,
                                     "layer": layer, "topk_ids": [e0, (e0 + 1) % 16],
                                     "topk_weights": [0.5, 0.25]}))
    path.write_text("\n".join(lines) + "\n")


def read_jsonl(path):
    recs = [json.loads(x) for x in open(path)]
    return recs[0], recs[1:]


def test_converter_segmentation(tmp_path):
    # warm-up batch of 3 (skipped), prefill of 5 = prompts of 2 and 3 tokens, then decode
    # batches of 2, 2, 1 (one request finished after two steps).
    batches = [3, 5, 2, 2, 1]
    for layer in (4, 9):
        write_log(tmp_path / f"l{layer}.jsonl", layer, batches)
    out = tmp_path / "seg.jsonl"
    p = run_converter(tmp_path / "l9.jsonl", tmp_path / "l4.jsonl", "--skip-rows", "3",
                      "--prompt-tokens", "2,3", "-o", out)
    assert p.returncode == 0, p.stderr
    meta, recs = read_jsonl(out)
    assert meta["type"] == "meta" and meta["original_layers"] == [4, 9]
    assert {r["layer"] for r in recs} == {0, 1}
    per_req = Counter((r["request"], r["phase"]) for r in recs if r["layer"] == 0)
    # request 0: 2 prefill + 2 decode (slot 0); request 1: 3 prefill + 2 decode (slot 1);
    # the batch of 1 after the shrink is a new stream (condense may have moved requests).
    assert per_req == {(0, "prefill"): 2, (0, "decode"): 2, (1, "prefill"): 3,
                       (1, "decode"): 2, (2, "decode"): 1}
    # tokens are positions within each request, prefill first
    assert sorted(r["token"] for r in recs if r["request"] == 1 and r["layer"] == 0) == \
        [0, 1, 2, 3, 4]
    # layer 0 of the output is the log of layer 4
    first = [r for r in recs if r["request"] == 0 and r["token"] == 0 and r["layer"] == 0][0]
    assert first["experts"] == [(1 * 7 + 0 + 4) % 16, (1 * 7 + 0 + 4 + 1) % 16]

    p = run_converter(tmp_path / "l4.jsonl", tmp_path / "l9.jsonl", "--skip-rows", "3",
                      "--prompt-tokens", "2,3", "--decode-streams", "slot", "-o", out)
    assert p.returncode == 0, p.stderr
    _, recs = read_jsonl(out)
    per_req = Counter((r["request"], r["phase"]) for r in recs if r["layer"] == 0)
    assert per_req == {(0, "prefill"): 2, (0, "decode"): 3, (1, "prefill"): 3,
                       (1, "decode"): 2}

    p = run_converter(tmp_path / "l4.jsonl", "--skip-rows", "3", "--prompt-tokens", "2,2",
                      "-o", out)
    assert p.returncode == 1 and "prefill batch holds 5 tokens" in p.stderr


def count_experts_in_logs(files, skip):
    """(original layer, expert) -> accesses, straight from the vLLM-logger files."""
    counts = Counter()
    for path in files:
        rows = [json.loads(x) for x in open(path) if x.strip()]
        rows = [r for r in rows if r.get("type") == "route"][skip:]
        for r in rows:
            for e in r["topk_ids"]:
                counts[(r["layer"], e)] += 1
    return counts


def count_experts_in_trace(path, original_layers):
    with h5py.File(path, "r") as f:
        ex = f["tokens/experts"][()]
    counts = Counter()
    for li, layer in enumerate(original_layers):
        ids, n = np.unique(ex[:, li, :], return_counts=True)
        for e, c in zip(ids, n):
            counts[(layer, int(e))] += int(c)
    return counts


@pytest.mark.parametrize("folder,pattern,preset,skip,geometry,want", [
    ("qwen1.5-moe-a2.7b-vllm-logger", "moe_layer*.jsonl", "qwen1.5-moe-a2.7b-gsm8k25", 8513,
     ("5", "60", "4"), dict(requests=235, tokens=4292, prefill=1406, first_prompts=25)),
    ("olmoe-1b-7b-vllm-logger", "moe_routes_layer*.jsonl", "olmoe-1b-7b-gsm8k25", 2048,
     ("1", "64", "8"), dict(requests=2, tokens=4471, prefill=1377, first_prompts=0)),
])
def test_vllm_logger_import(fmoe, real_data, tmp_path, folder, pattern, preset, skip,
                            geometry, want):
    files = sorted((real_data / folder).glob(pattern))
    assert files, f"FMOE_REAL_DATA has no {folder}/{pattern}"
    conv = tmp_path / "conv.jsonl"
    p = run_converter("--preset", preset, *files, "-o", conv)
    assert p.returncode == 0, p.stderr
    meta = json.loads(open(conv).readline())
    out = tmp_path / "vllm.h5"
    L, J, K = geometry
    s = json.loads(fmoe("trace", "import", "--layers", L, "--experts", J, "--top-k", K, conv,
                        "-o", out, "--json", "--quiet").stdout)
    assert s["requests"] == want["requests"] and s["tokens"] == want["tokens"]
    assert count_experts_in_trace(out, meta["original_layers"]) == \
        count_experts_in_logs(files, skip)
    with h5py.File(out, "r") as f:
        assert int((f["tokens/phase"][()] == 0).sum()) == want["prefill"]
        prompt = f["requests/prompt_tokens"][()]
    if want["first_prompts"]:
        # the 25 prompts, as the prefill batch computed them (prompt 0: 64 tokens cached)
        assert list(prompt[:25]) == meta["prompt_tokens"]
        assert prompt[0] == 1 and (prompt[25:] == 0).all()
