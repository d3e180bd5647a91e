"""`fmoe serve` under load: does continuous batching pay, and is memory flat.

    .venv/bin/python tests/bench/bench_serve.py [--build build] [--model DIR]
        [--parallel 1,2,4,8] [--clients 8] [--requests 24] [--max-tokens 32]
        [--cache-experts N] [--policy lru] [--threads N] [--serve-args "..."] [--prompt-lines K]
        [--json FILE]

For each P in --parallel: start `fmoe serve --parallel P` on a loopback port, then
--clients concurrent streaming clients send --requests chat requests in all (greedy,
max_tokens fixed, ignore_eos so every request makes the same number of tokens) taken
from datasets/samples/prompts_100.txt. Printed per P:

- aggregate generated tokens/s over the load (first request sent -> last token);
- p50/p99 over requests of the time to first token and of the inter-token latency
  ((last token - first token) / (tokens - 1) of a request), measured by the clients on
  the SSE stream (a client-side view: queueing included);
- the server's RSS (VmRSS from /proc) after a first pass of the same load with other
  prompts (which touches the KV caches and buffers for the first time) and after the
  measured second pass:
  memory must stay flat under sustained load;
- the expert-cache figures summed from the responses' `fmoe` objects when offloaded.

The ratio tokens/s at P against P = 1 is the batching gain: with P sequences every layer's
experts are loaded and multiplied once for all of them.

With --simulate, the server records its traffic (--trace-out) and, after it stops,
`fmoe simulate --batch P --arrivals trace` replays that trace (both passes, at their
measured arrival times) with a profile `fmoe calibrate` measured on this machine (--link
file when --serve-args has --tier file, else host): the predicted tokens/s (output
tokens over the replay's span) and mean TPOT and TTFT are printed next to the measured
ones over the same two passes. Not a test: figures depend on the
machine; run it by hand and put the table in docs/results.md with the machine named.

With --llama-server BIN (llama.cpp's server; tests/bench/bench_cpu_forward.sh says how to
build llama.cpp here), the same load also runs against `llama-server -m MODEL -np P -t
THREADS` on the same --model (a GGUF file, which both servers read), the two servers
alternating for each P and each --repeat (fmoe first on even repeats, llama-server first on
odd ones, so drifting load hits both alike). Each request asks both for the same prompt,
greedy, ignore_eos and max_tokens, so both generate the same number of tokens; the prompt
token counts differ by the chat templates (each server applies its own: fmoe the model
family's, llama-server the GGUF's). The table gains a server column and the fmoe /
llama-server ratios per P over the repeats (range).
"""
import argparse
import http.client
import json
import pathlib
import subprocess
import sys
import tempfile
import threading
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
PROMPTS = REPO / "datasets" / "samples" / "prompts_100.txt"


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def start_server(fmoe, args, parallel, work, trace=None):
    port_file = pathlib.Path(work) / f"port-{parallel}"
    cmd = [fmoe, "serve", "--port", "0", "--port-file", str(port_file), "--parallel",
           str(parallel), "--max-queue", str(max(64, args.requests)), "--quiet"]
    if args.model:
        cmd += ["--model", args.model]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if args.cache_experts:
        cmd += ["--cache-experts", str(args.cache_experts), "--policy", args.policy]
    if args.serve_args:
        cmd += args.serve_args.split()
    if trace:
        cmd += ["--trace-out", str(trace)]
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if p.poll() is not None:
            sys.exit(f"bench_serve: fmoe serve exited {p.returncode}: {p.stderr.read()}")
        if port_file.exists():
            port = int(port_file.read_text())
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    return p, port
            except OSError:
                pass
        time.sleep(0.05)
    p.kill()
    sys.exit("bench_serve: the server did not become ready in 120 s")


def free_port():
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_ready(p, port, name):
    """Until GET /health answers 200 (llama-server answers 503 while it loads the model)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if p.poll() is not None:
            err = p.stderr.read() if p.stderr else ""
            sys.exit(f"bench_serve: {name} exited {p.returncode}: {err[-2000:]}")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    p.kill()
    sys.exit(f"bench_serve: {name} did not become ready in 300 s")


def start_llama_server(args, parallel, work):
    """llama-server on the same model, P slots of the context fmoe serve gives a sequence,
    the same threads for decode and prefill, its defaults otherwise (its prompt cache on:
    the warm-up pass sends other prompts than the measured one, so what the cache saves
    is what a user's distinct prompts would share, the chat template's prefix). Its log
    goes to a file: a pipe nobody reads would fill and stall it."""
    port = free_port()
    cmd = [args.llama_server, "-m", args.model, "--host", "127.0.0.1", "--port", str(port),
           "-np", str(parallel), "-c", str(parallel * args.context), "--no-webui"]
    if args.threads:
        cmd += ["-t", str(args.threads), "-tb", str(args.threads)]
    log = open(pathlib.Path(work) / f"llama-server-{parallel}.log", "w")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)
    log.close()
    try:
        wait_ready(p, port, "llama-server")
    except SystemExit:
        sys.stderr.write((pathlib.Path(work) / f"llama-server-{parallel}.log").read_text()[-2000:])
        raise
    return p, port


def stream_request(port, prompt, max_tokens):
    """One streaming chat request; returns (t_sent, [chunk arrival times], usage, fmoe figures).
    A chunk may carry several tokens (text held back while a UTF-8 sequence or a possible
    stop string is incomplete), so token counts come from `usage`."""
    body = json.dumps({"model": "x", "messages": [{"role": "user", "content": prompt}],
                       "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "ignore_eos": True,
                       "stream_options": {"include_usage": True}})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.monotonic()
    c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"status {r.status}: {r.read()[:200]!r}")
    times, figures, usage = [], {}, {}
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            break
        ev = json.loads(data)
        if ev.get("choices") and ev["choices"][0].get("delta", {}).get("content"):
            times.append(time.monotonic())
        if "fmoe" in ev:
            figures = ev["fmoe"]
        if ev.get("usage"):
            usage = ev["usage"]
    c.close()
    return t0, times, usage, figures


def load(port, prompts, args, first=0):
    """--clients threads share --requests requests, prompts first, first + 1, ... (mod the
    file's 100). Returns per-request results."""
    results, lock, next_i = [], threading.Lock(), [0]

    def worker():
        while True:
            with lock:
                i = next_i[0]
                if i >= args.requests:
                    return
                next_i[0] += 1
            r = stream_request(port, prompts[(first + i) % len(prompts)], args.max_tokens)
            with lock:
                results.append(r)

    threads = [threading.Thread(target=worker) for _ in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def predict(fmoe, args, P, trace, profile, res, t_first, t_end):
    """fmoe simulate --batch P of the served trace against what the clients measured over
    the same requests (both passes)."""
    import h5py  # only here: the trace's figures
    import hdf5plugin  # noqa: F401 (registers the zstd filter)
    cmd = [fmoe, "simulate", "--trace", str(trace), "--batch", str(P), "--arrivals", "trace",
           "--profile", str(profile), "--policy", args.policy, "--json", "--quiet"]
    if args.cache_experts:
        cmd += ["--cache-experts", str(args.cache_experts)]
    else:
        with h5py.File(trace) as f:
            cmd += ["--cache-experts", str(int(f.attrs["num_layers"]) * int(f.attrs["num_experts"]))]
    out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    r = out["results"][0]
    with h5py.File(trace) as f:  # every request ran its last token without feeding it back
        tokens = int(f["requests/output_tokens"][:].sum()) + int(f["requests/id"].shape[0])
        first_arrival = float(f["requests/arrival_s"][:].min())
    tpots = [(ts[-1] - ts[0]) / (u["completion_tokens"] - 1) for _, ts, u, _ in res
             if ts and u["completion_tokens"] > 1]
    ttfts = [ts[0] - t for t, ts, _, _ in res if ts]
    measured_tokens = sum(u["completion_tokens"] for _, _, u, _ in res)
    return {"sim_tokens_per_s": tokens / (r["total_s"] - first_arrival),
            "sim_tpot_s": r["tpot_s"]["mean"], "sim_ttft_s": r["ttft_s"]["mean"],
            "measured_tokens_per_s": measured_tokens / (t_end - t_first),
            "measured_tpot_s": sum(tpots) / len(tpots),
            "measured_ttft_s": sum(ttfts) / len(ttfts)}


def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=str(REPO / "build"))
    ap.add_argument("--model", default=None)
    ap.add_argument("--parallel", default="1,2,4,8")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--cache-experts", type=int, default=0)
    ap.add_argument("--policy", default="lru")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--serve-args", default="",
                    help="more options for fmoe serve, e.g. '--tier file --direct-io'")
    ap.add_argument("--simulate", action="store_true",
                    help="also predict each run with fmoe simulate --batch P (calibrated)")
    ap.add_argument("--llama-server", default=None, metavar="BIN",
                    help="also run the load against llama.cpp's llama-server on --model (a GGUF)")
    ap.add_argument("--context", type=int, default=2048,
                    help="llama-server context per sequence (its -c is P times this)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="with --llama-server: runs of each server per P, alternating order")
    ap.add_argument("--prompt-lines", type=int, default=1,
                    help="join K consecutive lines of the prompt file into each prompt (long "
                         "prompts: bursts of prefill, where --batch-tokens matters)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.llama_server and not (args.model and args.model.endswith(".gguf")):
        ap.error("--llama-server needs --model FILE.gguf: both servers read the same file")
    if args.llama_server and args.simulate:
        ap.error("--simulate and --llama-server are separate runs")
    fmoe = str(pathlib.Path(args.build) / "cmd" / "fmoe")
    prompts = [l.strip() for l in PROMPTS.read_text().splitlines() if l.strip()]
    if args.prompt_lines > 1:  # prompt i: lines i..i+K-1 (mod the file), as many prompts
        prompts = [" ".join(prompts[(i + k) % len(prompts)] for k in range(args.prompt_lines))
                   for i in range(len(prompts))]
    rows = []
    with tempfile.TemporaryDirectory() as work:
        profile = pathlib.Path(work) / "profile.json"
        if args.simulate:
            model = pathlib.Path(args.model) if args.model else REPO / "datasets" / "fmoe-tiny"
            link = ["--link", "file", "--file-dir", work] if "file" in args.serve_args else []
            print("fmoe calibrate ...", file=sys.stderr)
            subprocess.run([fmoe, "calibrate", "--model-config", str(model / "config.json"),
                            *link, "-o", str(profile), "--quiet"], check=True)
        runs = []
        for P in [int(x) for x in args.parallel.split(",")]:
            for k in range(args.repeat if args.llama_server else 1):
                servers = ["fmoe", "llama-server"] if args.llama_server else ["fmoe"]
                runs += [(P, k, name) for name in (servers if k % 2 == 0 else servers[::-1])]
        for P, rep, server in runs:
            trace = pathlib.Path(work) / f"served-{P}.h5" if args.simulate else None
            if server == "fmoe":
                proc, port = start_server(fmoe, args, P, work, trace)
            else:
                proc, port = start_llama_server(args, P, work)
            try:
                t_first = time.monotonic()
                # warm-up: the same load with other prompts (a server that caches prompts
                # must not find the measured ones there)
                warm = load(port, prompts, args, first=args.requests)
                rss0 = rss_mib(proc.pid)
                t0 = time.monotonic()
                res = load(port, prompts, args)
                t1 = max(max(ts) for _, ts, _, _ in res if ts)
                rss1 = rss_mib(proc.pid)
            finally:
                proc.terminate()
                proc.wait(timeout=60)
            sim = predict(fmoe, args, P, trace, profile, warm + res, t_first, t1) if trace else {}
            tokens = sum(u["completion_tokens"] for _, _, u, _ in res)
            ttft = [ts[0] - t for t, ts, _, _ in res if ts]
            itl = [(ts[-1] - ts[0]) / (u["completion_tokens"] - 1) for _, ts, u, _ in res
                   if ts and u["completion_tokens"] > 1]
            cache = {}
            for _, _, _, f in res:
                for k, v in f.items():
                    cache[k] = cache.get(k, 0) + v
            rows.append({"server": server, "repeat": rep, "parallel": P, "tokens": tokens,
                         "seconds": t1 - t0,
                         "tokens_per_s": tokens / (t1 - t0),
                         "ttft_p50_ms": 1e3 * pct(ttft, 0.5), "ttft_p99_ms": 1e3 * pct(ttft, 0.99),
                         "itl_p50_ms": 1e3 * pct(itl, 0.5), "itl_p99_ms": 1e3 * pct(itl, 0.99),
                         "rss_before_mib": rss0, "rss_after_mib": rss1, "fmoe": cache,
                         "simulated": sim})
    if args.llama_server:
        report_against_llama(args, rows)
        return
    base = rows[0]["tokens_per_s"]
    print(f"model {args.model or 'fmoe-tiny (bundled)'}, {args.clients} clients, "
          f"{args.requests} requests x {args.max_tokens} tokens"
          + (f", {args.policy} with {args.cache_experts} expert slots" if args.cache_experts
             else ", every expert resident"))
    print("| P | tokens/s | vs P=1 | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms "
          "| RSS after warm-up MiB | RSS after load MiB | hits | misses |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['parallel']} | {r['tokens_per_s']:.1f} | {r['tokens_per_s'] / base:.2f} "
              f"| {r['ttft_p50_ms']:.0f} | {r['ttft_p99_ms']:.0f} | {r['itl_p50_ms']:.1f} "
              f"| {r['itl_p99_ms']:.1f} | {r['rss_before_mib']:.1f} | {r['rss_after_mib']:.1f} "
              f"| {r['fmoe'].get('hits', '-')} | {r['fmoe'].get('misses', '-')} |")
    if args.simulate:
        print()
        print("| P | measured tokens/s | simulated tokens/s | measured TPOT ms | simulated TPOT ms "
              "| measured TTFT ms | simulated TTFT ms |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            m = r["simulated"]
            print(f"| {r['parallel']} | {m['measured_tokens_per_s']:.1f} "
                  f"| {m['sim_tokens_per_s']:.1f} | {1e3 * m['measured_tpot_s']:.1f} "
                  f"| {1e3 * m['sim_tpot_s']:.1f} | {1e3 * m['measured_ttft_s']:.0f} "
                  f"| {1e3 * m['sim_ttft_s']:.0f} |")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))


def report_against_llama(args, rows):
    """Per server and P: the medians over the repeats; then fmoe / llama-server per P as the
    range of the per-repeat ratios (each repeat's two runs ran back to back)."""
    import statistics
    print(f"model {args.model}, {args.clients} clients, {args.requests} requests x "
          f"{args.max_tokens} tokens, threads {args.threads or 'default'}, "
          f"{args.repeat} run(s) of each server per P (medians)")
    print("| P | server | tokens/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms "
          "| RSS after load MiB |")
    print("|---|---|---|---|---|---|---|---|")
    keys = ["tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms",
            "rss_after_mib"]
    Ps = sorted({r["parallel"] for r in rows})
    for P in Ps:
        for server in ["fmoe", "llama-server"]:
            rs = [r for r in rows if r["parallel"] == P and r["server"] == server]
            m = {key: statistics.median(r[key] for r in rs) for key in keys}
            print(f"| {P} | {server} | {m['tokens_per_s']:.1f} | {m['ttft_p50_ms']:.0f} "
                  f"| {m['ttft_p99_ms']:.0f} | {m['itl_p50_ms']:.1f} | {m['itl_p99_ms']:.1f} "
                  f"| {m['rss_after_mib']:.0f} |")
    print()
    print("| P | tokens/s fmoe / llama-server | TTFT p50 fmoe / llama-server "
          "| ITL p50 fmoe / llama-server |")
    print("|---|---|---|---|")
    for P in Ps:
        ratios = {key: [] for key in ["tokens_per_s", "ttft_p50_ms", "itl_p50_ms"]}
        for k in range(args.repeat):
            pair = {r["server"]: r for r in rows if r["parallel"] == P and r["repeat"] == k}
            for key in ratios:
                ratios[key].append(pair["fmoe"][key] / pair["llama-server"][key])
        cells = [f"{min(v):.2f}-{max(v):.2f}" if len(v) > 1 else f"{v[0]:.2f}"
                 for v in ratios.values()]
        print(f"| {P} | " + " | ".join(cells) + " |")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
