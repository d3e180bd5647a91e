"""`n` choices of `fmoe serve` through the official `openai` client: each choice is a
sequence of its own (the prompt run once per choice, seeds seed, seed+1, ...), with its
own index, finish_reason and logprobs, and usage counting every choice's tokens.
"""
import pytest

import serve_util

openai = pytest.importorskip("openai")

MSGS = [{"role": "user", "content": "Say something about lists."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from serve_util.module_server(tmp_path_factory, "serve-n", "--parallel", "2")


def test_n_sampled_distinct_and_seeded(server):
    cl = server.client()
    kw = dict(model="m", messages=MSGS, max_tokens=12, temperature=1.0, seed=5, n=4)
    r = cl.chat.completions.create(**kw)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    texts = [c.message.content for c in r.choices]
    assert len(set(texts)) > 1, texts
    # choice i is the request with seed 5 + i
    one = cl.chat.completions.create(model="m", messages=MSGS, max_tokens=12, temperature=1.0,
                                     seed=7)
    assert one.choices[0].message.content == texts[2]
    assert cl.chat.completions.create(**kw).choices[3].message.content == texts[3]
    single = [cl.chat.completions.create(model="m", messages=MSGS, max_tokens=12,
                                         temperature=1.0, seed=5 + i) for i in range(4)]
    assert r.usage.completion_tokens == sum(s.usage.completion_tokens for s in single)
    assert r.usage.prompt_tokens == single[0].usage.prompt_tokens


def test_n_greedy_identical_with_logprobs(server):
    r = server.client().completions.create(model="m", prompt="The list", max_tokens=6,
                                           temperature=0, n=3, logprobs=2,
                                           extra_body={"ignore_eos": True})
    assert len(r.choices) == 3
    assert len({c.text for c in r.choices}) == 1
    assert all(c.finish_reason == "length" for c in r.choices)
    assert all(c.logprobs.tokens == r.choices[0].logprobs.tokens for c in r.choices)
    assert r.usage.completion_tokens == 18


def test_n_stream(server):
    cl = server.client()
    kw = dict(model="m", messages=MSGS, max_tokens=10, temperature=1.0, seed=11, n=3,
              logprobs=True)
    plain = cl.chat.completions.create(**kw)
    chunks = list(cl.chat.completions.create(stream=True, stream_options={"include_usage": True},
                                             **kw))
    text = {0: "", 1: "", 2: ""}
    finish = {}
    toks = {0: [], 1: [], 2: []}
    for ch in chunks:
        for c in ch.choices:
            text[c.index] += c.delta.content or ""
            if c.finish_reason:
                finish[c.index] = c.finish_reason
            if c.logprobs:
                toks[c.index] += [t.token for t in c.logprobs.content]
    for c in plain.choices:
        assert text[c.index] == c.message.content
        assert finish[c.index] == c.finish_reason
        assert toks[c.index] == [t.token for t in c.logprobs.content]
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens


def test_n_bounds(server):
    for n in (0, 9):
        st, _, _ = server.post("/v1/chat/completions",
                               {"model": "m", "messages": MSGS, "n": n, "max_tokens": 2})
        assert st == 400
