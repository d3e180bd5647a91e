"""gpt-oss's harmony chat format through `fmoe serve`, with the openai client.

The model is fmoe-tiny's weights under gpt-oss's real chat template
(tests/fixtures/chat_templates/openai-gpt-oss-120b.jinja) and a tokenizer that has
harmony's special tokens: fmoe-tiny's, with its last seven merges given up so that their
ids become <|start|>, <|message|>, <|end|>, <|channel|>, <|return|>, <|call|> and
<|constrain|> (a random model does not care which strings its ids spell). Checked against
independent sources:
- the prompt: jinja2's rendering of the same template (chat_jinja_util, the way
  transformers calls it) encoded by HuggingFace `tokenizers` (usage.prompt_tokens);
- a forced call (a named tool_choice appends gpt-oss's call header to the prompt): its
  arguments are the text the same model generates from those prompt ids on
  /v1/completions; a stream reassembles to the whole response;
- generation stops at <|call|>: a copy of the model whose <|call|> row of the (tied)
  embedding is a slightly larger copy of the row of a token x the model writes greedily
  ends its call where the original model first wrote x.
The parse of harmony outputs (channels, header orders, built-in tools) is tested on
strings split at every byte in tests/serve/test_serve_tools.c.
"""
import json
import struct

import numpy as np
import pytest

import serve_util
from chat_jinja_util import reference, variables
from conftest import REPO

tokenizers = pytest.importorskip("tokenizers")
openai = pytest.importorskip("openai")

TINY = REPO / "datasets" / "fmoe-tiny"
GPT_OSS = (REPO / "tests" / "fixtures" / "chat_templates" / "openai-gpt-oss-120b.jinja").read_text()
HARMONY = ["<|start|>", "<|message|>", "<|end|>", "<|channel|>", "<|return|>", "<|call|>",
           "<|constrain|>"]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
FORCE = {"type": "function", "function": {"name": "get_weather"}}
CALL_HEADER = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"


def harmony_tokenizer():
    """fmoe-tiny's tokenizer.json with its last len(HARMONY) merges given up: their ids
    become harmony's special tokens."""
    t = json.loads((TINY / "tokenizer.json").read_text())
    vocab, merges = t["model"]["vocab"], t["model"]["merges"]
    gone = ["".join(m) for m in merges[-len(HARMONY):]]
    used = {p for m in merges[:-len(HARMONY)] for p in m}
    assert not set(gone) & used  # no kept merge builds on a removed token
    del merges[-len(HARMONY):]
    ids = [vocab.pop(g) for g in gone]
    for tok, i in zip(HARMONY, ids):
        t["added_tokens"].append({"id": i, "content": tok, "single_word": False,
                                  "lstrip": False, "rstrip": False, "normalized": False,
                                  "special": True})
    return t, dict(zip(HARMONY, ids))


def write_model(d, embed_patch=None):
    """fmoe-tiny with the harmony tokenizer and gpt-oss's template in folder d;
    embed_patch(rows float32 [V, H]) may change the tied embedding."""
    d.mkdir()
    tok, ids = harmony_tokenizer()
    (d / "tokenizer.json").write_text(json.dumps(tok))
    cfg = json.loads((TINY / "tokenizer_config.json").read_text())
    cfg["chat_template"] = GPT_OSS
    cfg["eos_token"] = "<|return|>"
    for tok_, i in ids.items():
        cfg.setdefault("added_tokens_decoder", {})[str(i)] = {
            "content": tok_, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": True}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    # the generation config of fmoe-tiny (its ids 0 and 2), not gpt-oss's: serve itself
    # must stop at <|return|> and <|call|>
    for f in ("config.json", "generation_config.json"):
        (d / f).symlink_to(TINY / f)
    if embed_patch is None:
        (d / "model.safetensors").symlink_to(TINY / "model.safetensors")
    else:
        raw = (TINY / "model.safetensors").read_bytes()
        n = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8:8 + n])
        e = header["model.embed_tokens.weight"]
        a, b = (8 + n + o for o in e["data_offsets"])
        bits = np.frombuffer(raw[a:b], np.uint16).astype(np.uint32) << 16
        rows = bits.view(np.float32).reshape(e["shape"]).copy()
        embed_patch(rows, ids)
        bf16 = (rows.view(np.uint32) >> 16).astype(np.uint16)  # truncated to bfloat16
        (d / "model.safetensors").write_bytes(raw[:a] + bf16.tobytes() + raw[b:])
    return d


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("harmony") / "m")


@pytest.fixture(scope="module")
def server(tmp_path_factory, model):
    s = serve_util.Server(tmp_path_factory.mktemp("serve"), "--model", model, "--parallel", "2")
    yield s
    s.stop()


def rendered(messages, tools=None, **kwargs):
    msgs = json.loads(json.dumps(messages))
    for m in msgs:
        if "reasoning_content" in m:  # what the caller of apply_chat_template would pass
            m["thinking"] = m["reasoning_content"]
        for c in m.get("tool_calls") or []:
            try:
                c["function"]["arguments"] = json.loads(c["function"]["arguments"])
            except ValueError:
                pass
    v = variables(msgs, tools=tools, **kwargs)
    v.pop("bos_token")
    v["eos_token"] = "<|return|>"
    (out,) = reference(GPT_OSS, [v])
    assert "text" in out, out
    return out["text"]


def ids(model, text):
    hf = tokenizers.Tokenizer.from_file(str(model / "tokenizer.json"))
    return hf.encode(text, add_special_tokens=False).ids


def greedy_ids(server, prompt_ids, max_tokens, schema=None):
    fmt = {"response_format": {"type": "json_schema",
                               "json_schema": {"name": "args", "schema": schema}}} if schema else {}
    st, _, body = server.post("/v1/completions", {
        "model": "m", "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0,
        "logprobs": 0, **fmt})
    assert st == 200, body
    return json.loads(body)["choices"][0]


def test_the_tokenizer_has_harmony_tokens(model):
    tok, want = harmony_tokenizer()
    for t, i in want.items():
        assert ids(model, f"a{t}b")[1:-1] == [i] or ids(model, t) == [i]


@pytest.mark.parametrize("convo,tools,kwargs", [
    (ASK, None, {}),
    ([{"role": "system", "content": "Be brief."}] + ASK, TOOLS, {}),
    (ASK, TOOLS, {"reasoning_effort": "high"}),
    # a whole round: a final answer, a call, its result
    ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}] + ASK + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}], TOOLS, {}),
    # the reasoning serve returned, sent back: rendered as the template's `thinking`
    (ASK + [
        {"role": "assistant", "content": "", "reasoning_content": "Need the weather.",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "rain"}], TOOLS, {}),
])
def test_prompt_is_the_templates_rendering(server, model, convo, tools, kwargs):
    r = server.client().chat.completions.create(
        model="m", messages=convo, tools=tools or openai.NOT_GIVEN, max_tokens=2,
        temperature=0, extra_body={"chat_template_kwargs": kwargs} if kwargs else {})
    text = rendered(convo, tools=tools, **kwargs)
    assert text.endswith("<|start|>assistant")
    if any("reasoning_content" in m for m in convo):
        assert "<|channel|>analysis<|message|>Need the weather.<|end|>" in text
    assert r.usage.prompt_tokens == len(ids(model, text))


def test_named_call_and_its_stream(server, model):
    c = server.client()
    kw = dict(model="m", messages=ASK, tools=TOOLS, tool_choice=FORCE, max_tokens=8,
              temperature=0)
    r = c.chat.completions.create(**kw)
    prompt = ids(model, rendered(ASK, tools=TOOLS) + CALL_HEADER)
    assert r.usage.prompt_tokens == len(prompt)
    msg = r.choices[0].message
    (call,) = msg.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    # the arguments: the text the model writes after the header under the tool's
    # parameters schema (a forced call's arguments are constrained), cut by max_tokens
    params = TOOLS[0]["function"]["parameters"]
    assert call.function.arguments == greedy_ids(server, prompt, 8, params)["text"]
    assert call.function.arguments.startswith('{"city"')
    assert msg.content is None and msg.reasoning_content is None
    calls, content = {}, ""
    for chunk in c.chat.completions.create(stream=True, **kw):
        if chunk.choices:
            d = chunk.choices[0].delta
            content += d.content or ""
            for tc in d.tool_calls or []:
                calls.setdefault(tc.index, ["", ""])
                calls[tc.index][0] += tc.function.name or ""
                calls[tc.index][1] += tc.function.arguments or ""
    assert calls == {0: ["get_weather", call.function.arguments]} and content == ""


def test_output_without_harmony_is_the_content(server, model):
    """A random model writes no channel header: its whole text is the answer, in a stream
    too (held until it ends, as it could still become a header)."""
    c = server.client()
    kw = dict(model="m", messages=ASK, max_tokens=6, temperature=0)
    r = c.chat.completions.create(**kw)
    want = greedy_ids(server, ids(model, rendered(ASK)), 6)["text"]
    assert r.choices[0].message.content == want
    streamed = "".join(ch.choices[0].delta.content or "" for ch in
                       c.chat.completions.create(stream=True, **kw) if ch.choices)
    assert streamed == want


# a schema the automaton does not do ("not"), without "strict": the arguments are written
# unconstrained, so the model's own choice of <|call|> is what ends them
FREE = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "not": {"required": ["x"]}}}}]


def test_generation_stops_at_call(server, model, tmp_path_factory):
    prompt = ids(model, rendered(ASK, tools=FREE) + CALL_HEADER)
    toks = greedy_ids(server, prompt, 12)["logprobs"]["tokens"]
    hf = tokenizers.Tokenizer.from_file(str(model / "tokenizer.json"))
    by_text = {}
    for i in range(hf.get_vocab_size()):
        by_text.setdefault(hf.decode([i]), i)
    x = by_text[toks[2]]  # the third token the model writes
    first = toks.index(toks[2])

    def patch(rows, special):
        # <|call|> outscores x wherever x wins (its logits are positive there)
        rows[special["<|call|>"]] = rows[x] * 1.0625

    m2 = write_model(tmp_path_factory.mktemp("harmony-stop") / "m", patch)
    s = serve_util.Server(tmp_path_factory.mktemp("serve-stop"), "--model", m2)
    try:
        r = s.client().chat.completions.create(model="m", messages=ASK, tools=FREE,
                                               tool_choice=FORCE, max_tokens=12,
                                               temperature=0)
        ch, k = r.choices[0], r.usage.completion_tokens
        # ended by <|call|> (not by length), no later than where x first came, and the
        # arguments are the original model's text up to there
        assert ch.finish_reason == "tool_calls" and k <= first < 12
        assert ch.message.tool_calls[0].function.arguments == "".join(toks[:k])
    finally:
        s.stop()


def test_tool_choice_none_offers_no_tools_and_returns_no_call(server, model):
    """tool_choice "none": the template gets no tools (jinja2's rendering without them)
    and the reply has no tool_calls, streamed or not; that a call the model writes anyway
    becomes content is checked on the parser (test_serve_tools.c,
    harmony_call_under_tool_choice_none_is_content)."""
    c = server.client()
    kw = dict(model="m", messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=6,
              temperature=0)
    r = c.chat.completions.create(**kw)
    assert r.usage.prompt_tokens == len(ids(model, rendered(ASK)))
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].finish_reason in ("stop", "length")
    for chunk in c.chat.completions.create(stream=True, **kw):
        assert not (chunk.choices and chunk.choices[0].delta.tool_calls)
