"""Structured output of `fmoe serve` (response_format) through the official `openai` client:
every document the server says it finished is checked by the `jsonschema` package against
the schema it was asked for, over many seeds at temperature 1 on the bundled fmoe-tiny,
which writes babble: only the mask can make its output valid (the same requests without
response_format are checked to be mostly invalid JSON). json_object outputs parse with
json.loads; schemas with keywords fmoe does not do are a 400 of OpenAI's error shape that
names the keyword and its path, and the server goes on serving.
"""
import json
import subprocess

import pytest

import serve_util

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

MSGS = [{"role": "user", "content": "Describe a record as JSON."}]

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "address": {"type": "object",
                    "properties": {"street": {"type": "string"}, "zip": {"type": "integer"}},
                    "required": ["street", "zip"], "additionalProperties": False},
        "scores": {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 3},
        "member": {"type": "boolean"},
    },
    "required": ["name", "age", "address", "scores", "member"],
    "additionalProperties": False,
}
SHAPES = {
    "type": "object",
    "properties": {
        "kind": {"const": "point"},
        "coords": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2},
        "label": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "level": {"enum": [1, 2, 3, "max", None]},
        "flags": {"type": "array", "items": {"type": ["boolean", "null"]}, "maxItems": 4},
    },
    "required": ["kind", "coords", "label", "level", "flags"],
    "additionalProperties": False,
}
# enum values with every JSON escape: the model must write each one exactly as escaped
ESCAPES = {
    "type": "object",
    "properties": {"quote": {"enum": ["say \"hi\"", "back\\slash", "new\nline\ttab",
                                      "\u00e9t\u00e9 \u0001 \u20ac"]},
                   "free": {"type": "string"}},
    "required": ["quote", "free"],
    "additionalProperties": False,
}
ITEMS = {
    "type": "array",
    "items": {"type": "object",
              "properties": {"id": {"type": "integer"}, "ok": {"type": "boolean"},
                             "note": {"enum": ["a", "b\"c"]}},
              "required": ["id", "ok"], "additionalProperties": False},
    "minItems": 1, "maxItems": 3,
}
# not strict: optional properties may be left out
OPTIONAL = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"enum": ["x", "y"]},
                   "c": {"type": "number"}},
    "required": ["b"],
}
# as pydantic writes nested models (openai's client.beta.chat.completions.parse): $defs and
# $ref, titles; jsonschema resolves the references itself
PYDANTIC = {
    "$defs": {
        "Color": {"enum": ["red", "green"], "title": "Color", "type": "string"},
        "Point": {"properties": {"x": {"title": "X", "type": "number"},
                                 "y": {"title": "Y", "type": "number"}},
                  "required": ["x", "y"], "title": "Point", "type": "object",
                  "additionalProperties": False},
    },
    "properties": {"color": {"$ref": "#/$defs/Color"},
                   "points": {"items": {"$ref": "#/$defs/Point"}, "title": "Points",
                              "type": "array", "maxItems": 2},
                   "origin": {"anyOf": [{"$ref": "#/$defs/Point"}, {"type": "null"}]}},
    "required": ["color", "points", "origin"], "title": "Shape", "type": "object",
    "additionalProperties": False,
}
# lengths, integer bounds, oneOf of distinct first bytes, allOf of one
BOUNDS = {
    "$defs": {"Digit": {"type": "integer", "minimum": 0, "maximum": 9}},
    "type": "object",
    "properties": {
        "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "cold": {"type": "integer", "exclusiveMinimum": -40, "exclusiveMaximum": -3},
        "big": {"type": "integer", "minimum": 1000},
        "code": {"type": "string", "minLength": 3, "maxLength": 5},
        "tag": {"type": "string", "maxLength": 2},
        "pick": {"oneOf": [{"type": "string", "maxLength": 3},
                           {"type": "integer", "minimum": 5, "maximum": 7}]},
        "digit": {"allOf": [{"$ref": "#/$defs/Digit"}], "description": "one digit"},
    },
    "required": ["age", "cold", "big", "code", "tag", "pick", "digit"],
    "additionalProperties": False,
}
# pattern: the regex subset (literals, classes, \d \w \s, quantifiers, groups, |);
# jsonschema checks it with Python's re.search, independent of fmoe's automaton
PATTERNS = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "pattern": "^[a-z][a-z0-9_]{2,7}$"},
        "phone": {"type": "string", "pattern": "^\\d{3}-\\d{3,4}$"},
        "pet": {"type": "string", "pattern": "^(cat|dog|bird)s?$"},
        "words": {"type": "string", "pattern": "^\\w+( \\w+){0,2}$"},
        "version": {"type": "string", "pattern": "^v[0-9]+(\\.[0-9]+)?[^a-z]?$"},
        "tags": {"type": "array", "maxItems": 2,
                 "items": {"type": "string", "pattern": "^#[A-Z]+$"}},
    },
    "required": ["id", "phone", "pet", "words", "version", "tags"],
    "additionalProperties": False,
}
SCHEMAS = {"bounds": BOUNDS, "person": PERSON, "shapes": SHAPES, "escapes": ESCAPES, "items": ITEMS,
           "optional": OPTIONAL, "pydantic": PYDANTIC, "patterns": PATTERNS}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from serve_util.module_server(tmp_path_factory, "serve-json", "--parallel", "8")


def schema_format(schema, strict=True):
    return {"type": "json_schema", "json_schema": {"name": "record", "schema": schema,
                                                   "strict": strict}}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_schema_outputs_validate_over_seeds(server, name):
    schema = SCHEMAS[name]
    cl = server.client()
    done = 0
    r = cl.chat.completions.create(model="m", messages=MSGS, temperature=1.0, seed=1, n=8,
                                   max_tokens=128,
                                   response_format=schema_format(schema, name != "optional"))
    for c in r.choices:
        if c.finish_reason == "stop":
            jsonschema.validate(json.loads(c.message.content), schema)
            done += 1
        else:
            assert c.finish_reason == "length", c
    assert done >= 4, f"only {done} of 8 documents finished within max_tokens"


def test_without_the_mask_the_same_requests_are_not_json(server):
    """The check above can fail: the model alone does not write these documents."""
    r = server.client().chat.completions.create(model="m", messages=MSGS, temperature=1.0,
                                                seed=1, n=8, max_tokens=60)
    valid = 0
    for c in r.choices:
        try:
            jsonschema.validate(json.loads(c.message.content), PERSON)
            valid += 1
        except (ValueError, jsonschema.ValidationError):
            pass
    assert valid == 0


def test_json_object_outputs_parse(server):
    r = server.client().chat.completions.create(
        model="m", messages=MSGS, temperature=1.0, seed=3, n=8, max_tokens=100,
        response_format={"type": "json_object"})
    assert any(c.finish_reason == "stop" for c in r.choices)
    for c in r.choices:
        if c.finish_reason == "stop":
            assert isinstance(json.loads(c.message.content), dict), c.message.content


def test_length_before_the_document_ends(server):
    """max_tokens reached first: finish_reason "length" and the text is a cut document."""
    r = server.client().chat.completions.create(model="m", messages=MSGS, temperature=1.0,
                                                seed=2, max_tokens=3,
                                                response_format=schema_format(PERSON))
    c = r.choices[0]
    assert c.finish_reason == "length"
    assert c.message.content.startswith("{")
    with pytest.raises(ValueError):
        json.loads(c.message.content)


def test_stream_and_completions_endpoint(server):
    cl = server.client()
    kw = dict(model="m", messages=MSGS, temperature=1.0, seed=9, max_tokens=100,
              response_format=schema_format(SHAPES))
    whole = cl.chat.completions.create(**kw).choices[0]
    text = "".join(ch.choices[0].delta.content or ""
                   for ch in cl.chat.completions.create(stream=True, **kw) if ch.choices)
    assert text == whole.message.content
    if whole.finish_reason == "stop":
        jsonschema.validate(json.loads(text), SHAPES)
    # /v1/completions takes response_format too (as vLLM's does)
    st, _, body = server.post("/v1/completions",
                              {"model": "m", "prompt": "Data:", "max_tokens": 100, "seed": 5,
                               "n": 4, "temperature": 1.0, "response_format": schema_format(ITEMS)})
    assert st == 200, body
    for c in json.loads(body)["choices"]:
        if c["finish_reason"] == "stop":
            jsonschema.validate(json.loads(c["text"]), ITEMS)


BAD = [
    ({"type": "object", "properties": {"name": {"type": "string", "pattern": "(?i)a"}}},
     "'pattern' at $.properties.name: '(?' at offset 1 is not supported"),
    ({"type": "string", "pattern": "(a)\\1"}, "'pattern' at $: a back-reference"),
    ({"type": "object", "properties": {"d": {"type": "string", "format": "date"}}},
     "'format' at $.properties.d"),
    ({"type": "array", "items": {"$ref": "#/$defs/node"}}, "'$ref' at $.items"),
    ({"$defs": {"N": {"type": "object", "properties": {"next": {"$ref": "#/$defs/N"}}}},
      "$ref": "#/$defs/N"}, "recursive schemas are not supported"),
    ({"type": "object", "properties": {"n": {"type": "number", "minimum": 3}}},
     "'minimum' at $.properties.n"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "'oneOf' at $"),
    ({"allOf": [{"type": "integer"}, {"maximum": 3}]}, "'allOf' at $"),
    ({"type": "object", "properties": {"s": {"maxLength": 3}}}, "'maxLength' at $.properties.s"),
    ({"anyOf": [{"type": "integer"}, {"type": "number"}]}, "'anyOf' at $"),
    ({"type": "object", "properties": {"a": {}}, "required": ["b"]}, "'required' at $"),
    ({"type": "strng"}, "unknown type"),
]


@pytest.mark.parametrize("schema,needle", BAD)
def test_unsupported_schema_is_400_naming_keyword_and_path(server, schema, needle):
    st, _, body = server.post("/v1/chat/completions",
                              {"model": "m", "messages": MSGS, "max_tokens": 4,
                               "response_format": schema_format(schema)})
    assert st == 400, body
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["param"] == "response_format"
    assert needle in err["message"], err["message"]
    assert "\n" not in err["message"]


def test_bad_response_format_shapes_and_server_unharmed(server):
    cl = server.client()
    for rf in ({"type": "xml"}, {"type": "json_schema"},
               {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}},
               {"type": "json_schema", "json_schema": {"name": "x", "schema": 3}},
               {"type": "json_schema", "json_schema": {"name": "x", "strict": "yes",
                                                       "schema": {}}},
               "json_object"):
        with pytest.raises(openai.BadRequestError) as e:
            cl.chat.completions.create(model="m", messages=MSGS, max_tokens=4,
                                       response_format=rf)
        assert e.value.status_code == 400
        assert e.value.body["param"] == "response_format", e.value.body
    st, _, _ = server.request("GET", "/health")
    assert st == 200
    r = cl.chat.completions.create(model="m", messages=MSGS, max_tokens=64, temperature=0,
                                   response_format=schema_format({"type": "object",
                                                                  "properties": {}}))
    assert r.choices[0].message.content == "{}"


# ---------------------------------------------------------------------------------------
# fmoe generate --json-schema FILE / --json-object
# ---------------------------------------------------------------------------------------

def generate(*args):
    exe = serve_util._build_dir() / "cmd" / "fmoe"
    return subprocess.run([str(exe), "generate", "--prompt", "Data:", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def test_generate_json_schema_over_seeds(tmp_path):
    path = tmp_path / "person.json"
    path.write_text(json.dumps(SHAPES))
    done = 0
    for seed in range(4):
        p = generate("--json-schema", path, "--temperature", 1, "--seed", seed,
                     "--max-new-tokens", 128, "--json")
        assert p.returncode == 0, p.stderr
        out = json.loads(p.stdout)
        if out["finish_reason"] == "stop":
            jsonschema.validate(json.loads(out["text"]), SHAPES)
            done += 1
    assert done >= 2
    p = generate("--json-object", "--temperature", 1, "--seed", 1, "--json")
    assert p.returncode == 0, p.stderr
    assert isinstance(json.loads(json.loads(p.stdout)["text"]), dict)


def test_generate_refuses_unsupported_schema_in_one_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"type": "object",
                                "properties": {"d": {"type": "string", "format": "date"}}}))
    p = generate("--json-schema", path)
    assert p.returncode != 0 and p.stdout == ""
    assert p.stderr.count("\n") == 1, p.stderr
    assert f"{path}: 'format' at $.properties.d is not supported" in p.stderr
    p = generate("--json-schema", path, "--json-object")
    assert p.returncode == 2 and "exclude each other" in p.stderr


def test_openai_parse_with_a_pydantic_model(server):
    """openai's own structured-output helper: it writes the schema from pydantic models
    ($defs, $ref, an enum, an Optional) and parses the reply back into them."""
    import enum
    from typing import List, Optional

    pydantic = pytest.importorskip("pydantic")

    class Color(str, enum.Enum):
        red = "red"
        green = "green"

    class Point(pydantic.BaseModel):
        x: float
        y: int

    class Shape(pydantic.BaseModel):
        name: str
        color: Color
        points: List[Point]
        origin: Optional[Point]

    parsed = []
    for seed in range(6):
        try:
            r = server.client().beta.chat.completions.parse(
                model="m", messages=MSGS, response_format=Shape, temperature=1.0, seed=seed,
                max_tokens=150)
        except openai.LengthFinishReasonError:
            continue
        parsed.append(r.choices[0].message.parsed)
    assert parsed and all(isinstance(p, Shape) for p in parsed)
