"""`logprobs` of `fmoe serve` through the official `openai` client, against an independent
computation: `fmoe generate --dump-logits` runs the same prompt greedily in its own process
and numpy's log-softmax of its logits is what the server must report (the raw model
distribution, before temperature, top-k and top-p). Also: the shape of both endpoints'
logprobs, streaming against not streaming, and the refusals of bad values.
"""
import json
import subprocess

import numpy as np
import pytest

import serve_util
from conftest import REPO

openai = pytest.importorskip("openai")
tokenizers = pytest.importorskip("tokenizers")

TINY = REPO / "datasets" / "fmoe-tiny"
PROMPT = "The list"
N = 8
MSGS = [{"role": "user", "content": "Say something about lists."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from serve_util.module_server(tmp_path_factory, "serve-lp", "--parallel", "2")


@pytest.fixture(scope="module")
def hf_tok():
    return tokenizers.Tokenizer.from_file(str(TINY / "tokenizer.json"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory, fmoe_bin):
    """(ids, log_softmax rows) of `fmoe generate` on PROMPT, greedy, N tokens."""
    npy = tmp_path_factory.mktemp("gen") / "logits.npy"
    out = subprocess.run([str(fmoe_bin), "generate", "--prompt", PROMPT, "--temperature", "0",
                          "--max-new-tokens", str(N), "--ignore-eos", "--json",
                          "--dump-logits", str(npy)],
                         capture_output=True, text=True, timeout=120, check=True)
    ids = json.loads(out.stdout)["generated_ids"]
    x = np.load(npy).astype(np.float64)
    assert x.shape[0] == N == len(ids)
    m = x.max(axis=1, keepdims=True)
    return ids, x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


def test_completion_logprobs_match_generate(server, reference, hf_tok):
    ids, lsm = reference
    r = server.client().completions.create(model="m", prompt=PROMPT, max_tokens=N,
                                           temperature=0, logprobs=5,
                                           extra_body={"ignore_eos": True})
    c = r.choices[0]
    lp = c.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == N
    assert lp.tokens == [hf_tok.decode([i]) for i in ids]
    assert "".join(lp.tokens) == c.text
    assert lp.text_offset == [sum(len(t.encode()) for t in lp.tokens[:k]) for k in range(N)]
    for k in range(N):
        # the chosen token: its logprob is the row's maximum (greedy), as generate computed
        assert lp.token_logprobs[k] == pytest.approx(lsm[k, ids[k]], abs=2e-3)
        assert lp.token_logprobs[k] == pytest.approx(lsm[k].max(), abs=2e-3)
        top = list(lp.top_logprobs[k].values())
        assert top == sorted(top, reverse=True)
        assert len(top) <= 5
        # the top 5 values are generate's five largest (pieces may coincide: <= 5 keys)
        want = np.sort(lsm[k])[::-1][:5]
        for v in top:
            assert np.min(np.abs(want - v)) < 2e-3
        assert max(top) == pytest.approx(lp.token_logprobs[k], abs=1e-6)
        assert np.exp(np.array(top)).sum() <= 1 + 1e-5
    assert np.exp(sum(lp.token_logprobs)) <= 1


def test_chat_logprobs_shape_stream_and_plain(server):
    cl = server.client()
    plain = cl.chat.completions.create(model="m", messages=MSGS, max_tokens=10, temperature=0,
                                       logprobs=True, top_logprobs=3)
    content = plain.choices[0].logprobs.content
    assert len(content) == plain.usage.completion_tokens or plain.choices[0].finish_reason == "stop"
    assert "".join(t.token for t in content) == plain.choices[0].message.content
    for t in content:
        assert bytes(t.bytes).decode() == t.token
        assert len(t.top_logprobs) == 3
        tops = [a.logprob for a in t.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        assert t.logprob == pytest.approx(tops[0], abs=1e-6)  # greedy: the most likely
        assert t.token == t.top_logprobs[0].token
        assert t.logprob <= 0
    chunks = list(cl.chat.completions.create(model="m", messages=MSGS, max_tokens=10,
                                             temperature=0, logprobs=True, top_logprobs=3,
                                             stream=True))
    streamed = [t for ch in chunks if ch.choices and ch.choices[0].logprobs
                for t in ch.choices[0].logprobs.content]
    assert [t.token for t in streamed] == [t.token for t in content]
    assert [t.logprob for t in streamed] == pytest.approx([t.logprob for t in content], abs=1e-5)
    # each chunk's tokens are its text
    for ch in chunks:
        if ch.choices and ch.choices[0].delta.content:
            assert "".join(t.token for t in ch.choices[0].logprobs.content) == \
                ch.choices[0].delta.content
    # without logprobs: null
    r = cl.chat.completions.create(model="m", messages=MSGS, max_tokens=2, temperature=0)
    assert r.choices[0].logprobs is None


def test_completion_stream_agrees(server):
    cl = server.client()
    kw = dict(model="m", prompt=PROMPT, max_tokens=N, temperature=0, logprobs=2,
              extra_body={"ignore_eos": True})
    plain = cl.completions.create(**kw).choices[0].logprobs
    chunks = list(cl.completions.create(stream=True, **kw))
    toks, lps, offs = [], [], []
    for ch in chunks:
        if ch.choices and ch.choices[0].logprobs:
            toks += ch.choices[0].logprobs.tokens
            lps += ch.choices[0].logprobs.token_logprobs
            offs += ch.choices[0].logprobs.text_offset
    assert toks == plain.tokens and offs == plain.text_offset
    assert lps == pytest.approx(plain.token_logprobs, abs=1e-5)


def test_sampled_logprobs_are_of_the_raw_distribution(server):
    # at temperature 2 the chosen token need not be the likeliest, but its logprob is
    # still log_softmax(logits): it appears among the top 20 with the same value or below
    r = server.client().chat.completions.create(model="m", messages=MSGS, max_tokens=8,
                                                temperature=2, seed=7, logprobs=True,
                                                top_logprobs=20)
    # the first token's distribution is the prompt's whatever the sampling: the same top 20
    # as greedy decoding reports (a temperature-scaled one would be flatter)
    g = server.client().chat.completions.create(model="m", messages=MSGS, max_tokens=1,
                                                temperature=0, logprobs=True, top_logprobs=20)
    first, greedy = r.choices[0].logprobs.content[0], g.choices[0].logprobs.content[0]
    assert [a.token for a in first.top_logprobs] == [a.token for a in greedy.top_logprobs]
    assert [a.logprob for a in first.top_logprobs] == \
        pytest.approx([a.logprob for a in greedy.top_logprobs], abs=1e-4)
    for t in r.choices[0].logprobs.content:
        tops = {a.token: a.logprob for a in t.top_logprobs}
        assert len(t.top_logprobs) == 20
        if t.token in tops:
            assert tops[t.token] == pytest.approx(t.logprob, abs=1e-6)
        else:
            assert t.logprob <= min(tops.values()) + 1e-6


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"prompt": "x", "logprobs": 6}, "logprobs"),
    ("/v1/completions", {"prompt": "x", "logprobs": -1}, "logprobs"),
    ("/v1/chat/completions", {"messages": MSGS, "logprobs": True, "top_logprobs": 21},
     "top_logprobs"),
    ("/v1/chat/completions", {"messages": MSGS, "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": MSGS, "logprobs": "yes"}, "logprobs"),
])
def test_bad_values(server, path, body, param):
    status, _, data = server.post(path, {"model": "m", "max_tokens": 2, **body})
    assert status == 400
    e = json.loads(data)["error"]
    assert set(e) == {"message", "type", "param", "code"}
    assert e["type"] == "invalid_request_error" and e["param"] == param


def test_bad_value_through_client(server):
    with pytest.raises(openai.BadRequestError) as e:
        server.client().chat.completions.create(model="m", messages=MSGS, logprobs=True,
                                                top_logprobs=21)
    assert e.value.status_code == 400
