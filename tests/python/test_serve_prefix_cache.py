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

import memory_limit
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


def same_answers(a, b):
    """Texts equal, and every step's log-probabilities within 1e-4 (the products of
    another batch shape round differently, 1e-6 relative: tests/model/test_batch.c)."""
    assert [x[0] for x in a] == [x[0] for x in b]
    for (_, la), (_, lb) in zip(a, b):
        assert len(la) == len(lb)
        for sa, sb in zip(la, lb):
            assert [t for t, _ in sa] == [t for t, _ in sb]
            assert max(abs(x - y) for (_, x), (_, y) in zip(sa, sb)) < 1e-4, (sa, sb)


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
                                           temperature=0, logprobs=True, top_logprobs=3)
            text = r.choices[0].message.content
            # the text, and the distributions it came from: a tiny model may answer every
            # prompt alike, but its log-probabilities follow the whole context
            answers.append((text, [[(t.token, t.logprob)] + [(a.token, a.logprob)
                                                             for a in t.top_logprobs]
                                   for t in r.choices[0].logprobs.content]))
            usages.append(r.usage)
            msgs.append({"role": "assistant", "content": text})
            msgs.append({"role": "user", "content": " ".join(rng.choices(WORDS, k=4))})
    return answers, usages


def test_multi_turn_answers_equal_without_the_cache(cached, plain):
    before = cached_total(cached)
    a_on, u_on = run_conversations(cached, seed=3)
    a_off, u_off = run_conversations(plain, seed=3)
    same_answers(a_on, a_off)
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


def kv_bytes(ctx):
    """One sequence's KV cache of fmoe-tiny at `ctx` positions, from its config: every
    layer's keys and values, float32."""
    import json
    c = json.loads((TINY / "config.json").read_text())
    hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return c["num_hidden_layers"] * ctx * 2 * c["num_key_value_heads"] * hd * 4


def gauge(server, name):
    for line in server.metrics_text().splitlines():
        if line.startswith(name + " "):
            return int(float(line.split()[1]))
    raise AssertionError(f"no {name} in /metrics")


def test_pool_keeps_more_conversations_than_slots(tmp_path):
    """--prefix-cache-gb: one sequence and room for three kept caches. Three interleaved
    chats then each find their previous turn (in the pool, copied into the slot), with the
    same greedy answers as without any cache; the pool's memory is three caches (from the
    model's config); with room for fewer than the chats need, the oldest are evicted and
    counted. Without the pool, one slot keeps only the last chat's cache."""
    ctx = 256
    three = 3 * kv_bytes(ctx) / 2**30
    for d in ("pool", "bare", "small"):
        (tmp_path / d).mkdir()
    pooled = serve_util.Server(tmp_path / "pool", "--parallel", "1", "--max-context", ctx,
                               "--prefix-cache-gb", f"{three * 1.01:.9f}")
    bare = serve_util.Server(tmp_path / "bare", "--parallel", "1", "--max-context", ctx)
    small = serve_util.Server(tmp_path / "small", "--parallel", "1", "--max-context", ctx,
                              "--prefix-cache-gb", f"{three / 3 * 1.01:.9f}")
    try:
        assert gauge(pooled, "fmoe_prefix_cache_bytes") == 3 * kv_bytes(ctx)
        a_pool, u_pool = run_conversations(pooled, seed=5)
        a_bare, u_bare = run_conversations(bare, seed=5)
        a_small, u_small = run_conversations(small, seed=5)
        same_answers(a_pool, a_bare)
        same_answers(a_small, a_bare)
        for t in range(1, 3):
            for c in range(3):
                now, before = u_pool[3 * t + c], u_pool[3 * (t - 1) + c]
                assert now.prompt_tokens_details.cached_tokens >= before.prompt_tokens
                # one slot, three chats: the slot holds another chat's tokens
                assert u_bare[3 * t + c].prompt_tokens_details.cached_tokens < 8
        assert gauge(pooled, "fmoe_prefix_cache_evictions_total") == 0
        assert gauge(pooled, "fmoe_prefix_cache_tokens") > 0
        assert gauge(small, "fmoe_prefix_cache_evictions_total") > 0
        assert gauge(bare, "fmoe_prefix_cache_bytes") == 0
    finally:
        for s in (pooled, bare, small):
            assert s.stop()[0] == 0


def rss_bytes(pid):
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_memory_stays_bounded_over_a_stream_of_conversations(tmp_path):
    """A stream of 16 random conversations (1 to 4 turns, random lengths), their turns
    interleaved at random, through two sequences and a pool with room for two caches: the
    pool holds its configured bytes and at most two caches' tokens throughout, evicts, and
    the server's resident memory after the last 24 requests is within 4 MiB of what it
    was after the first 16 (every cache it keeps was allocated by then: growth would be
    caches kept beyond the bound)."""
    ctx = 256
    two = 2 * kv_bytes(ctx)
    srv = serve_util.Server(tmp_path, "--parallel", "2", "--max-context", ctx,
                            "--prefix-cache-gb", f"{two / 2**30 * 1.01:.9f}")
    try:
        rng = random.Random(11)
        cl = srv.client()
        convs = [[{"role": "user", "content": " ".join(rng.choices(WORDS, k=rng.randint(2, 12)))}]
                 for _ in range(16)]
        left = {i: rng.randint(1, 4) for i in range(16)}
        done = 0
        rss_early = None
        while left:
            i = rng.choice(sorted(left))
            msgs = convs[i]
            r = cl.chat.completions.create(model="m", messages=msgs,
                                           max_tokens=rng.randint(1, 8), temperature=0)
            msgs.append({"role": "assistant", "content": r.choices[0].message.content})
            msgs.append({"role": "user", "content": " ".join(rng.choices(WORDS, k=rng.randint(1, 6)))})
            left[i] -= 1
            if not left[i]:
                del left[i]
            done += 1
            assert gauge(srv, "fmoe_prefix_cache_bytes") == two
            assert gauge(srv, "fmoe_prefix_cache_tokens") <= 2 * ctx
            if done == 16:
                rss_early = rss_bytes(srv.proc.pid)
        assert done >= 30 and rss_early is not None
        assert gauge(srv, "fmoe_prefix_cache_evictions_total") > 0
        grown = rss_bytes(srv.proc.pid) - rss_early
        # an ASan build keeps freed memory in its quarantine: resident memory grows there
        # whatever the cache does (28 KiB here in the plain build)
        if not memory_limit.asan_build():
            assert grown < 4 << 20, f"resident memory grew by {grown / 2**20:.1f} MiB"
    finally:
        assert srv.stop()[0] == 0


def test_a_running_request_shares_its_prompt(tmp_path):
    """Two chats with one long system prompt, the second sent while the first is still
    decoding: the second copies the system prompt's rows from the running sequence
    (cached_tokens at least the tokens the two prompts share, counted by HF tokenizers on
    the same rendering), and its log-probabilities equal those of a server without the
    cache."""
    tok = tokenizers.Tokenizer.from_file(str(TINY / "tokenizer.json"))
    system = " ".join(WORDS * 4)
    msgs = [[{"role": "system", "content": system}, {"role": "user", "content": u}]
            for u in ("sorting lists", "graphs and trees")]
    chatml = ["".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in ms)
              + "<|im_start|>assistant\n" for ms in msgs]
    a_ids, b_ids = (tok.encode(t).ids for t in chatml)
    shared = 0
    while a_ids[shared] == b_ids[shared]:
        shared += 1
    results = {}
    for name, extra in (("on", []), ("off", ["--no-prefix-cache"])):
        (tmp_path / name).mkdir()
        s = serve_util.Server(tmp_path / name, "--parallel", "2", "--max-context", 1024, *extra)
        try:
            cl = s.client()
            first = cl.chat.completions.create(model="m", messages=msgs[0], max_tokens=600,
                                               temperature=0, stream=True,
                                               extra_body={"ignore_eos": True})
            chunks = iter(first)
            while not next(chunks).choices[0].delta.content:  # the role chunk comes first
                pass  # a token: its prompt has run, it is decoding now
            b = cl.chat.completions.create(model="m", messages=msgs[1], max_tokens=6,
                                           temperature=0, logprobs=True, top_logprobs=3)
            for _ in chunks:  # let it finish
                pass
            results[name] = b
        finally:
            assert s.stop()[0] == 0
    on, off = results["on"], results["off"]
    assert on.usage.prompt_tokens == len(b_ids)
    assert on.usage.prompt_tokens_details.cached_tokens >= shared > 40
    assert off.usage.prompt_tokens_details.cached_tokens == 0
    assert on.choices[0].message.content == off.choices[0].message.content
    for x, y in zip(on.choices[0].logprobs.content, off.choices[0].logprobs.content):
        assert x.token == y.token and abs(x.logprob - y.logprob) < 1e-4


def test_n_choices_prefill_the_prompt_once(tmp_path, plain):
    """A request with n = 4 on a server with four sequences: the first choice runs the
    prompt, the three others wait for it and copy its rows (all but the last prompt
    token, which each runs for its own logits), so the prefix counter grows by exactly
    3 (prompt - 1) on a fresh server; the choices' greedy texts and log-probabilities
    equal those of a server that runs the prompt four times."""
    msgs = [{"role": "user", "content": "Name three sorting algorithms and compare them."}]
    kw = dict(model="m", messages=msgs, max_tokens=5, temperature=0, n=4, logprobs=True,
              top_logprobs=2)
    s = serve_util.Server(tmp_path, "--parallel", "4")
    try:
        on = s.client().chat.completions.create(**kw)
        assert cached_total(s) == 3 * (on.usage.prompt_tokens - 1)
    finally:
        assert s.stop()[0] == 0
    off = plain.client().chat.completions.create(**kw)
    for a, b in zip(on.choices, off.choices):
        assert a.message.content == b.message.content
        for x, y in zip(a.logprobs.content, b.logprobs.content):
            assert x.token == y.token and abs(x.logprob - y.logprob) < 1e-4
