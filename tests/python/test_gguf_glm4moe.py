"""GGUF architecture glm4moe (GLM-4.5 as llama.cpp's converter writes it) in the forward
pass: lib/gguf_names.c's post_attention_norm, lib/gguf_config.c's translation of the
glm4moe.* keys into a glm4_moe config (block_count counting the MTP layer, the rotary
share from rope.dimension_count, biases and q/k norms from the tensors present).

Each tiny GLM-4.5 checkpoint of make_tiny_models.py is written here as an F32 GGUF by
gguf-py's own writer, with the key and tensor names gguf-py's constants give
MODEL_ARCH.GLM4_MOE and the keys llama.cpp's conversion/glm.py (Glm4MoeModel) writes,
including one multi-token-prediction layer (random blk.L.* and blk.L.nextn.* tensors,
nextn_predict_layers 1, block_count L + 1), without fmoe's hf_config key; it must run to
exactly the logits, experts and greedy tokens of the HF directory.
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
    return tiny.maker(tmp_path_factory.mktemp("tiny-glm4moe-gguf"))


def write_glm4moe(model_dir, out, nextn=1, scaling=None):
    cfg = json.loads((pathlib.Path(model_dir) / "config.json").read_text())
    ck = {k: v[0] for k, v in read_checkpoint(model_dir).items()}
    L, J, h = cfg["num_hidden_layers"], cfg["n_routed_experts"], cfg["hidden_size"]
    D = cfg["head_dim"]
    names = {t: gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.GLM4_MOE]}
    T = gguf.MODEL_TENSOR
    w = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.GLM4_MOE])
    w.add_block_count(L + nextn)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(h)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(D)
    w.add_value_length(D)
    w.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    w.add_rope_dimension_count(int(D * cfg["rope_parameters"]["partial_rotary_factor"]))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(J)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_shared_count(cfg["n_shared_experts"])
    w.add_leading_dense_block_count(cfg["first_k_dense_replace"])
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_expert_weights_scale(cfg["routed_scaling_factor"])
    w.add_expert_weights_norm(cfg["norm_topk_prob"])
    # the converter writes no group keys (GLM-4.5 has one group); the tiny model has four
    w.add_expert_group_count(cfg["n_group"])
    w.add_expert_group_used_count(cfg["topk_group"])
    if nextn:
        w.add_nextn_predict_layers(nextn)
    if scaling:
        w.add_rope_scaling_type(scaling)
        w.add_rope_scaling_factor(4.0)

    def add(name, a):
        w.add_tensor(name, np.ascontiguousarray(a, np.float32))

    def blk(t, i, suffix="weight"):
        return names[t].format(bid=i) + "." + suffix

    add(names[T.TOKEN_EMBD] + ".weight", ck["model.embed_tokens.weight"])
    add(names[T.OUTPUT_NORM] + ".weight", ck["model.norm.weight"])
    add(names[T.OUTPUT] + ".weight", ck["lm_head.weight"])
    rng = np.random.default_rng(1)
    for i in range(L + nextn):
        src = i if i < L else L - 1  # the MTP layer: a MoE layer's shapes, random values
        p = f"model.layers.{src}."

        def get(k):
            a = ck[p + k]
            return a if i < L else rng.standard_normal(a.shape).astype(np.float32)
        add(blk(T.ATTN_NORM, i), get("input_layernorm.weight"))
        add(blk(T.ATTN_POST_NORM, i), get("post_attention_layernorm.weight"))
        for t, hf in ((T.ATTN_Q, "q"), (T.ATTN_K, "k"), (T.ATTN_V, "v")):
            add(blk(t, i), get(f"self_attn.{hf}_proj.weight"))
            if p + f"self_attn.{hf}_proj.bias" in ck:
                add(blk(t, i, "bias"), get(f"self_attn.{hf}_proj.bias"))
        add(blk(T.ATTN_OUT, i), get("self_attn.o_proj.weight"))
        if p + "self_attn.q_norm.weight" in ck:
            add(blk(T.ATTN_Q_NORM, i), get("self_attn.q_norm.weight"))
            add(blk(T.ATTN_K_NORM, i), get("self_attn.k_norm.weight"))
        if p + "mlp.gate.weight" not in ck:
            for t, hf in ((T.FFN_GATE, "gate"), (T.FFN_UP, "up"), (T.FFN_DOWN, "down")):
                add(blk(t, i), get(f"mlp.{hf}_proj.weight"))
        else:
            add(blk(T.FFN_GATE_INP, i), get("mlp.gate.weight"))
            add(blk(T.FFN_EXP_PROBS_B, i, "bias"), get("mlp.gate.e_score_correction_bias"))
            for t, ts, hf in ((T.FFN_GATE_EXP, T.FFN_GATE_SHEXP, "gate"),
                              (T.FFN_UP_EXP, T.FFN_UP_SHEXP, "up"),
                              (T.FFN_DOWN_EXP, T.FFN_DOWN_SHEXP, "down")):
                add(blk(t, i), np.stack([get(f"mlp.experts.{e}.{hf}_proj.weight")
                                         for e in range(J)]))
                add(blk(ts, i), get(f"mlp.shared_experts.{hf}_proj.weight"))
        if i >= L:
            add(blk(T.NEXTN_EH_PROJ, i), rng.standard_normal((h, 2 * h)))
            for t in (T.NEXTN_ENORM, T.NEXTN_HNORM, T.NEXTN_SHARED_HEAD_NORM):
                add(blk(t, i), rng.standard_normal(h))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


@pytest.mark.parametrize("nextn", [1, 0], ids=["mtp", "no-mtp"])
@pytest.mark.parametrize("name", tiny.GLM4_MOE_PLAIN)
def test_glm4moe_gguf_runs_exactly_as_the_checkpoint(name, nextn, models, driver, tmp_path):
    d = models(name)
    ref = dict(np.load(d / "reference.npz"))
    f = write_glm4moe(d, tmp_path / "m.gguf", nextn)
    l1, r1 = drive(driver, d, ref, tmp_path, "dir")
    l2, r2 = drive(driver, f, ref, tmp_path, "gguf")
    assert np.array_equal(l1, l2), f"{name}: max |diff| {np.abs(l1 - l2).max()}"
    assert r1 == r2
    assert r2["generated"] == ref["generated"].tolist()


def test_glm4moe_gguf_geometry(models, tmp_path, fmoe_bin):
    """The geometry of the config rebuilt from the glm4moe keys (fmoe inspect): the
    decoder's three layers, not block_count's four with the MTP layer. (The rotary share,
    q/k norms and biases it rebuilds are pinned by the exact logits above.)"""
    d = models("glm4_moe_qk_norm")
    f = write_glm4moe(d, tmp_path / "m.gguf")
    p = subprocess.run([str(fmoe_bin), "inspect", str(f)], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert "glm4_moe, 3 layers (2 MoE) x 8 experts, top-2, 1 shared" in p.stdout, p.stdout


def test_glm4moe_gguf_rope_scaling_refused(models, driver, tmp_path):
    """A glm4moe file with rope scaling (the published models have none) is refused in one
    line naming the key, not run without it."""
    f = write_glm4moe(models("glm4_moe"), tmp_path / "m.gguf",
                      scaling=gguf.RopeScalingType.YARN)
    p = subprocess.run([str(driver), str(f), "--tokens", "1,2"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 1, p.stderr
    assert p.stderr.count("\n") == 1, p.stderr
    assert "glm4moe.rope.scaling.type yarn" in p.stderr, p.stderr
