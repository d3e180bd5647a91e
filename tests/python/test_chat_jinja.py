"""fmoe's Jinja interpreter (runtime/tokenizer/jinja*.c) against jinja2 rendering the way
transformers' apply_chat_template does (chat_jinja_util.py).

Real templates (tests/fixtures/chat_templates, the Mixtral fixture's, and with
FMOE_CHAT_TEMPLATES_DIR the whole of llama.cpp's models/templates folder) are rendered with
conversations of the shapes fmoe serve passes: byte-identical output, or both refuse.
Expressions and statements are checked one by one, then the refusals: a construct the
interpreter does not implement, and hostile templates (deep nesting, runaway loops, huge
output), each refused in one line and in well under a second.
"""
import json
import os
import pathlib
import shutil
import subprocess
import time

import pytest

from chat_jinja_util import conversations, fmoe_render, reference

REPO = pathlib.Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "tests" / "fixtures" / "chat_templates"
MIXTRAL = REPO / "tests" / "fixtures" / "tokenizers" / "mixtral-8x7b-instruct"
EUNSUPPORTED = -5


@pytest.fixture(scope="module")
def render_bin(build_dir):
    p = build_dir / "tests" / "tokenizer" / "jinja_render"
    if not p.exists():
        pytest.fail(f"{p} is not built")
    return p


def compare(render_bin, path, text=None):
    """(identical, refused, mismatches) of one template over all conversations."""
    template = text if text is not None else path.read_text()
    names = [n for n, _ in conversations()]
    cases = [v for _, v in conversations()]
    want = reference(template, cases)
    got = fmoe_render(render_bin, path, cases)
    mismatches, refused = [], []
    for name, w, g in zip(names, want, got):
        if "error" in g:
            assert "\n" not in g["error"] and g["error"].startswith("chat template line "), g
        if "text" in w and "text" in g and w["text"] == g["text"]:
            continue
        if "error" in w and "error" in g:
            continue  # both refuse: the template's raise_exception, a type error, ...
        if "text" in w and g.get("code") == EUNSUPPORTED:
            refused.append((name, g["error"]))
            continue
        mismatches.append((name, w, g))
    return not mismatches and not refused, refused, mismatches


def first_difference(w, g):
    if "text" in w and "text" in g:
        a, b = w["text"], g["text"]
        i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
        return f"at {i}: jinja2 {a[max(0, i - 40):i + 60]!r} / fmoe {b[max(0, i - 40):i + 60]!r}"
    return f"jinja2 {w} / fmoe {g}"


@pytest.mark.parametrize("name", sorted(p.name for p in TEMPLATES.glob("*.jinja")))
def test_real_templates_match_transformers(render_bin, name):
    identical, refused, mismatches = compare(render_bin, TEMPLATES / name)
    assert not refused, refused
    assert not mismatches, [(n, first_difference(w, g)) for n, w, g in mismatches]


def test_mixtral_fixture_template_matches_transformers(render_bin, tmp_path):
    cfg = json.loads((MIXTRAL / "tokenizer_config.json").read_text())
    p = tmp_path / "mixtral.jinja"
    p.write_text(cfg["chat_template"])
    identical, refused, mismatches = compare(render_bin, p)
    assert identical, (refused, mismatches)


def test_llama_cpp_templates(render_bin):
    """Every template of llama.cpp's models/templates folder (FMOE_CHAT_TEMPLATES_DIR)."""
    d = os.environ.get("FMOE_CHAT_TEMPLATES_DIR")
    if not d or not pathlib.Path(d).is_dir():
        pytest.skip("FMOE_CHAT_TEMPLATES_DIR does not name llama.cpp's models/templates")
    paths = sorted(pathlib.Path(d).glob("*.jinja"))
    assert paths
    identical, refused, bad = [], [], []
    for p in paths:
        same, ref, mism = compare(render_bin, p)
        if same:
            identical.append(p.name)
        elif mism:
            bad.append((p.name, [(n, first_difference(w, g)) for n, w, g in mism][:2]))
        else:
            refused.append((p.name, ref[0][1]))
    print(f"\n{len(identical)}/{len(paths)} of llama.cpp's templates render identically; "
          f"refused: {refused}")
    assert not bad, bad


# ---- expressions and statements, one by one ------------------------------------------------

SNIPPETS = [
    # literals, printing as Python prints
    "{{ 'a' ~ 1 ~ none ~ true ~ false }}|{{ None }}|{{ True }}",
    "{{ 1.5 }} {{ 1e20 }} {{ 1e16 }} {{ 1e15 }} {{ 0.1 + 0.2 }} {{ 1e-5 }} {{ 0.0001 }} {{ -0.0 }} {{ 2.0 }}",
    "{{ [1, 'a', none, 1.0, [true]] }} {{ {'a': 1, 'b': [2]} }} {{ (1, 2) }} {{ (1,) }} {{ () }}",
    "{{ \"it's\" }} {{ ['it\\'s', \"q\\\"\"] }} {{ 'a\\tb\\n' }}|{{ 'x' 'y' }}|{{ '\\u00e9\\x41' }}",
    # arithmetic
    "{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 7.5 // 2 }} {{ 'ab' * 3 }} {{ [1] * 2 }}",
    "{{ 1 + 2 * 3 - 4 }} {{ (1 + 2) * 3 }} {{ -2 ** 2 }} {{ 10 - 2 - 3 }} {{ 1 ~ 2 + 3 }}",
    "{{ [1, 2] + [3] }} {{ 'a' + 'b' }} {{ 3 > 2 > 1 }} {{ 1 < 2 < 1 }} {{ 1 == 1.0 }} {{ 'a' < 'b' }}",
    # logic returns operands, as Python's
    "{{ none or 'd' }}|{{ 0 and 1 }}|{{ '' or [] }}|{{ 'x' and 'y' }}|{{ not 0 }}|{{ not 'a' }}",
    "{{ 'a' if false }}|{{ 'b' if true else 'c' }}|{{ 'd' if 0 else 'e' if 1 else 'f' }}",
    "{{ 'a' in 'cat' }} {{ 1 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }} {{ 'z' not in 'abc' }}",
    # member access
    "{{ d.a }} {{ d['a'] }} {{ d.items is callable }} {{ d['items'] }} {{ d.missing }}|{{ d.get('a') }} {{ d.get('x', 7) }}",
    "{{ xs[0] }} {{ xs[-1] }} {{ xs[9] }}|{{ xs[1:] }} {{ xs[:-1] }} {{ xs[::-1] }} {{ xs[::2] }} {{ 'héllo'[1:3] }} {{ 'héllo'[::-1] }} {{ 'héllo'[1] }}",
    "{{ none.x }}|{{ (none).y }}|{{ 5.x }}|{{ xs.0 }}",
    # tests
    "{{ x is defined }}{{ y is none }}{{ 3 is odd }}{{ 4 is even }}{{ 'a' is string }}{{ x is not defined }}{{ y is not none }}",
    "{{ 1 is number }}{{ 1.0 is number }}{{ true is number }}{{ 1 is integer }}{{ true is integer }}{{ 1.0 is float }}{{ true is boolean }}{{ true is true }}{{ 0 is false }}",
    "{{ d is mapping }}{{ xs is mapping }}{{ xs is iterable }}{{ 'a' is iterable }}{{ d is sequence }}{{ 1 is iterable }}{{ xs is sequence }}",
    "{{ 'u' is equalto 'u' }}{{ 3 is eq(3) }}{{ 6 is divisibleby 3 }}{{ 'a' is in 'cat' }}{{ 'abc' is lower }}{{ 'ABC' is upper }}{{ x is undefined }}",
    # filters
    "{{ ' x '|trim }}|{{ 'xxaxx'|trim('x') }}|{{ 'Hello World'|lower }}|{{ 'hello wORLD-foo(bar'|title }}|{{ 'hELLO'|capitalize }}|{{ 'a'|upper }}",
    "{{ xs|length }} {{ 'héllo'|length }} {{ d|length }} {{ xs|count }} {{ undefined_var|length }} {{ xs|first }} {{ xs|last }} {{ []|first }}|",
    "{{ xs|join(', ') }}|{{ xs|join }}|{{ ms|join(',', attribute='r') }}|{{ 'abc'|list }}|{{ d|list }}|{{ d|items|list }}",
    "{{ 'aXbXc'|replace('X', '-') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ 'ab'|replace('', '-') }}",
    "{{ '3'|int + 1 }} {{ '3.7'|int }} {{ 'x'|int }} {{ 'x'|int(5) }} {{ 3.9|int }} {{ '2.5'|float }} {{ 2|float }} {{ 'x'|float }}",
    "{{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 2.1|round(0, 'ceil') }} {{ 2.9|round(0, 'floor') }} {{ -3|abs }} {{ -2.5|abs }}",
    "{{ x|default('dflt') }} {{ ''|default('e') }} {{ ''|default('e', true) }} {{ none|d('n') }} {{ 0|default(1, boolean=true) }}",
    "{{ ms|map(attribute='r')|list }} {{ ms|selectattr('r', 'equalto', 'u')|map(attribute='c')|join(',') }} {{ ms|rejectattr('r', 'eq', 'u')|list|length }}",
    "{{ xs|select('odd')|list }} {{ xs|reject('odd')|list }} {{ [0, 1, '', 'a']|select|list }} {{ ['a', 'B']|map('upper')|list }} {{ none|map(attribute='x')|list }}",
    "{{ ['b', 'A', 'c']|sort }} {{ ['b', 'A', 'c']|sort(case_sensitive=true) }} {{ [3, 1, 2]|sort(reverse=true) }} {{ ms|sort(attribute='c')|map(attribute='c')|list }}",
    "{{ ['a', 'A', 'b', 'a']|unique|list }} {{ [1, 2, 3]|reverse|list }} {{ 'abc'|reverse }} {{ {'b': 1, 'A': 2}|dictsort }} {{ [1, 2, 3, 4, 5]|batch(2)|list }}",
    "{{ [1, 2, 3]|sum }} {{ [3, 1, 2]|min }} {{ [3, 1, 2]|max }} {{ 'a b  c'|wordcount }} {{ '<a href=\"x\">'|e }} {{ ('<b>'|safe) + '<i>' }}",
    "{{ 'line1\nline2\n\nline4'|indent }}|{{ 'a\nb'|indent(2, true) }}|{{ 'a\n\nb\n'|indent(2, blank=true) }}|{{ 'a\nb'|indent('> ') }}",
    "{{ ms|tojson }}|{{ ms[0]|tojson(indent=2) }}|{{ {'b': 1, 'a': [1, {}]}|tojson(sort_keys=true) }}|{{ 'é\"\\n\\u0001'|tojson }}|{{ 'é🙂'|tojson(ensure_ascii=true) }}",
    "{{ {'a': [1, 2]}|tojson(separators=(',', ':')) }}|{{ [1.5, none, true, 'x']|tojson(indent=1) }}|{{ []|tojson(indent=2) }}|{{ {}|tojson }}",
    # string methods
    "{{ ' x '.strip() }}|{{ 'xyxay'.strip('xy') }}|{{ '  a '.lstrip() }}|{{ ' a  '.rstrip() }}|{{ 'a\n'.rstrip('\n') }}",
    "{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'c')) }} {{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a b c'.split(none, 1) }}",
    "{{ 'Hello'.upper() }} {{ 'Hello'.lower() }} {{ 'hello world'.title() }} {{ 'abcb'.find('b') }} {{ 'abcb'.rfind('b') }} {{ 'abc'.find('z') }} {{ 'abab'.count('ab') }}",
    "{{ 'a{}b{}'.format(1, 'x') }} {{ '{0}-{0}'.format(2) }} {{ '{n}!'.format(n='hi') }} {{ '{{x}}'.format() }} {{ ', '.join(['a', 'b']) }} {{ 'a\nb'.splitlines() }}",
    "{{ 'abc'.replace('b', 'B') }} {{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|list }} {{ '12'.isdigit() }} {{ 'ab'.isalpha() }}",
    # statements
    "{% for m in ms %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem.r if loop.previtem is defined }}{{ loop.nextitem is defined }}{{ loop.cycle('a', 'b') }};{% endfor %}",
    "{% for x in xs if x > 1 %}{{ loop.index }}:{{ x }}/{{ loop.length }} {% else %}none{% endfor %}|{% for x in [] %}x{% else %}empty{% endfor %}",
    "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}{% for (a, b) in [[1, 2]] %}{{ a + b }}{% endfor %}{% for c in 'hé' %}[{{ c }}]{% endfor %}",
    "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}{{ range(3)|list }}{{ range(1, 7, 2)|list }}{{ range(3, 0, -1)|list }}",
    "{% set x = 1 %}{% for i in range(3) %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}{% if true %}{% set y = 5 %}{% endif %}{{ y }}",
    "{% set ns = namespace(a=0, s='') %}{% for i in range(5) %}{% set ns.a = ns.a + i %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.a }} {{ ns.s }}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = 1, 2 %}{{ t }}{% set x %}block {{ 1 + 1 }}{% endset %}[{{ x|upper }}]",
    "{% macro f(a, b='d', c=none) %}[{{ a }}{{ b }}{{ c }}]{% endmacro %}{{ f(1) }}{{ f(2, 3) }}{{ f(4, c=5) }}{{ f(a=6) }}",
    "{% macro rec(n) %}{% if n > 0 %}{{ n }}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(4) }}",
    "{% filter upper %}shout {{ 'it' }}{% endfilter %}|{% raw %}{{ not a tag }}{% endraw %}",
    "{{ dict(a=1, b='x') }} {{ dict({'z': 1}, y=2) }} {{ namespace(k=1).k }}",
    # whitespace control as transformers sets it (trim_blocks, lstrip_blocks)
    "  {% if true %}\n  yes\n  {% endif %}\nend\n",
    "a\n    {% for i in xs %}\n    {{ i }}\n    {% endfor %}\nb",
    "{# c #}\n  {#- c2 -#}  x {{- ' y' -}}  \n z {%- if true -%}  \n  w  {%- endif %}\n",
    "a  {%+ if true %}b{% endif +%}\nc\n  {%- if true %}\nd{% endif %}",
    "x {{ 1 }}\n  {{ 2 }}  \n{% if true %}  y{% endif %}  \n",
    "line\r\nother\rthird {{ 'a' }}\n\n",
    # errors both refuse
    "{{ raise_exception('bad thing') }}",
    "{{ undefined_var.attr }}",
    "{{ 1 + 'a' }}",
    "{{ xs.append(4) }}",
    "{{ ms|map(attribute='r')|tojson }}",
    "{% for x in none %}{% endfor %}",
    "{{ 1 // 0 }}",
]

VARS = {"xs": [1, 2, 3, 4], "d": {"a": 1, "items": "key", "B": 2},
        "ms": [{"r": "u", "c": "z"}, {"r": "a", "c": "y"}, {"r": "u", "c": "x"}], "y": None}


def test_snippets_match_transformers(render_bin, tmp_path):
    failures = []
    for i, s in enumerate(SNIPPETS):
        p = tmp_path / f"s{i}.jinja"
        p.write_bytes(s.encode())
        (w,) = reference(s, [VARS])
        (g,) = fmoe_render(render_bin, p, [VARS])
        if "error" in g:
            assert "\n" not in g["error"], g
        if ("text" in w) != ("text" in g) or w.get("text") != g.get("text"):
            failures.append((s, w, g))
    assert not failures, "\n".join(f"{s!r}\n   jinja2: {w}\n   fmoe:   {g}" for s, w, g in failures)


# ---- refusals ------------------------------------------------------------------------------

REFUSED = [
    ("{% include 'other.jinja' %}", "line 1: '{% include %}' is not supported"),
    ("a\n{% extends 'base' %}", "line 2: '{% extends %}' is not supported"),
    ("a\n\n{{ x|nonesuch }}", "line 3: filter 'nonesuch' is not supported"),
    ("{% if x is nonesuch %}{% endif %}", "line 1: test 'nonesuch' is not supported"),
    ("{% for x in xs recursive %}{% endfor %}", "line 1: recursive for loops are not supported"),
    ("{% call m() %}{% endcall %}", "line 1: '{% call %}' is not supported"),
    ("{% if x %}", "is not closed"),
    ("{{ x ", "'{{' is not closed"),
    ("{% endfor %}", "line 1: unexpected 'endfor'"),
    ("{{ f(*args) }}", "'*args' / '**kwargs' in a call are not supported"),
]


@pytest.mark.parametrize("template,message", REFUSED)
def test_refused_in_one_line(render_bin, tmp_path, template, message):
    p = tmp_path / "t.jinja"
    p.write_text(template)
    (g,) = fmoe_render(render_bin, p, [{"xs": [1]}])
    assert "error" in g and message in g["error"] and "\n" not in g["error"], g


HOSTILE = [
    ("deep parentheses", "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}", "nested more than"),
    ("deep blocks", "{% if true %}" * 3000 + "x" + "{% endif %}" * 3000, "nested more than"),
    ("deep lists", "{{ " + "[" * 5000 + "]" * 5000 + " }}", "nested more than"),
    ("runaway loops", "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}"
                      "{% endfor %}", "evaluation steps"),
    ("huge range", "{{ range(10000000000)|length }}", "range() of more than"),
    ("huge output", "{% for a in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "over"),
    ("string doubling", "{% set ns = namespace(s='xx') %}{% for i in range(64) %}"
                        "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}", "over"),
    ("repetition", "{{ 'x' * 100000000000 }}", "repetition over"),
    ("endless recursion", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
     "macro calls nested more than"),
    ("big integers", "{{ 2 ** 1000 }}", "integer overflow"),
    ("long chain", "{{ " + " + ".join(["1"] * 50000) + " }}", "expressions nested more than"),
    ("deep recursion", "{% macro f(n) %}" + "{% if true %}" * 150 + "{{ f(n) }}" + "{% endif %}" * 150
                       + "{% endmacro %}{{ f(0) }}", "nested more than"),
    ("deep value", "{% set ns = namespace(x=[]) %}{% for i in range(5000) %}{% set ns.x = [ns.x] %}"
                   "{% endfor %}{{ ns.x }}", "nested more than"),
]


@pytest.mark.parametrize("name,template,message", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_templates_refused_in_one_line(render_bin, tmp_path, name, template, message):
    p = tmp_path / "t.jinja"
    p.write_text(template)
    t0 = time.monotonic()
    (g,) = fmoe_render(render_bin, p, [{}])
    assert time.monotonic() - t0 < 10
    assert "error" in g and message in g["error"] and "\n" not in g["error"], g


def test_refused_template_falls_back_with_one_warning(fmoe_bin, tmp_path):
    """A template the interpreter refuses, with a family's markers: the fixed renderer, and
    one warning line saying why; without markers, the refusal is the answer."""
    tiny = REPO / "datasets" / "fmoe-tiny"
    shutil.copy(tiny / "tokenizer.json", tmp_path / "tokenizer.json")
    cfg = json.loads((tiny / "tokenizer_config.json").read_text())

    def tokenize(template, *extra):
        cfg["chat_template"] = template
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
        return subprocess.run([str(fmoe_bin), "tokenize", "--tokenizer", str(tmp_path), "--chat",
                               "--text", "hi", "--json", *extra], capture_output=True, text=True)

    p = tokenize("{% include 'x' %}<|im_start|>")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["prompt"] == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    warnings = [l for l in p.stderr.splitlines() if "warning" in l]
    assert len(warnings) == 1 and "line 1: '{% include %}' is not supported" in warnings[0]
    p = tokenize("{% include 'x' %}<|im_start|>", "--chat-template", "jinja")
    assert p.returncode == 1 and "'{% include %}' is not supported" in p.stderr
    p = tokenize("{% include 'x' %}")
    assert p.returncode == 1 and "'{% include %}' is not supported" in p.stderr
    p = tokenize("<<{{ messages[0].content|upper }}>>{% if add_generation_prompt %}[bot]{% endif %}")
    assert p.returncode == 0 and json.loads(p.stdout)["prompt"] == "<<HI>>[bot]", p.stderr


def test_gguf_chat_template_key(fmoe_bin, tmp_path):
    """A GGUF whose embedded files carry no template: its tokenizer.chat_template key."""
    gguf = pytest.importorskip("gguf")
    w = gguf.GGUFWriter(str(tmp_path / "t.gguf"), "llama")
    w.add_string("fmoe.file.tokenizer.json", (REPO / "datasets" / "fmoe-tiny" / "tokenizer.json").read_text())
    w.add_string("tokenizer.chat_template", "[{{ messages[0].content }}]{{ '>' if add_generation_prompt }}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    p = subprocess.run([str(fmoe_bin), "tokenize", "--tokenizer", str(tmp_path / "t.gguf"), "--chat",
                        "--text", "hi", "--json"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["prompt"] == "[hi]>"
