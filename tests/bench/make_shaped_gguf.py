#!/usr/bin/env python3
"""Real-shape MoE models without a download: GGUF files with random weights.

    tests/bench/make_shaped_gguf.py --shape mixtral-8x7b|qwen3-30b-a3b|deepseek-v2-lite|
                                            gpt-oss-20b [--small]
        [--type q4_k_m|q4_k] [--seed S] [--skew [S]] [--layers N]
        [--llama-keys-only] [--report FILE.json] [--quiet] -o FILE.gguf

writes a GGUF file with the keys, tensor names, extents and ggml types that llama.cpp's
converter (convert_hf_to_gguf.py) followed by `llama-quantize MODEL OUT Q4_K_M` give
Mixtral-8x7B (28.4 GB) or Qwen3-30B-A3B (18.6 GB), with random weights, in about 1.5 and
1 minute on the 2-core development VM with under 400 MB of memory. `--small` keeps the
architecture, the vocabulary and the type rules with 8 layers and narrow matrices (about
190 MB, a few seconds): the tests use it (tests/python/test_make_shaped_gguf.py).
DeepSeek-V2-Lite (10.4 GB) and gpt-oss-20b (11.6 GB, its experts MXFP4 as the converter
keeps them) follow the same rules with their architectures' tensors; their small variants
are checked by tests/python/test_shaped_families.py, and docs/bench-models.md says where
each number comes from and how rows that are not whole 256-blocks fall back to Q5_0/Q8_0.
llama.cpp loads these files (`llama-simple`), and re-quantizing one with llama-quantize
to Q4_K_M gives back the same keys, tensors and types.

What is in the file
-------------------
- Keys: general.* (architecture, type, name, size label, quantization version 2, file
  type 15 = Q4_K_M, or 14 with `--type q4_k`), the hyperparameters the converter writes
  from each model's config.json under `llama.*` (llama.cpp's name for Mixtral) or
  `qwen3moe.*`, and the tokenizer as `tokenizer.ggml.*`, made from the real tokenizer files
  under tests/fixtures/tokenizers/ the way the converter makes it: Mixtral's SentencePiece
  vocabulary (`llama`: tokens, scores, token types, bos/eos/unk, add_bos, chat template),
  Qwen3's byte-level BPE (`gpt2`, pre-tokenizer `qwen2`: tokens, token types, merges,
  eos/pad/bos), padded to vocab_size with `[PAD<i>]` tokens of type UNUSED. Unless
  `--llama-keys-only`, tokenizer.json (and Mixtral's tokenizer_config.json) are also
  embedded as `fmoe.file.*` strings, as `fmoe quantize` does, so that `fmoe generate
  --model FILE.gguf` needs no --tokenizer. Qwen3's chat template is not in the
  repository, so that file has none.
- Tensors: llama.cpp's names and extents (`blk.N.ffn_gate_exps.weight` is [n_embd, n_ff,
  n_expert], innermost first), in the order llama-quantize writes them (the tensors
  outside the layers, then layer by layer, names sorted).
- Types, llama-quantize's Q4_K_M choice (llama_tensor_get_type): Q4_K unless said
  otherwise; output.weight Q6_K; ffn_down_exps Q6_K on the layers i of n where
  use_more_bits holds (i < n/8, i >= 7n/8, or (i - n/8) % 3 == 2), attn_v likewise; a
  model with exactly 8 experts (Mixtral) has Q8_0 for every attn_v and attn_k and Q5_K
  for attn_output; token_embd Q4_K; the norms and the routers (ffn_gate_inp) F32, as
  llama.cpp never quantizes them. `--type q4_k`: every matrix llama.cpp would quantize is
  Q4_K (what `llama-quantize --pure MODEL OUT Q4_K_S` writes).

The weights
-----------
Blocks are random bytes with their scale fields overwritten: f16 d and dmin finite, the
6-bit scales and mins chosen so that each sub-block has mean 0, d so that a matrix's
values have standard deviation 1/sqrt(fan_in); the output projections (attn_output,
ffn_down) are scaled down with depth so that all the layers together add about half the
embeddings' variance to the residual stream: activations stay of order 1 through every
layer. Norm weights are 1 +- 2%. Besides unit noise, every token embedding has the same
large negative value in one 32-wide chunk of the hidden state (real models' hidden states
have such dominant directions). attn_v, ffn_gate_exps and ffn_up_exps read that chunk as
zeros, so it adds nothing coherent to the residual; the routers are built on it.

Routing
-------
Router row e of a layer is random, orthogonal to the chunk (logit noise of about 1 a
token), plus skew * b[rank of e] along the chunk, b a standardised Zipf-like profile
(-log(1 + rank)) over a random ranking of the experts per layer. Every token's hidden
state has about the same component along the chunk, so the experts ranked first win more
often: routing is not uniform. The default skew 0.5 is mild (about 2.7 of 3 bits of
expert-frequency entropy for Mixtral, 6.2 of 7 for Qwen3); `--skew` alone means 1.5,
strongly skewed (about 1.8 of 3 and 4.1 of 7) for the caching policies to work on; 0
leaves the random rows alone. The generator estimates each layer's entropy from random
hidden states made the same way and prints it next to uniform's log2(n_expert) (and in
--report); a recording (`fmoe record` of the file, as the test does) gives the real ones,
which on the small shapes were within about 0.2 bits of the estimate.

Streaming
---------
Header, keys and tensor infos first, then each tensor's data generated and written in
chunks of at most 64 MiB, so memory stays well under 1 GB whatever the size. The file is
written as FILE.partial and renamed when complete (SIGINT or SIGTERM remove the partial
file); a bad argument is one line on stderr and exit status 2 with nothing written. A file
of 1 GB or more prints a progress line on stderr.
"""
import argparse
import json
import math
import os
import pathlib
import shutil
import signal
import struct
import subprocess
import sys
import time
import zlib

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover - the venv has it (tests/python/requirements.txt)
    sys.stderr.write("make_shaped_gguf.py: needs the gguf package (pip install gguf)\n")
    sys.exit(1)

REPO = pathlib.Path(__file__).resolve().parents[2]
TOKENIZERS = REPO / "tests" / "fixtures" / "tokenizers"
PROG = "make_shaped_gguf.py"

T = gguf.GGMLQuantizationType
QK_K = 256

# The two shapes: the published configs (config.json of mistralai/Mixtral-8x7B-v0.1 and
# Qwen/Qwen3-30B-A3B), and a small variant of each with the same architecture and vocab.
SHAPES = {
    "mixtral-8x7b": dict(
        arch="llama", name="Mixtral-8x7B", vocab=32000, n_layer=32, n_embd=4096,
        n_head=32, n_head_kv=8, head_dim=128, n_ff=14336, n_ff_exp=None, n_expert=8,
        n_expert_used=2, ctx=32768, rope_theta=1e6, rms_eps=1e-5, qk_norm=False,
        tokenizer="mixtral",
        small=dict(n_layer=8, n_embd=1024, n_head=8, n_head_kv=2, n_ff=1024)),
    "qwen3-30b-a3b": dict(
        arch="qwen3moe", name="Qwen3-30B-A3B", vocab=151936, n_layer=48, n_embd=2048,
        n_head=32, n_head_kv=4, head_dim=128, n_ff=6144, n_ff_exp=768, n_expert=128,
        n_expert_used=8, ctx=40960, rope_theta=1e6, rms_eps=1e-6, qk_norm=True,
        tokenizer="qwen3",
        small=dict(n_layer=8, n_embd=256, n_head=8, n_head_kv=1, n_ff=768, n_ff_exp=256)),
    # deepseek-ai/DeepSeek-V2-Lite config.json: MLA without a query LoRA, the first layer
    # dense, 2 shared experts. The small variant keeps 27 layers (llama.cpp tells V2-Lite from
    # V2 by n_layer 27 and then reads no q_lora_rank) and the same remainders of each width
    # modulo 256, so that llama-quantize's fallback types are the same as the full model's.
    "deepseek-v2-lite": dict(
        arch="deepseek2", name="DeepSeek-V2-Lite", vocab=102400, n_layer=27, n_embd=2048,
        n_head=16, n_head_kv=16, head_dim=192, n_ff=10944, n_ff_exp=1408, n_expert=64,
        n_expert_used=6, n_expert_shared=2, n_dense=1, kv_lora=512, qk_nope=128, qk_rope=64,
        v_head=128, ctx=163840, rope_theta=10000.0, rms_eps=1e-6, qk_norm=False,
        yarn=dict(factor=40.0, original=4096, mscale_all_dim=0.707),
        tokenizer="deepseek",
        small=dict(n_embd=256, n_head=4, n_head_kv=4, head_dim=96, n_ff=448, n_ff_exp=128,
                   kv_lora=128, qk_nope=64, qk_rope=32, v_head=64)),
    # openai/gpt-oss-20b config.json: sinks, sliding window 128 on even layers, biases,
    # MXFP4 experts. Widths 2880 are not whole 256-blocks: llama-quantize falls back.
    "gpt-oss-20b": dict(
        arch="gpt-oss", name="gpt-oss-20b", vocab=201088, n_layer=24, n_embd=2880,
        n_head=64, n_head_kv=8, head_dim=64, n_ff=2880, n_ff_exp=2880, n_expert=32,
        n_expert_used=4, ctx=131072, rope_theta=150000.0, rms_eps=1e-5, qk_norm=False,
        sliding_window=128, yarn=dict(factor=32.0, original=4096),
        tokenizer="gpt-oss",
        small=dict(n_layer=8, n_embd=576, n_head=8, n_head_kv=2, n_ff=576, n_ff_exp=576)),
}

# ggml token types (gguf.TokenType)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

SIGMA_EMBD = 1.0      # noise of the token embeddings
RHO_EMBD = 0.7        # share of an embedding row's norm in its massive chunk
ROUTER_NOISE = 1.0    # std of the random part of a router logit
GROWTH = 0.5          # variance the layers add to the residual, all together, in units of
                      # the embeddings' noise variance
K_ADD = 0.45          # a layer adds RMS K_ADD * alpha (alpha: its output projections' scale
                      # against 1/sqrt(fan_in)), measured on recordings of the small shapes
SKEW_DEFAULT = 0.5
SKEW_STRONG = 1.5
# The matrices that read the hidden state's massive chunk as zeros, so that only the
# routers (and the attention scores) see it: it adds nothing coherent to the residual.
DEAD_TO_MASSIVE = ("attn_v.weight", "ffn_gate_exps", "ffn_up_exps", "ffn_gate.weight",
                   "ffn_up.weight", "ffn_gate_shexp", "ffn_up_shexp", "attn_kv_a_mqa")
CHUNK_BYTES = 64 << 20
PROGRESS_MIN_BYTES = 1 << 30


class UsageError(Exception):
    pass


# --- the type llama-quantize gives each tensor ----------------------------------------

def use_more_bits(i, n):
    """llama.cpp's rule for the layers whose ffn_down / attn_v get more bits."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


# llama-quantize's fallback when a row is not whole blocks of the type it chose
# (tensor_type_fallback in src/llama-quant.cpp): the 32-wide type nearest in bits
FALLBACK = {T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0}


def tensor_type(name, ne, layer, n_layer, n_expert, qtype, arch="llama"):
    """The ggml type of one tensor after convert_hf_to_gguf.py + llama-quantize."""
    if (len(ne) < 2 or name.endswith("_norm.weight") or "ffn_gate_inp" in name
            or name.endswith(".bias") or "attn_sinks" in name):
        return T.F32  # never quantized (the converter writes these in F32)
    if arch == "gpt-oss" and "_exps." in name:
        return T.MXFP4  # the converter repacks OpenAI's MXFP4 blocks; they stay as they are
    if qtype == "q4_k":
        t = T.Q4_K
    elif name == "output.weight":
        # a row that is not whole Q6_K blocks makes the output Q8_0 outright
        t = T.Q6_K if ne[0] % QK_K == 0 else T.Q8_0
    elif name == "token_embd.weight":
        t = T.Q4_K
    elif "attn_v.weight" in name:
        t = T.Q6_K if use_more_bits(layer, n_layer) else T.Q4_K
        if n_expert == 8:
            t = T.Q8_0
    elif "attn_k.weight" in name:
        t = T.Q8_0 if n_expert == 8 else T.Q4_K
    elif "attn_output.weight" in name:
        t = T.Q5_K if n_expert == 8 else T.Q4_K
    elif "ffn_down" in name:
        t = T.Q6_K if use_more_bits(layer, n_layer) else T.Q4_K
    else:
        t = T.Q4_K
    if ne[0] % gguf.GGML_QUANT_SIZES[t][0]:
        t = FALLBACK.get(t, t)
    block = gguf.GGML_QUANT_SIZES[t][0]
    if ne[0] % block:  # llama.cpp would fall back to F16; our shapes never need it
        raise UsageError(f"{name}: rows of {ne[0]} values are not whole {t.name} blocks")
    return t


def model_config(shape, small, layers):
    s = dict(SHAPES[shape])
    if small:
        s.update(s["small"])
        s["name"] += " (small)"
    if layers is not None:
        s["n_layer"] = layers
    s.pop("small")
    s["shape"] = shape
    return s


def layer_tensors(cfg, i):
    """[(name, ne)] of layer i, llama.cpp's names and extents (innermost first)."""
    h, hd, E, a = cfg["n_embd"], cfg["head_dim"], cfg["n_expert"], cfg["arch"]
    ff = cfg["n_ff_exp"] or cfg["n_ff"]
    b = f"blk.{i}."
    if a == "deepseek2":
        # multi-head latent attention, as the converter splits kv_b (DeepseekV2Model.
        # modify_tensors): k_b transposed per head [qk_nope, kv_lora, n_head], v_b
        # [kv_lora, v_head, n_head]; no q LoRA (V2-Lite), so one attn_q
        nh, kvl, rope = cfg["n_head"], cfg["kv_lora"], cfg["qk_rope"]
        out = [(b + "attn_norm.weight", (h,)),
               (b + "attn_q.weight", (h, nh * (cfg["qk_nope"] + rope))),
               (b + "attn_kv_a_mqa.weight", (h, kvl + rope)),
               (b + "attn_kv_a_norm.weight", (kvl,)),
               (b + "attn_k_b.weight", (cfg["qk_nope"], kvl, nh)),
               (b + "attn_v_b.weight", (kvl, cfg["v_head"], nh)),
               (b + "attn_output.weight", (nh * cfg["v_head"], h)),
               (b + "ffn_norm.weight", (h,))]
        if i < cfg["n_dense"]:
            return out + [(b + "ffn_gate.weight", (h, cfg["n_ff"])),
                          (b + "ffn_up.weight", (h, cfg["n_ff"])),
                          (b + "ffn_down.weight", (cfg["n_ff"], h))]
        sh = ff * cfg["n_expert_shared"]
        return out + [(b + "ffn_gate_inp.weight", (h, E)),
                      (b + "ffn_gate_exps.weight", (h, ff, E)),
                      (b + "ffn_up_exps.weight", (h, ff, E)),
                      (b + "ffn_down_exps.weight", (ff, h, E)),
                      (b + "ffn_gate_shexp.weight", (h, sh)),
                      (b + "ffn_up_shexp.weight", (h, sh)),
                      (b + "ffn_down_shexp.weight", (sh, h))]
    q, kv = cfg["n_head"] * hd, cfg["n_head_kv"] * hd
    if a == "gpt-oss":
        # src/models/openai-moe.cpp: biases everywhere, per-head sinks, the FFN's norm
        # named post_attention_norm
        return [(b + "attn_norm.weight", (h,)),
                (b + "attn_q.weight", (h, q)), (b + "attn_q.bias", (q,)),
                (b + "attn_k.weight", (h, kv)), (b + "attn_k.bias", (kv,)),
                (b + "attn_v.weight", (h, kv)), (b + "attn_v.bias", (kv,)),
                (b + "attn_output.weight", (q, h)), (b + "attn_output.bias", (h,)),
                (b + "attn_sinks.weight", (cfg["n_head"],)),
                (b + "post_attention_norm.weight", (h,)),
                (b + "ffn_gate_inp.weight", (h, E)), (b + "ffn_gate_inp.bias", (E,)),
                (b + "ffn_gate_exps.weight", (h, ff, E)), (b + "ffn_gate_exps.bias", (ff, E)),
                (b + "ffn_up_exps.weight", (h, ff, E)), (b + "ffn_up_exps.bias", (ff, E)),
                (b + "ffn_down_exps.weight", (ff, h, E)), (b + "ffn_down_exps.bias", (h, E))]
    out = [(b + "attn_norm.weight", (h,)),
           (b + "attn_q.weight", (h, q)),
           (b + "attn_k.weight", (h, kv)),
           (b + "attn_v.weight", (h, kv)),
           (b + "attn_output.weight", (q, h)),
           (b + "ffn_norm.weight", (h,)),
           (b + "ffn_gate_inp.weight", (h, E)),
           (b + "ffn_gate_exps.weight", (h, ff, E)),
           (b + "ffn_up_exps.weight", (h, ff, E)),
           (b + "ffn_down_exps.weight", (ff, h, E))]
    if cfg["qk_norm"]:
        out += [(b + "attn_q_norm.weight", (hd,)), (b + "attn_k_norm.weight", (hd,))]
    return out


def plan(cfg, qtype):
    """The tensors, in the order llama-quantize writes them: [(name, ne, type, layer)]."""
    h = cfg["n_embd"]
    out = [("token_embd.weight", (h, cfg["vocab"]), None),
           ("output_norm.weight", (h,), None),
           ("output.weight", (h, cfg["vocab"]), None)]
    for i in range(cfg["n_layer"]):
        out += [(n, ne, i) for n, ne in layer_tensors(cfg, i)]
    # llama_model_loader sorts by layer (none first), then by name; quantize keeps that order
    out.sort(key=lambda t: (-1 if t[2] is None else t[2], t[0]))
    return [(n, ne, tensor_type(n, ne, -1 if i is None else i, cfg["n_layer"],
                                cfg["n_expert"], qtype, cfg["arch"]), i)
            for n, ne, i in out]


def ffn_norm_name(cfg, layer):
    """The norm in front of layer's FFN (and router)."""
    return f"blk.{layer}." + ("post_attention_norm.weight" if cfg["arch"] == "gpt-oss"
                              else "ffn_norm.weight")


def is_moe_layer(cfg, layer):
    return layer >= cfg.get("n_dense", 0)


def nbytes_of(ne, t):
    block, size = gguf.GGML_QUANT_SIZES[t]
    return math.prod(ne) // block * size


# --- tokenizers ------------------------------------------------------------------------

def _varint(buf, pos):
    v = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        v |= (b & 0x7F) << shift
        if b < 0x80:
            return v, pos
        shift += 7


def _skip(buf, pos, wire):
    if wire == 0:
        return _varint(buf, pos)[1]
    if wire == 1:
        return pos + 8
    if wire == 2:
        n, pos = _varint(buf, pos)
        return pos + n
    if wire == 5:
        return pos + 4
    raise ValueError(f"protobuf wire type {wire}")


def read_sentencepiece(path):
    """[(piece, score, type)] from a SentencePiece model file (a protobuf ModelProto whose
    field 1 repeats SentencePiece {1: piece, 2: score, 3: type})."""
    buf = path.read_bytes()
    pieces, pos = [], 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if field != 1 or wire != 2:
            pos = _skip(buf, pos, wire)
            continue
        n, pos = _varint(buf, pos)
        end, piece, score, typ = pos + n, b"", 0.0, NORMAL
        while pos < end:
            k, pos = _varint(buf, pos)
            f, w = k >> 3, k & 7
            if f == 1 and w == 2:
                m, pos = _varint(buf, pos)
                piece, pos = buf[pos:pos + m], pos + m
            elif f == 2 and w == 5:
                score, pos = struct.unpack_from("<f", buf, pos)[0], pos + 4
            elif f == 3 and w == 0:
                typ, pos = _varint(buf, pos)
            else:
                pos = _skip(buf, pos, w)
        pieces.append((piece.decode("utf-8"), score, typ))
    return pieces


def looks_special(tok):
    return tok.startswith("<|") and tok.endswith("|>")


def mixtral_tokenizer(vocab):
    """Keys and embedded files for Mixtral's tokenizer, as the converter writes them."""
    d = TOKENIZERS / "mixtral-8x7b-instruct"
    pieces = read_sentencepiece(d / "tokenizer.model")
    tokens = [f"[PAD{i}]" for i in range(vocab)]
    scores = [-10000.0] * vocab
    types = [UNUSED] * vocab
    for i, (p, s, t) in enumerate(pieces[:vocab]):
        tokens[i], scores[i], types[i] = p, s, t
    cfg_text = (d / "tokenizer_config.json").read_text(encoding="utf-8")
    cfg = json.loads(cfg_text)
    for sid, tok in cfg.get("added_tokens_decoder", {}).items():
        i = int(sid)
        if i < vocab:
            special = tok.get("special") or looks_special(tok["content"])
            tokens[i] = tok["content"] if special else tok["content"].replace("\u2581", " ")
            types[i] = CONTROL if special else USER_DEFINED
            scores[i] = -1000.0
    ids = {t: i for i, t in enumerate(tokens)}
    kv = [("tokenizer.ggml.model", "llama"), ("tokenizer.ggml.pre", "default"),
          ("tokenizer.ggml.tokens", tokens), ("tokenizer.ggml.scores", scores),
          ("tokenizer.ggml.token_type", types),
          ("tokenizer.ggml.bos_token_id", ids[cfg["bos_token"]]),
          ("tokenizer.ggml.eos_token_id", ids[cfg["eos_token"]]),
          ("tokenizer.ggml.unknown_token_id", ids[cfg["unk_token"]]),
          ("tokenizer.ggml.add_bos_token", bool(cfg.get("add_bos_token", True))),
          ("tokenizer.ggml.add_eos_token", bool(cfg.get("add_eos_token", False))),
          ("tokenizer.chat_template", cfg["chat_template"])]
    files = {"tokenizer.json": (d / "tokenizer.json").read_text(encoding="utf-8"),
             "tokenizer_config.json": cfg_text}
    return kv, files


def qwen3_tokenizer(vocab):
    return bpe_tokenizer(vocab, "qwen3", "qwen2", eos="<|im_end|>", pad="<|endoftext|>",
                         bos="<|endoftext|>")


def gpt_oss_tokenizer(vocab):
    # o200k_harmony; ids as its tokenizer_config.json names them; pre-tokenizer gpt-4o
    return bpe_tokenizer(vocab, "gpt-oss", "gpt-4o", eos="<|return|>", pad="<|endoftext|>",
                         bos="<|startoftext|>")


DEEPSEEK_BOS, DEEPSEEK_EOS = 100000, 100001


def byte_level_chars():
    """GPT-2's bytes_to_unicode: the printable stand-in for each byte."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def deepseek_tokenizer(vocab):
    """DeepSeek-V2's tokenizer is not in the repository: a small byte-level BPE (the 256
    byte tokens and a few merges of common English pairs), padded to the vocabulary with
    UNUSED tokens, with DeepSeek's bos/eos at their ids 100000/100001 and pre-tokenizer
    deepseek-llm (what the converter names V2's)."""
    chars = byte_level_chars()
    tokens = list(chars)
    merges = []
    for a, b in [("\u0120", "t"), ("h", "e"), ("i", "n"), ("\u0120", "a"), ("e", "r"),
                 ("o", "n"), ("\u0120t", "he"), ("r", "e"), ("a", "n"), ("o", "r")]:
        merges.append(f"{a} {b}")
        tokens.append(a + b)
    ttypes = [NORMAL] * len(tokens) + [UNUSED] * (vocab - len(tokens))
    tokens += [f"[PAD{i}]" for i in range(len(tokens), vocab)]
    bos, eos = "<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5cend\u2581of\u2581sentence\uff5c>"
    tokens[DEEPSEEK_BOS], tokens[DEEPSEEK_EOS] = bos, eos
    ttypes[DEEPSEEK_BOS] = ttypes[DEEPSEEK_EOS] = CONTROL
    kv = [("tokenizer.ggml.model", "gpt2"), ("tokenizer.ggml.pre", "deepseek-llm"),
          ("tokenizer.ggml.tokens", tokens), ("tokenizer.ggml.token_type", ttypes),
          ("tokenizer.ggml.merges", merges),
          ("tokenizer.ggml.bos_token_id", DEEPSEEK_BOS),
          ("tokenizer.ggml.eos_token_id", DEEPSEEK_EOS),
          ("tokenizer.ggml.padding_token_id", DEEPSEEK_EOS),
          ("tokenizer.ggml.add_bos_token", True), ("tokenizer.ggml.add_eos_token", False)]
    tj = {"version": "1.0", "truncation": None, "padding": None,
          "added_tokens": [{"id": i, "content": tokens[i], "single_word": False,
                            "lstrip": False, "rstrip": False, "normalized": False,
                            "special": True} for i in (DEEPSEEK_BOS, DEEPSEEK_EOS)],
          "normalizer": None,
          "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                            "trim_offsets": True, "use_regex": True},
          # DeepSeek's own tokenizer.json adds the BOS (as add_bos_token says to llama.cpp)
          "post_processor": {
              "type": "TemplateProcessing",
              "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                         {"Sequence": {"id": "A", "type_id": 0}}],
              "pair": [{"SpecialToken": {"id": bos, "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": bos, "type_id": 1}},
                       {"Sequence": {"id": "B", "type_id": 1}}],
              "special_tokens": {bos: {"id": bos, "ids": [DEEPSEEK_BOS], "tokens": [bos]}}},
          "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                      "use_regex": True},
          "model": {"type": "BPE", "dropout": None, "unk_token": None,
                    "continuing_subword_prefix": None, "end_of_word_suffix": None,
                    "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                    "vocab": {t: i for i, t in enumerate(tokens)}, "merges": merges}}
    return kv, {"tokenizer.json": json.dumps(tj, ensure_ascii=False)}


def bpe_tokenizer(vocab, folder, pre, eos, pad, bos):
    path = TOKENIZERS / folder / "tokenizer.json.zst"
    if not shutil.which("zstd"):
        raise RuntimeError(f"{path} needs the zstd command (Debian package zstd)")
    text = subprocess.run(["zstd", "-dc", str(path)], check=True, capture_output=True).stdout
    text = text.decode("utf-8")
    tj = json.loads(text)
    by_id = {i: t for t, i in tj["model"]["vocab"].items()}
    added = {a["id"]: a for a in tj["added_tokens"]}
    tokens, types = [], []
    for i in range(vocab):
        if i in added:
            tok = added[i]["content"]
            special = added[i]["special"] or looks_special(tok)
            tokens.append(tok)
            types.append(CONTROL if special else USER_DEFINED)
        elif i in by_id:
            tokens.append(by_id[i])
            types.append(NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
    merges = [m if isinstance(m, str) else
              " ".join(p.replace(" ", chr(ord(" ") + 256)) for p in m)
              for m in tj["model"]["merges"]]
    ids = {t: i for i, t in enumerate(tokens)}
    # Qwen3: ids as its tokenizer_config.json (eos <|im_end|>, pad <|endoftext|>) and
    # config.json (bos_token_id 151643) give them; its ByteLevel post-processor adds nothing
    kv = [("tokenizer.ggml.model", "gpt2"), ("tokenizer.ggml.pre", pre),
          ("tokenizer.ggml.tokens", tokens), ("tokenizer.ggml.token_type", types),
          ("tokenizer.ggml.merges", merges),
          ("tokenizer.ggml.eos_token_id", ids[eos]),
          ("tokenizer.ggml.padding_token_id", ids[pad]),
          ("tokenizer.ggml.bos_token_id", ids[bos]),
          ("tokenizer.ggml.add_bos_token", False),
          ("tokenizer.ggml.add_eos_token", False)]
    return kv, {"tokenizer.json": text}


# --- random weights --------------------------------------------------------------------

def rng_for(seed, name):
    return np.random.Generator(np.random.SFC64(np.random.SeedSequence([seed, zlib.crc32(name.encode())])))


def rand_bytes(rng, n):
    words = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, size=(n + 7) // 8,
                         dtype=np.int64, endpoint=True)
    return words.view(np.uint8)[:n]


def f16_bytes(x):
    return np.asarray(x, dtype="<f2").view(np.uint8).reshape(-1, 2)


def pack_k_scales(sc, m):
    """Eight 6-bit scales and mins per block into ggml's 12-byte K-quant layout."""
    sc = sc.astype(np.uint8)
    m = m.astype(np.uint8)
    out = np.empty((sc.shape[0], 12), np.uint8)
    out[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
    return out


def uniform_int_rms(lo, hi):
    v = np.arange(lo, hi + 1, dtype=np.float64)
    return float(np.sqrt(np.mean(v * v)))


SC_LO, SC_HI = 40, 63         # Q4_K/Q5_K sub-block scales
Q6_LO, Q6_HI = 16, 63         # |Q6_K scales|
Q4_STD = math.sqrt((16 * 16 - 1) / 12)
Q5_STD = math.sqrt((32 * 32 - 1) / 12)
Q6_RMS = math.sqrt((64 * 64 - 1) / 12 + 0.25)
Q8_RMS = math.sqrt((256 * 256 - 1) / 12 + 0.25)


def block_jitter(rng, n):
    return (0.85 + 0.3 * rng.random(n, dtype=np.float32)).astype(np.float32)


def kquant_blocks(rng, t, nblk, sigma, massive=None, dead=None):
    """nblk random Q4_K or Q5_K blocks, every sub-block zero-mean with std ~sigma.
    massive = (sub, first, period, value): sub-block `sub` of blocks first, first + period,
    ... (the same place in every row) has mean `value` instead."""
    size = gguf.GGML_QUANT_SIZES[t][1]
    qmean = 7.5 if t == T.Q4_K else 15.5
    qstd = Q4_STD if t == T.Q4_K else Q5_STD
    b = rand_bytes(rng, nblk * size).reshape(nblk, size)
    sc = rng.integers(SC_LO, SC_HI + 1, size=(nblk, 8), dtype=np.uint8)
    d = block_jitter(rng, nblk) * np.float32(sigma / (qstd * uniform_int_rms(SC_LO, SC_HI)))
    m = sc.copy()
    dmin = d * np.float32(qmean)  # dmin * m = qmean * d * sc: the sub-block's mean is 0
    if massive is not None:
        sub, first, period, value = massive
        rows = np.arange(first, nblk, period)
        # these blocks take a dmin large enough for the offset; their other sub-blocks
        # keep a zero mean as nearly as 6 bits of m allow
        big = ((qmean * SC_HI) * d[rows] - np.float32(value)) / np.float32(63)
        dmin[rows] = big
        target = qmean * d[rows, None] * sc[rows].astype(np.float32)
        target[:, sub] -= np.float32(value)
        m[rows] = np.clip(np.rint(target / big[:, None]), 0, 63).astype(np.uint8)
    if dead is not None:  # (sub, first, period): that sub-block all zeros
        sub, first, period = dead
        sc[first::period, sub] = 0
        m[first::period, sub] = 0
    b[:, 0:2] = f16_bytes(d)
    b[:, 2:4] = f16_bytes(dmin)
    b[:, 4:16] = pack_k_scales(sc, m)
    return b


def q6k_blocks(rng, nblk, sigma, dead=None):
    b = rand_bytes(rng, nblk * 210).reshape(nblk, 210)
    mag = rng.integers(Q6_LO, Q6_HI + 1, size=(nblk, 16), dtype=np.int16)
    sign = np.where(rng.random((nblk, 16), dtype=np.float32) < 0.5, -1, 1).astype(np.int16)
    if dead is not None:  # (sub, first, period): the two 16-value groups of a sub-block
        sub, first, period = dead
        mag[first::period, 2 * sub:2 * sub + 2] = 0
    b[:, 192:208] = (mag * sign).astype(np.int8).view(np.uint8)
    d = block_jitter(rng, nblk) * np.float32(sigma / (Q6_RMS * uniform_int_rms(Q6_LO, Q6_HI)))
    b[:, 208:210] = f16_bytes(d)
    return b


def q8_0_blocks(rng, nblk, sigma, dead=None):
    b = rand_bytes(rng, nblk * 34).reshape(nblk, 34)
    d = block_jitter(rng, nblk) * np.float32(sigma / Q8_RMS)
    if dead is not None:  # (0, first, period): that block's scale 0
        d[dead[1]::dead[2]] = 0
    b[:, 0:2] = f16_bytes(d)
    return b


Q5_0_RMS = math.sqrt((32 * 32 - 1) / 12 + 0.25)
# MXFP4 (OCP microscaling): e2m1 values; ggml stores them doubled (kvalues_mxfp4) and
# halves the e8m0 scale 2^(e-127)
MXFP4_RMS = math.sqrt(np.mean(np.square([0, 1, 2, 3, 4, 6, 8, 12])))


def q5_0_blocks(rng, nblk, sigma, dead=None):
    b = rand_bytes(rng, nblk * 22).reshape(nblk, 22)
    d = block_jitter(rng, nblk) * np.float32(sigma / Q5_0_RMS)
    if dead is not None:
        d[dead[1]::dead[2]] = 0
    b[:, 0:2] = f16_bytes(d)
    return b


def q5_0_from_float(x):
    """ggml's Q5_0 of x [nblk, 32]: d = max-magnitude value / -16, q = round(x/d) + 16."""
    idx = np.argmax(np.abs(x), axis=1)
    mx = x[np.arange(x.shape[0]), idx]
    d = (mx / -16).astype(np.float32)
    inv = np.where(d != 0, 1 / np.where(d != 0, d, 1), 0).astype(np.float32)
    q = np.clip(np.rint(x * inv[:, None]) + 16, 0, 31).astype(np.uint32)
    out = np.empty((x.shape[0], 22), np.uint8)
    out[:, 0:2] = f16_bytes(d)
    hi = (q >> 4) & 1
    qh = (hi[:, :16] << np.arange(16, dtype=np.uint32)).sum(1) | \
         (hi[:, 16:] << np.arange(16, 32, dtype=np.uint32)).sum(1)
    out[:, 2:6] = qh.astype("<u4").view(np.uint8).reshape(-1, 4)
    out[:, 6:22] = ((q[:, :16] & 15) | ((q[:, 16:] & 15) << 4)).astype(np.uint8)
    return out


def mxfp4_blocks(rng, nblk, sigma, dead=None):
    b = rand_bytes(rng, nblk * 17).reshape(nblk, 17)
    # value RMS MXFP4_RMS * 2^(e-128): the nearest power of two to sigma, one step of jitter
    e = np.rint(np.log2(sigma / MXFP4_RMS)) + 128 + rng.integers(-1, 1, nblk, endpoint=True)
    e = np.clip(e, 1, 254).astype(np.uint8)
    if dead is not None:
        e[dead[1]::dead[2]] = 0
    b[:, 0] = e
    return b


def quant_chunks(rng, t, ne, sigma, massive=None, dead=None):
    """The tensor's bytes, chunk by chunk (each a whole number of rows). massive =
    (column, value): in every row, the 32 values from that column on have mean value.
    dead = column: in every row, the 32 values from that column on are 0."""
    block, size = gguf.GGML_QUANT_SIZES[t]
    per_row = ne[0] // block
    rows = math.prod(ne[1:])
    rows_per_chunk = max(1, CHUNK_BYTES // (per_row * size))
    place = None
    if dead is not None:  # (sub-block of 32 within its block, the block, blocks per row)
        place = ((dead % block) // 32, dead // block, per_row)
    for r0 in range(0, rows, rows_per_chunk):
        n = min(rows_per_chunk, rows - r0) * per_row
        if t in (T.Q4_K, T.Q5_K):
            mb = None
            if massive is not None:
                col, value = massive
                mb = ((col % block) // 32, col // block, per_row, value)
            yield kquant_blocks(rng, t, n, sigma, mb, place)
        elif massive is not None and t == T.Q5_0:
            # random blocks, but the one holding the massive chunk in each row quantized
            # from noise plus the value (a random Q5_0 block cannot carry an offset)
            col, value = massive
            b = q5_0_blocks(rng, n, sigma)
            x = sigma * rng.standard_normal((n // per_row, 32), dtype=np.float32)
            b[col // 32::per_row] = q5_0_from_float(x + np.float32(value))
            yield b
        elif massive is not None:
            raise ValueError(f"no massive values in {t.name}")
        elif t == T.Q5_0:
            yield q5_0_blocks(rng, n, sigma, place)
        elif t == T.MXFP4:
            yield mxfp4_blocks(rng, n, sigma, place)
        elif t == T.Q6_K:
            yield q6k_blocks(rng, n, sigma, place)
        elif t == T.Q8_0:
            yield q8_0_blocks(rng, n, sigma, place)
        else:
            raise ValueError(f"no generator for {t.name}")


# --- the model's numbers -------------------------------------------------------------

class Model:
    """Everything about one file but the big tensors' bytes."""

    def __init__(self, cfg, qtype, seed, skew):
        self.cfg, self.qtype, self.seed, self.skew = cfg, qtype, seed, skew
        self.tensors = plan(cfg, qtype)
        h, L = cfg["n_embd"], cfg["n_layer"]
        g = np.random.Generator(np.random.SFC64(np.random.SeedSequence([seed, 1])))
        # the massive chunk: one 32-wide sub-block of the hidden state, placed at random
        self.massive_chunk = int(g.integers(0, h // 32))
        # its value, so that it holds RHO_EMBD of an embedding row's norm
        r2 = RHO_EMBD ** 2 / (1 - RHO_EMBD ** 2)
        self.massive_value = -SIGMA_EMBD * math.sqrt(r2 * h / 32)
        self.r2 = r2
        self.alpha = min(1.0, math.sqrt(GROWTH / L) / K_ADD)
        self.small = {}          # the F32 tensors, made up front (routers need the norms)
        self.rankings = {}
        for name, ne, t, layer in self.tensors:
            if t != T.F32:
                continue
            rng = rng_for(seed, name)
            if name.endswith("ffn_gate_inp.weight"):
                continue
            if name.endswith(".bias") or "attn_sinks" in name:
                # small biases; sinks near 0 (a sink logit of 0 takes a share of 1/(n+1))
                self.small[name] = (0.02 * rng.standard_normal(math.prod(ne))).astype(np.float32)
                continue
            self.small[name] = (1 + 0.02 * rng.standard_normal(ne[0])).astype(np.float32)
        for name, ne, t, layer in self.tensors:
            if name.endswith("ffn_gate_inp.weight"):
                self.small[name] = self.router(name, layer)

    def direction(self):
        u = np.zeros(self.cfg["n_embd"], np.float32)
        c = self.massive_chunk
        u[32 * c:32 * c + 32] = -1.0 / math.sqrt(32)  # the massive values are negative
        return u

    def router(self, name, layer):
        h, E = self.cfg["n_embd"], self.cfg["n_expert"]
        rng = rng_for(self.seed, name)
        rows = ROUTER_NOISE * rng.standard_normal((E, h), dtype=np.float32)
        rank = rng.permutation(E)  # rank[e]: expert e's place in this layer's popularity
        b = -np.log1p(np.arange(E, dtype=np.float64))
        b = (b - b.mean()) / b.std()
        # the massive chunk's share of the router's input falls a little with depth: keep
        # the bias it gives at the first layer's strength
        beta = self.skew * b[rank] * (self.rho(0) / self.rho(layer))
        self.rankings[layer] = np.argsort(rank).tolist()  # experts, most popular first
        gamma = self.small[ffn_norm_name(self.cfg, layer)]
        u = self.direction() * gamma
        u /= np.linalg.norm(u)
        # the random part sees only what differs between tokens: without this, the
        # hidden states' common part would give every expert a random bias of its own
        rows -= (rows @ u)[:, None] * u[None, :]
        # logit_e = w_e . x with |x| = sqrt(h): noise ~ROUTER_NOISE, bias beta_e * (u . x)/sqrt(h)
        rows += beta[:, None].astype(np.float32) * u[None, :]
        return (rows / np.float32(math.sqrt(h))).astype(np.float32)

    def rho(self, layer):
        """The expected share of the massive chunk in the norm of layer's hidden state."""
        return math.sqrt(self.r2 / (self.r2 + 1 + GROWTH * layer / self.cfg["n_layer"]))

    def sigma(self, name, ne):
        if name == "token_embd.weight":
            return SIGMA_EMBD
        fan_in = ne[0]
        s = 1.0 / math.sqrt(fan_in)
        if "attn_output" in name or "ffn_down" in name:
            s *= self.alpha
        return s

    def chunks(self, name, ne, t):
        if t == T.F32:
            yield self.small[name].view(np.uint8)
            return
        massive = dead = None
        if name == "token_embd.weight":
            massive = (32 * self.massive_chunk, self.massive_value)
        elif any(k in name for k in DEAD_TO_MASSIVE):
            dead = 32 * self.massive_chunk
        yield from quant_chunks(rng_for(self.seed, name), t, ne, self.sigma(name, ne),
                                massive, dead)

    # -- routing estimate --

    def entropy_estimate(self, tokens=2048):
        """Each layer's expected expert-frequency entropy (bits), from random hidden states
        made like the model's: an embedding row (unit noise plus the massive chunk) plus
        the noise the layers before have added, RMS-normalised and scaled by ffn_norm."""
        cfg = self.cfg
        h, E, K, L = cfg["n_embd"], cfg["n_expert"], cfg["n_expert_used"], cfg["n_layer"]
        g = np.random.Generator(np.random.SFC64(np.random.SeedSequence([self.seed, 2])))
        base = SIGMA_EMBD * g.standard_normal((tokens, h), dtype=np.float32)
        c = self.massive_chunk
        base[:, 32 * c:32 * c + 32] += self.massive_value
        noise = g.standard_normal((tokens, h), dtype=np.float32)
        out = []
        for layer in range(L):
            if not is_moe_layer(cfg, layer):
                out.append(None)  # a dense layer (DeepSeek's first): no router
                continue
            # the layers before have added noise of variance GROWTH * layer / n_layer
            x = base + math.sqrt(GROWTH * layer / L) * noise
            x /= np.sqrt(np.mean(x * x, axis=1, keepdims=True) + cfg["rms_eps"])
            x *= self.small[ffn_norm_name(cfg, layer)]
            logits = x @ self.small[f"blk.{layer}.ffn_gate_inp.weight"].T
            top = np.argpartition(-logits, K - 1, axis=1)[:, :K]
            f = np.bincount(top.ravel(), minlength=E) / top.size
            f = f[f > 0]
            out.append(float(-(f * np.log2(f)).sum()))
        return out


# --- the file --------------------------------------------------------------------------

def size_label(tensors):
    total = shared = expert = 0
    n_exp = 0
    for name, ne, t, layer in tensors:
        n = math.prod(ne)
        total += n
        if "_exps." in name and len(ne) == 3:
            expert += n // ne[2]
            n_exp = ne[2]
        else:
            shared += n
    return gguf.size_label(total, shared, expert, n_exp)


def key_values(model, llama_only):
    cfg = model.cfg
    a = cfg["arch"]
    kv = [("general.type", "model"),
          ("general.name", f"{cfg['name']} shape, random weights (fmoe)"),
          ("general.size_label", size_label(model.tensors))]
    hp = [(f"{a}.block_count", cfg["n_layer"]),
          (f"{a}.context_length", cfg["ctx"]),
          (f"{a}.embedding_length", cfg["n_embd"]),
          (f"{a}.feed_forward_length", cfg["n_ff"]),
          (f"{a}.attention.head_count", cfg["n_head"]),
          (f"{a}.attention.head_count_kv", cfg["n_head_kv"]),
          (f"{a}.rope.freq_base", float(cfg["rope_theta"])),
          (f"{a}.attention.layer_norm_rms_epsilon", float(cfg["rms_eps"])),
          (f"{a}.expert_count", cfg["n_expert"]),
          (f"{a}.expert_used_count", cfg["n_expert_used"])]
    if a == "deepseek2":  # DeepseekV2Model.set_gguf_parameters: MLA as MQA, one kv head
        hp[5] = (f"{a}.attention.head_count_kv", 1)
        y = cfg["yarn"]
        hp += [(f"{a}.leading_dense_block_count", cfg["n_dense"]),
               (f"{a}.vocab_size", cfg["vocab"]),
               (f"{a}.attention.kv_lora_rank", cfg["kv_lora"]),
               (f"{a}.attention.key_length", cfg["kv_lora"] + cfg["qk_rope"]),
               (f"{a}.attention.value_length", cfg["kv_lora"]),
               (f"{a}.attention.key_length_mla", cfg["qk_nope"] + cfg["qk_rope"]),
               (f"{a}.attention.value_length_mla", cfg["v_head"]),
               (f"{a}.expert_feed_forward_length", cfg["n_ff_exp"]),
               (f"{a}.expert_shared_count", cfg["n_expert_shared"]),
               (f"{a}.expert_weights_scale", 1.0),
               # config.json's n_group 1, topk_group 1, scoring_func softmax (TextModel.
               # set_gguf_parameters writes them for any model that has them)
               (f"{a}.expert_group_count", 1), (f"{a}.expert_group_used_count", 1),
               (f"{a}.expert_gating_func", 1),
               (f"{a}.rope.dimension_count", cfg["qk_rope"]),
               (f"{a}.rope.scaling.type", "yarn"),
               (f"{a}.rope.scaling.factor", y["factor"]),
               (f"{a}.rope.scaling.original_context_length", y["original"]),
               (f"{a}.rope.scaling.yarn_beta_fast", 32.0),
               (f"{a}.rope.scaling.yarn_beta_slow", 1.0),
               (f"{a}.rope.scaling.yarn_log_multiplier", 0.1 * y["mscale_all_dim"])]
    elif a == "gpt-oss":  # GptOssModel.set_gguf_parameters
        y = cfg["yarn"]
        hp += [(f"{a}.attention.key_length", cfg["head_dim"]),
               (f"{a}.attention.value_length", cfg["head_dim"]),
               (f"{a}.rope.scaling.type", "yarn"),
               (f"{a}.rope.scaling.factor", y["factor"]),
               (f"{a}.rope.scaling.original_context_length", y["original"]),
               (f"{a}.rope.scaling.yarn_beta_fast", 32.0),
               (f"{a}.rope.scaling.yarn_beta_slow", 1.0),
               (f"{a}.attention.sliding_window", cfg["sliding_window"]),
               (f"{a}.expert_feed_forward_length", cfg["n_ff_exp"])]
    elif a == "qwen3moe":  # config.json has head_dim and moe_intermediate_size
        hp += [(f"{a}.attention.key_length", cfg["head_dim"]),
               (f"{a}.attention.value_length", cfg["head_dim"]),
               (f"{a}.expert_feed_forward_length", cfg["n_ff_exp"])]
    else:                # Mixtral's converter adds these two after the others
        hp += [(f"{a}.vocab_size", cfg["vocab"]),
               (f"{a}.rope.dimension_count", cfg["n_embd"] // cfg["n_head"])]
    kv += hp
    tok_kv, files = {"mixtral": mixtral_tokenizer, "qwen3": qwen3_tokenizer,
                     "deepseek": deepseek_tokenizer,
                     "gpt-oss": gpt_oss_tokenizer}[cfg["tokenizer"]](cfg["vocab"])
    kv += tok_kv
    if not llama_only:
        kv += [(f"fmoe.file.{n}", text) for n, text in files.items()]
    # llama-quantize sets these two last
    kv += [("general.quantization_version", gguf.GGML_QUANT_VERSION),
           ("general.file_type", int(gguf.LlamaFileType.MOSTLY_Q4_K_M if model.qtype == "q4_k_m"
                                     else gguf.LlamaFileType.MOSTLY_Q4_K_S))]
    return kv


UINT32_KEYS = ("block_count", "context_length", "embedding_length", "feed_forward_length",
               "head_count", "head_count_kv", "expert_count", "expert_used_count",
               "key_length", "value_length", "expert_feed_forward_length", "vocab_size",
               "dimension_count", "token_id", "quantization_version", "file_type",
               "leading_dense_block_count", "kv_lora_rank", "key_length_mla",
               "value_length_mla", "expert_shared_count", "sliding_window",
               "original_context_length", "group_count", "group_used_count", "gating_func")


def add_kv(w, key, val):
    if isinstance(val, bool):
        w.add_bool(key, val)
    elif isinstance(val, int):
        if key.endswith(UINT32_KEYS):
            w.add_uint32(key, val)
        else:
            w.add_int32(key, val)
    elif isinstance(val, float):
        w.add_float32(key, val)
    elif isinstance(val, str):
        w.add_string(key, val)
    elif isinstance(val, list):
        if val and isinstance(val[0], int) and not isinstance(val[0], bool):
            w.add_key_value(key, val, gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32)
        else:
            w.add_array(key, val)
    else:
        raise TypeError(key)


class Progress:
    def __init__(self, total, quiet):
        self.total, self.done = total, 0
        self.on = not quiet and total >= PROGRESS_MIN_BYTES
        self.t0 = self.last = time.monotonic()
        self.tty = sys.stderr.isatty()

    def add(self, n):
        self.done += n
        now = time.monotonic()
        if self.on and (now - self.last >= (1 if self.tty else 10) or self.done == self.total):
            self.last = now
            rate = self.done / max(now - self.t0, 1e-9)
            eta = (self.total - self.done) / max(rate, 1)
            line = (f"{PROG}: {self.done / 1e9:6.2f} / {self.total / 1e9:.2f} GB "
                    f"({100 * self.done / self.total:5.1f}%), {rate / 1e6:.0f} MB/s, "
                    f"{eta:.0f} s left")
            sys.stderr.write(("\r" + line) if self.tty else (line + "\n"))
            if self.tty and self.done == self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()


def write_file(model, out, llama_only, quiet):
    partial = out.with_name(out.name + ".partial")
    kv = key_values(model, llama_only)
    w = gguf.GGUFWriter(str(partial), model.cfg["arch"])
    for k, v in kv:
        add_kv(w, k, v)
    total = 0
    for name, ne, t, layer in model.tensors:
        nb = nbytes_of(ne, t)
        total += nb
        if t == T.F32:
            w.add_tensor_info(name, tuple(reversed(ne)), np.dtype(np.float32), nb)
        else:
            w.add_tensor_info(name, tuple(reversed(ne)), np.dtype(np.float32), nb, raw_dtype=t)
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        assert w.fout is not None and len(w.fout) == 1
        f = w.fout[0]
        align = w.data_alignment
        progress = Progress(total, quiet)
        for name, ne, t, layer in model.tensors:
            f.write(b"\0" * (-f.tell() % align))
            want, got = nbytes_of(ne, t), 0
            for chunk in model.chunks(name, ne, t):
                f.write(memoryview(np.ascontiguousarray(chunk)).cast("B"))
                got += chunk.nbytes
                progress.add(chunk.nbytes)
            if got != want:
                raise AssertionError(f"{name}: wrote {got} bytes, expected {want}")
        f.write(b"\0" * (-f.tell() % align))
        f.flush()
        os.fsync(f.fileno())
        w.close()
        os.replace(partial, out)
    except BaseException:
        try:
            w.close()
        except Exception:
            pass
        partial.unlink(missing_ok=True)
        raise
    return total


# --- command line ----------------------------------------------------------------------

class Parser(argparse.ArgumentParser):
    def error(self, message):
        sys.stderr.write(f"{PROG}: error: {message} (see --help)\n")
        sys.exit(2)


def positive_int(s):
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {s!r}")
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {s}")
    return v


def seed_int(s):
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {s!r}")
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {s}")
    return v


def skew_float(s):
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {s!r}")
    if not math.isfinite(v) or v < 0 or v > 20:
        raise argparse.ArgumentTypeError(f"must be between 0 and 20: {s}")
    return v


def main(argv=None):
    p = Parser(prog=PROG, description=(
        "Write a GGUF file with the keys, tensor names, shapes and types llama.cpp's "
        "converter and llama-quantize give Mixtral-8x7B, Qwen3-30B-A3B, DeepSeek-V2-Lite or "
        "gpt-oss-20b, random weights, "
        "the real tokenizer, and routers that do not route uniformly."),
        epilog="Exit status: 0 written, 1 failed while writing (nothing left behind), "
               "2 bad arguments.")
    p.add_argument("--shape", required=True, choices=sorted(SHAPES), help="the model to imitate")
    p.add_argument("--small", action="store_true",
                   help="narrow matrices and fewer layers (8; DeepSeek-V2-Lite keeps its 27, "
                        "which llama.cpp needs): same architecture, vocabulary and type "
                        "rules, a few hundred MB")
    p.add_argument("--type", dest="qtype", default="q4_k_m", choices=["q4_k_m", "q4_k"],
                   help="q4_k_m: llama-quantize's Q4_K_M mix (default); q4_k: every "
                        "quantized matrix Q4_K")
    p.add_argument("--seed", type=seed_int, default=0, help="random seed (default 0)")
    p.add_argument("--skew", type=skew_float, nargs="?", const=SKEW_STRONG, default=SKEW_DEFAULT,
                   help=f"routing skew: 0 random routers, {SKEW_DEFAULT:g} mild (default), "
                        f"--skew alone {SKEW_STRONG:g} (strong)")
    p.add_argument("--layers", type=positive_int, help="override the number of layers "
                   "(the type rules follow it)")
    p.add_argument("--llama-keys-only", action="store_true",
                   help="leave out the fmoe.file.* copies of the tokenizer files (fmoe then "
                        "needs --tokenizer DIR)")
    p.add_argument("--report", metavar="FILE.json",
                   help="also write the tensors' types and the routing estimate as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress or summary on stderr")
    p.add_argument("-o", "--output", required=True, metavar="FILE.gguf", help="the file to write")
    args = p.parse_args(argv)

    out = pathlib.Path(args.output)
    if out.is_dir():
        p.error(f"-o {out}: is a folder")
    if not out.parent.is_dir():
        p.error(f"-o {out}: folder {out.parent} does not exist")
    if args.report:
        rep = pathlib.Path(args.report)
        if rep.resolve() == out.resolve():
            p.error("--report and -o name the same file")
        if rep.is_dir() or not rep.parent.is_dir():
            p.error(f"--report {rep}: not a file in an existing folder")

    def terminated(signum, frame):
        raise KeyboardInterrupt  # write_file removes FILE.partial on its way out
    signal.signal(signal.SIGTERM, terminated)

    t0 = time.monotonic()
    try:
        cfg = model_config(args.shape, args.small, args.layers)
        model = Model(cfg, args.qtype, args.seed, args.skew)
    except UsageError as e:
        p.error(str(e))
    try:
        entropies = model.entropy_estimate()
        total = write_file(model, out, args.llama_keys_only, args.quiet)
    except KeyboardInterrupt:
        sys.stderr.write(f"{PROG}: interrupted; nothing written\n")
        return 130
    except (OSError, RuntimeError, subprocess.CalledProcessError) as e:
        sys.stderr.write(f"{PROG}: {e}\n")
        return 1
    secs = time.monotonic() - t0
    uniform = math.log2(cfg["n_expert"])
    counts = {}
    for name, ne, t, layer in model.tensors:
        counts[t.name] = counts.get(t.name, 0) + 1
    if not args.quiet:
        sys.stderr.write(
            f"{PROG}: wrote {out} ({total / 1e9:.2f} GB of tensors, {len(model.tensors)} tensors: "
            + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) + f") in {secs:.1f} s\n")
        sys.stderr.write(f"{PROG}: estimated routing entropy per layer, bits (uniform "
                         f"{uniform:.2f}), skew {args.skew:g}:\n")
        for i in range(0, len(entropies), 8):
            sys.stderr.write("   " + " ".join(
                f"L{j}=" + ("dense" if entropies[j] is None else f"{entropies[j]:.2f}")
                for j in range(i, min(i + 8, len(entropies)))) + "\n")
    if args.report:
        rep = dict(shape=args.shape, small=args.small, type=args.qtype, seed=args.seed,
                   skew=args.skew, config={k: v for k, v in cfg.items()},
                   tensors=[dict(name=n, ne=list(ne), type=t.name) for n, ne, t, _ in model.tensors],
                   bytes=total, seconds=secs, uniform_entropy=uniform,
                   estimated_entropy=entropies,
                   popular_experts={str(k): v[:4] for k, v in model.rankings.items()},
                   massive_chunk=model.massive_chunk, massive_value=model.massive_value)
        pathlib.Path(args.report).write_text(json.dumps(rep, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
