"""`fmoe serve` under a slowloris client: 60 connections from one address (127.0.0.2) that
send a request head a few bytes at a time, never finishing it, each trickle well inside the
idle timeout. What must hold, on loopback in a few seconds:

- /health (from 127.0.0.1) answers 200 within 1 s throughout, and a completion, plain and
  streamed, is served meanwhile;
- the server's thread count stays where it was (connections cost no thread);
- the slow client holds at most --client-connections of them at once (the rest are closed
  as they arrive), and those are closed at the request deadline (--timeout), although each
  sent a byte within every idle period.
"""
import json
import os
import socket
import time

import pytest

from serve_util import Server

SLOW = 60
PER_CLIENT = 8
DEADLINE_S = 2
SLOW_ADDR = "127.0.0.2"


def threads_of(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError("no Threads line")


def is_closed(s):
    """True when the server closed (or reset) the connection."""
    s.setblocking(False)
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        s.settimeout(2)


@pytest.fixture
def server(tmp_path):
    probe = socket.socket()
    try:
        probe.bind((SLOW_ADDR, 0))
    except OSError as e:
        pytest.skip(f"cannot bind {SLOW_ADDR} here: {e}")
    finally:
        probe.close()
    s = Server(tmp_path, "--parallel", 1, "--threads", 1, "--timeout", DEADLINE_S,
               "--client-connections", PER_CLIENT)
    yield s
    s.stop()


def test_slow_heads_do_not_block_the_server(server):
    pid = server.proc.pid
    base_threads = threads_of(pid)
    slow = []
    t0 = time.monotonic()
    for i in range(SLOW):
        s = socket.socket()
        s.bind((SLOW_ADDR, 0))
        s.settimeout(2)
        try:
            s.connect(("127.0.0.1", server.port))
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        except OSError:
            pass  # refused outright: as good as closed at once
        slow.append(s)
    health_worst = 0.0
    max_threads = base_threads
    open_at_1s = None
    served = False
    last_trickle = 0.0
    while time.monotonic() - t0 < DEADLINE_S + 1.5:
        now = time.monotonic()
        if now - last_trickle >= 0.5:  # one header line a half second: never idle
            last_trickle = now
            for s in slow:
                try:
                    s.send(b"X-Slow: a\r\n", socket.MSG_DONTWAIT)
                except OSError:
                    pass
        t = time.monotonic()
        st, _, body = server.request("GET", "/health", timeout=1)
        health_worst = max(health_worst, time.monotonic() - t)
        assert st == 200, (st, body, time.monotonic() - t0)
        max_threads = max(max_threads, threads_of(pid))
        if open_at_1s is None and time.monotonic() - t0 >= 1.0:
            open_at_1s = sum(not is_closed(s) for s in slow)
        if not served:
            r = server.complete("Hello", max_tokens=4)
            assert r["choices"][0]["text"] is not None
            st, _, body = server.post("/v1/completions", {"model": "m", "prompt": "Hi",
                                                          "max_tokens": 4, "stream": True})
            assert st == 200 and body.rstrip().endswith(b"data: [DONE]"), body
            served = True
        time.sleep(0.2)
    still_open = sum(not is_closed(s) for s in slow)
    for s in slow:
        s.close()
    print(f"\n/health worst {health_worst * 1e3:.0f} ms; threads {base_threads} -> "
          f"{max_threads}; slow connections open at 1 s: {open_at_1s}, after the deadline: "
          f"{still_open}")
    assert health_worst < 1.0
    assert open_at_1s is not None and open_at_1s <= PER_CLIENT, open_at_1s
    assert still_open == 0, f"{still_open} slow connections outlived the {DEADLINE_S} s deadline"
    assert max_threads <= base_threads + 2, (base_threads, max_threads)
    # the server is still whole: a normal request on a fresh connection
    assert server.complete("Hello again", max_tokens=2)["choices"]
    st, _, body = server.request("GET", "/metrics", timeout=5)
    assert st == 200 and b"fmoe_requests_total" in body
