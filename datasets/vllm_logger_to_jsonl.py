#!/usr/bin/env python3
"""Convert vLLM-MoE-logger routing logs to fmoe's JSON Lines (docs/design.md §4.1).

Input: one JSONL log per MoE layer, as written by the monkey-patched FusedMoE.forward
loggers of github.com/weiran0129/vLLM-MoE-Logger (Qwen1.5-MoE-A2.7B-Chat, vLLM 0.11) and
github.com/KaxitPandya/cerebras-assesment2 (OLMoE-1B-7B-0924, vLLM 0.6.6):

    {"type": "meta", "model_id": ..., "vllm_version": ..., "top_k": 4, ...}
    {"type": "route", "req_id": "r1", "token_idx": 0, "layer": 0,
     "topk_ids": [43, 5, 7, 58], "topk_weights": [0.0966, 0.0517, 0.0390, 0.0370]}

Every file holds one layer; the files of one run must be row-aligned (row i is the same
token in every file). Output: one fmoe record per (row, layer), layers renumbered
0..n-1 in increasing order of the logged layer id, "probs" = the K top-k weights, plus a
first line {"type": "meta", ...} (which `fmoe trace import` skips) recording the source,
the original layer ids and how requests were reconstructed. Python 3 standard library
only.

Why segmentation is needed. The loggers do not identify requests ("req_id" is a
constant), so requests are reconstructed from the engine's batch structure:

  * Forward batches. Where "token_idx" restarts at 0 for every forward pass (the Qwen
    logs), each restart starts a new batch. Where it is one global counter (the OLMoE
    logs), batch boundaries are lost; then only --prefill-tokens can say where the
    prefill batch ends.
  * Prefill. The first batch after --skip-rows is the prefill of all prompts (vLLM
    schedules them together), its tokens in request order. With --prompt-tokens (the
    number of tokens each request computed in that batch, in order) it is split into one
    request per prompt; without it the whole batch becomes one prefill request.
  * Decode. Each later batch is one decode step with one token per live request, in the
    engine's batch-slot order. vLLM V1 (the Qwen logs) keeps a request in its slot while
    the batch size stays the same, but when requests finish InputBatch.condense() moves
    the requests from the last slots into the freed ones, and the log does not say which
    requests finished. So:
      --decode-streams segment (default, exact): one request stream per slot per run of
        equal batch size. Every stream is a contiguous piece of one real request. The
        first run's slot s continues prompt s (same request) when --prompt-tokens gave as
        many prompts as the first decode batch has tokens.
      --decode-streams slot: one stream per slot over the whole decode; after a batch
        shrinks a slot may continue a different request (the condense move), so a stream
        can splice two requests.
    Without batch boundaries (the OLMoE logs) the decode rows become one stream in engine
    order.

Presets (--preset), from the SOURCE.txt of each log set and what the logs show:

  qwen1.5-moe-a2.7b-gsm8k25  weiran0129/vLLM-MoE-Logger @ 2c3c87c, moe_layer{00,08,12,18,23}
      --skip-rows 8513: rows 0..8191 memory-profiling dummy batch, 8192..8447 a 256-token
        warm-up batch, 8448..8512 a 65-token warm-up batch.
      --prompt-tokens 1,26,57,35,...: the 25 GSM8K prompts tokenised with the Qwen2
        tokenizer (Qwen3-30B-A3B's tokenizer.json has the same BPE) are
        65,26,57,35,111,56,42,70,104,60,60,65,67,58,52,94,53,58,29,65,63,46,55,40,39 =
        1,470 tokens, but the prefill batch holds 1,406: prompt 0's first 64 tokens (four
        16-token KV blocks) were served from vLLM's prefix cache, so it computed 1 token.
        Checked on the log: at layer 0 a prompt's first token routes as a function of the
        token id alone, and the rows starting prompts 1, 10, 15, 23 (all "A") are
        identical, as are those starting prompts 6 and 11 ("T"), exactly at the offsets
        these counts give. The first decode batch has 25 tokens = one per prompt.
      Result: 25 prompt requests (1,406 prefill tokens, then 82 decode steps of 25 tokens
        = 2,050) plus 210 decode-only streams over the remaining 45 steps, after the first
        request finished (836 tokens); 235 requests, 4,292 tokens in all.
  olmoe-1b-7b-gsm8k25  KaxitPandya/cerebras-assesment2 @ e89e8f6, moe_routes_layer00
      --skip-rows 2048: the vLLM profiling dummy run (all [7,6,4,5,1,0,2,3], weight .125).
      --prefill-tokens 1377: token_idx is a global counter, so the prefill batch's end is
        not in the log. timing.json reports 3,119 generated tokens for the 25 requests;
        each request's first token comes from the prefill, so 3,119 - 25 = 3,094 decode
        rows and 4,471 - 3,094 = 1,377 prefill rows. The log agrees: the identical
        layer-0 rows of prompts that start alike (prompts 1/10/15/23 "A", 6/11 "T...",
        5/24 "Kylar"/"Kyle") put prompt 24's first token at row 1,340, 37 tokens before
        1,377 (39 in Qwen's tokenizer). The prompt lengths in OLMoE's tokenizer are not recoverable from the
        files at hand, so the prefill stays one request.
      Result: one prefill request of 1,377 tokens and one decode stream of 3,094 tokens.

Usage:
    vllm_logger_to_jsonl.py --preset qwen1.5-moe-a2.7b-gsm8k25 \\
        moe_layer00.jsonl moe_layer08.jsonl ... -o qwen.jsonl
    fmoe trace import --format jsonl --layers 5 --experts 60 --top-k 4 qwen.jsonl -o qwen.h5
"""
import argparse
import json
import os
import sys

PRESETS = {
    "qwen1.5-moe-a2.7b-gsm8k25": {
        "skip_rows": 8513,
        "prompt_tokens": [1, 26, 57, 35, 111, 56, 42, 70, 104, 60, 60, 65, 67, 58, 52, 94,
                          53, 58, 29, 65, 63, 46, 55, 40, 39],
        "prefill_tokens": None,
    },
    "olmoe-1b-7b-gsm8k25": {
        "skip_rows": 2048,
        "prompt_tokens": None,
        "prefill_tokens": 1377,
    },
}


class ConvertError(Exception):
    pass


def read_log(path):
    """Returns (meta dict or {}, layer id, list of (token_idx, ids, weights))."""
    meta, layer, rows = {}, None, []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConvertError(f"{path}:{lineno}: malformed JSON ({e.msg})")
            if not isinstance(rec, dict):
                raise ConvertError(f"{path}:{lineno}: expected a JSON object")
            kind = rec.get("type")
            if kind == "meta":
                meta = rec
                continue
            if kind != "route":
                raise ConvertError(f"{path}:{lineno}: unknown record type {kind!r}")
            try:
                tok, lay = rec["token_idx"], rec["layer"]
                ids, w = rec["topk_ids"], rec["topk_weights"]
            except KeyError as e:
                raise ConvertError(f"{path}:{lineno}: no {e.args[0]!r}")
            if layer is None:
                layer = lay
            elif lay != layer:
                raise ConvertError(f"{path}:{lineno}: layer {lay}, but this file logs layer "
                                   f"{layer} (one layer per file)")
            if not isinstance(ids, list) or not isinstance(w, list) or len(ids) != len(w):
                raise ConvertError(f"{path}:{lineno}: topk_ids and topk_weights must be "
                                   f"lists of equal length")
            rows.append((tok, ids, w, lineno))
    if layer is None:
        raise ConvertError(f"{path}: no route records")
    return meta, layer, rows


def batches_of(token_idx):
    """Start offsets of forward batches where token_idx restarts at 0, or None when it is
    one global counter (no restart)."""
    starts = [i for i, t in enumerate(token_idx) if t == 0]
    if not [i for i in starts if i > 0]:
        return None
    if starts[0] != 0:
        raise ConvertError(f"the first row kept has token_idx {token_idx[0]}, not 0: "
                           f"--skip-rows does not end at a batch boundary (batches start "
                           f"where token_idx is 0, e.g. {starts[0]} rows later)")
    return starts


def segment(n_rows, token_idx, prompt_tokens, prefill_tokens, mode):
    """Assigns every row to (request, phase). Returns a list of (request, phase) per row
    and a list of request descriptions (in order of first appearance)."""
    assign = [None] * n_rows
    requests = []

    def new_request(**desc):
        requests.append(dict(id=len(requests), prefill_tokens=0, decode_tokens=0, **desc))
        return len(requests) - 1

    starts = batches_of(token_idx)
    if starts is not None:
        for b, s in enumerate(starts):
            end = starts[b + 1] if b + 1 < len(starts) else n_rows
            for i in range(s, end):
                if token_idx[i] != i - s:
                    raise ConvertError(f"row {i}: token_idx {token_idx[i]} breaks the batch "
                                       f"starting at row {s}")
        bounds = [(s, starts[b + 1] if b + 1 < len(starts) else n_rows)
                  for b, s in enumerate(starts)]
        if prefill_tokens is not None and prefill_tokens != bounds[0][1]:
            raise ConvertError(f"--prefill-tokens {prefill_tokens}, but the first batch holds "
                               f"{bounds[0][1]} tokens")
    else:
        p = prefill_tokens if prefill_tokens is not None else 0
        if p > n_rows:
            raise ConvertError(f"--prefill-tokens {p} exceeds the {n_rows} rows left")
        bounds = [(0, p)] if p > 0 else []
        if p < n_rows:
            bounds.append((p, n_rows))

    # Prefill batch.
    prompt_req = []
    have_prefill = starts is not None or (prefill_tokens or 0) > 0
    if have_prefill and bounds:
        s, e = bounds[0]
        if prompt_tokens:
            if sum(prompt_tokens) != e - s:
                raise ConvertError(f"--prompt-tokens sum to {sum(prompt_tokens)}, but the "
                                   f"prefill batch holds {e - s} tokens")
            i = s
            for k, n in enumerate(prompt_tokens):
                r = new_request(kind="prompt", prompt=k)
                prompt_req.append(r)
                for _ in range(n):
                    assign[i] = (r, "prefill")
                    i += 1
        else:
            r = new_request(kind="prefill-batch")
            for i in range(s, e):
                assign[i] = (r, "prefill")
        decode_bounds = bounds[1:]
    else:
        decode_bounds = bounds

    if starts is None:
        # No batch boundaries: the decode rows stay one stream in engine order.
        for s, e in decode_bounds:
            r = new_request(kind="decode-stream", note="engine order, steps unknown")
            for i in range(s, e):
                assign[i] = (r, "decode")
    else:
        prev_size, run = None, -1
        stream = {}
        for s, e in decode_bounds:
            size = e - s
            if mode == "segment" and size != prev_size:
                run += 1
                stream = {}
            elif mode == "slot" and run < 0:
                run = 0
            prev_size = size
            for slot in range(size):
                if slot not in stream:
                    if run == 0 and len(prompt_req) == (e - s) and slot < len(prompt_req):
                        stream[slot] = prompt_req[slot]
                    else:
                        stream[slot] = new_request(kind="decode-stream", run=run, slot=slot,
                                                   first_row=s + slot)
                assign[s + slot] = (stream[slot], "decode")
    for a in assign:
        if a is not None:
            requests[a[0]]["prefill_tokens" if a[1] == "prefill" else "decode_tokens"] += 1
    return assign, requests


def describe(have_batches, prompt_tokens, prefill_tokens, mode):
    """One sentence for the output's meta line: how requests were made."""
    if have_batches or prefill_tokens:
        pre = (f"the prefill batch split into {len(prompt_tokens)} requests by prompt_tokens"
               if prompt_tokens else "the prefill batch as one request")
    else:
        pre = "no prefill batch"
    if not have_batches:
        dec = "the decode rows as one stream in engine order (no batch boundaries in the log)"
    elif mode == "segment":
        dec = ("decode rows as one stream per batch slot per run of equal batch size (exact: "
               "vLLM moves requests between slots only when the batch shrinks)")
    else:
        dec = ("decode rows as one stream per batch slot (a slot may continue a different "
               "request after the batch shrinks)")
    return (f"requests are not identified in the log; reconstructed: {pre}; {dec}. "
            f"See datasets/vllm_logger_to_jsonl.py.")


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Convert vLLM-MoE-logger JSONL logs (one file per layer) to fmoe's JSONL "
                    "routing format (docs/design.md §4.1). See the module docstring for how "
                    "requests are reconstructed.")
    ap.add_argument("logs", nargs="+", help="one log file per MoE layer, row-aligned")
    ap.add_argument("-o", "--output", required=True, help="output JSONL file ('-' = stdout)")
    ap.add_argument("--preset", choices=sorted(PRESETS),
                    help="defaults for the published log sets (see the docstring)")
    ap.add_argument("--skip-rows", type=int, default=None,
                    help="route rows to skip at the start of every file (profiling and "
                         "warm-up); default: the preset's, else 0")
    ap.add_argument("--prompt-tokens", default=None,
                    help="comma-separated tokens each request computed in the prefill batch, "
                         "in order (they must sum to the batch size); 'none' = keep the "
                         "prefill batch as one request; default: the preset's, else none")
    ap.add_argument("--prefill-tokens", type=int, default=None,
                    help="rows of the prefill batch, for logs whose token_idx never restarts "
                         "(no batch boundaries); default: the preset's, else 0")
    ap.add_argument("--decode-streams", choices=["segment", "slot"], default="segment",
                    help="segment: a new stream per slot whenever the batch size changes "
                         "(exact; default); slot: one stream per batch slot (may splice "
                         "requests after a request finishes)")
    args = ap.parse_args(argv)

    preset = PRESETS.get(args.preset, {"skip_rows": 0, "prompt_tokens": None,
                                       "prefill_tokens": None})
    skip = args.skip_rows if args.skip_rows is not None else preset["skip_rows"]
    prompt_tokens = preset["prompt_tokens"]
    if args.prompt_tokens is not None:
        if args.prompt_tokens.strip().lower() == "none":
            prompt_tokens = None
        else:
            try:
                prompt_tokens = [int(x) for x in args.prompt_tokens.split(",")]
            except ValueError:
                ap.error("--prompt-tokens: expected comma-separated integers")
            if any(n <= 0 for n in prompt_tokens):
                ap.error("--prompt-tokens: counts must be positive")
    prefill_tokens = (args.prefill_tokens if args.prefill_tokens is not None
                      else preset["prefill_tokens"])
    if skip < 0:
        ap.error("--skip-rows must be >= 0")

    try:
        logs = [(p,) + read_log(p) for p in args.logs]
        logs.sort(key=lambda x: x[2])
        layers = [x[2] for x in logs]
        if len(set(layers)) != len(layers):
            raise ConvertError(f"two files log the same layer ({layers})")
        n = len(logs[0][3])
        for p, _, _, rows in logs:
            if len(rows) != n:
                raise ConvertError(f"{p}: {len(rows)} route rows, but {logs[0][0]} has {n} "
                                   f"(files must be row-aligned)")
        if skip >= n:
            raise ConvertError(f"--skip-rows {skip} leaves nothing of {n} rows")
        token_idx = [r[0] for r in logs[0][3][skip:]]
        for p, _, _, rows in logs[1:]:
            for i, r in enumerate(rows[skip:]):
                if r[0] != token_idx[i]:
                    raise ConvertError(f"{p}:{r[3]}: token_idx {r[0]}, but {logs[0][0]} has "
                                       f"{token_idx[i]} in that row (files not row-aligned)")
        k = len(logs[0][3][skip][1])
        have_batches = batches_of(token_idx) is not None
        assign, requests = segment(n - skip, token_idx, prompt_tokens, prefill_tokens,
                                   args.decode_streams)
    except ConvertError as e:
        print(f"vllm_logger_to_jsonl: {e}", file=sys.stderr)
        return 1

    meta0 = logs[0][1]
    meta = {
        "type": "meta",
        "source": "vllm-moe-logger",
        "converter": "datasets/vllm_logger_to_jsonl.py",
        "model_id": meta0.get("model_id"),
        "vllm_version": meta0.get("vllm_version"),
        "files": [os.path.basename(x[0]) for x in logs],
        "original_layers": layers,
        "layer_map": "output layer i = original_layers[i]",
        "top_k": k,
        "skip_rows": skip,
        "prompt_tokens": prompt_tokens,
        "prefill_tokens": prefill_tokens,
        "decode_streams": args.decode_streams,
        "batches": "token_idx restarts" if have_batches else "none (global counter)",
        "segmentation": describe(have_batches, prompt_tokens,
                                 prefill_tokens, args.decode_streams),
        "requests": requests,
    }
    out = sys.stdout if args.output == "-" else open(args.output, "w", encoding="utf-8")
    position = [0] * len(requests)
    lines = 0
    try:
        out.write(json.dumps(meta) + "\n")
        for i, a in enumerate(assign):
            r, phase = a
            t = position[r]
            position[r] += 1
            for li, (_, _, _, rows) in enumerate(logs):
                _, ids, w, _ = rows[skip + i]
                out.write(json.dumps({"request": r, "token": t, "phase": phase, "layer": li,
                                      "experts": ids, "probs": w}) + "\n")
                lines += 1
    finally:
        if out is not sys.stdout:
            out.close()
    tokens = len(assign)
    prefill = sum(1 for a in assign if a[1] == "prefill")
    print(f"vllm_logger_to_jsonl: {len(requests)} requests, {tokens} tokens ({prefill} "
          f"prefill, {tokens - prefill} decode), {len(logs)} layers {layers}, {lines} lines "
          f"-> {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
