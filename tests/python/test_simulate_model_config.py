"""`fmoe simulate --model-config` answers for the model file given: "what if the experts
were Q4_K" of a trace recorded from a bf16 checkpoint uses the GGUF file's expert size
(per layer, for a llama-quantize mix), and the output says whose size it used.

Before, the trace's expert size always won when the trace had one: the run silently
answered for bf16 experts (docs/cmd/fmoe-simulate.md, --model-config).
"""
import json
import math
import pathlib

import pytest

from conftest import run_fmoe

np = pytest.importorskip("numpy")
gguf = pytest.importorskip("gguf")
from test_mixed_expert_types import layer_bytes, mix  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
TINY = REPO / "datasets" / "fmoe-tiny"
PROMPTS = REPO / "datasets" / "samples" / "prompts_100.txt"


@pytest.fixture(scope="module")
def files(tmp_path_factory, fmoe_bin):
    d = tmp_path_factory.mktemp("model-config")
    for q in ("q4_k", "q8_0"):
        run_fmoe(fmoe_bin, "quantize", "--type", q, TINY, "-o", d / f"{q}.gguf", "--quiet")
    mix(d / "q4_k.gguf", d / "q8_0.gguf", d / "mixed.gguf")
    prompts = d / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS.read_text().splitlines()[:6]) + "\n")
    run_fmoe(fmoe_bin, "record", "--model", TINY, "--dataset", prompts, "--max-new-tokens", 8,
             "--temperature", 0, "-o", d / "bf16.h5", "--quiet")
    return d


def sim(fmoe_bin, d, *extra):
    log = d / "log.jsonl"
    log.unlink(missing_ok=True)
    p = run_fmoe(fmoe_bin, "simulate", "--trace", d / "bf16.h5", "--policy", "ondemand",
                 "--json", "--quiet", "--decision-log", log, *extra)
    recs = [json.loads(x) for x in log.read_text().splitlines()[1:]]
    misses = [r["layer"] for r in recs if r["event"] == "access" and r["result"] == "miss"]
    return json.loads(p.stdout), misses


def test_the_model_configs_expert_size_is_used_and_named(fmoe_bin, files):
    plain, misses = sim(fmoe_bin, files, "--cache-experts", 6)
    bf16 = plain["expert_bytes"]
    assert plain["results"][0]["bytes_loaded"] == len(misses) * bf16

    q4 = layer_bytes(files / "q4_k.gguf")
    assert len(set(q4)) == 1 and q4[0] < 0.6 * bf16
    j, misses = sim(fmoe_bin, files, "--cache-experts", 6, "--model-config",
                    files / "q4_k.gguf")
    assert j["expert_bytes"] == q4[0]
    r = j["results"][0]
    assert r["bytes_loaded"] == len(misses) * q4[0] > 0
    assert plain["expert_bytes_from"] == "trace"
    assert j["expert_bytes_from"] == "model-config"
    assert j["model_config"] == str(files / "q4_k.gguf")
    assert j["trace_expert_bytes"] == bf16
    assert "layer_expert_bytes" not in j  # uniform
    assert r["cache_bytes"] == 6 * q4[0]
    # --cache-gb counts slots of the model-config's expert
    j, _ = sim(fmoe_bin, files, "--cache-gb", 0.001, "--model-config", files / "q4_k.gguf")
    assert j["results"][0]["cache_experts"] == math.floor(0.001 * 2**30 / q4[0])
    # the table says whose size it is
    p = run_fmoe(fmoe_bin, "simulate", "--trace", files / "bf16.h5", "--cache-experts", 6,
                 "--quiet", "--model-config", files / "q4_k.gguf")
    head = p.stdout.splitlines()[0]
    assert f"from --model-config {files / 'q4_k.gguf'}" in head and "the trace's: " in head


def test_a_mixed_gguf_gives_each_layers_size(fmoe_bin, files):
    b = layer_bytes(files / "mixed.gguf")
    assert len(set(b)) > 1
    j, misses = sim(fmoe_bin, files, "--cache-experts", 6, "--model-config",
                    files / "mixed.gguf")
    assert j["expert_bytes"] == max(b)
    assert j["results"][0]["bytes_loaded"] == sum(b[l] for l in misses) > 0
    assert j["layer_expert_bytes"] == b
    p = run_fmoe(fmoe_bin, "simulate", "--trace", files / "bf16.h5", "--cache-experts", 6,
                 "--quiet", "--model-config", files / "mixed.gguf")
    assert "the largest layer's, from --model-config" in p.stdout.splitlines()[0]
