"""`fmoe calibrate`: the profile it writes is valid JSON that `fmoe simulate --profile`
accepts (with the host lane for --miss cpu), carries the fit errors and raw points and the
fMoE matcher's time per match (which simulate gives the fmoe policies' prefetches), and bad
input gets one-line errors. Runs `fmoe calibrate` when the binary registers it, else the
same command built on its own (tests/sim/fmoe_calibrate_cli).
"""
import json
import random
import pathlib
import subprocess

import pytest

from test_build_store import synthetic_trace
from test_simulate_reference import random_requests, write_trace

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def calibrate(build_dir, fmoe_bin):
    p = subprocess.run([str(fmoe_bin), "calibrate", "--help"], capture_output=True, text=True)
    if p.returncode == 0 and p.stdout.startswith("usage: fmoe calibrate"):
        cmd = [str(fmoe_bin), "calibrate"]
    else:
        cli = build_dir / "tests" / "sim" / "fmoe_calibrate_cli"
        if not cli.exists():
            pytest.fail(f"neither 'fmoe calibrate' nor {cli} is built")
        cmd = [str(cli)]

    def run(*args, check=True):
        r = subprocess.run(cmd + [str(a) for a in args], capture_output=True, text=True,
                           timeout=120)
        if check and r.returncode != 0:
            raise AssertionError(f"calibrate {args} exited {r.returncode}: {r.stderr}")
        return r
    return run


def test_quick_profile_is_accepted_by_simulate(calibrate, fmoe, tmp_path):
    prof = tmp_path / "p.json"
    r = calibrate("--quick", "-o", prof, "--file-dir", tmp_path, "--name", "box")
    assert "fit error rms" in r.stderr and "wrote" in r.stderr
    assert not (tmp_path / "p.json.partial").exists()
    p = json.loads(prof.read_text())
    assert p["format"] == "fmoe-hardware" and p["version"] == 1 and p["name"] == "box"
    assert p["link"]["alpha_s"] >= 0 and p["link"]["beta_bytes_per_s"] > 0
    for part in ("attention_s", "expert_s", "head_s"):
        assert p["compute"][part]["base"] >= 0 and p["compute"][part]["per_token"] >= 0
    assert p["host"]["expert_s"]["per_token"] >= 0
    cal = p["calibration"]
    assert cal["quick"] is True
    assert cal["link_used"] in ("file", "h2d")
    for link in ("ram", "file"):
        L = cal["links"][link]
        assert len(L["points"]) >= 3
        assert all(pt["seconds"] > 0 for pt in L["points"])
        assert L["fit_rms_rel_error"] >= 0 and L["fit_max_rel_error"] >= L["fit_rms_rel_error"]
    assert cal["links"]["file"]["page_cache"] in ("dropped", "tmpfs", "warm")
    if cal["link_used"] == "file":
        assert p["link"]["beta_bytes_per_s"] == pytest.approx(
            cal["links"]["file"]["beta_bytes_per_s"])
    assert len(cal["compute"]["expert_cpu"]["points"]) >= 3
    # The simulator takes it, with the host lane too.
    trace = tmp_path / "t.h5"
    write_trace(trace, random_requests(random.Random(4), 3, 2, 8, 2), 2, 8, 2)
    for miss in ("load", "cpu"):
        out = fmoe("simulate", "--trace", trace, "--cache-experts", "4", "--profile", prof,
                   "--miss", miss, "--json", "--quiet").stdout
        res = json.loads(out)
        assert res["hardware"] == "box"
        assert res["results"][0]["e2e_s"]["mean"] > 0


def test_stdout_and_model_config(calibrate, fixtures_dir, tmp_path):
    configs = sorted((fixtures_dir / "configs").rglob("config.json"))
    cfg = next((c for c in configs if "qwen1.5" in str(c).lower()), None)
    args = ["--quick", "--quiet", "--file-dir", tmp_path]
    if cfg:
        args += ["--model-config", cfg]
    r = calibrate(*args)
    assert r.stderr == ""
    p = json.loads(r.stdout)
    if cfg:  # Qwen1.5-MoE: hidden 2048, expert 1408, shared 5632, at an eighth (--quick)
        m = p["calibration"]["model"]
        assert m["shapes_of"].startswith("qwen2_moe")
        assert (m["hidden_size"], m["expert_intermediate_size"]) == (256, 176)
        assert m["shared_intermediate_size"] == 704
        # the matcher is timed at the model's own maps (24 MoE layers x 60 experts), in full
        mt = p["calibration"]["matcher"]
        assert (mt["layers"], mt["experts"], mt["store_entries"]) == (24, 60, 1000)
    assert p["matcher"]["match_s"] > 0


def test_matcher_time_is_measured_and_simulate_uses_it(calibrate, fmoe, tmp_path):
    prof = tmp_path / "p.json"
    calibrate("--quick", "--quiet", "-o", prof, "--file-dir", tmp_path)
    p = json.loads(prof.read_text())
    match_s = p["matcher"]["match_s"]
    mt = p["calibration"]["matcher"]
    # default geometry: Mixtral-like maps (32 MoE layers x 8 experts), 1000 entries
    assert (mt["layers"], mt["experts"], mt["store_entries"]) == (32, 8, 1000)
    assert mt["match_s"] == match_s
    # one layer's search over 1000 maps: well above a nanosecond, well below a millisecond
    assert 1e-9 < match_s < 1e-3
    assert mt["token_s"] == pytest.approx(32 * match_s, rel=1e-6)

    # simulate takes the profile's match_s as the fmoe policies' match delay: the same run
    # as a profile without the field plus --match-delay match_s, bit for bit
    trace = synthetic_trace(fmoe, tmp_path, requests=12, layers=6, experts=8)
    bare = dict(p)
    del bare["matcher"]
    (tmp_path / "bare.json").write_text(json.dumps(bare))
    slow = dict(p, matcher={"match_s": 1.0})  # every prefetch a second late
    (tmp_path / "slow.json").write_text(json.dumps(slow))

    def sim(profile, *extra):
        out = fmoe("simulate", "--trace", trace, "--cache-experts", "12", "--policy", "fmoe",
                   "--prefetch-distance", "2", "--profile", profile, "--json", "--quiet",
                   *extra).stdout
        return json.loads(out)["results"][0]

    with_field = sim(prof)
    assert with_field == sim(tmp_path / "bare.json", "--match-delay", repr(match_s))
    without = sim(tmp_path / "bare.json")
    late = sim(tmp_path / "slow.json")
    # the field is read: a second's delay makes every prefetch come too late to be a hit
    assert without["prefetch_hits"] > 0 and late["prefetch_hits"] < without["prefetch_hits"]
    # (not asserted: that the late run is slower. Prefetches that come too late are taken
    # over by demand loads and cost no link time, so on a trace where fmoe's prefetches
    # are partly wrong the late run can end sooner.)


def test_bad_input(calibrate, tmp_path):
    r = calibrate("--link", "pcie", check=False)
    assert r.returncode == 2 and "--link must be auto, h2d, file or ram" in r.stderr
    r = calibrate("--quick", "--file-dir", tmp_path / "missing", check=False)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "missing" in r.stderr and "scratch file" in r.stderr
    r = calibrate("--quick", "--model-config", tmp_path / "none.json", check=False)
    assert r.returncode == 1 and "none.json" in r.stderr
    r = calibrate("--bogus", check=False)
    assert r.returncode == 2 and "unknown option '--bogus'" in r.stderr
    r = calibrate("--help")
    assert r.stdout.startswith("usage: fmoe calibrate")


def test_promoe_predictor_time_is_measured(calibrate, tmp_path):
    """calibrate times one token's pass of a ProMoE predictor of train-predictor's default
    shape for the model (h -> min(2M / (h + J), h / 2) -> J) and of DuoServe's ExpertMLP,
    and writes them where simulate reads them (predictor.promoe_s, predictor.duoserve_s:
    the policies' prefetch delays)."""
    prof = tmp_path / "p.json"
    calibrate("--quick", "--quiet", "-o", prof, "--file-dir", tmp_path)
    p = json.loads(prof.read_text())
    pr, model = p["calibration"]["predictor"], p["calibration"]["model"]
    h, J = model["hidden_size"], pr["experts"]
    assert pr["kind"] == "promoe" and pr["input"] == h and J == 8
    assert pr["hidden"] == min(2_000_000 // (h + J), max(h // 2, 16))
    assert pr["promoe_s"] == p["predictor"]["promoe_s"]
    # 2 x (h x H + H x J) multiply-adds: well above a nanosecond, well below 0.1 s
    assert 1e-9 < pr["promoe_s"] < 0.1
    # DuoServe's ExpertMLP at the default geometry (Mixtral-like 32 x 8): the paper's widths
    # for Mixtral-8x7B (the DuoServe-MoE paper, "DuoServe-MoE: Dual-Phase Expert Prefetch and
    # Cache Scheduling for Efficient MoE LLM Inference", §4.2), an input of (32 + 1) x 8
    # (docs/policies.md#duoserve-moe), ~3.5M multiply-adds
    assert pr["duoserve_widths"] == [264, 2048, 1024, 512, 256, 128, 64, 8]
    assert pr["duoserve_s"] == p["predictor"]["duoserve_s"]
    assert 1e-7 < pr["duoserve_s"] < 1.0


def test_cpu_gemms_are_timed_with_the_forward_passs_kernels(calibrate, tmp_path):
    """The CPU GEMM series are the CPU backend's own products on weights of the checkpoint's
    dtype (what a live run computes), not OpenBLAS on fp32: bf16 by default (Mixtral-like),
    fp32 for a config whose torch_dtype is float32."""
    p = json.loads(calibrate("--quick", "--quiet", "--file-dir", tmp_path).stdout)
    comp = p["calibration"]["compute"]
    for key in ("expert_cpu", "layer_gemms_cpu", "lm_head_cpu"):
        assert comp[key]["what"].endswith("(fmoe cpu bf16)"), comp[key]["what"]
    cfg = json.loads((REPO / "datasets" / "fmoe-tiny" / "config.json").read_text())
    cfg["torch_dtype"] = "float32"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    p = json.loads(calibrate("--quick", "--quiet", "--file-dir", tmp_path, "--model-config",
                             tmp_path / "config.json").stdout)
    assert p["calibration"]["compute"]["expert_cpu"]["what"] == "expert (fmoe cpu f32)"


def test_quantized_experts_are_timed_in_their_block_format(calibrate, fmoe, tmp_path):
    """A GGUF whose routed experts are Q4_K (fmoe quantize --experts-only): the expert chain
    is timed on Q4_K blocks through the block kernels, the layer GEMMs and the LM head in
    the types the file keeps them in (bf16, the router f32), as the live run computes
    them."""
    gguf = tmp_path / "tiny-q4k.gguf"
    fmoe("quantize", "--type", "q4_k", "--experts-only", REPO / "datasets" / "fmoe-tiny",
         "-o", gguf, "--quiet")
    p = json.loads(calibrate("--quick", "--quiet", "--file-dir", tmp_path, "--model-config",
                             gguf).stdout)
    comp = p["calibration"]["compute"]
    # the default --activations, auto, resolved: q8 where the backend is the cpu (the
    # expert's block kernels then take 8-bit inputs, and the name says so), f32 on cuda
    act = p["calibration"]["activations"]
    assert act in ("f32", "q8"), act
    assert comp["expert_cpu"]["what"] == \
        "expert (fmoe cpu q4_k%s)" % (", activations q8" if act == "q8" else "")
    assert comp["layer_gemms_cpu"]["what"] == "layer GEMMs (fmoe cpu bf16/f32)"
    assert comp["lm_head_cpu"]["what"] == "LM head (fmoe cpu bf16)"


def test_32_value_block_experts_are_timed_in_their_format(calibrate, fmoe, tmp_path):
    """Q5_0 routed experts (the 32-value type llama-quantize writes for rows that are not
    whole Q4_K blocks): timed on Q5_0 blocks through their own kernels, and named so."""
    gguf = tmp_path / "tiny-q5_0.gguf"
    fmoe("quantize", "--type", "q5_0", "--experts-only", REPO / "datasets" / "fmoe-tiny",
         "-o", gguf, "--quiet")
    p = json.loads(calibrate("--quick", "--quiet", "--file-dir", tmp_path, "--model-config",
                             gguf).stdout)
    act = p["calibration"]["activations"]
    assert p["calibration"]["compute"]["expert_cpu"]["what"] == \
        "expert (fmoe cpu q5_0%s)" % (", activations q8" if act == "q8" else "")


def test_a_llama_quantize_mix_is_timed_in_each_matrixs_own_type(calibrate, tmp_path):
    """A Q4_K_M file (make_shaped_gguf.py's Mixtral shape: q4_k projections, q6_k values in
    some layers, f32 routers, a q6_k head): the layer GEMMs are timed on each matrix's type
    as the file stores it in most layers, and the LM head on its own type - as the live
    pass computes them - not on the config's bf16, which costs three to four times as
    much. The expected types come from gguf-py reading the file, not from fmoe."""
    import collections
    import sys
    from gguf import GGUFReader, GGMLQuantizationType as Q
    f = tmp_path / "mix.gguf"
    subprocess.run([sys.executable, str(REPO / "tests" / "bench" / "make_shaped_gguf.py"),
                    "--shape", "mixtral-8x7b", "--small", "--layers", "8", "--quiet",
                    "-o", str(f)], check=True, timeout=300)
    names = {Q.F32: "f32", Q.F16: "f16", Q.BF16: "bf16", Q.Q8_0: "q8_0", Q.Q4_K: "q4_k",
             Q.Q5_K: "q5_k", Q.Q6_K: "q6_k"}
    r = GGUFReader(str(f))
    types = {t.name: names[Q(t.tensor_type)] for t in r.tensors}
    layers = {int(n.split(".")[1]) for n in types if n.startswith("blk.")}

    def mode(role):
        c = collections.Counter(types[f"blk.{l}.{role}.weight"] for l in sorted(layers))
        return c.most_common(1)[0][0]
    expected = [mode(role) for role in
                ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_inp")]
    assert "q4_k" in expected and "f32" in expected  # a mix, not one type
    head = types.get("output.weight", types["token_embd.weight"])
    p = json.loads(calibrate("--quick", "--quiet", "--file-dir", tmp_path, "--link", "ram",
                             "--model-config", f).stdout)
    model = p["calibration"]["model"]
    assert model["layer_matrix_dtypes"] == expected
    assert model["lm_head_dtype"] == head
    comp = p["calibration"]["compute"]
    formats = "/".join(dict.fromkeys(expected))  # distinct, in order
    act = ", activations q8" if p["calibration"]["activations"] == "q8" else ""
    assert comp["layer_gemms_cpu"]["what"] == f"layer GEMMs (fmoe cpu {formats}{act})"
    assert comp["lm_head_cpu"]["what"] == f"LM head (fmoe cpu {head}{act})"


def test_compute_is_timed_through_the_backend_table_with_the_layer_overhead(calibrate, fmoe,
                                                                           tmp_path):
    """Every compute series is timed through the backend's function table (the CPU one
    here, by the code that times the CUDA one with --backend cuda: each series names the
    table it went through), attention through the backend's own attention op, and the
    per-layer overhead (norms, RoPE, KV writes, top-k, the routing read back) is a profile
    term, compute.layer_overhead_s, of positive measured points that simulate adds to every
    MoE layer: the same profile without it simulates shorter runs."""
    prof = tmp_path / "p.json"
    calibrate("--quick", "--quiet", "--backend", "cpu", "--file-dir", tmp_path, "-o", prof)
    p = json.loads(prof.read_text())
    comp = p["calibration"]["compute"]
    names = {"expert_cpu": "expert (fmoe cpu bf16)",
             "layer_gemms_cpu": "layer GEMMs (fmoe cpu bf16)",
             "attention_cpu": "attention (fmoe cpu)", "lm_head_cpu": "LM head (fmoe cpu bf16)",
             "layer_overhead_cpu": "layer overhead (fmoe cpu)"}
    for key, what in names.items():
        assert comp[key]["what"] == what
        assert comp[key]["backend_ops"] == "cpu"  # the table's own name
        assert len(comp[key]["points"]) == 3
        assert all(pt["seconds"] > 0 for pt in comp[key]["points"]), comp[key]
    assert not any(k.endswith("_gpu") for k in comp)
    over = p["compute"]["layer_overhead_s"]
    assert over["base"] >= 0 and over["per_token"] >= 0
    assert over["base"] + over["per_token"] > 0
    assert over["base"] == pytest.approx(max(comp["layer_overhead_cpu"]["intercept_s"], 0))
    assert [pt["tokens"] for pt in comp["layer_overhead_cpu"]["points"]] == [1, 4, 16]
    for part in ("attention_s", "expert_s", "head_s"):
        assert p["compute"][part]["base"] + p["compute"][part]["per_token"] > 0

    trace = tmp_path / "t.h5"
    write_trace(trace, random_requests(random.Random(5), 3, 2, 8, 2), 2, 8, 2)
    without = dict(p, compute={k: v for k, v in p["compute"].items()
                               if k != "layer_overhead_s"})
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(without))

    def e2e(profile):
        out = fmoe("simulate", "--trace", trace, "--cache-experts", "4", "--profile", profile,
                   "--json", "--quiet").stdout
        return json.loads(out)["results"][0]["e2e_s"]["mean"]
    assert e2e(prof) > e2e(bare) > 0


def test_link_file_of_a_model_times_its_experts_as_the_file_tier_reads_them(calibrate, fmoe,
                                                                            tmp_path):
    """--link-file MODEL (a model directory or a GGUF file) times the link on the model's
    own experts through the live file tier's reads (O_DIRECT, --read-depth): pieces of
    1/8, 1/4 and 1/2 of an expert and whole experts. The points' bytes are those pieces of
    the expert size read from the files by safetensors/gguf-py, not from fmoe; the fit
    has a positive rate; every point took positive time."""
    import os
    if not hasattr(os, "O_DIRECT"):
        pytest.skip("no O_DIRECT")
    import struct
    from gguf import GGUFReader
    tiny = REPO / "datasets" / "fmoe-tiny"
    # the bundled model: expert 0 of layer 0 is its gate, up and down projections, whose
    # byte ranges the safetensors header gives (8 bytes of length, then JSON)
    raw = (tiny / "model.safetensors").read_bytes()
    header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
    names = [n for n in header if ".mlp.experts.0." in n and ".layers.0." in n]
    st_bytes = sum(header[n]["data_offsets"][1] - header[n]["data_offsets"][0] for n in names)
    assert len(names) == 3
    gguf = tmp_path / "tiny-q4k.gguf"
    fmoe("quantize", "--type", "q4_k", "--experts-only", tiny, "-o", gguf, "--quiet")
    r = GGUFReader(str(gguf))
    stacked = [t for t in r.tensors if t.name.startswith("blk.0.ffn_") and "_exps" in t.name]
    assert len(stacked) == 3
    gguf_bytes = sum(int(t.n_bytes) // int(t.shape[-1]) for t in stacked)  # one expert's
    for model, expert in ((tiny, st_bytes), (gguf, gguf_bytes)):
        try:
            fd = os.open(model if model.is_file() else model / "model.safetensors",
                         os.O_RDONLY | os.O_DIRECT)
            os.close(fd)
        except OSError:
            pytest.skip("O_DIRECT does not open here (tmpfs)")
        p = json.loads(calibrate("--quick", "--quiet", "--link-file", model).stdout)
        fl = p["calibration"]["links"]["file"]
        assert fl["reads"].startswith("experts of the model") and fl["reads_per_point"] >= 4
        assert fl["page_cache"] == "O_DIRECT" and fl["read_depth"] == 4
        pts = fl["points"]
        assert [round(x["bytes"]) for x in pts][-1] == expert, (pts, expert)
        for x, pieces in zip(pts, (8, 4, 2, 1)):
            # a random piece of each read: the mean lies between the short last piece
            # and ceil(expert / pieces)
            assert expert - (pieces - 1) * -(-expert // pieces) <= x["bytes"] <= -(-expert // pieces)
            assert x["seconds"] > 0
        assert p["link"]["beta_bytes_per_s"] > 0 and p["calibration"]["link_used"] == "file"
    # a directory that is no model: one line naming what is missing
    (tmp_path / "empty").mkdir()
    r = calibrate("--quick", "--quiet", "--link-file", tmp_path / "empty", check=False)
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "empty/config.json" in r.stderr


def test_link_file_times_o_direct_reads_of_the_given_file(calibrate, fmoe, tmp_path):
    """--link-file times the file link on O_DIRECT reads of an existing file (the model's
    safetensors, what `--tier file --direct-io` reads) instead of a scratch file; the
    profile says which file and at which read depth (a live run's --read-depth: 4 unless
    given); a file smaller than the reads, a missing one and another --link are one-line
    errors."""
    model = REPO / "datasets" / "fmoe-tiny" / "model.safetensors"
    prof = tmp_path / "p.json"
    calibrate("--quick", "--quiet", "--link-file", model, "-o", prof)
    p = json.loads(prof.read_text())
    fl = p["calibration"]["links"]["file"]
    assert fl["page_cache"] == "O_DIRECT" and fl["file"] == str(model)
    assert fl["read_depth"] == 4
    calibrate("--quick", "--quiet", "--link-file", model, "--read-depth", "1", "-o", prof)
    assert json.loads(prof.read_text())["calibration"]["links"]["file"]["read_depth"] == 1
    assert p["calibration"]["link_used"] == "file"
    assert p["link"]["beta_bytes_per_s"] > 0
    small = tmp_path / "small.bin"
    small.write_bytes(b"x" * 8192)
    r = calibrate("--quick", "--quiet", "--link-file", small, check=False)
    assert r.returncode == 1 and "too small" in r.stderr and len(r.stderr.splitlines()) == 1
    r = calibrate("--quick", "--quiet", "--link-file", tmp_path / "none", check=False)
    assert r.returncode == 1 and "none" in r.stderr and len(r.stderr.splitlines()) == 1
    r = calibrate("--quick", "--quiet", "--link", "ram", "--link-file", model, check=False)
    assert r.returncode == 2 and "--link-file" in r.stderr


def test_link_decode_gb_measures_the_link_in_an_offloaded_decode(calibrate, tmp_path):
    """--link-decode-gb X (with --link-file MODEL) runs a short decode of MODEL offloaded
    from its file (--cache-gb X, LRU, O_DIRECT) and makes the copy engine's bytes over its
    busy seconds in decode the profile's link (alpha 0); the idle reads stay in the record.
    fmoe-tiny (6 layers, top-2 of 8, experts of 3 x 176 x 256 bf16 by its config) with 4
    slots: each token routes 12 experts, none seen again before 4 others, so LRU misses
    every access and --quick's 2 decode tokens copy exactly 24 experts."""
    import os
    if not hasattr(os, "O_DIRECT"):
        pytest.skip("no O_DIRECT")
    tiny = REPO / "datasets" / "fmoe-tiny"
    cfg = json.loads((tiny / "config.json").read_text())
    expert = 3 * cfg["moe_intermediate_size"] * cfg["hidden_size"] * 2
    layers, k = cfg["num_hidden_layers"], cfg["num_experts_per_tok"]
    gb = 4.5 * expert / 2**30
    try:
        fd = os.open(tiny / "model.safetensors", os.O_RDONLY | os.O_DIRECT)
        os.close(fd)
    except OSError:
        pytest.skip("O_DIRECT does not open here (tmpfs)")
    prof = tmp_path / "p.json"
    r = calibrate("--quick", "--link-file", tiny, "--link-decode-gb", gb, "--threads", 1,
                  "-o", prof)
    assert "copy file->RAM in decode" in r.stderr and "4 slots" in r.stderr, r.stderr
    p = json.loads(prof.read_text())
    fl = p["calibration"]["links"]["file"]
    d = fl["decode"]
    assert d["slots"] == 4 and d["tokens"] == 2 and d["policy"] == "lru"
    assert d["bytes"] == 2 * layers * k * expert, d
    assert d["hit_pct"] == 0 and d["busy_s"] > 0 and d["cache_gb"] == pytest.approx(gb)
    assert p["link"]["alpha_s"] == 0
    assert p["link"]["beta_bytes_per_s"] == pytest.approx(d["bytes"] / d["busy_s"])
    assert d["beta_bytes_per_s"] == pytest.approx(d["bytes"] / d["busy_s"])
    # the reads on an idle CPU are measured as without the option
    assert fl["reads"].startswith("experts of the model") and len(fl["points"]) == 4
    # --base re-measures it the same way, every other figure kept
    out = tmp_path / "fresh.json"
    calibrate("--quick", "--quiet", "--base", prof, "--link-file", tiny, "--link-decode-gb",
              gb, "-o", out)
    q = json.loads(out.read_text())
    qd = q["calibration"]["links"]["file"]["decode"]
    assert qd["bytes"] == d["bytes"] and q["link"]["alpha_s"] == 0
    assert q["link"]["beta_bytes_per_s"] == pytest.approx(qd["bytes"] / qd["busy_s"])
    for key in set(p) - {"link", "calibration"}:
        assert q[key] == p[key], key
    # what it needs: a model to decode, the file link; one line each, nothing written
    never = tmp_path / "never.json"
    for args, what in ((["--link-decode-gb", gb], "--link-file MODEL"),
                       (["--link-file", tiny / "model.safetensors", "--link-decode-gb", gb],
                        "--link-file MODEL"),
                       (["--link", "ram", "--link-file", tiny, "--link-decode-gb", gb],
                        "--link")):
        r = calibrate("--quick", "--quiet", *args, "-o", never, check=False)
        assert r.returncode == 2 and what in r.stderr, (args, r.stderr)
        assert not never.exists()
    # a cache too small for a layer's top-k: the offload's own one-line refusal, no output
    r = calibrate("--quick", "--quiet", "--base", prof, "--link-file", tiny, "--link-decode-gb",
                  0.5 * expert / 2**30, "-o", never, check=False)
    assert r.returncode != 0 and len(r.stderr.splitlines()) == 1, r.stderr
    assert not never.exists() and not (tmp_path / "never.json.partial").exists()


def test_base_remeasures_the_link_only(calibrate, tmp_path):
    """--base PROFILE measures the link alone and writes PROFILE with its link replaced:
    every other figure (compute, host, matcher, predictors, and a field this version does
    not know) is kept exactly, the link is this run's, and the calibration record names
    the base. A base that is no profile is refused in one line before anything is timed;
    the output is then not written."""
    model = REPO / "datasets" / "fmoe-tiny" / "model.safetensors"
    base = tmp_path / "base.json"
    calibrate("--quick", "--quiet", "-o", base)
    p = json.loads(base.read_text())
    # a link no disk has, and a field of a later version: neither may survive / both must
    p["link"] = {"alpha_s": 0.5, "beta_bytes_per_s": 1.0}
    p["x_later_field"] = {"kept": [1, 2, 3]}
    base.write_text(json.dumps(p))
    out = tmp_path / "fresh.json"
    r = calibrate("--quick", "--base", base, "--link-file", model, "-o", out)
    assert "everything else from" in r.stderr and "copy file->RAM" in r.stderr
    q = json.loads(out.read_text())
    assert q["link"]["beta_bytes_per_s"] > 1e6 and q["link"]["alpha_s"] < 0.5
    fl = q["calibration"]["links"]["file"]
    assert fl["file"] == str(model) and fl["page_cache"] == "O_DIRECT"
    assert q["link"]["beta_bytes_per_s"] == pytest.approx(fl["beta_bytes_per_s"])
    assert q["calibration"]["link_remeasured_from"] == str(base)
    for key in set(p) - {"link", "calibration"}:
        assert q[key] == p[key], key
    for key in set(p["calibration"]) - {"links", "link_used"}:
        assert q["calibration"][key] == p["calibration"][key], key
    assert q["calibration"]["links"]["ram"] == p["calibration"]["links"]["ram"]
    # --name renames; nothing else changes
    calibrate("--quick", "--quiet", "--base", base, "--name", "fresh", "-o", out)
    assert json.loads(out.read_text())["name"] == "fresh"
    # a base that is not a profile: refused, one line, no output written
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "fmoe-hardware", "version": 1}))
    out2 = tmp_path / "never.json"
    r = calibrate("--quick", "--quiet", "--base", bad, "-o", out2, check=False)
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "bad.json" in r.stderr and not out2.exists()
    assert not (tmp_path / "never.json.partial").exists()
