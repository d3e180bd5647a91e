"""Reference rendering of chat templates the way transformers does it, and the conversations
the tests render, for test_chat_jinja.py.

transformers (chat_template_utils._compile_jinja_template / render_jinja_template) compiles
with ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
extensions=[AssistantTracker, jinja2.ext.loopcontrols]), replaces the tojson filter with
json.dumps(ensure_ascii=False, indent=, separators=, sort_keys=), and adds the globals
raise_exception and strftime_now; it renders with messages=, tools= (None without),
documents=None, add_generation_prompt=, the special tokens, and the extra keyword
arguments. transformers itself is not needed: this is that code's behaviour, rebuilt on
jinja2 alone.
"""
import json
import subprocess
from datetime import datetime

import jinja2
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment


class _Generation(Extension):
    """transformers' AssistantTracker: {% generation %} renders its body unchanged."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _raise(message):
    raise jinja2.exceptions.TemplateError(message)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def variables(messages, add_generation_prompt=True, tools=None, **kwargs):
    v = {"messages": messages, "tools": tools, "documents": None,
         "add_generation_prompt": add_generation_prompt, "bos_token": "<s>", "eos_token": "</s>"}
    v.update(kwargs)
    return v


def reference(template, cases):
    """[{"text": ...} or {"error": ...}] per variable set, as transformers renders them."""
    env = environment()
    try:
        t = env.from_string(template)
    except Exception as e:  # noqa: BLE001 - any refusal is an outcome
        return [{"error": f"{type(e).__name__}: {e}"} for _ in cases]
    out = []
    for v in cases:
        try:
            out.append({"text": t.render(**v)})
        except Exception as e:  # noqa: BLE001
            out.append({"error": f"{type(e).__name__}: {e}"})
    return out


def fmoe_render(render_bin, template_path, cases):
    """The interpreter's answers, one process for all cases (tests/tokenizer/jinja_render)."""
    lines = "".join(json.dumps(v, ensure_ascii=False) + "\n" for v in cases)
    p = subprocess.run([str(render_bin), str(template_path)], input=lines.encode(),
                       capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    return [json.loads(l) for l in p.stdout.decode().splitlines()]


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city, now.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "lat": {"type": "number", "minimum": -90.0, "maximum": 90.0}},
        "required": ["city"]}}}

CALL = {"id": "call_0001", "type": "function",
        "function": {"name": "get_weather",
                     "arguments": {"city": "Paris", "unit": "celsius", "days": 2, "lat": 48.0}}}


def conversations():
    """(name, variables) pairs: the shapes of request fmoe serve passes to templates."""
    sys_ = {"role": "system", "content": "You are terse. Answer in one line."}
    u1 = {"role": "user", "content": "Hello! What's 2+2?"}
    a1 = {"role": "assistant", "content": "4."}
    u2 = {"role": "user", "content": "And \"3×3\"?\n\nThink {step} by step — ünïcödé 🙂"}
    tool_turns = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_0001", "name": "get_weather",
         "content": "{\"temp\": 21, \"sky\": \"clear\"}"},
        {"role": "assistant", "content": "It is 21 °C and clear."},
        {"role": "user", "content": "Thanks. And tomorrow?"},
    ]
    think = [u1, {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4.",
                  "reasoning_content": "add them"}, u2]
    return [
        ("user", variables([u1])),
        ("user-nogen", variables([u1], add_generation_prompt=False)),
        ("system-multiturn", variables([sys_, u1, a1, u2])),
        ("system-multiturn-nogen", variables([sys_, u1, a1], add_generation_prompt=False)),
        ("tools", variables([sys_] + tool_turns, tools=[WEATHER])),
        ("tools-nosystem", variables(tool_turns, tools=[WEATHER])),
        ("tools-null-content", variables(
            [tool_turns[0], dict(tool_turns[1], content=None)] + tool_turns[2:],
            tools=[WEATHER])),
        ("tools-string-arguments", variables(
            [tool_turns[0], dict(tool_turns[1], tool_calls=[dict(CALL, function=dict(
                CALL["function"], arguments=json.dumps(CALL["function"]["arguments"])))])]
            + tool_turns[2:], tools=[WEATHER])),
        ("content-parts", variables([sys_, {"role": "user", "content": [
            {"type": "text", "text": "Describe"}, {"type": "text", "text": " this."}]}])),
        ("assistant-last-nogen", variables([u1, a1], add_generation_prompt=False)),
        ("thinking", variables(think)),
        ("no-thinking", variables(think, enable_thinking=False)),
    ]
