"""Tool calls and reasoning through `fmoe serve`, with the openai client.

fmoe-tiny's weights under real chat templates (Qwen3's: <tool_call> and <think>;
DeepSeek-R1-Distill's: a prompt that ends inside <think>; Mistral-Nemo's: [TOOL_CALLS]
and 9-character call ids). A random tiny model writes no tool call of its own, so the
calls here are forced: a named tool_choice appends the call's opening markup to the
prompt and the model must write the arguments. What comes back is checked against
independent sources: the prompt against jinja2's rendering of the same template encoded
by HuggingFace `tokenizers` (prompt_tokens), the arguments against the text the same
model generates from that prompt on /v1/completions, a stream against the whole
response. The parser itself is tested on real model-format strings, split at every byte,
in tests/serve/test_serve_tools.c.
"""
import json

import pytest

import serve_util
from chat_jinja_util import reference, variables
from conftest import REPO

tokenizers = pytest.importorskip("tokenizers")
jsonschema = pytest.importorskip("jsonschema")
openai = pytest.importorskip("openai")

TINY = REPO / "datasets" / "fmoe-tiny"
TEMPLATES = REPO / "tests" / "fixtures" / "chat_templates"
QWEN3 = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text()
R1 = (TEMPLATES / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja").read_text()
NEMO = (TEMPLATES / "mistralai-Mistral-Nemo-Instruct-2407.jinja").read_text()

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]}},
                   "required": ["city"]}}}]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
FORCE = {"type": "function", "function": {"name": "get_weather"}}
QWEN_PREFIX = '<tool_call>\n{"name": "get_weather", "arguments": '


def model_with(tmp_path_factory, name, template):
    d = tmp_path_factory.mktemp(name)
    for f in TINY.iterdir():
        if f.name != "tokenizer_config.json":
            (d / f.name).symlink_to(f)
    cfg = json.loads((TINY / "tokenizer_config.json").read_text())
    cfg["chat_template"] = template
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    s = serve_util.Server(tmp_path_factory.mktemp("serve"), "--model",
                          model_with(tmp_path_factory, "qwen3", QWEN3), "--parallel", "2")
    yield s
    s.stop()


def rendered(template, messages, tools=None, **kwargs):
    """The prompt text transformers would render (tool-call arguments as dicts, as vLLM and
    fmoe hand them to the template)."""
    msgs = json.loads(json.dumps(messages))
    for m in msgs:
        for c in m.get("tool_calls") or []:
            try:
                args = json.loads(c["function"]["arguments"])
            except ValueError:
                continue
            if isinstance(args, dict):
                c["function"]["arguments"] = args
    v = variables(msgs, tools=tools, **kwargs)
    v.pop("bos_token")  # fmoe-tiny has none
    v["eos_token"] = "<|im_end|>"
    (out,) = reference(template, [v])
    assert "text" in out, out
    return out["text"]


def ids(text):
    hf = tokenizers.Tokenizer.from_file(str(TINY / "tokenizer.json"))
    return hf.encode(text, add_special_tokens=False).ids


def greedy(server, prompt_ids, max_tokens, schema=None):
    fmt = {"response_format": {"type": "json_schema",
                               "json_schema": {"name": "args", "schema": schema}}} if schema else {}
    st, _, body = server.post("/v1/completions", {"model": "m", "prompt": prompt_ids,
                                                  "max_tokens": max_tokens, "temperature": 0,
                                                  **fmt})
    assert st == 200, body
    return json.loads(body)["choices"][0]["text"]


def test_named_tool_choice_forces_a_call(qwen):
    c = qwen.client()
    r = c.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice=FORCE,
                                  max_tokens=24, temperature=0)
    msg, ch = r.choices[0].message, r.choices[0]
    # the prompt: Qwen3's template with the tools, then the forced opening
    want = ids(rendered(QWEN3, ASK, tools=TOOLS) + QWEN_PREFIX)
    assert r.usage.prompt_tokens == len(want)
    (call,) = msg.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert call.id.startswith("call_") and len(call.id) == 29
    assert isinstance(call.function.arguments, str) and call.function.arguments
    # the arguments are written under the tool's parameters schema: what the same model
    # writes from the same prompt under that schema as response_format, valid by jsonschema
    params = TOOLS[0]["function"]["parameters"]
    assert call.function.arguments == greedy(qwen, want, 24, params)
    jsonschema.validate(json.loads(call.function.arguments), params)
    assert msg.content is None
    assert ch.finish_reason == "tool_calls"
    # a forced call comes first: no think block is parsed before it
    assert getattr(msg, "reasoning_content", None) is None


def test_stream_reassembles_the_whole_response(qwen):
    c = qwen.client()
    kw = dict(model="m", messages=ASK, tools=TOOLS, tool_choice=FORCE, max_tokens=8,
              temperature=0)
    whole = c.chat.completions.create(**kw).choices[0]
    calls, content, finish, firsts = {}, "", None, []
    for chunk in c.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            if tc.index not in calls:  # the first delta of a call: id, type and name
                assert tc.id and tc.type == "function" and tc.function.name
                calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": ""}
                firsts.append(tc.index)
            else:
                assert tc.id is None and tc.function.name is None
            calls[tc.index]["arguments"] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert firsts == [0]
    w = whole.message.tool_calls[0]
    assert calls[0]["id"].startswith("call_")  # ids are per response
    assert (calls[0]["name"], calls[0]["arguments"]) == (w.function.name, w.function.arguments)
    assert content == "" and finish == whole.finish_reason


def test_round_trip_call_result_answer(qwen):
    """The call comes back as an assistant message and the tool's result follows it: the
    prompt is the template's rendering of exactly that conversation."""
    c = qwen.client()
    r = c.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice=FORCE,
                                  max_tokens=8, temperature=0)
    call = r.choices[0].message.tool_calls[0]
    # content "", not null: Qwen3's template tests `'</think>' in message.content`, which
    # fails on None under transformers as it does here
    convo = ASK + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
    # arguments that are a JSON object reach the template as the object, as with vLLM
    good = json.loads(json.dumps(convo))
    good[1]["tool_calls"][0]["function"]["arguments"] = '{"city": "Paris"}'
    for messages in (convo, good):
        a = c.chat.completions.create(model="m", messages=messages, tools=TOOLS, max_tokens=4,
                                      temperature=0)
        assert a.usage.prompt_tokens == len(ids(rendered(QWEN3, messages, tools=TOOLS)))
        assert a.choices[0].finish_reason in ("length", "stop", "tool_calls")
    assert '"city": "Paris"' in rendered(QWEN3, good, tools=TOOLS)


TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"type": "string"}}}}}


def test_auto_none_and_required_prompts(qwen):
    """required with one tool is that tool forced; with several the call's opening, the
    model then writing the whole {"name", "arguments"} object (constrained)."""
    c = qwen.client()
    for choice, tools, want in (
            ("auto", TOOLS, rendered(QWEN3, ASK, tools=TOOLS)),
            ("none", TOOLS, rendered(QWEN3, ASK)),
            ("required", TOOLS, rendered(QWEN3, ASK, tools=TOOLS) + QWEN_PREFIX),
            ("required", TOOLS + [TIME], rendered(QWEN3, ASK, tools=TOOLS + [TIME])
             + '<tool_call>\n')):
        r = c.chat.completions.create(model="m", messages=ASK, tools=tools, tool_choice=choice,
                                      max_tokens=4, temperature=0)
        assert r.usage.prompt_tokens == len(ids(want)), choice
        if choice == "none":
            assert r.choices[0].message.tool_calls is None


def test_parallel_tool_calls_false_is_accepted(qwen):
    r = qwen.client().chat.completions.create(
        model="m", messages=ASK, tools=TOOLS, tool_choice=FORCE, parallel_tool_calls=False,
        max_tokens=4, temperature=0)
    assert len(r.choices[0].message.tool_calls) == 1


def test_reasoning_content_when_the_prompt_opens_think(tmp_path_factory):
    """DeepSeek-R1's template ends the prompt inside <think> when thinking is on: the whole
    answer so far is reasoning_content, exactly the text the model generates."""
    s = serve_util.Server(tmp_path_factory.mktemp("serve-r1"), "--model",
                          model_with(tmp_path_factory, "r1", R1), "--parallel", "1")
    try:
        kw = dict(model="m", messages=ASK, max_tokens=6, temperature=0,
                  extra_body={"chat_template_kwargs": {"enable_thinking": True}})
        c = s.client()
        r = c.chat.completions.create(**kw)
        text = rendered(R1, ASK, enable_thinking=True)
        assert text.endswith("<think>\n")
        assert r.usage.prompt_tokens == len(ids(text))
        msg = r.choices[0].message
        generated = greedy(s, ids(text), 6)
        assert msg.reasoning_content == generated and msg.content == ""
        streamed = "".join(getattr(ch.choices[0].delta, "reasoning_content", None) or ""
                           for ch in c.chat.completions.create(stream=True, **kw)
                           if ch.choices)
        assert streamed == generated
        # thinking off: the prompt closes </think>, the text is content
        r = c.chat.completions.create(**{**kw, "extra_body": {}})
        assert r.choices[0].message.content == greedy(s, ids(rendered(R1, ASK)), 6)
    finally:
        s.stop()


def error_of(server, body):
    st, _, data = server.post("/v1/chat/completions", body)
    return st, json.loads(data)


@pytest.mark.parametrize("extra,param", [
    ({"tools": {"type": "function"}}, "tools"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]},
     "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]},
     "tools[0].function.name"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
])
def test_bad_tools_are_400_naming_the_field(qwen, extra, param):
    st, body = error_of(qwen, {"model": "m", "messages": ASK, "max_tokens": 2, **extra})
    assert st == 400, body
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["param"] == param, body
    assert qwen.request("GET", "/health")[0] == 200


def test_mistral_ids_and_tool_messages(tmp_path_factory):
    """Mistral-Nemo's template: [TOOL_CALLS] calls with 9-character ids, which the template
    insists on when they come back; a tool result without tool_call_id is the template's
    400, and the server goes on."""
    s = serve_util.Server(tmp_path_factory.mktemp("serve-nemo"), "--model",
                          model_with(tmp_path_factory, "nemo", NEMO), "--parallel", "1")
    try:
        c = s.client()
        r = c.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice=FORCE,
                                      max_tokens=6, temperature=0)
        call = r.choices[0].message.tool_calls[0]
        assert call.function.name == "get_weather"
        assert len(call.id) == 9 and call.id.isalnum()
        assert r.usage.prompt_tokens == len(ids(
            rendered(NEMO, ASK, tools=TOOLS) + '[TOOL_CALLS][{"name": "get_weather", '
                                               '"arguments": '))
        turn = {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
        ok = ASK + [turn, {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
        a = c.chat.completions.create(model="m", messages=ok, tools=TOOLS, max_tokens=2)
        assert a.usage.prompt_tokens == len(ids(rendered(NEMO, ok, tools=TOOLS)))
        st, body = error_of(s, {"model": "m", "tools": TOOLS, "max_tokens": 2,
                                "messages": ASK + [turn, {"role": "tool", "content": "sunny"}]})
        assert st == 400 and "Tool call IDs" in body["error"]["message"], body
        assert s.request("GET", "/health")[0] == 200
    finally:
        s.stop()


def test_template_of_a_format_fmoe_does_not_read_is_400_naming_it(tmp_path_factory):
    """Granite's template writes <|tool_call|>, which fmoe does not parse: tools are refused
    with the format named (not read as another), and chat without tools still works."""
    granite = (TEMPLATES / "ibm-granite-granite-3.3-2B-Instruct.jinja").read_text()
    s = serve_util.Server(tmp_path_factory.mktemp("serve-granite"), "--model",
                          model_with(tmp_path_factory, "granite", granite), "--parallel", "1")
    try:
        st, body = error_of(s, {"model": "m", "messages": ASK, "tools": TOOLS, "max_tokens": 2})
        assert st == 400 and body["error"]["param"] == "tools", body
        assert "<|tool_call|>" in body["error"]["message"], body
        st, body = error_of(s, {"model": "m", "messages": ASK, "max_tokens": 2})
        assert st == 200, body
    finally:
        s.stop()


def test_legacy_functions_answer_in_their_form(qwen):
    """OpenAI's deprecated functions / function_call: the same prompt and the same call as
    the tools / tool_choice they stand for, answered as OpenAI answers such a request
    (message.function_call {name, arguments}, finish_reason "function_call"), read back
    by the openai client's own models; a stream's function_call deltas reassemble to it."""
    c = qwen.client()
    legacy = dict(model="m", messages=ASK, functions=[t["function"] for t in TOOLS],
                  function_call={"name": "get_weather"}, max_tokens=8, temperature=0)
    old = c.chat.completions.create(**legacy)
    new = c.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice=FORCE,
                                    max_tokens=8, temperature=0)
    assert old.usage.prompt_tokens == new.usage.prompt_tokens == len(
        ids(rendered(QWEN3, ASK, tools=TOOLS) + QWEN_PREFIX))
    msg, want = old.choices[0].message, new.choices[0].message.tool_calls[0].function
    assert msg.tool_calls is None and msg.content is None
    assert msg.function_call.name == "get_weather"
    assert msg.function_call.arguments == want.arguments
    assert old.choices[0].finish_reason == new.choices[0].finish_reason.replace(
        "tool_calls", "function_call")
    name, args, finish = "", "", None
    for chunk in c.chat.completions.create(stream=True, **legacy):
        if chunk.choices:
            d = chunk.choices[0].delta
            assert not d.tool_calls
            if d.function_call:
                name += d.function_call.name or ""
                args += d.function_call.arguments or ""
            finish = chunk.choices[0].finish_reason or finish
    assert (name, args, finish) == ("get_weather", want.arguments,
                                    old.choices[0].finish_reason)
    # function_call "none": no tools offered
    st, _, body = qwen.post("/v1/chat/completions", {"model": "m", "messages": ASK,
                                                     "max_tokens": 2, "function_call": "none",
                                                     "functions": legacy["functions"]})
    assert st == 200 and json.loads(body)["usage"]["prompt_tokens"] == len(
        ids(rendered(QWEN3, ASK)))


def test_legacy_functions_call_that_stops(qwen):
    """A call that ends before max_tokens: finish_reason "function_call", the arguments
    a whole JSON object of the function's parameters (the forced arguments are
    constrained, so the enum closes the object within a few tokens)."""
    r = qwen.client().chat.completions.create(
        model="m", messages=ASK, functions=[t["function"] for t in TOOLS],
        function_call={"name": "get_weather"}, max_tokens=60, temperature=0)
    ch = r.choices[0]
    if ch.finish_reason == "length":
        pytest.skip("the tiny model did not close its call within 60 tokens")
    assert ch.finish_reason == "function_call", ch
    jsonschema.validate(json.loads(ch.message.function_call.arguments),
                        TOOLS[0]["function"]["parameters"])


@pytest.mark.parametrize("extra,param", [
    ({"functions": TOOLS[:1], "tools": TOOLS}, "functions"),
    ({"functions": [{"description": "no name"}]}, "functions[0]"),
    ({"functions": [t["function"] for t in TOOLS], "function_call": "sometimes"},
     "function_call"),
])
def test_bad_legacy_functions_are_400(qwen, extra, param):
    st, body = error_of(qwen, {"model": "m", "messages": ASK, "max_tokens": 2, **extra})
    assert st == 400 and body["error"]["param"] == param, body


@pytest.mark.parametrize("name", ["tools", "tool_choice", "functions", "function_call"])
def test_tools_on_completions_are_400_naming_the_field(qwen, name):
    value = {"tools": TOOLS, "tool_choice": "required",
             "functions": [t["function"] for t in TOOLS], "function_call": "auto"}[name]
    st, _, data = qwen.post("/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 2,
                                                name: value})
    body = json.loads(data)
    assert st == 400 and body["error"]["param"] == name, body
    assert set(body["error"]) == {"message", "type", "param", "code"}


SCHEMA_TOOLS = [
    {"type": "function", "function": {"name": "get_forecast", "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]},
                       "days": {"type": "integer", "minimum": 1, "maximum": 14},
                       "metric": {"type": "boolean"}},
        "required": ["city", "days", "metric"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "search", "parameters": {
        "type": "object",
        "properties": {"query": {"type": "string", "minLength": 1, "maxLength": 12},
                       "limit": {"type": "integer", "minimum": 1, "maximum": 50},
                       "tags": {"type": "array", "items": {"type": "string", "maxLength": 4},
                                "maxItems": 3}},
        "required": ["query", "limit", "tags"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "set_alarm", "parameters": {
        "type": "object",
        "properties": {"hour": {"type": "integer", "minimum": 0, "maximum": 23},
                       "minute": {"type": "integer", "minimum": 0, "maximum": 59},
                       "label": {"anyOf": [{"type": "string", "maxLength": 6},
                                           {"type": "null"}]}},
        "required": ["hour", "minute", "label"], "additionalProperties": False}}},
]


@pytest.mark.parametrize("tool", SCHEMA_TOOLS, ids=lambda t: t["function"]["name"])
def test_forced_arguments_follow_the_tool_schema_over_seeds(qwen, tool):
    """A named tool_choice writes the arguments under the tool's parameters schema: at
    temperature 1 over 16 seeds every finished call's arguments validate by jsonschema;
    the same prompt without the constraint (/v1/completions, same seeds) does not."""
    name, params = tool["function"]["name"], tool["function"]["parameters"]
    c = qwen.client()
    done = 0
    for seed in range(2):
        r = c.chat.completions.create(
            model="m", messages=ASK, tools=SCHEMA_TOOLS, n=8, seed=seed, temperature=1.0,
            max_tokens=96, tool_choice={"type": "function", "function": {"name": name}})
        for ch in r.choices:
            (call,) = ch.message.tool_calls
            assert call.function.name == name
            if ch.finish_reason == "tool_calls":
                jsonschema.validate(json.loads(call.function.arguments), params)
                done += 1
            else:
                assert ch.finish_reason == "length", ch
    assert done >= 12, f"only {done} of 16 calls finished within max_tokens"
    prompt = ids(rendered(QWEN3, ASK, tools=SCHEMA_TOOLS)
                 + f'<tool_call>\n{{"name": "{name}", "arguments": ')
    st, _, body = qwen.post("/v1/completions", {"model": "m", "prompt": prompt, "n": 8,
                                                "seed": 0, "temperature": 1.0,
                                                "max_tokens": 48})
    assert st == 200, body
    valid = 0
    for ch in json.loads(body)["choices"]:
        try:
            jsonschema.validate(json.loads(ch["text"]), params)
            valid += 1
        except (ValueError, jsonschema.ValidationError):
            pass
    assert valid < 8


def test_required_with_several_tools_calls_one_of_them_over_seeds(qwen):
    """tool_choice "required" with several tools: the model writes the whole call object
    under the union of the tools (a tagged union on "name"): at temperature 1 over 16 seeds
    every finished call names one of the tools and its arguments validate by jsonschema
    against that tool's parameters; the same prompt unconstrained (/v1/completions, same
    seeds) writes no such call."""
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in SCHEMA_TOOLS}
    c = qwen.client()
    done, names = 0, set()
    for seed in range(2):
        r = c.chat.completions.create(model="m", messages=ASK, tools=SCHEMA_TOOLS, n=8,
                                      seed=seed, temperature=1.0, max_tokens=96,
                                      tool_choice="required")
        for ch in r.choices:
            (call,) = ch.message.tool_calls
            assert call.function.name in by_name, call
            if ch.finish_reason == "tool_calls":
                jsonschema.validate(json.loads(call.function.arguments),
                                    by_name[call.function.name])
                done += 1
                names.add(call.function.name)
            else:
                assert ch.finish_reason == "length", ch
    assert done >= 12, f"only {done} of 16 calls finished within max_tokens"
    assert len(names) >= 2, names  # the model chose, not the server
    prompt = ids(rendered(QWEN3, ASK, tools=SCHEMA_TOOLS) + '<tool_call>\n')
    st, _, body = qwen.post("/v1/completions", {"model": "m", "prompt": prompt, "n": 8,
                                                "seed": 0, "temperature": 1.0,
                                                "max_tokens": 48})
    assert st == 200, body
    valid = 0
    for ch in json.loads(body)["choices"]:
        try:
            call = json.loads(ch["text"])
            jsonschema.validate(call["arguments"], by_name[call["name"]])
            valid += 1
        except (ValueError, KeyError, TypeError, jsonschema.ValidationError):
            pass
    assert valid < 8
    # a tool without parameters takes any JSON object as its arguments (not any value)
    ping = {"type": "function", "function": {"name": "ping"}}
    r = c.chat.completions.create(model="m", messages=ASK, tools=[ping, TIME], n=8, seed=0,
                                  temperature=1.0, max_tokens=64, tool_choice="required")
    finished = [ch for ch in r.choices if ch.finish_reason == "tool_calls"]
    assert finished
    for ch in finished:
        assert isinstance(json.loads(ch.message.tool_calls[0].function.arguments), dict)


def test_strict_tool_schema_that_cannot_be_enforced_is_400(qwen):
    tool = {"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"d": {"type": "string", "format": "date"}}}}}
    st, body = error_of(qwen, {"model": "m", "messages": ASK, "max_tokens": 2, "tools": [tool],
                               "tool_choice": "required"})
    assert st == 400 and body["error"]["param"] == "tools[0].function.parameters", body
    assert "'format' at $.properties.d" in body["error"]["message"]
    # not strict: the call is written unconstrained
    tool["function"]["strict"] = False
    st, body = error_of(qwen, {"model": "m", "messages": ASK, "max_tokens": 2, "tools": [tool],
                               "tool_choice": "required"})
    assert st == 200, body
    st, body = error_of(qwen, {"model": "m", "messages": ASK, "max_tokens": 2, "tools": TOOLS,
                               "tool_choice": "required",
                               "response_format": {"type": "json_object"}})
    assert st == 400 and body["error"]["param"] == "response_format", body


def test_mistral_small_args_format(tmp_path_factory):
    """Mistral Small 3.2's template: [TOOL_CALLS]name[ARGS]{...}, 9-character ids that its
    [CALL_ID] insists on when they come back; the forced call's prompt against jinja2's
    rendering, its arguments constrained by the schema (jsonschema), and the round trip."""
    small = (TEMPLATES / "mistralai-Mistral-Small-3.2-24B-Instruct-2506.jinja").read_text()
    s = serve_util.Server(tmp_path_factory.mktemp("serve-small"), "--model",
                          model_with(tmp_path_factory, "small", small), "--parallel", "1")
    try:
        c = s.client()
        r = c.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice=FORCE,
                                      max_tokens=48, temperature=0)
        want = ids(rendered(small, ASK, tools=TOOLS) + "[TOOL_CALLS]get_weather[ARGS]")
        assert r.usage.prompt_tokens == len(want)
        call = r.choices[0].message.tool_calls[0]
        assert call.function.name == "get_weather" and len(call.id) == 9 and call.id.isalnum()
        params = TOOLS[0]["function"]["parameters"]
        assert call.function.arguments == greedy(s, want, 48, params)
        if r.choices[0].finish_reason == "tool_calls":
            jsonschema.validate(json.loads(call.function.arguments), params)
        turn = {"role": "assistant", "content": "", "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]}
        convo = ASK + [turn, {"role": "tool", "tool_call_id": call.id, "content": "rain"}]
        a = c.chat.completions.create(model="m", messages=convo, tools=TOOLS, max_tokens=2)
        text = rendered(small, convo, tools=TOOLS)
        assert f"[TOOL_CALLS]get_weather[CALL_ID]{call.id}[ARGS]" in text
        assert a.usage.prompt_tokens == len(ids(text))
    finally:
        s.stop()


# Written for this test in the layout of Llama 3.1's template (whose licence keeps it out
# of the fixtures): tools as JSON in the user turn, an earlier call as
# <|python_tag|>{"name": ..., "parameters": ...}<|eom_id|>, turns closed by <|eot_id|>.
LLAMA3_LIKE = (
    "{%- for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
    "{%- if m.role == 'user' and tools %}{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
    "{%- endif %}"
    "{%- if m.tool_calls %}{% for c in m.tool_calls %}<|python_tag|>"
    "{{ '{\"name\": \"' + c.function.name + '\", \"parameters\": ' }}"
    "{{ c.function.arguments | tojson }}}<|eom_id|>{% endfor %}"
    "{%- else %}{{ m.content }}<|eot_id|>{% endif %}{% endfor %}"
    "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n"
    "{%- endif %}")


def test_llama3_json_format(tmp_path_factory):
    s = serve_util.Server(tmp_path_factory.mktemp("serve-llama3"), "--model",
                          model_with(tmp_path_factory, "llama3", LLAMA3_LIKE), "--parallel", "1")
    try:
        c = s.client()
        r = c.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice=FORCE,
                                      max_tokens=48, temperature=0)
        want = ids(rendered(LLAMA3_LIKE, ASK, tools=TOOLS)
                   + '{"name": "get_weather", "parameters": ')
        assert r.usage.prompt_tokens == len(want)
        call = r.choices[0].message.tool_calls[0]
        params = TOOLS[0]["function"]["parameters"]
        assert call.function.name == "get_weather" and call.id.startswith("call_")
        assert call.function.arguments == greedy(s, want, 48, params)
        assert r.choices[0].message.content is None
        # the model's own answer, not a call, is content
        a = c.chat.completions.create(model="m", messages=ASK, tools=TOOLS, max_tokens=6,
                                      temperature=0)
        text = greedy(s, ids(rendered(LLAMA3_LIKE, ASK, tools=TOOLS)), 6)
        if not text.lstrip().startswith("{"):
            assert a.choices[0].message.content == text
    finally:
        s.stop()


@pytest.mark.parametrize("family", ["nemo", "llama3"])
def test_required_with_several_tools_in_mistral_and_llama3_formats(tmp_path_factory, family):
    """The union constraint of tool_choice "required" in the other formats whose call is
    one JSON object: Mistral-Nemo's [TOOL_CALLS][{...}] and Llama 3's bare {"name",
    "parameters"}: every call names one of the tools, a finished one's arguments validate
    by jsonschema against that tool's parameters."""
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in SCHEMA_TOOLS}
    template = NEMO if family == "nemo" else LLAMA3_LIKE
    s = serve_util.Server(tmp_path_factory.mktemp("serve-req-" + family), "--model",
                          model_with(tmp_path_factory, family, template), "--parallel", "1")
    try:
        r = s.client().chat.completions.create(model="m", messages=ASK, tools=SCHEMA_TOOLS,
                                               n=4, seed=3, temperature=1.0, max_tokens=96,
                                               tool_choice="required")
        done = 0
        for ch in r.choices:
            (call,) = ch.message.tool_calls
            assert call.function.name in by_name, call
            if ch.finish_reason == "tool_calls":
                jsonschema.validate(json.loads(call.function.arguments),
                                    by_name[call.function.name])
                done += 1
        assert done >= 2, r
    finally:
        s.stop()
