"""GGUF architecture deepseek2 (DeepSeek-V2/V3 as llama.cpp's converter writes them) in the
forward pass: lib/gguf_names.c's MLA names, lib/gguf_config.c's translation of the
deepseek2.* keys into a config, and runtime/model/load.c's two ways to the attn_k_b /
attn_v_b split the attention reads: a newer converter's tensors read as they are, an older
file's whole attn_kv_b split at load (in blocks too: the last test).

Each tiny MLA checkpoint of make_tiny_models.py is written here as a GGUF (F32, or BF16 for
the bf16 one) by
gguf-py's own writer (its key and tensor names, llama.cpp's shapes: the split k_b is
[H][r][dn], each head's key rows transposed), without fmoe's hf_config key, so the config
is rebuilt from llama.cpp's metadata alone; it must run to exactly the logits, experts and
greedy tokens of the HF directory, with kv_b whole and split.
"""
import json
import pathlib
import subprocess

import numpy as np
import pytest

from forward_driver import drive

import make_tiny_models as tiny
from test_quantize import read_checkpoint

import gguf  # noqa: E402  (tests/python/requirements.txt)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny.maker(tmp_path_factory.mktemp("tiny-models"))


def write_deepseek2(model_dir, out, split, kv_b_q8=False):
    """kv_b_q8: kv_b_proj quantised to Q8_0 along its rows (r), as an older converter's
    quantised attn_kv_b; with split, the split the loader makes of that file, done here:
    attn_k_b the blocks' values (gguf-py's dequantisation) transposed, in F32, attn_v_b
    the value rows' very blocks."""
    cfg = json.loads((pathlib.Path(model_dir) / "config.json").read_text())
    ck = {k: v[0] for k, v in read_checkpoint(model_dir).items()}
    H, dn, dr = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"]
    dv, r, J = cfg["v_head_dim"], cfg["kv_lora_rank"], cfg["n_routed_experts"]
    v3 = cfg["model_type"] == "deepseek_v3"
    w = gguf.GGUFWriter(str(out), "deepseek2")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(H)
    w.add_head_count_kv(1 if split else H)  # the split files count the latent as one head
    w.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(J)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_leading_dense_block_count(cfg["first_k_dense_replace"])
    w.add_expert_shared_count(cfg["n_shared_experts"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_weights_scale(cfg["routed_scaling_factor"])
    w.add_expert_weights_norm(bool(cfg.get("norm_topk_prob")) if v3 else False)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if v3
                             else gguf.ExpertGatingFuncType.SOFTMAX)
    if cfg.get("n_group") and cfg.get("topk_method") != "greedy":
        w.add_expert_group_count(cfg["n_group"])
        w.add_expert_group_used_count(cfg["topk_group"])
    if cfg.get("q_lora_rank"):
        w.add_q_lora_rank(cfg["q_lora_rank"])
    w.add_kv_lora_rank(r)
    w.add_rope_dimension_count(dr)
    if split:  # newer converters: lengths of the latent, the heads' in the _mla keys
        w.add_key_length(r + dr)
        w.add_value_length(r)
        w.add_key_length_mla(dn + dr)
        w.add_value_length_mla(dv)
    else:
        w.add_key_length(dn + dr)
        w.add_value_length(dv)
    rp = cfg["rope_parameters"]
    if rp.get("rope_type") == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rp["factor"])
        w.add_rope_scaling_orig_ctx_len(rp["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_log_mul(0.1 * rp["mscale_all_dim"])

    bf16 = cfg.get("dtype", cfg.get("torch_dtype")) == "bfloat16"

    def add(name, a):
        """In the checkpoint's dtype (the split k_b/v_b too), so the products are the same
        kernels; norms and biases as GGUF keeps them, F32."""
        a = np.ascontiguousarray(a, np.float32)
        if bf16 and a.ndim > 1:
            w.add_tensor(name, (a.view(np.uint32) >> 16).astype(np.uint16),
                         raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            w.add_tensor(name, a)

    add("token_embd.weight", ck["model.embed_tokens.weight"])
    add("output_norm.weight", ck["model.norm.weight"])
    add("output.weight", ck["lm_head.weight"])
    for i in range(cfg["num_hidden_layers"]):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        add(b + "attn_norm.weight", ck[p + "input_layernorm.weight"])
        add(b + "ffn_norm.weight", ck[p + "post_attention_layernorm.weight"])
        a = p + "self_attn."
        if cfg.get("q_lora_rank"):
            add(b + "attn_q_a.weight", ck[a + "q_a_proj.weight"])
            add(b + "attn_q_a_norm.weight", ck[a + "q_a_layernorm.weight"])
            add(b + "attn_q_b.weight", ck[a + "q_b_proj.weight"])
        else:
            add(b + "attn_q.weight", ck[a + "q_proj.weight"])
        add(b + "attn_kv_a_mqa.weight", ck[a + "kv_a_proj_with_mqa.weight"])
        add(b + "attn_kv_a_norm.weight", ck[a + "kv_a_layernorm.weight"])
        kv_b = ck[a + "kv_b_proj.weight"]
        if kv_b_q8:
            q8 = gguf.GGMLQuantizationType.Q8_0
            blocks = gguf.quants.quantize(np.ascontiguousarray(kv_b, np.float32), q8)
            if not split:
                w.add_tensor(b + "attn_kv_b.weight", blocks, raw_dtype=q8)
            else:
                kv = gguf.quants.dequantize(blocks, q8).reshape(H, dn + dv, r)
                w.add_tensor(b + "attn_k_b.weight",
                             np.ascontiguousarray(kv[:, :dn, :].transpose(0, 2, 1)))
                w.add_tensor(b + "attn_v_b.weight",
                             np.ascontiguousarray(blocks.reshape(H, dn + dv, -1)[:, dn:, :]),
                             raw_dtype=q8)
        elif split:  # convert_hf_to_gguf.py's DeepseekV2Model
            kv = kv_b.reshape(H, dn + dv, r)
            add(b + "attn_k_b.weight", kv[:, :dn, :].transpose(0, 2, 1))
            add(b + "attn_v_b.weight", kv[:, dn:, :])
        else:
            add(b + "attn_kv_b.weight", kv_b)
        add(b + "attn_output.weight", ck[a + "o_proj.weight"])
        if p + "mlp.gate.weight" not in ck:
            for hf, gg in (("gate", "ffn_gate"), ("up", "ffn_up"), ("down", "ffn_down")):
                add(b + gg + ".weight", ck[p + f"mlp.{hf}_proj.weight"])
            continue
        add(b + "ffn_gate_inp.weight", ck[p + "mlp.gate.weight"])
        if v3:
            add(b + "exp_probs_b.bias", ck[p + "mlp.gate.e_score_correction_bias"])
        for hf, gg in (("gate", "ffn_gate"), ("up", "ffn_up"), ("down", "ffn_down")):
            add(b + gg + "_exps.weight",
                np.stack([ck[p + f"mlp.experts.{e}.{hf}_proj.weight"] for e in range(J)]))
            add(b + gg + "_shexp.weight", ck[p + f"mlp.shared_experts.{hf}_proj.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def with_config(src, dst, **changes):
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).symlink_to(f)
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").unlink()
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("split", [False, True], ids=["kv_b", "k_b+v_b"])
@pytest.mark.parametrize("name", tiny.MLA)
def test_deepseek2_gguf_runs_exactly_as_the_checkpoint(name, split, models, driver, tmp_path):
    d = models(name)
    ref = dict(np.load(d / "reference.npz"))
    f = write_deepseek2(d, tmp_path / "m.gguf", split)
    base = d
    rp = json.loads((d / "config.json").read_text())["rope_parameters"]
    if rp.get("rope_type") == "yarn":
        # GGUF carries one mscale (yarn_log_multiplier, from mscale_all_dim), and llama.cpp
        # takes mscale equal to it, as the published configs have: compare with that config
        base = with_config(d, tmp_path / "same-mscale",
                           rope_parameters=dict(rp, mscale=rp["mscale_all_dim"]))
    l1, r1 = drive(driver, base, ref, tmp_path, "dir")
    l2, r2 = drive(driver, f, ref, tmp_path, "gguf")
    assert np.array_equal(l1, l2), f"{name}: max |diff| {np.abs(l1 - l2).max()}"
    assert r1 == r2
    if base is d:
        assert r2["generated"] == ref["generated"].tolist()


def test_quantized_attn_kv_b_is_split_at_load(models, driver, tmp_path):
    """A whole attn_kv_b in blocks (an older converter's file, quantised) is split at load
    (runtime/model/load.c kv_b_split): value rows kept as their blocks, key rows dequantised
    and transposed into F32. The same model with that split written by NumPy and gguf-py
    must run to exactly its logits and routes. The tiny V2's latent is widened to 32 (new
    random kv_a and kv_b weights) so that kv_b's rows are whole Q8_0 blocks."""
    from test_quantize import read_checkpoint
    src = models("deepseek_v2")
    ref = dict(np.load(src / "reference.npz"))
    cfg = json.loads((src / "config.json").read_text())
    H, dn, dv, dr = (cfg[k] for k in ("num_attention_heads", "qk_nope_head_dim", "v_head_dim",
                                       "qk_rope_head_dim"))
    h, r = cfg["hidden_size"], 32
    cfg["kv_lora_rank"] = r
    rng = np.random.default_rng(5)
    ck = read_checkpoint(src)
    for i in range(cfg["num_hidden_layers"]):
        a = f"model.layers.{i}.self_attn."
        ck[a + "kv_a_proj_with_mqa.weight"] = (
            rng.normal(0, h ** -0.5, (r + dr, h)).astype(np.float32), "F32")
        ck[a + "kv_a_layernorm.weight"] = (np.ones(r, np.float32), "F32")
        ck[a + "kv_b_proj.weight"] = (
            rng.normal(0, r ** -0.5, (H * (dn + dv), r)).astype(np.float32), "F32")
    d = tmp_path / "r32"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    tiny.save_safetensors(d / "model.safetensors", ck)
    whole = write_deepseek2(d, tmp_path / "whole.gguf", False, kv_b_q8=True)
    split = write_deepseek2(d, tmp_path / "split.gguf", True, kv_b_q8=True)
    l1, r1 = drive(driver, whole, ref, tmp_path, "whole")
    l2, r2 = drive(driver, split, ref, tmp_path, "split")
    assert np.array_equal(l1, l2), f"max |diff| {np.abs(l1 - l2).max()}"
    assert r1 == r2
    # and the blocks matter: the float kv_b the blocks came from gives other logits
    l3, _ = drive(driver, d, ref, tmp_path, "dir")
    assert np.abs(l3 - l1).max() > 1e-4
