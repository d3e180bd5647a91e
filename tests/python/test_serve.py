"""`fmoe serve` through the official `openai` client and raw HTTP: the API's shapes.

The engine's scheduling (batching, disconnects, shutdown) is test_serve_engine.py's; this
file checks what a client sees: chat and completions, streamed and not, stop strings,
seeds, usage (prompt token counts from HuggingFace `tokenizers`, not from fmoe), the error
shape and status of bad requests, auth, /health, and /metrics as prometheus_client parses
it. The server runs the bundled fmoe-tiny with half of its experts offloaded, so that the
per-layer expert-cache counters move.
"""
import json
import shutil
import subprocess
import time

import pytest

import serve_util
from conftest import REPO

openai = pytest.importorskip("openai")
prom_parser = pytest.importorskip("prometheus_client.parser")
tokenizers = pytest.importorskip("tokenizers")

TINY = REPO / "datasets" / "fmoe-tiny"


class Server(serve_util.Server):
    def metrics(self):
        status, headers, body = self.request("GET", "/metrics")
        assert status == 200
        assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return {f.name: f for f in prom_parser.text_string_to_metric_families(body.decode())}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("serve"), "--cache-experts", "24", "--parallel", "2")
    yield s
    s.stop()
    assert s.proc.returncode == 0, s.proc.stderr.read()


@pytest.fixture(scope="module")
def hf_tok():
    return tokenizers.Tokenizer.from_file(str(TINY / "tokenizer.json"))


def chatml(messages):
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages) + \
        "<|im_start|>assistant\n"


MSGS = [{"role": "user", "content": "Tell me about lists."}]


def sample(families, family, name, **labels):
    for s in families[family].samples:
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise KeyError(f"{name} {labels}")


# --- chat and completions ----------------------------------------------------------------

def test_models(server):
    models = server.client().models.list()
    assert [m.id for m in models.data] == ["fmoe-tiny"]
    assert models.data[0].owned_by == "fmoe"


def test_chat(server, hf_tok):
    r = server.client().chat.completions.create(model="anything", messages=MSGS, max_tokens=16,
                                                temperature=0)
    assert r.id.startswith("chatcmpl-") and len(r.id) == len("chatcmpl-") + 24
    assert r.object == "chat.completion"
    assert r.model == "fmoe-tiny"
    assert abs(r.created - time.time()) < 600
    c = r.choices[0]
    assert c.index == 0 and c.message.role == "assistant"
    assert isinstance(c.message.content, str) and c.message.content
    assert c.finish_reason in ("stop", "length")
    want_prompt = len(hf_tok.encode(chatml(MSGS), add_special_tokens=False).ids)
    assert r.usage.prompt_tokens == want_prompt
    assert 1 <= r.usage.completion_tokens <= 16
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    extra = r.model_extra
    assert extra["timings"]["prompt_n"] == want_prompt
    assert extra["timings"]["predicted_n"] == r.usage.completion_tokens
    assert extra["fmoe"]["hits"] + extra["fmoe"]["misses"] > 0  # half the experts offloaded


def test_chat_stream_equals_plain(server):
    cl = server.client()
    plain = cl.chat.completions.create(model="m", messages=MSGS, max_tokens=24, temperature=0)
    chunks = list(cl.chat.completions.create(model="m", messages=MSGS, max_tokens=24,
                                             temperature=0, stream=True,
                                             stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")
    assert all(c.object == "chat.completion.chunk" and c.model == "fmoe-tiny" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [plain.choices[0].finish_reason]
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == plain.usage.completion_tokens
    assert last.usage.prompt_tokens == plain.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_completions_plain_and_stream(server, hf_tok):
    cl = server.client()
    prompt = "The list"
    plain = cl.completions.create(model="m", prompt=prompt, max_tokens=12, temperature=0)
    assert plain.object == "text_completion" and plain.id.startswith("cmpl-")
    assert plain.usage.prompt_tokens == len(hf_tok.encode(prompt).ids)
    chunks = list(cl.completions.create(model="m", prompt=prompt, max_tokens=12,
                                        temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.choices[0].text
    assert chunks[-1].choices[0].finish_reason == plain.choices[0].finish_reason
    # Token ids as the prompt give the same text.
    ids = hf_tok.encode(prompt).ids
    by_ids = cl.completions.create(model="m", prompt=ids, max_tokens=12, temperature=0)
    assert by_ids.choices[0].text == plain.choices[0].text


def test_ignore_eos_gives_exactly_max_tokens(server):
    r = server.client().completions.create(model="m", prompt="x", max_tokens=7, temperature=0,
                                           extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 7
    assert r.choices[0].finish_reason == "length"


def test_stop_string(server):
    cl = server.client()
    full = cl.completions.create(model="m", prompt="The list", max_tokens=40, temperature=0,
                                 extra_body={"ignore_eos": True}).choices[0].text
    assert len(full) > 12, full
    stop = full[len(full) // 2:len(full) // 2 + 3]
    want = full[:full.find(stop)]
    for stream in (False, True):
        if stream:
            chunks = list(cl.completions.create(model="m", prompt="The list", max_tokens=40,
                                                temperature=0, stop=[stop, "\u00a7never"],
                                                stream=True))
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            reason = chunks[-1].choices[0].finish_reason
        else:
            r = cl.completions.create(model="m", prompt="The list", max_tokens=40,
                                      temperature=0, stop=stop)
            text, reason = r.choices[0].text, r.choices[0].finish_reason
        assert text == want, (stop, full)
        assert reason == "stop"


def test_seed_reproducible(server):
    cl = server.client()

    def gen(seed):
        return cl.chat.completions.create(model="m", messages=MSGS, max_tokens=16,
                                          temperature=1.0, seed=seed).choices[0].message.content

    assert gen(42) == gen(42)
    assert len({gen(s) for s in (1, 2, 3, 4)}) > 1


def test_bad_request_through_client(server):
    cl = server.client()
    with pytest.raises(openai.BadRequestError) as e:
        cl.chat.completions.create(model="m", messages=MSGS, n=9)
    assert e.value.status_code == 400
    body = e.value.body
    err = body.get("error", body) if isinstance(body, dict) else {}
    assert err["param"] == "n" and err["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError):
        cl.chat.completions.create(model="m", messages=MSGS, max_tokens=100000)
    with pytest.raises(openai.BadRequestError):
        cl.completions.create(model="m", prompt="x", stop=["a", "b", "c", "d", "e"])


# --- raw HTTP -----------------------------------------------------------------------------

def error_of(body):
    e = json.loads(body)["error"]
    assert set(e) == {"message", "type", "param", "code"}
    assert isinstance(e["message"], str) and e["message"]
    return e


def test_raw_errors(server):
    h = {"Content-Type": "application/json"}
    status, _, body = server.request("POST", "/v1/chat/completions", b'{"messages": [', h)
    assert status == 400 and "JSON" in error_of(body)["message"]
    status, _, body = server.request("POST", "/v1/chat/completions", b"[1, 2]", h)
    assert status == 400
    bad = b'{"messages": [{"role": "user", "content": "caf\xc3"}]}'
    status, _, body = server.request("POST", "/v1/chat/completions", bad, h)
    e = error_of(body)
    offset = bad.index(b"\xc3")
    assert status == 400 and f"byte {offset}" in e["message"]
    status, _, body = server.request("POST", "/v1/chat/completions",
                                     json.dumps({"messages": MSGS, "temperature": "hot"}), h)
    assert status == 400 and error_of(body)["param"] == "temperature"
    status, _, body = server.request("GET", "/v1/nope")
    assert status == 404 and error_of(body)["type"] == "invalid_request_error"
    status, _, body = server.request("GET", "/v1/chat/completions")
    assert status == 405
    big = b'{"prompt": "' + b"a" * (1 << 20) + b'"}'
    status, _, body = server.request("POST", "/v1/completions", big, h)
    assert status == 413 and error_of(body)


def test_health(server):
    status, headers, body = server.request("GET", "/health")
    assert status == 200 and json.loads(body) == {"status": "ok"}
    assert headers["Content-Type"] == "application/json"


def test_metrics(server):
    before = server.metrics()
    for name, kind in [("fmoe_time_to_first_token_seconds", "histogram"),
                       ("fmoe_inter_token_latency_seconds", "histogram"),
                       ("fmoe_request_latency_seconds", "histogram"),
                       ("fmoe_request_queue_time_seconds", "histogram"),
                       ("fmoe_requests_running", "gauge"), ("fmoe_requests_waiting", "gauge"),
                       ("fmoe_prompt_tokens", "counter"), ("fmoe_generation_tokens", "counter"),
                       ("fmoe_requests", "counter"), ("fmoe_http_requests", "counter"),
                       ("fmoe_expert_cache_hits", "counter"),
                       ("fmoe_expert_cache_misses", "counter"),
                       ("fmoe_expert_cache_late", "counter"),
                       ("fmoe_expert_prefetch_issued", "counter"),
                       ("fmoe_expert_prefetch_useful", "counter"),
                       ("fmoe_expert_load_bytes", "counter"),
                       ("fmoe_expert_cache_resident", "gauge"),
                       ("fmoe_expert_stall_seconds", "counter")]:
        assert before[name].type == kind, name
    layers = sorted(int(s.labels["layer"]) for s in before["fmoe_expert_cache_hits"].samples)
    assert layers == list(range(6))
    resident = sum(s.value for s in before["fmoe_expert_cache_resident"].samples)
    assert 0 < resident <= 24

    r = server.client().completions.create(model="m", prompt="The list", max_tokens=5,
                                           temperature=0, extra_body={"ignore_eos": True})
    after = server.metrics()

    def total(fam, name):
        return sum(s.value for s in fam.samples if s.name == name)

    assert (sample(after, "fmoe_generation_tokens", "fmoe_generation_tokens_total")
            - sample(before, "fmoe_generation_tokens", "fmoe_generation_tokens_total")) == 5
    assert (sample(after, "fmoe_prompt_tokens", "fmoe_prompt_tokens_total")
            - sample(before, "fmoe_prompt_tokens", "fmoe_prompt_tokens_total")) == r.usage.prompt_tokens
    assert (sample(after, "fmoe_requests", "fmoe_requests_total", finish_reason="length")
            - sample(before, "fmoe_requests", "fmoe_requests_total", finish_reason="length")) == 1
    assert (sample(after, "fmoe_http_requests", "fmoe_http_requests_total", code="200")
            > sample(before, "fmoe_http_requests", "fmoe_http_requests_total", code="200"))
    accesses = lambda f: (total(f["fmoe_expert_cache_hits"], "fmoe_expert_cache_hits_total")
                          + total(f["fmoe_expert_cache_misses"], "fmoe_expert_cache_misses_total"))
    assert accesses(after) > accesses(before)
    ttft = after["fmoe_time_to_first_token_seconds"]
    assert (sample(after, ttft.name, ttft.name + "_count")
            > sample(before, ttft.name, ttft.name + "_count"))
    buckets = [s.value for s in ttft.samples if s.name.endswith("_bucket")]
    assert buckets == sorted(buckets)
    assert sample(after, ttft.name, ttft.name + "_bucket", le="+Inf") == \
        sample(after, ttft.name, ttft.name + "_count")


# --- auth ---------------------------------------------------------------------------------

def test_api_key(tmp_path):
    s = Server(tmp_path, "--api-key", "sekret")
    try:
        with pytest.raises(openai.AuthenticationError):
            s.client("wrong").models.list()
        with pytest.raises(openai.AuthenticationError):
            s.client("wrong").chat.completions.create(model="m", messages=MSGS, max_tokens=2)
        r = s.client("sekret").chat.completions.create(model="m", messages=MSGS, max_tokens=2)
        assert r.usage.completion_tokens >= 1
        status, headers, body = s.request("POST", "/v1/completions", b'{"prompt":"x"}')
        assert status == 401 and error_of(body)["code"] == "invalid_api_key"
        assert s.request("GET", "/health")[0] == 200
        assert s.request("GET", "/metrics")[0] == 200
    finally:
        s.stop()


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl(server):
    """The curl example of docs/serving.md, and a streamed one: what a shell user sees."""
    url = f"http://127.0.0.1:{server.port}/v1/chat/completions"
    body = json.dumps({"messages": MSGS, "max_tokens": 8, "temperature": 0})
    p = subprocess.run(["curl", "-sS", "--fail-with-body", url, "-H",
                        "Content-Type: application/json", "-d", body],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["object"] == "chat.completion" and r["usage"]["completion_tokens"] >= 1
    text = r["choices"][0]["message"]["content"]
    stream = json.dumps({"messages": MSGS, "max_tokens": 8, "temperature": 0, "stream": True})
    p = subprocess.run(["curl", "-sSN", url, "-H", "Content-Type: application/json", "-d",
                        stream], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    events = [l[6:] for l in p.stdout.splitlines() if l.startswith("data: ")]
    assert events[-1] == "[DONE]"
    pieces = [json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-1]
              if json.loads(e)["choices"]]
    assert "".join(pieces) == text
    p = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", url, "-d",
                        "{not json"], capture_output=True, text=True, timeout=60)
    assert p.stdout == "400"
