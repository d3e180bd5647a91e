"""Multi-turn chat against `fmoe serve`: what the prefix cache saves.

    .venv/bin/python tests/bench/bench_serve_multiturn.py [--build build] [--model M]
        [--clients 8] [--turns 6] [--max-tokens 24] [--parallel 8] [--threads N]
        [--serve-args "..."] [--llama-server BIN] [--repeat 2] [--json FILE]

Each of --clients clients holds one conversation of --turns turns, as a chat UI does: every
turn resends the whole conversation so far (its earlier user messages and the answers it
got) plus a new user message (lines of datasets/samples/prompts_100.txt), streaming,
greedy, ignore_eos, max_tokens fixed, so every turn generates the same number of tokens
whatever the server. The same conversations run against:

- `fmoe serve` (its prefix cache on, the default: a turn reuses its previous turn's KV
  cache and prefills only the new messages; docs/serving.md, "Prefix cache");
- `fmoe serve --no-prefix-cache` (every turn prefills the whole conversation);
- with --llama-server BIN, llama.cpp's server on the same --model (a GGUF file both read;
  its prompt cache is on by default, `cache_prompt`), `-np --parallel`.

The servers alternate within each --repeat (the order reversed on odd repeats). Printed per
server (medians over the repeats): time to first token p50 and p99 over all turns, and of
the last turn alone (the longest conversation); aggregate generated tokens/s (first request
sent -> last token); the prompt tokens the servers report as cached
(usage.prompt_tokens_details.cached_tokens; llama-server: timings.cache_n) over the
prompt tokens; then fmoe's ratios against the two others. Not a test: figures depend on
the machine and its load; run it by hand and put the table in docs/results.md with the
machine named.
"""
import argparse
import http.client
import json
import pathlib
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import bench_serve  # noqa: E402  (the servers' start-up and readiness checks)

REPO = pathlib.Path(__file__).resolve().parents[2]
PROMPTS = REPO / "datasets" / "samples" / "prompts_100.txt"


def turn(port, messages, max_tokens):
    """One streamed chat turn: (seconds to the first token, the answer's text, usage,
    cached prompt tokens, end time)."""
    body = json.dumps({"model": "x", "messages": messages, "max_tokens": max_tokens,
                       "temperature": 0, "stream": True, "ignore_eos": True,
                       "stream_options": {"include_usage": True}})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.monotonic()
    c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"status {r.status}: {r.read()[:300]!r}")
    first, text, usage, cached = None, [], {}, 0
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            break
        ev = json.loads(data)
        piece = ev.get("choices") and ev["choices"][0].get("delta", {}).get("content")
        if piece:
            first = first or time.monotonic()
            text.append(piece)
        if ev.get("usage"):
            usage = ev["usage"]
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        if ev.get("timings") and "cache_n" in ev["timings"]:  # llama-server's own report
            cached = max(cached, ev["timings"]["cache_n"])
    c.close()
    end = time.monotonic()
    return (first or end) - t0, "".join(text), usage, cached, end


def conversations(port, args, prompts):
    """--clients threads, one conversation each; every turn's figures."""
    out, lock = [], threading.Lock()

    def client(k):
        msgs = [{"role": "system", "content": "You are a helpful assistant."}]
        for t in range(args.turns):
            msgs.append({"role": "user", "content": prompts[(k * args.turns + t) % len(prompts)]})
            ttft, text, usage, cached, end = turn(port, msgs, args.max_tokens)
            msgs.append({"role": "assistant", "content": text})
            with lock:
                out.append({"client": k, "turn": t, "ttft_s": ttft, "end": end,
                            "prompt_tokens": usage.get("prompt_tokens", 0),
                            "completion_tokens": usage.get("completion_tokens", 0),
                            "cached_tokens": cached})

    threads = [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
    t0 = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return t0, out


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


def measure(server, port, args, prompts):
    t0, turns = conversations(port, args, prompts)
    t1 = max(x["end"] for x in turns)
    last = [x["ttft_s"] for x in turns if x["turn"] == args.turns - 1]
    return {"server": server,
            "tokens_per_s": sum(x["completion_tokens"] for x in turns) / (t1 - t0),
            "ttft_p50_ms": 1e3 * pct([x["ttft_s"] for x in turns], 0.5),
            "ttft_p99_ms": 1e3 * pct([x["ttft_s"] for x in turns], 0.99),
            "last_turn_ttft_p50_ms": 1e3 * pct(last, 0.5),
            "prompt_tokens": sum(x["prompt_tokens"] for x in turns),
            "cached_tokens": sum(x["cached_tokens"] for x in turns)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=str(REPO / "build"))
    ap.add_argument("--model", default=None, help="a model folder or GGUF file (default: "
                                                  "the bundled fmoe-tiny)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--context", type=int, default=2048,
                    help="positions per sequence, both servers")
    ap.add_argument("--serve-args", default="", help="more fmoe serve options")
    ap.add_argument("--llama-server", default=None, metavar="BIN")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.llama_server and not (args.model and args.model.endswith(".gguf")):
        ap.error("--llama-server needs --model FILE.gguf: both servers read the same file")
    # what bench_serve's start-up functions read
    args.requests, args.cache_experts, args.policy = 64, 0, "lru"
    fmoe = str(pathlib.Path(args.build) / "cmd" / "fmoe")
    prompts = [l.strip() for l in PROMPTS.read_text().splitlines() if l.strip()]
    servers = ["fmoe", "fmoe --no-prefix-cache"] + (["llama-server"] if args.llama_server else [])
    rows = []
    base_args = args.serve_args
    with tempfile.TemporaryDirectory() as work:
        for rep in range(args.repeat):
            for server in servers if rep % 2 == 0 else servers[::-1]:
                if server == "llama-server":
                    proc, port = bench_serve.start_llama_server(args, args.parallel, work)
                else:
                    args.serve_args = (base_args + f" --max-context {args.context}"
                                       + (" --no-prefix-cache" if "no-prefix" in server else ""))
                    proc, port = bench_serve.start_server(fmoe, args, args.parallel, work)
                try:
                    print(f"{server}, repeat {rep} ...", file=sys.stderr)
                    r = measure(server, port, args, prompts)
                finally:
                    proc.terminate()
                    proc.wait(timeout=60)
                r["repeat"] = rep
                rows.append(r)
    keys = ["tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "last_turn_ttft_p50_ms"]
    print(f"model {args.model or 'fmoe-tiny (bundled)'}; {args.clients} conversations of "
          f"{args.turns} turns x {args.max_tokens} tokens; --parallel {args.parallel}, "
          f"threads {args.threads or 'default'}; medians of {args.repeat} repeats")
    print("| server | tokens/s | TTFT p50 ms | TTFT p99 ms | last turn TTFT p50 ms "
          "| prompt tokens cached |")
    print("|---|---:|---:|---:|---:|---:|")
    med = {}
    for server in servers:
        rs = [r for r in rows if r["server"] == server]
        m = {k: statistics.median(r[k] for r in rs) for k in keys}
        med[server] = m
        cached = sum(r["cached_tokens"] for r in rs) / max(1, sum(r["prompt_tokens"] for r in rs))
        print(f"| {server} | {m['tokens_per_s']:.1f} | {m['ttft_p50_ms']:.0f} "
              f"| {m['ttft_p99_ms']:.0f} | {m['last_turn_ttft_p50_ms']:.0f} | {cached:.0%} |")
    print()
    for other in servers[1:]:
        a, b = med["fmoe"], med[other]
        print(f"fmoe / {other}: tokens/s {a['tokens_per_s'] / b['tokens_per_s']:.2f}x, "
              f"TTFT p50 {a['ttft_p50_ms'] / b['ttft_p50_ms']:.2f}x, last turn's TTFT p50 "
              f"{a['last_turn_ttft_p50_ms'] / b['last_turn_ttft_p50_ms']:.2f}x")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
