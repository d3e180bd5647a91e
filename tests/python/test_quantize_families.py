"""`fmoe quantize` for DeepSeek-V2/V3 (GGUF deepseek2), GLM-4.5 (glm4moe) and gpt-oss
(gpt-oss, from float and MXFP4 checkpoints), and from FP8 block-scaled checkpoints (runtime/model/quantize.c, fp8_block.c).

- The tiny checkpoints written as F32 GGUF run to exactly the logits, routes and greedy
  tokens of the safetensors directory; the bf16 one written as BF16 (every byte kept) to
  the same routes and tokens, logits within 1e-5 (the file's router is F32, as the
  converter writes ffn_gate_inp, where the directory's is bf16: dots of another order).
- The file carries config.json verbatim (so geometry and fingerprint are the checkpoint's),
  and llama.cpp's keys alone (fmoe.hf_config renamed away) rebuild the same geometry
  through lib/gguf_config.c, which reads the keys llama.cpp's converter writes.
- Names and extents are the converter's (DeepseekV2Model / Glm4MoeModel / GptOssModel,
  gguf-py's MODEL_TENSORS): kv_b_proj split into attn_k_b [H][r][dn] and attn_v_b
  [H][dv][r], gpt-oss's fused experts de-interleaved and transposed, as NumPy does it here
  from the checkpoint.
- gpt-oss's MXFP4 experts (OpenAI's layout) are copied block for block, never requantised;
  --experts-type mxfp4 on float experts equals gguf-py's MXFP4 quantiser byte for byte.
- An FP8 checkpoint (test_fp8_weights.py's writer) converts to F32 holding exactly the
  NumPy dequantisation fp8 · scale_inv of every block, edge blocks included.
"""
import json
import subprocess

import numpy as np
import pytest

from forward_driver import drive

import make_tiny_models as tiny
from conftest import run_fmoe
from test_fp8_weights import decode, write_pair
from test_quantize import read_checkpoint

import gguf  # noqa: E402  (tests/python/requirements.txt)

CASES = {"deepseek_v2": ("deepseek2", "f32"), "deepseek_v3": ("deepseek2", "f32"),
         "deepseek_v3_yarn": ("deepseek2", "f32"), "deepseek_v3_bf16": ("deepseek2", "bf16"),
         "glm4_moe": ("glm4moe", "f32"), "glm4_moe_qk_norm": ("glm4moe", "f32"),
         "gpt_oss": ("gpt-oss", "f32")}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny.maker(tmp_path_factory.mktemp("tiny-quantize-families"))


@pytest.mark.parametrize("name", sorted(CASES))
def test_gguf_runs_exactly_as_the_checkpoint(name, models, driver, fmoe_bin, tmp_path):
    d = models(name)
    ref = dict(np.load(d / "reference.npz"))
    out = tmp_path / "m.gguf"
    run_fmoe(fmoe_bin, "quantize", "--type", CASES[name][1], d, "-o", out, "--quiet")
    l1, r1 = drive(driver, d, ref, tmp_path, "dir")
    l2, r2 = drive(driver, out, ref, tmp_path, "gguf")
    if CASES[name][1] == "f32":
        assert np.array_equal(l1, l2), f"{name}: max |diff| {np.abs(l1 - l2).max()}"
    else:  # the file's router (ffn_gate_inp) is F32, the directory's bf16: other dot kernels
        assert np.abs(l1 - l2).max() <= 1e-5, f"{name}: max |diff| {np.abs(l1 - l2).max()}"
    for k in ("prompt", "generated", "experts"):
        assert r1[k] == r2[k], k
    assert np.allclose(r1["weights"], r2["weights"], rtol=0, atol=1e-5)
    assert r2["generated"] == ref["generated"].tolist()


def inspect(fmoe_bin, path):
    return json.loads(run_fmoe(fmoe_bin, "inspect", path, "--json").stdout)


@pytest.mark.parametrize("name", sorted(CASES))
def test_config_kept_and_keys_rebuild_the_geometry(name, models, fmoe_bin, tmp_path):
    d = models(name)
    out = tmp_path / "m.gguf"
    run_fmoe(fmoe_bin, "quantize", "--type", "q8_0", d, "-o", out, "--quiet")
    r = gguf.GGUFReader(str(out))
    f = r.fields["fmoe.hf_config"]
    assert bytes(f.parts[f.data[0]]) == (d / "config.json").read_bytes()
    got = inspect(fmoe_bin, out)
    assert got["architecture"] == CASES[name][0]
    m = got["model"]
    assert m["config"] == "fmoe.hf_config"
    raw = bytearray(out.read_bytes())
    at = raw.find(b"fmoe.hf_config")
    raw[at:at + 14] = b"fmoe.hf_confiX"
    bare = tmp_path / "bare.gguf"
    bare.write_bytes(bytes(raw))
    built = inspect(fmoe_bin, bare)["model"]
    assert built["config"] == "built from GGUF metadata"
    for k in ("model_type", "layers", "moe_layers", "experts", "top_k", "shared_experts",
              "hidden_size", "moe_intermediate_size"):
        assert built[k] == m[k], (k, built[k], m[k])


def expected_layout(cfg, ck, arch):
    """{GGUF name: (numpy shape, values)} as llama.cpp's converter lays the checkpoint out
    (numpy shape = reversed ggml extents)."""
    L = cfg["num_hidden_layers"]
    J = cfg.get("n_routed_experts") or cfg.get("num_local_experts")
    out = {"token_embd.weight": ck["model.embed_tokens.weight"],
           "output_norm.weight": ck["model.norm.weight"], "output.weight": ck["lm_head.weight"]}
    post = "post_attention_norm" if arch in ("glm4moe", "gpt-oss") else "ffn_norm"
    for i in range(L):
        p = f"model.layers.{i}."
        out[f"blk.{i}.attn_norm.weight"] = ck[p + "input_layernorm.weight"]
        out[f"blk.{i}.{post}.weight"] = ck[p + "post_attention_layernorm.weight"]
        names = {"q_a_proj.weight": "attn_q_a.weight", "q_a_layernorm.weight": "attn_q_a_norm.weight",
                 "q_b_proj.weight": "attn_q_b.weight", "q_proj.weight": "attn_q.weight",
                 "kv_a_proj_with_mqa.weight": "attn_kv_a_mqa.weight",
                 "kv_a_layernorm.weight": "attn_kv_a_norm.weight", "k_proj.weight": "attn_k.weight",
                 "v_proj.weight": "attn_v.weight", "o_proj.weight": "attn_output.weight",
                 "q_proj.bias": "attn_q.bias", "k_proj.bias": "attn_k.bias",
                 "v_proj.bias": "attn_v.bias", "q_norm.weight": "attn_q_norm.weight",
                 "k_norm.weight": "attn_k_norm.weight", "o_proj.bias": "attn_output.bias",
                 "sinks": "attn_sinks.weight"}
        for hf, gg in names.items():
            if p + "self_attn." + hf in ck:
                out[f"blk.{i}.{gg}"] = ck[p + "self_attn." + hf]
        if p + "self_attn.kv_b_proj.weight" in ck:
            H, dn, dv = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
            kv = ck[p + "self_attn.kv_b_proj.weight"].reshape(H, dn + dv, -1)
            out[f"blk.{i}.attn_k_b.weight"] = kv[:, :dn].transpose(0, 2, 1)
            out[f"blk.{i}.attn_v_b.weight"] = kv[:, dn:]
        if p + "mlp.router.weight" in ck:  # gpt-oss: fused input-major, gate/up interleaved
            out[f"blk.{i}.ffn_gate_inp.weight"] = ck[p + "mlp.router.weight"]
            out[f"blk.{i}.ffn_gate_inp.bias"] = ck[p + "mlp.router.bias"]
            gu, gub = ck[p + "mlp.experts.gate_up_proj"], ck[p + "mlp.experts.gate_up_proj_bias"]
            out[f"blk.{i}.ffn_gate_exps.weight"] = gu.transpose(0, 2, 1)[:, ::2]
            out[f"blk.{i}.ffn_up_exps.weight"] = gu.transpose(0, 2, 1)[:, 1::2]
            out[f"blk.{i}.ffn_down_exps.weight"] = ck[p + "mlp.experts.down_proj"].transpose(0, 2, 1)
            out[f"blk.{i}.ffn_gate_exps.bias"] = gub[:, ::2]
            out[f"blk.{i}.ffn_up_exps.bias"] = gub[:, 1::2]
            out[f"blk.{i}.ffn_down_exps.bias"] = ck[p + "mlp.experts.down_proj_bias"]
        elif p + "mlp.gate.weight" in ck:
            out[f"blk.{i}.ffn_gate_inp.weight"] = ck[p + "mlp.gate.weight"]
            if p + "mlp.gate.e_score_correction_bias" in ck:
                out[f"blk.{i}.exp_probs_b.bias"] = ck[p + "mlp.gate.e_score_correction_bias"]
            for w in ("gate", "up", "down"):
                out[f"blk.{i}.ffn_{w}_exps.weight"] = np.stack(
                    [ck[p + f"mlp.experts.{e}.{w}_proj.weight"] for e in range(J)])
                out[f"blk.{i}.ffn_{w}_shexp.weight"] = ck[p + f"mlp.shared_experts.{w}_proj.weight"]
        else:
            for w in ("gate", "up", "down"):
                out[f"blk.{i}.ffn_{w}.weight"] = ck[p + f"mlp.{w}_proj.weight"]
    return out


def tensors(path):
    """{name: (type, values)} of the F32 and BF16 tensors (BF16 as uint16 bit patterns)."""
    r = gguf.GGUFReader(str(path))
    out = {}
    for t in r.tensors:
        a = np.asarray(t.data)
        if t.tensor_type == gguf.GGMLQuantizationType.BF16:
            a = a.view(np.uint16)
        elif t.tensor_type != gguf.GGMLQuantizationType.F32:
            continue  # block types: not compared here (test_quantize.py)
        out[t.name] = (t.tensor_type, a.reshape(tuple(reversed(t.shape.tolist()))))
    return out


@pytest.mark.parametrize("name", ["deepseek_v2", "deepseek_v3", "glm4_moe_qk_norm", "gpt_oss"])
def test_names_and_values_are_the_converters(name, models, fmoe_bin, tmp_path):
    d = models(name)
    cfg = json.loads((d / "config.json").read_text())
    ck = {k: v[0] for k, v in read_checkpoint(d).items()}
    want = expected_layout(cfg, ck, CASES[name][0])
    out = tmp_path / "m.gguf"
    run_fmoe(fmoe_bin, "quantize", "--type", "f32", d, "-o", out, "--quiet")
    got = tensors(out)
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert got[k][1].shape == v.shape, (k, got[k][1].shape, v.shape)
        assert np.array_equal(got[k][1], v), k


@pytest.mark.parametrize("block", [(128, 128), (16, 32)], ids=["128x128", "16x32"])
def test_fp8_checkpoint_converts_exactly(block, models, fmoe_bin, tmp_path):
    src = models("deepseek_v3")
    fp8 = write_pair(src, tmp_path / "fp8", tmp_path / "bf16", *block)
    cfg = json.loads((src / "config.json").read_text())
    deq = {}
    for k, (x, dt) in fp8.items():
        if dt == "F8_E4M3":
            deq[k] = decode(x, fp8[k + "_scale_inv"][0], *block)
        elif not k.endswith("_scale_inv"):
            deq[k] = x
    out = tmp_path / "m.gguf"
    run_fmoe(fmoe_bin, "quantize", "--type", "f32", tmp_path / "fp8", "-o", out, "--quiet")
    got = tensors(out)
    want = expected_layout(cfg, deq, "deepseek2")
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert np.array_equal(got[k][1], v), k
    # kept in their dtype (--experts-only), FP8 matrices become BF16, rounded to nearest even
    out = tmp_path / "e.gguf"
    run_fmoe(fmoe_bin, "quantize", "--type", "q8_0", "--experts-only", tmp_path / "fp8", "-o",
             out, "--quiet")
    t, v = tensors(out)["blk.0.attn_output.weight"]
    assert t == gguf.GGMLQuantizationType.BF16
    assert np.array_equal(v, tiny._bf16_bits(deq["model.layers.0.self_attn.o_proj.weight"]))


def test_fp8_missing_scale_refused(models, fmoe_bin, tmp_path):
    src = models("deepseek_v3")
    fp8 = write_pair(src, tmp_path / "fp8", tmp_path / "bf16", 128, 128)
    w = "model.layers.2.self_attn.kv_b_proj.weight"
    del fp8[w + "_scale_inv"]
    tiny.save_safetensors(tmp_path / "fp8" / "model.safetensors", fp8)
    out = tmp_path / "m.gguf"
    p = run_fmoe(fmoe_bin, "quantize", "--type", "f32", tmp_path / "fp8", "-o", out, check=False)
    assert p.returncode == 1, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{w}_scale_inv are missing" in lines[0], lines
    assert not out.exists() and not (tmp_path / "m.gguf.partial").exists()


def e2m1_values(blocks, scales):
    """OpenAI's MXFP4 blocks [..., G, 16] and scales [..., G] as float64 [..., G·32]: value
    2k from the low nibble of byte k, 2k + 1 from its high one (transformers'
    convert_moe_packed_tensors), each an E2M1 number times 2^(s - 127)."""
    idx = np.stack([blocks & 0xF, blocks >> 4], -1).reshape(*blocks.shape[:-1], 32)
    v = tiny.E2M1.astype(np.float64)[idx] * np.ldexp(1.0, scales.astype(np.int64) - 127)[..., None]
    return v.reshape(*v.shape[:-2], -1)


def test_gptoss_mxfp4_experts_copied_exactly(models, driver, fmoe_bin, tmp_path):
    """OpenAI's MXFP4 experts go into the file as MXFP4, block for block (the converter's
    repack_mxfp4, written here by test_gguf_gptoss.ggml_mxfp4 and checked again through
    gguf-py's dequantiser against the E2M1 values of the checkpoint's nibbles); the rest as
    --type says; the file runs exactly as the directory."""
    from test_gguf_gptoss import ggml_mxfp4, read_raw
    d = models("gpt_oss_mxfp4")
    ref = dict(np.load(d / "reference.npz"))
    out = tmp_path / "m.gguf"
    run_fmoe(fmoe_bin, "quantize", "--type", "f32", d, "-o", out, "--quiet")
    ck = read_raw(d)
    cfg = json.loads((d / "config.json").read_text())
    r = gguf.GGUFReader(str(out))
    got = {t.name: t for t in r.tensors}
    Q = gguf.GGMLQuantizationType
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}.mlp.experts."
        gu = (ck[p + "gate_up_proj_blocks"], ck[p + "gate_up_proj_scales"])
        dn = (ck[p + "down_proj_blocks"], ck[p + "down_proj_scales"])
        want = {"gate": (gu[0][:, ::2], gu[1][:, ::2]), "up": (gu[0][:, 1::2], gu[1][:, 1::2]),
                "down": dn}
        for w, (bl, sc) in want.items():
            t = got[f"blk.{i}.ffn_{w}_exps.weight"]
            assert t.tensor_type == Q.MXFP4, w
            raw = np.asarray(t.data).reshape(-1)
            assert np.array_equal(raw, ggml_mxfp4(bl, sc).reshape(-1)), (i, w)
            ours = gguf.quants.dequantize(raw, Q.MXFP4).reshape(-1)
            assert np.array_equal(ours, e2m1_values(bl, sc).reshape(-1)), (i, w)
        assert got[f"blk.{i}.attn_q.weight"].tensor_type == Q.F32
    l1, r1 = drive(driver, d, ref, tmp_path, "dir")
    l2, r2 = drive(driver, out, ref, tmp_path, "gguf")
    assert np.array_equal(l1, l2), f"max |diff| {np.abs(l1 - l2).max()}"
    assert r1 == r2
    assert r2["generated"] == ref["generated"].tolist()


def test_gptoss_mxfp4_not_requantised(models, fmoe_bin, tmp_path):
    """--experts-type other than mxfp4 on MXFP4 experts is refused in one line; mxfp4 is
    the copy; --type q8_0 quantises the rest and keeps the experts."""
    d = models("gpt_oss_mxfp4")
    out = tmp_path / "m.gguf"
    p = run_fmoe(fmoe_bin, "quantize", "--type", "q8_0", "--experts-type", "q4_k", d, "-o", out,
                 check=False)
    assert p.returncode == 1, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "MXFP4" in lines[0] and "q4_k" in lines[0].lower(), lines
    assert not out.exists() and not (tmp_path / "m.gguf.partial").exists()
    run_fmoe(fmoe_bin, "quantize", "--type", "q8_0", "--experts-type", "mxfp4", d, "-o", out,
             "--quiet")
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(str(out)).tensors}
    Q = gguf.GGMLQuantizationType
    assert types["blk.0.ffn_down_exps.weight"] == Q.MXFP4
    assert types["blk.0.attn_q.weight"] == Q.Q8_0


def test_gptoss_mxfp4_bad_scales_refused(fmoe_bin, tmp_path):
    """Scales of the wrong shape: one line naming the tensor and the shape expected, no
    file left."""
    d = tmp_path / "bad"
    tensors = tiny.write_gpt_oss_mxfp4(d)
    w = "model.layers.1.mlp.experts.down_proj_scales"
    tensors[w] = (tensors[w][0][:, :, :1], "U8")
    tiny.save_safetensors(d / "model.safetensors", tensors)
    out = tmp_path / "m.gguf"
    p = run_fmoe(fmoe_bin, "quantize", "--type", "f32", d, "-o", out, check=False)
    assert p.returncode == 1, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and w in lines[0] and "MXFP4 scales" in lines[0], lines
    assert not out.exists() and not (tmp_path / "m.gguf.partial").exists()


@pytest.mark.parametrize("name", ["qwen3_moe", "gpt_oss"])
def test_experts_type_mxfp4_is_gguf_pys_quantiser(name, models, driver, fmoe_bin, tmp_path):
    """--experts-type mxfp4 on float experts: each stacked expert tensor is gguf-py's
    MXFP4 quantisation of the converter's layout, byte for byte; the file runs."""
    d = models(name)
    cfg = json.loads((d / "config.json").read_text())
    ck = {k: v[0] for k, v in read_checkpoint(d).items()}
    if name == "gpt_oss":
        want = expected_layout(cfg, ck, "gpt-oss")
    else:  # one [rows, cols] tensor per expert, stacked
        want = {f"blk.{i}.ffn_{w}_exps.weight": np.stack(
            [ck[f"model.layers.{i}.mlp.experts.{e}.{w}_proj.weight"]
             for e in range(cfg["num_local_experts"])])
            for i in range(cfg["num_hidden_layers"]) for w in ("gate", "up", "down")}
    out = tmp_path / "m.gguf"
    run_fmoe(fmoe_bin, "quantize", "--type", "f32", "--experts-type", "mxfp4", d, "-o", out,
             "--quiet")
    Q = gguf.GGMLQuantizationType
    n = 0
    for t in gguf.GGUFReader(str(out)).tensors:
        if "_exps.weight" not in t.name:
            continue
        assert t.tensor_type == Q.MXFP4, t.name
        theirs = gguf.quants.quantize(np.ascontiguousarray(want[t.name], np.float32), Q.MXFP4)
        assert np.array_equal(np.asarray(t.data).reshape(-1), theirs.reshape(-1)), t.name
        n += 1
    assert n == 3 * len([k for k in want if k.endswith("ffn_down_exps.weight")]) > 0
    ref = dict(np.load(d / "reference.npz"))
    _, routes = drive(driver, out, ref, tmp_path, "gguf")
    assert len(routes["generated"]) == len(ref["generated"])
