"""Offloading a GGUF file whose layers store their experts with different types.

llama-quantize's mixes (Q4_K_M, Q5_K_M, ...) give some layers' down projections more bits
than the rest, so one routed expert's bytes differ by layer. This file builds such a file
from the bundled fmoe-tiny with gguf-py, independently of fmoe's own writer: every tensor
of `fmoe quantize --type q4_k`, except that layers MIXED take their three expert tensors
from `fmoe quantize --type q8_0` (more bytes per expert, as Q6_K layers have in Q4_K_M).
Then, with every layer's expert bytes computed here from gguf-py's tensor sizes:

- offloaded runs (host tier, file tier, O_DIRECT) give the all-resident tokens;
- a recording stores the bytes per layer (/model/layer_expert_bytes, read with h5py) and
  the largest as expert_bytes; a uniform model's trace has no such dataset;
- `--cache-gb` converts with the largest expert (one slot holds any layer's expert);
- the live decisions equal `fmoe simulate`'s, decision for decision, for a policy that
  only loads on demand and for prefetching ones;
- bytes over the link are counted at each layer's size, live and simulated, and the
  simulated transfer time follows them;
- a trace whose per-layer bytes exceed expert_bytes is refused in one line.
"""
import json
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
TINY = REPO / "datasets" / "fmoe-tiny"
PROMPTS = REPO / "datasets" / "samples" / "prompts_100.txt"

np = pytest.importorskip("numpy")
gguf = pytest.importorskip("gguf")
h5py = pytest.importorskip("h5py")
import hdf5plugin  # noqa: F401,E402
from conftest import run_fmoe  # noqa: E402
from test_offload_live import ZERO_LINK, decisions, read_log  # noqa: E402

MIXED = (1, 4)  # of fmoe-tiny's 6 MoE layers
EXPERT_TENSORS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


def mix(base, richer, out):
    """base's fields and tensors, with the expert tensors of the layers in MIXED taken
    from richer (the same checkpoint quantized with more bits)."""
    rb, rr = gguf.GGUFReader(str(base)), gguf.GGUFReader(str(richer))
    a = rb.fields["general.architecture"]
    w = gguf.GGUFWriter(str(out), bytes(a.parts[a.data[0]]).decode())
    for f in rb.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        w.add_key_value(f.name, f.contents(), f.types[0])
    rich = {t.name: t for t in rr.tensors}
    for t in rb.tensors:
        layer = int(t.name.split(".")[1]) if t.name.startswith("blk.") else -1
        src = rich[t.name] if layer in MIXED and t.name.split(".")[2] in EXPERT_TENSORS else t
        w.add_tensor(src.name, np.asarray(src.data), raw_dtype=src.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def layer_bytes(path):
    """[L] bytes of one routed expert per layer, from gguf-py's tensor sizes."""
    r = gguf.GGUFReader(str(path))
    per = {}
    for t in r.tensors:
        parts = t.name.split(".")
        if t.name.startswith("blk.") and parts[2] in EXPERT_TENSORS:
            experts = int(t.shape[-1])  # gguf-py lists dims innermost first
            per[int(parts[1])] = per.get(int(parts[1]), 0) + int(t.n_bytes) // experts
    return [per[i] for i in sorted(per)]


@pytest.fixture(scope="module")
def files(tmp_path_factory, fmoe_bin):
    d = tmp_path_factory.mktemp("mixed")
    for q in ("q4_k", "q8_0"):
        run_fmoe(fmoe_bin, "quantize", "--type", q, TINY, "-o", d / f"{q}.gguf", "--quiet")
    mix(d / "q4_k.gguf", d / "q8_0.gguf", d / "mixed.gguf")
    prompts = d / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS.read_text().splitlines()[:8]) + "\n")
    (d / "zero.json").write_text(json.dumps(ZERO_LINK))
    return {"dir": d, "mixed": d / "mixed.gguf", "uniform": d / "q4_k.gguf",
            "prompts": prompts, "zero": d / "zero.json", "bytes": layer_bytes(d / "mixed.gguf")}


def test_the_mixed_file_really_differs_by_layer(files):
    b = files["bytes"]
    assert len(b) == 6
    assert all(b[i] > b[0] for i in MIXED) and all(b[i] == b[0] for i in range(6)
                                                   if i not in MIXED)
    r = gguf.GGUFReader(str(files["mixed"]))
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert types["blk.1.ffn_gate_exps.weight"] == "Q8_0"
    assert types["blk.0.ffn_gate_exps.weight"] == "Q4_K"


GEN = ["--prompt", "What is a context manager?", "--max-new-tokens", 12, "--temperature", 0,
       "--json"]


@pytest.mark.parametrize("tier", [["--tier", "host"], ["--tier", "file"],
                                  ["--tier", "file", "--direct-io"]])
def test_offloaded_runs_give_the_resident_tokens(fmoe_bin, files, tier):
    common = ["generate", "--model", files["mixed"], "--tokenizer", TINY, *GEN]
    resident = json.loads(run_fmoe(fmoe_bin, *common).stdout)["generated_ids"]
    p = run_fmoe(fmoe_bin, *common, "--policy", "lru", "--cache-experts", 6, *tier)
    j = json.loads(p.stdout)
    assert j["generated_ids"] == resident
    assert j["offload"]["misses"] > 0


def record(fmoe_bin, model, prompts, out, *extra):
    run_fmoe(fmoe_bin, "record", "--model", model, "--tokenizer", TINY, "--dataset", prompts,
             "--max-new-tokens", 8, "--temperature", 0, "--probs-f32", "-o", out, "--quiet",
             *extra)


def test_a_recording_stores_each_layers_bytes(fmoe_bin, files, tmp_path):
    record(fmoe_bin, files["mixed"], files["prompts"], tmp_path / "m.h5")
    with h5py.File(tmp_path / "m.h5", "r") as t:
        assert [int(x) for x in t["model/layer_expert_bytes"][:]] == files["bytes"]
        assert int(t.attrs["expert_bytes"]) == max(files["bytes"])
    record(fmoe_bin, files["uniform"], files["prompts"], tmp_path / "u.h5")
    with h5py.File(tmp_path / "u.h5", "r") as t:
        assert "layer_expert_bytes" not in t["model"]
        assert int(t.attrs["expert_bytes"]) == files["bytes"][0]


def live_and_simulated(fmoe_bin, files, tmp_path, policy, cache, extra=()):
    trace, live, sim = tmp_path / f"{policy}.h5", tmp_path / "live.jsonl", tmp_path / "sim.jsonl"
    spec = ["--speculative", 1] if policy == "mixtral-offload" else []
    record(fmoe_bin, files["mixed"], files["prompts"], trace, *spec, "--policy", policy,
           *cache, "--prefetch-distance", 1, "--sync-transfers", "--sync-predictions",
           "--decision-log", live, *extra)
    run_fmoe(fmoe_bin, "simulate", "--trace", trace, "--policy", policy, *cache,
             "--prefetch-distance", 1, "--profile", files["zero"], "--decision-log", sim,
             "--quiet")
    return trace, read_log(live)[1], read_log(sim)[1]


@pytest.mark.parametrize("policy", ["lru", "mixtral-offload", "moe-infinity"])
def test_live_and_simulated_decisions_are_identical(fmoe_bin, files, tmp_path, policy):
    _, lrec, srec = live_and_simulated(fmoe_bin, files, tmp_path, policy,
                                       ["--cache-experts", 6])
    misses = [r for r in lrec if r["event"] == "access" and r["result"] == "miss"]
    assert {r["layer"] for r in misses} >= set(MIXED)  # the bigger experts move too
    if policy != "lru":
        assert any(r["event"] == "prefetch" for r in lrec)
    a, b = decisions(lrec), decisions(srec)
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    assert first is None and len(a) == len(b), (first, a[first] if first is not None else None,
                                                 b[first] if first is not None else None)


def test_cache_gb_counts_slots_of_the_largest_expert(fmoe_bin, files, tmp_path):
    """6.5 of the largest experts' bytes is 6 slots (of the smallest it would be 8)."""
    gb = 6.5 * max(files["bytes"]) / 2**30
    assert int(gb * 2**30 // min(files["bytes"])) > 6
    _, by_gb, _ = live_and_simulated(fmoe_bin, files, tmp_path, "lru", ["--cache-gb", gb])
    _, by_n, _ = live_and_simulated(fmoe_bin, files, tmp_path, "lru", ["--cache-experts", 6])
    assert decisions(by_gb) == decisions(by_n)
    assert max(r["slot"] for r in by_gb if r["event"] == "access") == 5


def test_bytes_over_the_link_are_each_layers(fmoe_bin, files, tmp_path):
    """ondemand loads every miss and prefetches nothing: the bytes loaded are the sum over
    misses of their layer's expert bytes, in `generate --json` and in `simulate --json`;
    and the simulated transfer time is those bytes over the link's rate."""
    b = files["bytes"]
    p = run_fmoe(fmoe_bin, "generate", "--model", files["mixed"], "--tokenizer", TINY, *GEN,
                 "--policy", "ondemand", "--cache-experts", 6, "--sync-transfers",
                 "--decision-log", tmp_path / "g.jsonl")
    off = json.loads(p.stdout)["offload"]
    recs = read_log(tmp_path / "g.jsonl")[1]
    misses = [r["layer"] for r in recs if r["event"] == "access" and r["result"] == "miss"]
    assert off["misses"] == len(misses) > 0
    assert off["bytes_loaded"] == sum(b[l] for l in misses)

    trace = tmp_path / "od.h5"
    record(fmoe_bin, files["mixed"], files["prompts"], trace)
    rate = 1e3  # bytes/s: each transfer takes minutes, next to which compute is nothing
    prof = dict(ZERO_LINK, link={"alpha_s": 0.0, "beta_bytes_per_s": rate})
    (tmp_path / "slow.json").write_text(json.dumps(prof))
    s = run_fmoe(fmoe_bin, "simulate", "--trace", trace, "--policy", "ondemand",
                 "--cache-experts", 6, "--profile", tmp_path / "slow.json", "--json",
                 "--decision-log", tmp_path / "s.jsonl", "--quiet")
    res = json.loads(s.stdout)["results"][0]
    srec = read_log(tmp_path / "s.jsonl")[1]
    smiss = [r["layer"] for r in srec if r["event"] == "access" and r["result"] == "miss"]
    assert res["bytes_loaded"] == sum(b[l] for l in smiss)
    # every load is a demand load the compute waits for, one after another on the link:
    # the run takes the bytes over the rate, not misses x the largest expert over the rate
    assert sum(b[l] for l in smiss) < 0.9 * len(smiss) * max(b)
    assert res["total_s"] == pytest.approx(sum(b[l] for l in smiss) / rate, rel=1e-3)


def test_layer_bytes_above_expert_bytes_are_refused(fmoe_bin, files, tmp_path):
    trace = tmp_path / "bad.h5"
    record(fmoe_bin, files["mixed"], files["prompts"], trace)
    with h5py.File(trace, "r+") as t:
        t["model/layer_expert_bytes"][2] = int(t.attrs["expert_bytes"]) + 1
    p = run_fmoe(fmoe_bin, "simulate", "--trace", trace, "--policy", "lru",
                 "--cache-experts", 6, "--quiet", check=False)
    assert p.returncode != 0
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "layer_expert_bytes" in err[0] and "layer 2" in err[0], err


def weight_bytes(path):
    """(all tensor bytes, routed-expert tensor bytes) of a GGUF file, from gguf-py."""
    r = gguf.GGUFReader(str(path))
    total = sum(int(t.n_bytes) for t in r.tensors)
    experts = sum(int(t.n_bytes) for t in r.tensors
                  if t.name.startswith("blk.") and t.name.split(".")[2] in EXPERT_TENSORS)
    return total, experts


def test_memory_gb_sizes_the_slots_beside_the_resident_weights(fmoe_bin, files):
    """--memory-gb X: the non-expert weights stay resident and count in X; the slots (each
    the largest expert, rounded to pages) and one scratch slot fill the rest."""
    total, experts = weight_bytes(files["mixed"])
    other, slot = total - experts, -(-max(files["bytes"]) // 4096) * 4096
    want = 10
    gb = (other + (want + 1.5) * slot) / 2**30
    p = run_fmoe(fmoe_bin, "generate", "--model", files["mixed"], "--tokenizer", TINY, *GEN,
                 "--policy", "lru", "--memory-gb", gb)
    off = json.loads(p.stdout)["offload"]
    assert off["misses"] > 0 and off["cache_experts"] == want


def test_memory_gb_below_the_minimum_is_refused_in_one_line(fmoe_bin, files):
    total, experts = weight_bytes(files["mixed"])
    other, slot = total - experts, -(-max(files["bytes"]) // 4096) * 4096
    top_k = json.loads((TINY / "config.json").read_text())["num_experts_per_tok"]
    minimum = (other + (top_k + 1) * slot) / 2**30  # top-k slots and the scratch slot
    p = run_fmoe(fmoe_bin, "generate", "--model", files["mixed"], "--tokenizer", TINY, *GEN,
                 "--memory-gb", minimum * 0.99, check=False)
    assert p.returncode == 2
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "--memory-gb" in err[0] and f"{minimum:.2f}" in err[0], err
    p = run_fmoe(fmoe_bin, "generate", "--model", files["mixed"], "--tokenizer", TINY, *GEN,
                 "--memory-gb", minimum * 1.01)
    assert json.loads(p.stdout)["offload"]["cache_experts"] == top_k
