"""A real-shape model read from its file under a memory budget (the small variant).

tests/bench/make_shaped_gguf.py --small writes a Qwen3-30B-A3B-shaped file (8 layers of 128
experts, top-8, llama-quantize's Q4_K_M mix, so experts of two sizes) of about 190 MB.
Offloaded from that file with `--memory-gb` well below its size, `--tier file --direct-io`:

- the experts the run touches are not resident beyond its slots, and the non-expert weights
  are held once: the peak RSS (`generate --json`'s peak_rss_bytes, the process's VmHWM) is
  the all-resident run's less the touched experts' bytes, plus the slots, within 8 MiB
  (weights held twice, or experts left mapped, are 40-60 MiB more);
- the tokens are the all-resident run's;
- the decisions equal `fmoe simulate`'s of the trace the run recorded, decision for
  decision, with the slot count `--memory-gb` chose (the trace's offload_cache_experts);
- a budget below the non-expert weights plus top-k slots is refused in one line.
"""
import json
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
GEN = REPO / "tests" / "bench" / "make_shaped_gguf.py"

gguf = pytest.importorskip("gguf")
h5py = pytest.importorskip("h5py")
import hdf5plugin  # noqa: F401,E402
from conftest import run_fmoe  # noqa: E402
from test_offload_live import ZERO_LINK, decisions, read_log  # noqa: E402

PROMPT = "In a small village at the edge of a great forest there lived an old clockmaker"
EXPERT_TENSORS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("shaped")
    out = d / "qwen3-small.gguf"
    subprocess.run([sys.executable, str(GEN), "--shape", "qwen3-30b-a3b", "--small",
                    "--quiet", "-o", str(out)], check=True, timeout=300)
    r = gguf.GGUFReader(str(out))
    layer, other = {}, 0
    for t in r.tensors:
        parts = t.name.split(".")
        if t.name.startswith("blk.") and parts[2] in EXPERT_TENSORS:
            layer[int(parts[1])] = layer.get(int(parts[1]), 0) + int(t.n_bytes) // int(t.shape[-1])
        else:
            other += int(t.n_bytes)
    (d / "zero.json").write_text(json.dumps(ZERO_LINK))
    (d / "prompt.txt").write_text(PROMPT + "\n")
    return {"path": out, "dir": d, "layer_bytes": [layer[i] for i in sorted(layer)],
            "other": other}


def generate(fmoe_bin, m, *extra):
    p = run_fmoe(fmoe_bin, "generate", "--model", m["path"], "--prompt", PROMPT,
                 "--max-new-tokens", 32, "--temperature", 0, "--ignore-eos", "--json", *extra)
    return json.loads(p.stdout)


def test_the_experts_differ_in_size_by_layer(model):
    assert len(set(model["layer_bytes"])) == 2  # Q4_K and Q6_K down projections


def test_offloaded_from_the_file_holds_only_its_slots(fmoe_bin, model, tmp_path):
    slot = -(-(max(model["layer_bytes"]) + 6 * 4096) // 4096) * 4096
    gb = (model["other"] + 16.5 * slot) / 2**30  # 15 slots and the scratch slot
    resident = generate(fmoe_bin, model)
    log = tmp_path / "d.jsonl"
    off = generate(fmoe_bin, model, "--policy", "lru", "--memory-gb", gb, "--tier", "file",
                   "--direct-io", "--decision-log", log)
    assert off["offload"]["cache_experts"] == 15
    assert off["generated_ids"] == resident["generated_ids"]
    touched = {(r["layer"], r["expert"]) for r in read_log(log)[1] if r["event"] == "access"}
    touched_bytes = sum(model["layer_bytes"][l] for l, _ in touched)
    assert touched_bytes > 32 * 2**20  # the resident run maps that much of the experts
    bound = resident["peak_rss_bytes"] - touched_bytes + 16 * slot + 8 * 2**20
    assert off["peak_rss_bytes"] <= bound, (off["peak_rss_bytes"] / 2**20, bound / 2**20)


@pytest.mark.parametrize("policy", ["lru", "mixtral-offload"])
def test_live_decisions_equal_simulated_under_memory_gb(fmoe_bin, model, tmp_path, policy):
    slot = -(-(max(model["layer_bytes"]) + 6 * 4096) // 4096) * 4096
    gb = (model["other"] + 101.5 * slot) / 2**30  # 100 slots and the scratch slot
    trace, live, sim = tmp_path / "t.h5", tmp_path / "live.jsonl", tmp_path / "sim.jsonl"
    spec = ["--speculative", 1] if policy == "mixtral-offload" else []
    run_fmoe(fmoe_bin, "record", "--model", model["path"], "--dataset", model["dir"] / "prompt.txt",
             "--max-new-tokens", 12, "--temperature", 0, "--ignore-eos", "--probs-f32", *spec,
             "--policy", policy, "--memory-gb", gb, "--tier", "file", "--direct-io",
             "--prefetch-distance", 1, "--sync-transfers", "--sync-predictions",
             "--decision-log", live, "-o", trace, "--quiet")
    with h5py.File(trace, "r") as t:
        n = int(t.attrs["offload_cache_experts"])
        assert [int(x) for x in t["model/layer_expert_bytes"][:]] == model["layer_bytes"]
    assert n == 100
    run_fmoe(fmoe_bin, "simulate", "--trace", trace, "--policy", policy, "--cache-experts", n,
             "--prefetch-distance", 1, "--profile", model["dir"] / "zero.json",
             "--decision-log", sim, "--quiet")
    a, b = decisions(read_log(live)[1]), decisions(read_log(sim)[1])
    assert sum(r["event"] == "access" and r["result"] == "miss" for r in a) > 0
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    assert first is None and len(a) == len(b), (first, a[first] if first is not None else None,
                                                 b[first] if first is not None else None)


def test_a_budget_below_the_minimum_is_refused(fmoe_bin, model):
    p = run_fmoe(fmoe_bin, "generate", "--model", model["path"], "--prompt", PROMPT,
                 "--memory-gb", model["other"] / 2**30, "--tier", "file", check=False)
    assert p.returncode == 2
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "minimum" in err[0], err
