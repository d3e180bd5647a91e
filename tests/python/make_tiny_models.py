"""Tiny random MoE checkpoints and their reference outputs, for test_forward.py.

Each model is a few hundred KB, written at test time (never committed) into a directory
with the checkpoint (config.json + safetensors, as the family publishes it) and
reference.npz:

    tokens      int64 [n]         the prompt
    logits      float32 [n, V]    logits of every prompt position (one prefill call)
    experts     int64 [T, L, K]   router top-k of every token run: the prompt, then each
                                  generated token fed back (T = n + G - 1), descending
    generated   int64 [G]         the greedy continuation

Families in transformers (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, DeepSeek-V2/V3,
Phi-3.5-MoE, GLM-4.5): the checkpoint has the layout transformers' own
save_pretrained(safe_serialization=True) writes for the family
(file names, tensor names, dtypes, shapes, config.json), with weights drawn here by numpy
from a seed, and the reference is the model's forward pass in transformers with a KV cache,
token by token, exactly as generate() decodes (and generate()'s own greedy output is checked
to agree). Layout and reference are fixtures under tests/fixtures/transformers/, so the quick
tier runs without torch and the full tier recomputes both with transformers and checks them
(tests/python/hf_reference.py). DeepSeek-MoE V1 exists only as remote code, so its
checkpoint is written here with numpy in the authors' layout and its reference is a plain
numpy forward pass (deepseek_forward) written from their modeling_deepseek.py.

Weights are drawn wider than transformers' init (std 0.2 instead of 0.02; norm weights
1 + 0.1 N(0,1), biases 0.1 N(0,1)) so that routers and logits are decisive: near-ties
would make top-k and argmax comparisons a test of rounding rather than of the
implementation.

    python make_tiny_models.py OUTDIR [NAME ...]     # all models when no NAME is given
"""
import json
import os
import pathlib
import struct
import sys
import zlib

import numpy as np

PROMPT_LEN = 12
GENERATE = 32
VOCAB = 320

# name -> (family, config overrides, dtype, save options)
HF_MODELS = {
    "mixtral": ("mixtral", {}, "float32", {}),
    "mixtral_bf16": ("mixtral", {}, "bfloat16", {}),
    "mixtral_dynamic": ("mixtral", {"max_position_embeddings": 24, "head_dim": 16,
                                    "rope_parameters": {"rope_type": "dynamic", "factor": 2.0,
                                                        "rope_theta": 10000.0}},
                        "float32", {}),
    # The *_swa models: sliding windows shorter than the prompt (PROMPT_LEN 12), so that
    # prefill, chunked prefill and the token-by-token decode all drop keys.
    "mixtral_swa": ("mixtral", {"sliding_window": 5}, "float32", {}),
    "qwen2_moe": ("qwen2_moe", {"mlp_only_layers": [1]}, "float32", {}),
    # layer_types differs on layers 0 and 1 from what use_sliding_window would give without
    # it (sliding on even layers below max_window_layers), so fmoe must follow the list.
    "qwen2_moe_swa": ("qwen2_moe", {"use_sliding_window": True, "sliding_window": 4,
                                    "layer_types": ["full_attention", "sliding_attention",
                                                    "sliding_attention"]},
                      "float32", {}),
    "qwen3_moe": ("qwen3_moe", {"norm_topk_prob": True, "head_dim": 32},
                  "float32", {"max_shard_size": "200KB"}),
    "qwen3_moe_yarn": ("qwen3_moe", {"norm_topk_prob": True,
                                     "rope_parameters": {"rope_type": "yarn", "factor": 4.0,
                                                         "original_max_position_embeddings": 16,
                                                         "rope_theta": 10000.0}},
                       "float32", {}),
    "qwen3_moe_swa": ("qwen3_moe", {"norm_topk_prob": True, "use_sliding_window": True,
                                    "sliding_window": 6}, "float32", {}),
    "olmoe": ("olmoe", {"clip_qkv": 4.0}, "float32", {}),
    "olmoe_f16": ("olmoe", {}, "float16", {}),
    # DeepSeek-V2/V3, multi-head latent attention (runtime/model/mla.c). V2-Lite's shape:
    # a full-rank q_proj, plain greedy top-k; then V2's low-rank query with
    # group_limited_greedy, and V3's noaux_tc (sigmoid + e_score_correction_bias, groups
    # ranked by their two best). The _yarn model scales its rope 4x from 8 positions, so
    # the 44 positions of prompt and continuation are far past the original context; its
    # mscale differs from mscale_all_dim, so both the cos/sin factor and the softmax
    # scale's mscale² matter.
    "deepseek_v2_lite": ("deepseek_v2", {"q_lora_rank": None, "topk_method": "greedy",
                                         "routed_scaling_factor": 1.0}, "float32", {}),
    # group_limited_greedy ranks groups by their best score, so with topk_group >= top_k
    # it never changes the top-k: one group of four is kept.
    "deepseek_v2": ("deepseek_v2", {"topk_method": "group_limited_greedy", "n_group": 4,
                                    "topk_group": 1, "routed_scaling_factor": 16.0},
                    "float32", {}),
    "deepseek_v3": ("deepseek_v3", {}, "float32", {}),
    # bf16 weights: kv_b_proj widened per head by the MLA kernel, not read in place
    "deepseek_v3_bf16": ("deepseek_v3", {}, "bfloat16", {}),
    "deepseek_v3_yarn": ("deepseek_v3", {
        "rope_interleave": True,
        "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                            "original_max_position_embeddings": 8, "mscale": 1.0,
                            "mscale_all_dim": 0.8, "beta_fast": 32.0, "beta_slow": 1.0}},
                         "float32", {}),
    # Phi-3.5-MoE: LayerNorm with biases, q/k/v/o and lm_head biases, sparsemixer top-2.
    # router_jitter_noise 0.3 (published: 0.01) so that each choice's softmax keeps a mix
    # of one and several experts over the run, and the threshold is tested both ways.
    "phimoe": ("phimoe", {"attention_bias": True, "lm_head_bias": True,
                          "router_jitter_noise": 0.3}, "float32", {}),
    # longrope (Phi-3.5-MoE's rope_scaling). transformers recomputes the whole cache when a
    # sequence first passes original_max_position_embeddings (fmoe refuses that crossing
    # in a cached session), so each model stays on one side: _long switches at 8 positions,
    # before the 12-token prompt ends; _short at 64, past the 44-position run. The mscales
    # differ, so using the wrong one fails. transformers 5.23's PhimoeRotaryEmbedding
    # computes inv_freq without the sequence length (short_factor always, where
    # Microsoft's code and transformers 4.x switch to long_factor), so the lists are equal
    # here and the factor switch is checked by tests/model/test_kernels.c.
    **{f"phimoe_longrope_{side}": (
        "phimoe", {"attention_bias": True, "router_jitter_noise": 0.3,
                   "rope_parameters": {
                       "rope_type": "longrope", "rope_theta": 10000.0,
                       "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 3.0, 4.5, 6.0],
                       "long_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 3.0, 4.5, 6.0],
                       "short_mscale": 1.1, "long_mscale": 1.35,
                       "original_max_position_embeddings": omp}},
        "float32", {}) for side, omp in (("long", 8), ("short", 64))},
    # the published threshold: mostly weight-1 choices
    "phimoe_jitter": ("phimoe", {"attention_bias": True, "lm_head_bias": True,
                                 "router_jitter_noise": 0.01}, "float32", {}),
    # gpt-oss: q/k/v/o biases, attention sinks, sliding_window 4 on the even layers (the
    # default layer_types) so that the 12-token prompt and its continuation drop keys,
    # YaRN from 16 positions (truncate false, as published), experts with biases and the
    # clamped SwiGLU. swiglu_limit 1.5 (published: 7) so that the clamp bites on these
    # weights: without it the logits move (test_forward.py checks).
    "gpt_oss": ("gpt_oss", {"sliding_window": 4, "swiglu_limit": 1.5,
                            "rope_parameters": {"rope_type": "yarn", "factor": 4.0,
                                                "beta_fast": 32.0, "beta_slow": 1.0,
                                                "truncate": False, "rope_theta": 150000.0,
                                                "original_max_position_embeddings": 16}},
                "float32", {}),
    # GLM-4.5 (glm4_moe): GQA with q/k/v biases, partial rotary 0.5 (the first 16 of 32
    # dims per head rotate), DeepSeek-V3's biased sigmoid router over 4 groups of 2 (2
    # kept), a shared expert, one dense first layer. _qk_norm is GLM-4.5's per-head q/k
    # RMSNorm (use_qk_norm); the plain one is GLM-4.5-Air's attention (none).
    "glm4_moe": ("glm4_moe", {}, "float32", {}),
    "glm4_moe_qk_norm": ("glm4_moe", {"use_qk_norm": True}, "float32", {}),
    # YaRN over the rotated part (transformers' _compute_yarn_parameters takes the
    # frequencies of a head_dim · partial_rotary_factor wide head), 4x from 16 positions
    "glm4_moe_yarn": ("glm4_moe", {"rope_parameters": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
        "rope_theta": 10000.0, "partial_rotary_factor": 0.5}}, "float32", {}),
    # Llama 4 (Llama4ForCausalLM, model_type llama4_text): MoE on layers 1 and 3
    # (interleave_moe_layer_step 2; dense layers of intermediate_size_mlp 48), top-1
    # sigmoid routing onto the expert's input plus a shared expert; rotary with the
    # weightless QK L2 norm on layers 0-2 and chunked attention in chunks of 8 positions
    # (the 12-token prompt and its continuation span 6 chunks), layer 3 NoPE with full
    # attention and query temperature tuning (floor_scale 4, attn_scale 0.5 where Scout has
    # 8192 and 0.1, so that the factor changes every 4 positions); llama3 rope scaling 4x
    # from 16 positions, as Scout's config has (16x from 8192).
    "llama4": ("llama4", {"attention_chunk_size": 8, "floor_scale": 4, "attn_scale": 0.5,
                          "rope_parameters": {"rope_type": "llama3", "factor": 4.0,
                                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                              "original_max_position_embeddings": 16,
                                              "rope_theta": 500000.0}},
               "float32", {}),
    # Scout's shape, smaller: every layer MoE (interleave_moe_layer_step 1), 16 experts,
    # 8 layers (NoPE at 3 and 7), the published chunk and temperature defaults. The
    # Llama-4 trace of tests/bench/prefetch_vs_lru.py is recorded from it.
    "llama4_scout": ("llama4", {"num_hidden_layers": 8, "interleave_moe_layer_step": 1,
                                "num_local_experts": 16}, "float32", {}),
}
# The families below have CUDA kernels that have not run on a GPU yet (docs/gpu.md, "New
# model families"): tests/gpu/test_gpu_e2e.py checks one checkpoint of each against the CPU
# backend (its NEW_FAMILIES) and keeps its other tests to ALL. GGUF's deepseek2 is not
# mapped yet.
MLA = [k for k, v in HF_MODELS.items() if v[0] in ("deepseek_v2", "deepseek_v3")]
# Phi-3.5-MoE (LayerNorm with bias, sparsemixer); no GGUF mapping yet.
PHIMOE = [k for k, v in HF_MODELS.items() if v[0] == "phimoe"]
# GLM-4.5 (partial rotary, biased sigmoid routing); its GGUF glm4moe has its own test
# (test_glm4_moe.py).
GLM4_MOE = [k for k, v in HF_MODELS.items() if v[0] == "glm4_moe"]
GLM4_MOE_PLAIN = ["glm4_moe", "glm4_moe_qk_norm"]  # no rope scaling: the GGUF and live tests
# gpt-oss (attention sinks, clamped SwiGLU, MXFP4 experts).
GPT_OSS = [k for k, v in HF_MODELS.items() if v[0] == "gpt_oss"] + ["gpt_oss_mxfp4"]
# Llama 4 (chunked and temperature-tuned attention: compositions of existing ops).
LLAMA4 = [k for k, v in HF_MODELS.items() if v[0] == "llama4"]
ALL = [k for k in HF_MODELS
       if k not in MLA and k not in PHIMOE and k not in GLM4_MOE and k not in GPT_OSS
       and k not in LLAMA4] + [
    "deepseek"]


def base_config(family):
    c = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
             initializer_range=0.2, tie_word_embeddings=False, num_experts_per_tok=2)
    if family == "mixtral":
        c.update(intermediate_size=48, num_local_experts=8)
    elif family == "qwen2_moe":
        c.update(intermediate_size=80, moe_intermediate_size=32, num_experts=8,
                 shared_expert_intermediate_size=40)
    elif family == "qwen3_moe":
        c.update(intermediate_size=80, moe_intermediate_size=32, num_experts=8)
    elif family == "olmoe":
        c.update(intermediate_size=48, num_experts=8)
    elif family == "phimoe":
        c.update(intermediate_size=48, num_local_experts=8)
    elif family == "gpt_oss":  # head_dim is its own key (default 64); widths in whole
        # MXFP4 blocks of 32 for gpt_oss_mxfp4
        c.update(intermediate_size=64, num_local_experts=8, head_dim=16)
    elif family == "llama4":
        # intermediate_size is the experts' (and the shared expert's) width,
        # intermediate_size_mlp the dense layers'; 4 layers so that layer 3 is NoPE
        c.update(num_hidden_layers=4, head_dim=16, intermediate_size=32,
                 intermediate_size_mlp=48, num_local_experts=8, num_experts_per_tok=1,
                 interleave_moe_layer_step=2)
    elif family in ("deepseek_v2", "deepseek_v3"):
        # dv (12) differs from dn (16) and dn + dr (24), so a mixed-up head width fails.
        c.update(num_key_value_heads=4, intermediate_size=80, moe_intermediate_size=32,
                 n_routed_experts=8, n_shared_experts=1, first_k_dense_replace=1,
                 kv_lora_rank=16, q_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8,
                 v_head_dim=12)
        if family == "deepseek_v3":
            c.update(n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5)
    elif family == "glm4_moe":
        # head_dim 32 (not h/H = 16) so that a head width taken from hidden_size fails
        c.update(intermediate_size=80, moe_intermediate_size=32, n_routed_experts=8,
                 n_shared_experts=1, first_k_dense_replace=1, head_dim=32, n_group=4,
                 topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5,
                 attention_bias=True, use_qk_norm=False, partial_rotary_factor=0.5)
    return c


def _hf_classes(family):
    import transformers
    return {
        "mixtral": (transformers.MixtralForCausalLM, transformers.MixtralConfig),
        "qwen2_moe": (transformers.Qwen2MoeForCausalLM, transformers.Qwen2MoeConfig),
        "qwen3_moe": (transformers.Qwen3MoeForCausalLM, transformers.Qwen3MoeConfig),
        "olmoe": (transformers.OlmoeForCausalLM, transformers.OlmoeConfig),
        "phimoe": (transformers.PhimoeForCausalLM, transformers.PhimoeConfig),
        "gpt_oss": (transformers.GptOssForCausalLM, transformers.GptOssConfig),
        "deepseek_v2": (transformers.DeepseekV2ForCausalLM, transformers.DeepseekV2Config),
        "deepseek_v3": (transformers.DeepseekV3ForCausalLM, transformers.DeepseekV3Config),
        "glm4_moe": (transformers.Glm4MoeForCausalLM, transformers.Glm4MoeConfig),
        "llama4": (transformers.Llama4ForCausalLM, transformers.Llama4TextConfig),
    }[family]


def _read_safetensors_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def hf_layout(name):
    """What transformers' save_pretrained writes for NAME: its JSON files verbatim and, per
    safetensors file, the metadata and the tensors (name, dtype, shape) in file order."""
    def compute():
        import tempfile

        import torch
        family, overrides, dtype, save_opts = HF_MODELS[name]
        cls, cfg_cls = _hf_classes(family)
        cfg = base_config(family)
        cfg.update(overrides)
        model = cls(cfg_cls(**cfg)).to(getattr(torch, dtype))
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp, safe_serialization=True, **save_opts)
            layout = {"json": {}, "safetensors": {}}
            for f in sorted(os.listdir(tmp)):
                path = os.path.join(tmp, f)
                if f.endswith(".json"):
                    with open(path) as fh:
                        layout["json"][f] = json.load(fh)
                elif f.endswith(".safetensors"):
                    h = _read_safetensors_header(path)
                    meta = h.pop("__metadata__", None)
                    order = sorted(h, key=lambda k: h[k]["data_offsets"][0])
                    layout["safetensors"][f] = {
                        "metadata": meta,
                        "tensors": [[k, h[k]["dtype"], h[k]["shape"]] for k in order]}
                else:
                    raise AssertionError(f"save_pretrained wrote an unexpected file {f}")
        return layout
    import hf_reference
    return hf_reference.stored_or_fresh_json(f"tiny-{name}-layout", compute)


def _bf16_bits(x):
    """float32 -> bfloat16 bit patterns, rounded to nearest even (as torch rounds)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _weight(name, tensor, shape, dtype):
    """A tensor's values: seeded by the model and tensor names, so every run writes the same
    bytes; norms near 1 and biases near 0, as the loaders must really read them."""
    rng = np.random.default_rng(zlib.crc32(f"{name}/{tensor}".encode()))
    x = rng.standard_normal(shape).astype(np.float32)
    if "norm" in tensor:
        x = 1 + 0.1 * x
    elif tensor.endswith("bias"):
        x = 0.1 * x
    else:
        x = 0.2 * x
    if dtype == "F32":
        return x
    if dtype == "F16":
        return x.astype(np.float16)
    if dtype == "BF16":
        return _bf16_bits(x)
    raise AssertionError(f"{name}: tensor {tensor} has dtype {dtype}, not F32/F16/BF16")


def write_hf_checkpoint(name, outdir):
    layout = hf_layout(name)
    os.makedirs(outdir, exist_ok=True)
    for f, doc in layout["json"].items():
        with open(os.path.join(outdir, f), "w") as fh:
            json.dump(doc, fh, indent=2)
    for f, spec in layout["safetensors"].items():
        save_safetensors(os.path.join(outdir, f),
                         {t: (_weight(name, t, shape, dt), dt) for t, dt, shape in spec["tensors"]},
                         metadata=spec["metadata"])


def write_hf_checkpoint_with_vocab(name, outdir, vocab):
    """NAME's checkpoint (its stored layout, weights drawn as write_hf_checkpoint does) with
    a vocabulary of VOCAB tokens: for `fmoe generate`/`record` through another model's
    tokenizer (fmoe-tiny's has 4096). No reference: it runs fmoe against itself."""
    layout = json.loads(json.dumps(hf_layout(name)))
    layout["json"]["config.json"]["vocab_size"] = vocab
    for spec in layout["safetensors"].values():
        for t in spec["tensors"]:
            if t[0] in ("model.embed_tokens.weight", "lm_head.weight", "lm_head.bias"):
                t[2][0] = vocab
    os.makedirs(outdir, exist_ok=True)
    for f, doc in layout["json"].items():
        with open(os.path.join(outdir, f), "w") as fh:
            json.dump(doc, fh, indent=2)
    for f, spec in layout["safetensors"].items():
        save_safetensors(os.path.join(outdir, f),
                         {t: (_weight(name, t, shape, dt), dt) for t, dt, shape in spec["tensors"]},
                         metadata=spec["metadata"])


def make_hf(name, outdir):
    import hf_reference
    write_hf_checkpoint(name, outdir)

    def compute():
        import torch
        cls, _ = _hf_classes(HF_MODELS[name][0])
        # float32 from the saved checkpoint, so a bf16/f16 model is compared on exactly the
        # values it stores. transformers 5 saves Qwen3-MoE's expert count as
        # num_local_experts (an attribute_map alias) where published configs say
        # num_experts: the parser's alias is exercised here and the published key by
        # tests/lib.
        model, info = cls.from_pretrained(outdir, dtype=torch.float32, output_loading_info=True)
        bad = {k: v for k, v in info.items() if v}
        assert not bad, f"{name}: transformers did not load the checkpoint cleanly: {bad}"
        model = model.eval()
        model.config._attn_implementation = "eager"
        rng = np.random.default_rng(zlib.crc32(name.encode()))
        tokens = rng.integers(0, VOCAB, size=PROMPT_LEN)
        return hf_reference_run(model, tokens, torch)

    ref = hf_reference.stored_or_fresh(f"tiny-{name}", compute, atol=1e-5)
    np.savez(os.path.join(outdir, "reference.npz"), **ref)
    return ref


def _topk(router_logits, k):
    p = np.asarray(router_logits, dtype=np.float32)
    p = np.exp(p - p.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.argsort(-p, axis=-1, kind="stable")[..., :k]


class _GateChoices:
    """DeepSeek-V2/V3's chosen experts, read from the gates themselves (their selection
    is grouped and biased, not a top-k of router_logits): a forward hook on every MoE
    layer's gate, which returns (router_logits, topk_weights, topk_indices) with the
    indices unsorted. Each token's experts are put in fmoe's order: descending by the
    score they were chosen on (V3: sigmoid + e_score_correction_bias; V2: the softmax),
    lower index first among equals."""

    def __init__(self, model):
        self.rows, self.hooks = [], []
        for layer in model.model.layers:
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None:
                self.hooks.append(gate.register_forward_hook(self.hook))

    def hook(self, gate, args, out):
        logits, _, idx = out
        if hasattr(gate, "e_score_correction_bias"):
            choice = logits.sigmoid() + gate.e_score_correction_bias
        else:
            choice = logits.softmax(dim=-1)
        choice, idx = choice.float().numpy(), idx.numpy()
        self.rows.append(np.asarray([sorted(r.tolist(), key=lambda j: (-c[j], j))
                                     for r, c in zip(idx, choice)]))

    def take(self):
        """[tokens, MoE layers, K] of the calls since the last take."""
        rows, self.rows = self.rows, []
        return list(np.stack(rows, 1))


def hf_reference_run(model, tokens, torch):
    k = model.config.num_experts_per_tok
    gates = _GateChoices(model) if model.config.model_type in (
        "deepseek_v2", "deepseek_v3", "glm4_moe") else None

    def routed(out):
        if gates is not None:
            return gates.take()
        return list(np.stack([_topk(r.float().numpy(), k) for r in out.router_logits], 1))

    experts = []
    kw = {} if gates is not None else {"output_router_logits": True}
    with torch.no_grad():
        ids = torch.tensor(tokens[None, :], dtype=torch.long)
        out = model(input_ids=ids, use_cache=True, **kw)
        logits = out.logits[0].float().numpy()
        experts += routed(out)
        past = out.past_key_values
        nxt = int(torch.argmax(out.logits[0, -1]))
        generated = []
        for i in range(GENERATE):
            generated.append(nxt)
            if i == GENERATE - 1:
                break
            out = model(input_ids=torch.tensor([[nxt]]), past_key_values=past, use_cache=True,
                        **kw)
            experts += routed(out)
            past = out.past_key_values
            nxt = int(torch.argmax(out.logits[0, -1]))
        # generate() must agree with the loop above.
        gen = model.generate(ids, max_new_tokens=GENERATE, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
        if gates is not None:
            gates.rows = []  # generate()'s own calls
        assert gen[0, len(tokens):].tolist() == generated, "generate() disagrees"
    return dict(tokens=np.asarray(tokens, dtype=np.int64), logits=logits.astype(np.float32),
                experts=np.asarray(experts, dtype=np.int64),
                generated=np.asarray(generated, dtype=np.int64))


# ---------------------------------------------------------------------------------------
# DeepSeek-MoE V1: checkpoint written with numpy, reference in numpy
# ---------------------------------------------------------------------------------------

DEEPSEEK_CONFIG = {
    "architectures": ["DeepseekForCausalLM"], "model_type": "deepseek",
    "vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 96,
    "moe_intermediate_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 4, "n_shared_experts": 2, "n_routed_experts": 8,
    "num_experts_per_tok": 2, "first_k_dense_replace": 1, "moe_layer_freq": 1,
    "norm_topk_prob": True, "scoring_func": "softmax", "rms_norm_eps": 1e-6,
    "rope_theta": 10000, "rope_scaling": None, "max_position_embeddings": 256,
    "tie_word_embeddings": False, "torch_dtype": "float32", "hidden_act": "silu",
    "attention_bias": False, "aux_loss_alpha": 0.001, "seq_aux": True,
}


def save_safetensors(path, tensors, metadata=None):
    """Writes a safetensors file (float32 / float16 / bfloat16-as-uint16) without the
    package: tensors maps name -> (array, dtype name), written in that order."""
    header, offset, blobs = {}, 0, []
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, (arr, dtype) in tensors.items():
        b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def deepseek_weights(cfg, seed=0):
    rng = np.random.default_rng(seed)
    h, V, D = cfg["hidden_size"], cfg["vocab_size"], cfg["hidden_size"] // cfg["num_attention_heads"]
    I, Im, J = cfg["intermediate_size"], cfg["moe_intermediate_size"], cfg["n_routed_experts"]
    Is = Im * cfg["n_shared_experts"]

    def w(*shape):
        return (0.2 * rng.standard_normal(shape)).astype(np.float32)

    def norm(n):
        return (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    t = {"model.embed_tokens.weight": w(V, h), "model.norm.weight": norm(h),
         "lm_head.weight": w(V, h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm(h)
        t[p + "post_attention_layernorm.weight"] = norm(h)
        for n in "qkvo":
            t[p + f"self_attn.{n}_proj.weight"] = w(h, h)
        moe = i >= cfg["first_k_dense_replace"] and i % cfg["moe_layer_freq"] == 0
        if not moe:
            t[p + "mlp.gate_proj.weight"], t[p + "mlp.up_proj.weight"] = w(I, h), w(I, h)
            t[p + "mlp.down_proj.weight"] = w(h, I)
            continue
        t[p + "mlp.gate.weight"] = w(J, h)
        for e in range(J):
            q = p + f"mlp.experts.{e}."
            t[q + "gate_proj.weight"], t[q + "up_proj.weight"] = w(Im, h), w(Im, h)
            t[q + "down_proj.weight"] = w(h, Im)
        q = p + "mlp.shared_experts."
        t[q + "gate_proj.weight"], t[q + "up_proj.weight"] = w(Is, h), w(Is, h)
        t[q + "down_proj.weight"] = w(h, Is)
    return t


def _rms(x, w, eps):
    x = x.astype(np.float64)
    return w * (x / np.sqrt((x * x).mean(-1, keepdims=True) + eps))


def _silu(x):
    return x / (1 + np.exp(-x))


def deepseek_forward(cfg, t, tokens):
    """modeling_deepseek.py (V1) in numpy, float64, no cache: logits [n, V] and the top-k
    experts [n, L, K] of every token."""
    h, H = cfg["hidden_size"], cfg["num_attention_heads"]
    D, eps, K = h // H, cfg["rms_norm_eps"], cfg["num_experts_per_tok"]
    n = len(tokens)
    x = t["model.embed_tokens.weight"][tokens].astype(np.float64)
    inv = 1.0 / (cfg["rope_theta"] ** (np.arange(0, D, 2) / D))
    ang = np.arange(n)[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], 1)), np.sin(np.concatenate([ang, ang], 1))

    def rope(v):  # [n, H, D]
        rot = np.concatenate([-v[..., D // 2:], v[..., :D // 2]], -1)
        return v * cos[:, None, :] + rot * sin[:, None, :]

    def mlp(p, v):
        return (_silu(v @ t[p + "gate_proj.weight"].T) * (v @ t[p + "up_proj.weight"].T)) \
            @ t[p + "down_proj.weight"].T

    routes = []
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        xn = _rms(x, t[p + "input_layernorm.weight"], eps)
        q = rope((xn @ t[p + "self_attn.q_proj.weight"].T).reshape(n, H, D))
        k = rope((xn @ t[p + "self_attn.k_proj.weight"].T).reshape(n, H, D))
        v = (xn @ t[p + "self_attn.v_proj.weight"].T).reshape(n, H, D)
        s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(D) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        a = np.einsum("hqk,khd->qhd", s, v).reshape(n, h)
        x = x + a @ t[p + "self_attn.o_proj.weight"].T
        xn = _rms(x, t[p + "post_attention_layernorm.weight"], eps)
        if p + "mlp.gate.weight" not in t:
            x = x + mlp(p + "mlp.", xn)
            continue
        logits = xn @ t[p + "mlp.gate.weight"].T
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        idx = np.argsort(-probs, -1, kind="stable")[:, :K]
        wts = np.take_along_axis(probs, idx, -1)
        if K > 1 and cfg["norm_topk_prob"]:
            wts = wts / (wts.sum(-1, keepdims=True) + 1e-20)
        routes.append(idx)
        y = np.zeros_like(xn)
        for tok in range(n):
            for j in range(K):
                y[tok] += wts[tok, j] * mlp(p + f"mlp.experts.{idx[tok, j]}.", xn[tok:tok + 1])[0]
        x = x + y + mlp(p + "mlp.shared_experts.", xn)
    x = _rms(x, t["model.norm.weight"], eps)
    return x @ t["lm_head.weight"].T, np.stack(routes, 1)


def make_deepseek(outdir):
    cfg = DEEPSEEK_CONFIG
    t = deepseek_weights(cfg)
    os.makedirs(outdir, exist_ok=True)
    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    save_safetensors(os.path.join(outdir, "model.safetensors"),
                     {k: (v, "F32") for k, v in t.items()})
    t64 = {k: v.astype(np.float64) for k, v in t.items()}
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, VOCAB, size=PROMPT_LEN)
    logits, _ = deepseek_forward(cfg, t64, tokens)
    seq = list(tokens)
    generated = []
    for i in range(GENERATE):
        lg, _ = deepseek_forward(cfg, t64, np.asarray(seq))
        nxt = int(np.argmax(lg[-1]))
        generated.append(nxt)
        seq.append(nxt)
    _, experts = deepseek_forward(cfg, t64, np.asarray(seq[:-1]))
    ref = dict(tokens=np.asarray(tokens, dtype=np.int64), logits=logits.astype(np.float32),
               experts=experts.astype(np.int64), generated=np.asarray(generated, dtype=np.int64))
    np.savez(os.path.join(outdir, "reference.npz"), **ref)
    return ref


# ---------------------------------------------------------------------------------------
# gpt-oss with MXFP4 experts, in OpenAI's published layout
# ---------------------------------------------------------------------------------------

E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def mxfp4_pack(w):
    """w [..., rows, cols] float32 -> (blocks [..., rows, cols/32, 16], scales [..., rows,
    cols/32]) uint8 as OpenAI's checkpoints store them: E8M0 scale s (2^(s - 127)) from
    gguf-py's rule (floor(log2 max|x|) - 2 + 127), each value the nearest E2M1 level, two
    per byte, value 2k in the low nibble of byte k (transformers' mxfp4.py reads
    sub[:, 0::2] = lut[lo])."""
    *pre, rows, cols = w.shape
    x = w.reshape(*pre, rows, cols // 32, 32).astype(np.float32)
    amax = np.abs(x).max(-1, keepdims=True)
    with np.errstate(divide="ignore"):
        e = np.where(amax > 0, np.floor(np.log2(amax)) - 2 + 127, 0).astype(np.uint8)
    scale = np.ldexp(np.float32(1), e.astype(np.int32) - 127).astype(np.float32)
    idx = np.abs(x[..., None] - scale[..., None] * E2M1).argmin(-1).astype(np.uint8)
    blocks = idx[..., 0::2] | (idx[..., 1::2] << 4)
    return blocks, e[..., 0]


def write_gpt_oss_mxfp4(outdir, vocab=None):
    """The tiny gpt_oss checkpoint with its experts in MXFP4 (quantization_config mxfp4,
    *_blocks and *_scales as U8, the rest as written by write_hf_checkpoint), optionally
    with a vocabulary of VOCAB tokens (write_hf_checkpoint_with_vocab's use). Returns the
    tensors written."""
    layout = json.loads(json.dumps(hf_layout("gpt_oss")))
    if vocab:
        layout["json"]["config.json"]["vocab_size"] = vocab
        for spec in layout["safetensors"].values():
            for t in spec["tensors"]:
                if t[0] in ("model.embed_tokens.weight", "lm_head.weight"):
                    t[2][0] = vocab
    cfg = dict(layout["json"]["config.json"])
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
        "lm_head"]}
    (spec,) = layout["safetensors"].values()
    tensors = {}
    for t, dt, shape in spec["tensors"]:
        x = _weight("gpt_oss", t, shape, dt)
        if t.endswith("experts.gate_up_proj") or t.endswith("experts.down_proj"):
            blocks, scales = mxfp4_pack(np.swapaxes(x, 1, 2))  # output-major rows
            tensors[t + "_blocks"], tensors[t + "_scales"] = (blocks, "U8"), (scales, "U8")
        else:
            tensors[t] = (x, dt)
    os.makedirs(outdir, exist_ok=True)
    for f, doc in layout["json"].items():
        with open(os.path.join(outdir, f), "w") as fh:
            json.dump(cfg if f == "config.json" else doc, fh, indent=2)
    save_safetensors(os.path.join(outdir, "model.safetensors"), tensors)
    return tensors


def make_gpt_oss_mxfp4(outdir):
    """write_gpt_oss_mxfp4's checkpoint and its reference: transformers on the same weights
    with the experts dequantised by transformers' own
    integrations.mxfp4.convert_moe_packed_tensors."""
    import tempfile

    import hf_reference
    tensors = write_gpt_oss_mxfp4(outdir)

    def compute():
        import torch
        from transformers.integrations.mxfp4 import convert_moe_packed_tensors
        cls, _ = _hf_classes("gpt_oss")
        with tempfile.TemporaryDirectory() as plain:
            write_hf_checkpoint("gpt_oss", plain)
            model = cls.from_pretrained(plain, dtype=torch.float32).eval()
        model.config._attn_implementation = "eager"
        with torch.no_grad():
            for i, layer in enumerate(model.model.layers):
                for proj in ("gate_up_proj", "down_proj"):
                    p = f"model.layers.{i}.mlp.experts.{proj}"
                    w = convert_moe_packed_tensors(torch.from_numpy(tensors[p + "_blocks"][0]),
                                                   torch.from_numpy(tensors[p + "_scales"][0]),
                                                   dtype=torch.float32)
                    getattr(layer.mlp.experts, proj).copy_(w)
        rng = np.random.default_rng(zlib.crc32(b"gpt_oss_mxfp4"))
        return hf_reference_run(model, rng.integers(0, VOCAB, size=PROMPT_LEN), torch)

    ref = hf_reference.stored_or_fresh("tiny-gpt_oss_mxfp4", compute, atol=1e-5)
    np.savez(os.path.join(outdir, "reference.npz"), **ref)
    return ref


def make(name, outdir):
    if name == "deepseek":
        return make_deepseek(outdir)
    if name == "gpt_oss_mxfp4":
        return make_gpt_oss_mxfp4(outdir)
    return make_hf(name, outdir)


def maker(root):
    """get(name) -> the directory under ROOT with NAME's checkpoint and reference.npz, made
    on first use (the session fixtures of the forward tests, CPU and GPU)."""
    made = {}

    def get(name):
        if name not in made:
            d = pathlib.Path(root) / name
            make(name, str(d))
            made[name] = d
        return made[name]
    return get


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    for name in sys.argv[2:] or ALL + MLA + PHIMOE + GLM4_MOE + GPT_OSS + LLAMA4:
        make(name, os.path.join(out, name))
        print("wrote", os.path.join(out, name))
