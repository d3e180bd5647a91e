"""`fmoe serve` with a chat template no fixed renderer knows: rendered as written.

fmoe-tiny's weights with a made-up template that reads message fields beyond role and
content (name, tool_calls, a null content) and a chat_template_kwargs variable. The prompt
fmoe builds is checked through usage.prompt_tokens against jinja2's rendering (the way
transformers renders, chat_jinja_util.py) encoded by HuggingFace `tokenizers`.
"""
import json

import pytest

import serve_util
from chat_jinja_util import reference, variables
from conftest import REPO

tokenizers = pytest.importorskip("tokenizers")

TINY = REPO / "datasets" / "fmoe-tiny"
TEMPLATE = (
    "{% for m in messages %}### {{ m.role|upper }}{% if m.name %} ({{ m.name }}){% endif %}: "
    "{{ m.content if m.content is not none else m.tool_calls|tojson }}\n{% endfor %}"
    "{% if flavour is defined %}[{{ flavour }}]{% endif %}"
    "{% if messages|length > 3 %}{{ raise_exception('at most three messages') }}{% endif %}"
    "{% if add_generation_prompt %}### ASSISTANT:{% endif %}")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("odd-template")
    for f in TINY.iterdir():
        if f.name != "tokenizer_config.json":
            (d / f.name).symlink_to(f)
    cfg = json.loads((TINY / "tokenizer_config.json").read_text())
    cfg["chat_template"] = TEMPLATE
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


@pytest.fixture(scope="module")
def server(tmp_path_factory, model):
    s = serve_util.Server(tmp_path_factory.mktemp("serve"), "--model", model, "--parallel", "1")
    yield s
    s.stop()


def as_objects(messages):
    """Tool-call arguments given as a JSON string of an object reach the template as the
    object, as vLLM hands them to transformers (its chat_utils._postprocess_messages)."""
    messages = json.loads(json.dumps(messages))
    for m in messages:
        for c in m.get("tool_calls") or []:
            args = json.loads(c["function"]["arguments"])
            if isinstance(args, dict):
                c["function"]["arguments"] = args
    return messages


def prompt_tokens(messages, **kwargs):
    hf = tokenizers.Tokenizer.from_file(str(TINY / "tokenizer.json"))
    v = variables(as_objects(messages), **kwargs)
    v.pop("bos_token")  # fmoe-tiny has none
    v["eos_token"] = "<|im_end|>"
    (want,) = reference(TEMPLATE, [v])
    return len(hf.encode(want["text"], add_special_tokens=False).ids)


def chat(server, messages, **extra):
    st, _, body = server.post("/v1/chat/completions", {
        "model": "m", "messages": messages, "max_tokens": 2, "temperature": 0, **extra})
    return st, json.loads(body)


CALLS = [{"role": "user", "content": "Weather?", "name": "ana"},
         {"role": "assistant", "content": None, "tool_calls": [
             {"id": "c1", "type": "function",
              "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
         {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "sunny"}]


def test_unknown_template_chats_with_fields_and_kwargs(server):
    st, r = chat(server, CALLS)
    assert st == 200, r
    assert r["usage"]["prompt_tokens"] == prompt_tokens(CALLS)
    st, r = chat(server, CALLS, chat_template_kwargs={"flavour": "salty 🧂"})
    assert st == 200, r
    assert r["usage"]["prompt_tokens"] == prompt_tokens(CALLS, flavour="salty 🧂")
    assert prompt_tokens(CALLS, flavour="salty 🧂") != prompt_tokens(CALLS)


def test_template_errors_are_400(server):
    st, r = chat(server, CALLS + [{"role": "user", "content": "again"}])
    assert st == 400
    assert "at most three messages" in r["error"]["message"]
    st, r = chat(server, CALLS, chat_template_kwargs=["not", "an", "object"])
    assert st == 400 and r["error"]["param"] == "chat_template_kwargs"
