"""A random Mixtral-layout checkpoint for benchmarking the CPU forward pass (numpy only).

    python tests/model/make_bench_model.py OUTDIR [--hidden 1024] [--intermediate 3584]
        [--layers 8] [--experts 8] [--vocab 32000] [--dtype bf16|f32]

The defaults make a ~0.8B-parameter model (1.6 GB in bf16). Weights are N(0, 0.02);
the model is for timing, not for text.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np


def bf16_bits(a):
    u = a.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--intermediate", type=int, default=3584)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    a = ap.parse_args()
    h, I, D = a.hidden, a.intermediate, a.hidden // a.heads
    os.makedirs(a.out, exist_ok=True)
    cfg = {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"],
           "vocab_size": a.vocab, "hidden_size": h, "intermediate_size": I,
           "num_hidden_layers": a.layers, "num_attention_heads": a.heads,
           "num_key_value_heads": a.kv_heads, "num_local_experts": a.experts,
           "num_experts_per_tok": 2, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
           "rope_theta": 1e6, "tie_word_embeddings": False, "hidden_act": "silu",
           "torch_dtype": "bfloat16" if a.dtype == "bf16" else "float32"}
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    shapes = {"model.embed_tokens.weight": (a.vocab, h), "model.norm.weight": (h,),
              "lm_head.weight": (a.vocab, h)}
    for i in range(a.layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        shapes[p + "self_attn.q_proj.weight"] = (a.heads * D, h)
        shapes[p + "self_attn.k_proj.weight"] = (a.kv_heads * D, h)
        shapes[p + "self_attn.v_proj.weight"] = (a.kv_heads * D, h)
        shapes[p + "self_attn.o_proj.weight"] = (h, a.heads * D)
        shapes[p + "block_sparse_moe.gate.weight"] = (a.experts, h)
        for e in range(a.experts):
            q = p + f"block_sparse_moe.experts.{e}."
            shapes[q + "w1.weight"] = (I, h)
            shapes[q + "w2.weight"] = (h, I)
            shapes[q + "w3.weight"] = (I, h)
    es = 2 if a.dtype == "bf16" else 4
    dt = "BF16" if a.dtype == "bf16" else "F32"
    header, off = {}, 0
    for name, shp in shapes.items():
        n = int(np.prod(shp)) * es
        header[name] = {"dtype": dt, "shape": list(shp), "data_offsets": [off, off + n]}
        off += n
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    rng = np.random.default_rng(0)
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for name, shp in shapes.items():
            if name.endswith("norm.weight"):
                v = np.ones(shp, dtype=np.float32)
            else:
                v = (0.02 * rng.standard_normal(shp, dtype=np.float32))
            f.write((bf16_bits(v) if es == 2 else v).tobytes())
    params = sum(int(np.prod(s)) for s in shapes.values())
    print(f"{a.out}: {params / 1e9:.2f}B parameters, {off / 2**30:.2f} GiB", file=sys.stderr)


if __name__ == "__main__":
    main()
