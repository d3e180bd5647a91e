"""`fmoe serve` under a slowloris client: 60 connections from one address (127.0.0.2) that
send a request head a few bytes at a time, never finishing it, each trickle well inside the
idle timeout. What must hold, on loopback in a few seconds:

- /health (from 127.0.0.1) answers 200 within 1 s throughout, and a completion, plain and
  streamed, is served meanwhile;
- the server's thread count stays where it was (connections cost no thread);
- the slow client holds at most --client-connections of them at once (the rest are closed
  as they arrive), and those are closed at the request deadline (--timeout), although each
  sent a byte within every idle period.

And against a lock-out: slow connections from several addresses (127.0.0.2 to .9) fill the
connection table, and a legitimate client from 127.0.0.1 is still served at once, every
time, while they trickle and reconnect; a connection that has not sent a whole request head
within --header-timeout is closed, well before the request --timeout, and so is a kept-alive
connection idle that long.
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
# The legitimate client's latency bounds are for a plain build; an ASan build serves 2-3x
# slower (and in CI its pass runs beside another), so they stretch by 3 there. The lock-out
# these tests guard against held a client for the whole --timeout (30 s): still far above.
LATENCY_SCALE = 3 if "ASAN_OPTIONS" in os.environ else 1
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


def need_addresses(*addrs):
    for a in addrs:
        probe = socket.socket()
        try:
            probe.bind((a, 0))
        except OSError as e:
            pytest.skip(f"cannot bind {a} here: {e}")
        finally:
            probe.close()


@pytest.fixture
def server(tmp_path):
    need_addresses(SLOW_ADDR)
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
        st, _, body = server.request("GET", "/health", timeout=1 * LATENCY_SCALE)
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
    assert health_worst < 1.0 * LATENCY_SCALE
    assert open_at_1s is not None and open_at_1s <= PER_CLIENT, open_at_1s
    assert still_open == 0, f"{still_open} slow connections outlived the {DEADLINE_S} s deadline"
    assert max_threads <= base_threads + 2, (base_threads, max_threads)
    # the server is still whole: a normal request on a fresh connection
    assert server.complete("Hello again", max_tokens=2)["choices"]
    st, _, body = server.request("GET", "/metrics", timeout=5)
    assert st == 200 and b"fmoe_requests_total" in body


def open_slow(port, addr):
    """A connection from addr that sends the start of a request head and no more; None
    when the server refused or closed it at once."""
    s = socket.socket()
    s.bind((addr, 0))
    s.settimeout(2)
    try:
        s.connect(("127.0.0.1", port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
    except OSError:
        s.close()
        return None
    return s


def hold_lockout(server, addrs, per_addr, seconds, reconnect, limit=None):
    """Opens per_addr slow connections from each of addrs and keeps them trickling (one
    header line each 0.5 s; with reconnect, every closed one is opened again) for
    `seconds`, while a legitimate client on 127.0.0.1 asks for /health and a completion
    with a 3 s timeout each, in turn (limit: the server's --max-connections, which the
    count waits up to 1 s to come within). @return (worst legitimate latency in s, most slow
    connections seen open at once, slow connections opened in all)."""
    slow = [(a, open_slow(server.port, a)) for a in addrs for _ in range(per_addr)]
    opened = len(slow)
    t0 = time.monotonic()
    worst = 0.0
    most_open = 0
    last_trickle = 0.0
    while time.monotonic() - t0 < seconds:
        if time.monotonic() - last_trickle >= 0.5:
            last_trickle = time.monotonic()
            for i, (a, s) in enumerate(slow):
                if s is not None:
                    try:
                        s.send(b"X-Slow: a\r\n", socket.MSG_DONTWAIT)
                        continue
                    except OSError:
                        s.close()
                if reconnect:
                    slow[i] = (a, open_slow(server.port, a))
                    opened += 1
                else:
                    slow[i] = (a, None)
        t = time.monotonic()
        st, _, body = server.request("GET", "/health", timeout=3 * LATENCY_SCALE)
        assert st == 200, ("health", st, body, time.monotonic() - t0)
        st, _, body = server.post("/v1/completions", {"model": "m", "prompt": "Hi",
                                                      "max_tokens": 2, "temperature": 0},
                                  timeout=3 * LATENCY_SCALE)
        assert st == 200, ("completion", st, body, time.monotonic() - t0)
        worst = max(worst, time.monotonic() - t)
        # counted a while after the last (re)connections, once the server has accepted
        # them and closed what they displaced, and the closes have reached us (on a loaded
        # machine that may take longer: up to 1 s)
        for _ in range(10):
            time.sleep(0.1)
            now_open = sum(s is not None and not is_closed(s) for _, s in slow)
            if limit is None or now_open <= limit:
                break
        most_open = max(most_open, now_open)
    for _, s in slow:
        if s is not None:
            s.close()
    return worst, most_open, opened


def test_four_addresses_cannot_lock_out_a_client(tmp_path):
    """The old lock-out with the defaults: 256 slow connections, 64 (the per-address cap)
    from each of four addresses, filled a hard-coded table of 256 and every other client
    waited in the listen backlog for the whole --timeout (30 s)."""
    addrs = [f"127.0.0.{i}" for i in range(2, 6)]
    need_addresses(*addrs)
    server = Server(tmp_path, "--parallel", 1, "--threads", 1)
    try:
        worst, most_open, _ = hold_lockout(server, addrs, 64, 3.0, reconnect=False)
    finally:
        server.stop()
    print(f"\nlegitimate client worst {worst * 1e3:.0f} ms; slow connections open: {most_open}")
    assert worst < 2.0 * LATENCY_SCALE, worst


def test_full_table_makes_room_for_a_client(tmp_path):
    """Eight addresses trickle and reconnect, four times as many connections as
    --max-connections allows: the table stays within it (each new one takes the place of
    the one that waited longest for its request head) and the legitimate client is served
    at once whenever it asks."""
    addrs = [f"127.0.0.{i}" for i in range(2, 10)]
    need_addresses(*addrs)
    limit = 32
    server = Server(tmp_path, "--parallel", 1, "--threads", 1, "--max-connections", limit,
                    "--client-connections", 0)
    try:
        worst, most_open, opened = hold_lockout(server, addrs, 16, 3.0, reconnect=True,
                                                 limit=limit)
        st, _, body = server.request("GET", "/metrics", timeout=5)
        assert st == 200 and b"fmoe_requests_total" in body
    finally:
        server.stop()
    print(f"\nlegitimate client worst {worst * 1e3:.0f} ms; slow connections open at most "
          f"{most_open} of {opened} opened")
    assert worst < 2.0 * LATENCY_SCALE, worst
    assert most_open <= limit, most_open
    assert opened > 4 * limit  # the slow client did keep coming back


def test_header_timeout_closes_slow_heads_and_idle_connections(tmp_path):
    """--header-timeout 1 with --timeout 30: a connection trickling its head is closed at
    about 1 s, not 30, and so is a kept-alive connection idle after its request; a request
    whose head came in time is still answered in full."""
    need_addresses(SLOW_ADDR)
    server = Server(tmp_path, "--parallel", 1, "--threads", 1, "--timeout", 30,
                    "--header-timeout", 1)
    try:
        slow = [open_slow(server.port, SLOW_ADDR) for _ in range(4)]
        assert all(s is not None for s in slow)
        idle = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        body = json.dumps({"model": "m", "prompt": "Hi", "max_tokens": 1}).encode()
        idle.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        got = b""
        while not got.endswith(b"}"):  # the whole JSON reply; the connection stays open
            got += idle.recv(4096)
        assert got.startswith(b"HTTP/1.1 200 ") and b"close" not in got.lower(), got
        t0 = time.monotonic()
        closed_at = None
        while time.monotonic() - t0 < 4.0:
            for s in slow:
                try:
                    s.send(b"X-Slow: a\r\n", socket.MSG_DONTWAIT)
                except OSError:
                    pass
            if all(is_closed(s) for s in slow):
                closed_at = time.monotonic() - t0
                break
            time.sleep(0.2)
        idle_closed = is_closed(idle)
        for s in slow:
            s.close()
        idle.close()
        assert closed_at is not None and closed_at < 3.0, closed_at
        assert idle_closed
        # a request sent at once is served, body and all
        assert server.complete("Hello", max_tokens=2)["choices"]
    finally:
        server.stop()
