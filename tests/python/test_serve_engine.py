"""`fmoe serve`'s engine: continuous batching, limits, disconnects and shutdown.

The API shapes are checked with the openai client in test_serve.py; these tests drive the
server with http.client so that they control connections (a client that goes away, many at
once) and check what the engine does with them.

Rule for batching (stated in docs/serving.md): a request's greedy output served in a batch of P
sequences is the same as served alone. Every product in fmoe's CPU forward pass computes
each output row from that row's inputs only, in the same order whatever the other rows
are, so batched and alone agree bit for bit (test_batch.c checks the logits); this test
checks the texts.
"""
import concurrent.futures
import http.client
import json
import re
import signal
import socket
import time

import pytest

from serve_util import Server

PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):",
           "The quick brown fox", "In 1492,", "Water boils at", "My favourite colour is",
           "The best way to learn"]


def metric_value(text, name, labels=""):
    for line in text.splitlines():
        if line.startswith(name + labels + " ") or (not labels and line.startswith(name + " ")):
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.fixture
def serial(tmp_path):
    s = Server(tmp_path, "--parallel", 1)
    yield s
    s.stop()


def test_batched_greedy_equals_one_at_a_time(tmp_path, serial):
    alone = {p: serial.complete(p)["choices"][0]["text"] for p in PROMPTS}
    batched = Server(tmp_path, "--parallel", 4)
    try:
        with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as ex:
            got = dict(zip(PROMPTS, ex.map(lambda p: batched.complete(p)["choices"][0]["text"],
                                           PROMPTS)))
        m = batched.metrics_text()
    finally:
        assert batched.stop()[0] == 0
    assert got == alone
    assert len(set(alone.values())) > 1  # the prompts lead to different texts
    # the eight requests ran through the batched engine and finished
    assert metric_value(m, "fmoe_requests_total", '{finish_reason="length"}') == len(PROMPTS)


def test_batched_offloaded_equals_resident(tmp_path, serial):
    alone = {p: serial.complete(p)["choices"][0]["text"] for p in PROMPTS[:4]}
    off = Server(tmp_path, "--parallel", 4, "--cache-experts", 24, "--policy", "lru")
    try:
        with concurrent.futures.ThreadPoolExecutor(4) as ex:
            res = list(ex.map(off.complete, PROMPTS[:4]))
        m = off.metrics_text()
    finally:
        off.stop()
    assert {p: r["choices"][0]["text"] for p, r in zip(PROMPTS[:4], res)} == alone
    for r in res:
        f = r["fmoe"]
        assert f["hits"] + f["misses"] + f["late"] > 0
        assert f["misses"] > 0  # 24 slots of 48 experts: a request cannot hit everything
    hits = sum(float(l.rsplit(" ", 1)[1]) for l in m.splitlines()
               if l.startswith("fmoe_expert_cache_hits_total{"))
    misses = sum(float(l.rsplit(" ", 1)[1]) for l in m.splitlines()
                 if l.startswith("fmoe_expert_cache_misses_total{"))
    assert hits > 0 and misses > 0
    # an access counts for every request whose tokens chose the expert: each request's
    # share is at most the server's total, and together they cover it
    assert max(r["fmoe"]["misses"] for r in res) <= misses
    assert sum(r["fmoe"]["misses"] for r in res) >= misses
    assert max(r["fmoe"]["hits"] for r in res) <= hits


def test_seed_gives_the_same_sample(serial):
    a = serial.complete("Once upon a time", temperature=0.9, seed=7)["choices"][0]["text"]
    b = serial.complete("Once upon a time", temperature=0.9, seed=7)["choices"][0]["text"]
    c = serial.complete("Once upon a time", temperature=0.9, seed=8)["choices"][0]["text"]
    assert a == b
    assert a != c


def test_stop_string_ends_the_text_before_it(serial):
    full = serial.complete("Once upon a time", max_tokens=32)["choices"][0]["text"]
    # a stop string taken from the middle of the greedy output
    stop = full[len(full) // 2: len(full) // 2 + 3]
    assert stop.strip(), full
    r = serial.complete("Once upon a time", max_tokens=32, stop=[stop])
    assert r["choices"][0]["finish_reason"] == "stop"
    assert r["choices"][0]["text"] == full[: full.index(stop)]
    # streamed: no piece of the stop string is ever sent, the pieces add up to the same text
    st, _, body = serial.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 32,
                                                  "temperature": 0, "stop": [stop],
                                                  "stream": True})
    assert st == 200
    pieces = [json.loads(l[6:])["choices"][0]["text"] for l in body.decode().splitlines()
              if l.startswith("data: {") and json.loads(l[6:])["choices"]]
    assert "".join(pieces) == full[: full.index(stop)]


def test_queue_overflow_gets_503_with_retry_after(tmp_path):
    s = Server(tmp_path, "--parallel", 1, "--max-queue", 1)
    try:
        # a burst of 6 long requests at once: one runs, one waits, the others are refused
        body = {"prompt": "Once upon a time", "max_tokens": 1000, "temperature": 0,
                "ignore_eos": True}
        with concurrent.futures.ThreadPoolExecutor(6) as ex:
            res = list(ex.map(lambda _: s.post("/v1/completions", body), range(6)))
        ok = [r for r in res if r[0] == 200]
        refused = [r for r in res if r[0] == 503]
        assert len(ok) + len(refused) == 6
        assert len(ok) >= 2 and len(refused) >= 1
        for st, headers, data in refused:
            assert headers.get("Retry-After") == "1"
            assert "queue" in json.loads(data)["error"]["message"]
        for st, headers, data in ok:
            assert json.loads(data)["usage"]["completion_tokens"] == 1000
    finally:
        s.stop()


def test_disconnect_mid_stream_frees_the_sequence(tmp_path):
    s = Server(tmp_path, "--parallel", 1)
    try:
        sock = socket.create_connection(("127.0.0.1", s.port))
        body = json.dumps({"prompt": "Once upon a time", "max_tokens": 1000, "stream": True,
                           "temperature": 0, "ignore_eos": True}).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\n\r\n" + body)
        got = b""
        while got.count(b"data: ") < 3:
            got += sock.recv(4096)
        sock.close()
        # the only sequence must come free: a new request completes promptly
        t = time.monotonic()
        r = s.complete("Hello", max_tokens=4)
        assert r["choices"][0]["finish_reason"] in ("length", "stop")
        assert time.monotonic() - t < 30
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            m = s.metrics_text()
            if metric_value(m, "fmoe_requests_total", '{finish_reason="cancelled"}') == 1:
                break
            time.sleep(0.1)
        assert metric_value(m, "fmoe_requests_total", '{finish_reason="cancelled"}') == 1
    finally:
        s.stop()


def test_sigterm_finishes_requests_in_flight_and_exits_0(tmp_path):
    """The signal goes while both requests run (/metrics says so), not after a sleep that a
    fast machine outlasts; the requests are long enough (400 tokens, a quarter of a second
    on a fast machine) for the polling to see them, and the grace period long enough for
    any machine to finish them."""
    s = Server(tmp_path, "--parallel", 2, "--grace", 600)
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        fut = [ex.submit(s.post, "/v1/completions",
                         {"prompt": p, "max_tokens": 400, "temperature": 0, "ignore_eos": True},
                         600)
               for p in PROMPTS[:2]]
        deadline = time.monotonic() + 120
        while metric_value(s.metrics_text(), "fmoe_requests_running") != 2:
            assert time.monotonic() < deadline, "the two requests never ran together"
            time.sleep(0.005)
        s.proc.send_signal(signal.SIGTERM)
        results = [f.result() for f in fut]
    rc, err = s.stop(timeout=600)
    assert rc == 0, err
    for st, _, body in results:
        assert st == 200, body
        r = json.loads(body)
        assert r["usage"]["completion_tokens"] == 400


def test_sigterm_with_zero_grace_cuts_requests(tmp_path):
    s = Server(tmp_path, "--parallel", 1, "--grace", 0, "--cache-experts", 4, "--tier", "file")
    c = s.conn(60)
    c.request("POST", "/v1/completions",
              json.dumps({"prompt": "Once upon a time", "max_tokens": 1000, "temperature": 0,
                          "ignore_eos": True, "stream": True,
                          "stream_options": {"include_usage": True}}),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200
    first = r.fp.readline()
    while not first.startswith(b"data: "):
        first = r.fp.readline()
    s.proc.send_signal(signal.SIGTERM)  # the request is running: cut it
    lines = []
    try:
        for line in iter(r.fp.readline, b""):
            lines.append(line.decode(errors="replace").strip())
    except (ConnectionError, OSError):
        pass
    rest = "\n".join(lines)
    rc, err = s.stop()
    assert rc == 0, err
    usage = [json.loads(l[6:])["usage"] for l in rest.splitlines()
             if l.startswith("data: {") and json.loads(l[6:]).get("usage")]
    # the cut request's stream ends properly: a usage chunk with fewer tokens than asked,
    # then [DONE]
    assert usage and usage[-1]["completion_tokens"] < 1000
    assert "data: [DONE]" in rest


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_sustained_streaming_load_no_failure_and_flat_memory(tmp_path):
    """8 streaming clients for a fixed time, twice: every request below the queue limit
    succeeds, and the second pass leaves RSS where the first left it (within 4 MiB)."""
    s = Server(tmp_path, "--parallel", 4, "--max-queue", 16)

    def client(stop_at, out):
        while time.monotonic() < stop_at:
            c = s.conn(60)
            body = json.dumps({"prompt": PROMPTS[len(out) % len(PROMPTS)], "max_tokens": 24,
                               "temperature": 0.7, "seed": len(out), "stream": True})
            c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            r = c.getresponse()
            events = [l for l in r.read().decode().splitlines() if l.startswith("data: ")]
            c.close()
            out.append((r.status, events[-1] if events else ""))

    def one_pass(seconds):
        outs = [[] for _ in range(8)]
        stop_at = time.monotonic() + seconds
        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            list(ex.map(lambda o: client(stop_at, o), outs))
        return [x for o in outs for x in o]

    try:
        first = one_pass(2.0)
        rss1 = rss_kib(s.proc.pid)
        second = one_pass(2.0)
        rss2 = rss_kib(s.proc.pid)
    finally:
        assert s.stop()[0] == 0
    for res in (first, second):
        assert len(res) >= 8
        assert all(st == 200 and last == "data: [DONE]" for st, last in res), res[:3]
    assert abs(rss2 - rss1) <= 4096, (rss1, rss2)


def test_the_ready_line_describes_the_offload_and_the_stop_line_counts_it(tmp_path):
    """Before any request there are no figures: the ready line says how the cache is set
    up (slots, policy), not an all-zero summary; the counts of what the requests made of
    it come when the server stops."""
    s = Server(tmp_path, "--parallel", 1, "--cache-experts", 6, "--policy", "lfu",
               "--tier", "file", quiet=False)
    try:
        assert s.complete("The dictionary type maps keys to values, and", max_tokens=8)
    finally:
        rc, err = s.stop()
    assert rc == 0, err
    ready = [x for x in err.splitlines() if "ready:" in x]
    assert len(ready) == 1 and ready[0].endswith("offload 6 slots, policy lfu"), err
    assert "hits" not in ready[0]
    done = [x for x in err.splitlines() if x.startswith("fmoe serve: offload 6 slots:")]
    assert len(done) == 1, err
    hits, misses = re.search(r"([0-9.]+)% hits \(\d+ late\), (\d+) misses", done[0]).groups()
    assert int(misses) > 0 and "link" in done[0]

