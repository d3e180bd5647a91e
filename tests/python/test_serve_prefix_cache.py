"""Prefix reuse in `fmoe serve` (docs/serving.md, "Prefix cache"), through the official
`openai` client: a finished request's sequence keeps its KV cache, and a later request
whose prompt starts with the same tokens (the next turn of a chat, which resends the whole
conversation) prefills only the rest. Checked against a server with --no-prefix-cache:
greedy answers identical over interleaved multi-turn conversations that outnumber the
sequences (so caches are evicted and reused across conversations); the cached counts each
response reports (usage.prompt_tokens_details.cached_tokens, timings.cache_n) against the
prompts' common prefixes counted with the HF `tokenizers` library on the model's
tokenizer.json, and their sum against /metrics' counter; nothing reused with --trace-out.
"""
import pathlib
import random

import pytest

import serve_util

openai = pytest.importorskip("openai")
tokenizers = pytest.importorskip("tokenizers")

REPO = pathlib.Path(__file__).resolve().parents[2]
TINY = REPO / "datasets" / "fmoe-tiny"
WORDS = ("lists sorting graphs trees heaps queues stacks arrays strings maps sets "
         "numbers primes loops tests").split()


@pytest.fixture(scope="module")
def cached(tmp_path_factory):
    yield from serve_util.module_server(tmp_path_factory, "prefix-on", "--parallel", "2")


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    yield from serve_util.module_server(tmp_path_factory, "prefix-off", "--parallel", "2",
                                        "--no-prefix-cache")


def cached_total(server):
    for line in server.metrics_text().splitlines():
        if line.startswith("fmoe_prefix_cache_hit_tokens_total "):
            return int(float(line.split()[1]))
    raise AssertionError("no fmoe_prefix_cache_hit_tokens_total in /metrics")


def run_conversations(server, seed, turns=3, conversations=3):
    """Interleaved multi-turn chats, greedy: turn t of every conversation, then t + 1.
    Returns every answer and every response's usage, in order."""
    rng = random.Random(seed)
    cl = server.client()
    convs = [[{"role": "user", "content": " ".join(rng.choices(WORDS, k=6))}]
             for _ in range(conversations)]
    answers, usages = [], []
    for t in range(turns):
        for msgs in convs:
            r = cl.chat.completions.create(model="m", messages=msgs, max_tokens=6,
                                           temperature=0)
            text = r.choices[0].message.content
            answers.append(text)
            usages.append(r.usage)
            msgs.append({"role": "assistant", "content": text})
            msgs.append({"role": "user", "content": " ".join(rng.choices(WORDS, k=4))})
    return answers, usages


def test_multi_turn_answers_equal_without_the_cache(cached, plain):
    before = cached_total(cached)
    a_on, u_on = run_conversations(cached, seed=3)
    a_off, u_off = run_conversations(plain, seed=3)
    assert a_on == a_off
    assert [u.prompt_tokens for u in u_on] == [u.prompt_tokens for u in u_off]
    assert all(u.prompt_tokens_details.cached_tokens == 0 for u in u_off)
    hits = [u.prompt_tokens_details.cached_tokens for u in u_on]
    # three conversations on two sequences: a later turn finds its own earlier turn's
    # cache unless a third conversation took the slot meanwhile; some turns must hit
    assert sum(h > 0 for h in hits[3:]) >= 2, hits
    assert all(h < u.prompt_tokens for h, u in zip(hits, u_on))
    assert cached_total(cached) - before == sum(hits)


def test_cached_count_is_the_common_prefix(cached):
    """A completion whose prompt extends the previous one by a few words reuses exactly
    the tokens the two prompts share (counted by HF tokenizers), less nothing else: the
    last prompt token always runs."""
    tok = tokenizers.Tokenizer.from_file(str(TINY / "tokenizer.json"))
    cl = cached.client()
    base = "Once upon a time there was a list of numbers that"
    longer = base + " grew and grew until it filled the sky"
    other = "Completely different words begin this prompt here"
    for p in (other, base):  # base last: one of the two sequences holds it
        cl.completions.create(model="m", prompt=p, max_tokens=3, temperature=0)
    r = cl.completions.create(model="m", prompt=longer, max_tokens=3, temperature=0)
    a, b = tok.encode(base).ids, tok.encode(longer).ids
    common = 0
    while common < min(len(a), len(b)) and a[common] == b[common]:
        common += 1
    assert r.usage.prompt_tokens == len(b)
    assert r.usage.prompt_tokens_details.cached_tokens == common
    t = cached.complete(longer, max_tokens=3)["timings"]
    # the same prompt again: all but its last token come from the cache
    assert t["cache_n"] == len(b) - 1 and t["prompt_n"] == 1


def test_no_reuse_with_trace_out(tmp_path):
    s = serve_util.Server(tmp_path, "--parallel", "1", "--trace-out", tmp_path / "t.h5")
    try:
        cl = s.client()
        for _ in range(2):
            r = cl.completions.create(model="m", prompt="The same prompt twice", max_tokens=2,
                                      temperature=0)
            assert r.usage.prompt_tokens_details.cached_tokens == 0
    finally:
        assert s.stop()[0] == 0


def test_each_chat_returns_to_its_own_cache(cached):
    """As many chats as sequences: every later turn reuses at least its whole previous
    prompt (the previous answer's tokens too, where they tokenize back the same), and a
    new chat does not take another chat's slot for the role header they share."""
    _, usages = run_conversations(cached, seed=11, turns=3, conversations=2)
    for t in range(1, 3):
        for c in range(2):
            now, before = usages[2 * t + c], usages[2 * (t - 1) + c]
            assert now.prompt_tokens_details.cached_tokens >= before.prompt_tokens, (t, c)
