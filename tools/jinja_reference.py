#!/usr/bin/env python3
"""Expected outputs for qinfer's chat-template engine, rendered by Python Jinja2 (3.1.x) configured
exactly as transformers' apply_chat_template configures it.

Writes tests/jinja/data/expected/:
  TEMPLATE__REQUEST.txt    the prompt for every (tests/jinja/data/*.jinja, requests/*.json) pair
  TEMPLATE__REQUEST.error  instead, when rendering fails: the exception type and message
  snippets.json            small engine cases (template, context, output or error) defined below
  random.json              seeded random templates: whitespace control, expressions, statements

The tests read only these files, so CI needs no Python. Re-run after changing a template, a request
or a snippet:  python3 tools/jinja_reference.py
"""
import json
import sys
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "jinja" / "data"
EXPECTED = DATA / "expected"


# --- the environment of transformers.utils.chat_template_utils._compile_jinja_template ---

class TemplateRaised(jinja2.exceptions.TemplateError):
    pass


def raise_exception(message):
    raise TemplateRaised(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format):
    return datetime.now().strftime(format)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


# --- what qinfer's ChatTemplate::render does with a request (src/tokenizer/chat_template.h) ---

def special_tokens(config):
    out = {}
    for key in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            out[key] = value
    if isinstance(config.get("additional_special_tokens"), list):
        out["additional_special_tokens"] = [t["content"] if isinstance(t, dict) else t
                                            for t in config["additional_special_tokens"]]
    return out


def normalized_messages(request):
    messages = []
    for m in request["messages"]:
        m = json.loads(json.dumps(m))
        if m.get("content") is None:
            m["content"] = ""
        for call in m.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                text = function["arguments"]
                function["arguments"] = json.loads(text) if text else {}
        messages.append(m)
    return messages


def cut_after_final_message(prompt, last):
    # transformers' continue_final_message.
    final = last["content"]
    if isinstance(final, list):
        final = next(block["text"] for block in reversed(final) if "text" in block)
    if final.strip() not in prompt:
        raise ValueError("final message not in prompt")
    at = prompt.rindex(final.strip())
    if prompt[at:at + len(final.lstrip())] == final:
        return prompt[:at + len(final.lstrip())]
    return prompt[:at + len(final.strip())]


def render_request(template, request, tokens):
    messages = normalized_messages(request)
    add_generation_prompt = request.get("add_generation_prompt", True)
    continue_final = request.get("continue_final_message", False)
    assert not (add_generation_prompt and continue_final)
    context = dict(tokens)
    context.update(request.get("chat_template_kwargs") or {})
    prompt = template.render(messages=messages, tools=request.get("tools"), documents=request.get("documents"),
                             add_generation_prompt=add_generation_prompt, **context)
    if continue_final:
        prompt = cut_after_final_message(prompt, messages[-1])
    return prompt


# --- engine snippets: (name, template), all rendered with CONTEXT ---

CONTEXT = {
    "d": {"a": 1, "b": [1, 2], "items": "key named items", "nested": {"x": {"y": "deep"}}},
    "l": [3, 1, 2],
    "s": "héllo wörld",
    "n": None,
    "f": 1.5,
    "t": True,
    "e": "",
    "users": [{"name": "ann", "age": 30, "admin": True}, {"name": "Bob", "age": 25, "admin": False},
              {"name": "cy", "age": 35}],
    "msgs": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
             {"role": "assistant", "content": "yo"}],
}

SNIPPETS = [
    # printing Python values
    ("print_scalars", "{{ 1 }}|{{ -2 }}|{{ 1.0 }}|{{ 1.5e3 }}|{{ 0.1 + 0.2 }}|{{ 1e16 }}|{{ 1e15 }}|{{ 1e-5 }}|{{ 0.0001 }}|{{ 1_000 }}|{{ 0x1F }}|{{ 0o17 }}|{{ 0b101 }}"),
    ("print_none_bool", "{{ none }}|{{ None }}|{{ n }}|{{ true }}|{{ False }}|{{ t }}"),
    ("print_containers", "{{ l }}|{{ d }}|{{ users[0] }}|{{ (1,) }}|{{ (1, 'a') }}|{{ () }}|{{ [] }}|{{ {} }}|{{ 1, 2 }}"),
    ("print_repr_strings", "{{ ['a', \"it's\", 'say \"hi\"', 'both \\' \"', 'tab\\tnl\\n', 'back\\\\slash', '\\x01\\x7f', 'é日本\\u00a0\\u200b', '🌍'] }}"),
    ("print_floats", "{{ [0.5, 2.0, 100.0, 1e22, 123456789.123, -0.0, 3.14159, 1/3, 2.5e-10, 1e300*1e10] }}"),
    ("print_markup_in_list", "{{ ['<b>'|safe, '<i>'|escape] }}"),
    ("print_undefined", "[{{ missing }}][{{ d.missing }}][{{ l[10] }}][{{ missing is defined }}]"),
    ("print_namespace_macro", "{% set ns = namespace(a=1, b='x') %}{{ ns }}{% macro m() %}{% endmacro %}|{{ m }}"),
    # whitespace control
    ("trim_blocks", "{% if true %}\nyes\n{% endif %}\nafter"),
    ("lstrip_blocks", "  {% if true %}\n    indented\n  {% endif %}\n  {{ 'var keeps indent' }}\nend"),
    ("lstrip_not_after_text", "text {% if true %}x{% endif %} more"),
    ("minus_strip", "a   \n  {%- if true -%}  \n  b  \n  {%- endif -%}\n  c {{- ' d ' -}} e\n{{ 'f' -}}\n\n g"),
    ("plus_disables", "  {%+ if true %}x{% endif +%}\n|\n{%- if true +%}\ny{% endif %}"),
    ("comments", "a{# comment #}b\n  {# own line #}\nc {#- strip -#}  d\n{#\nmulti\nline\n#}\ne"),
    ("raw_block", "{% raw %}{{ not evaluated }} {% if %}{% endraw %}|  {% raw -%}  x  {%- endraw %}\n|"),
    ("trailing_newline_dropped", "line\n"),
    ("crlf_newlines", "a\r\n{% if true %}\r\nb\r\n{% endif %}\rc"),
    ("unicode_space_strip", "x \u00a0\u3000 {%- if true %}y{% endif %}"),
    # expressions and operators
    ("arithmetic", "{{ 7 + 2 }} {{ 7 - 2.5 }} {{ 7 * 3 }} {{ 7 / 2 }} {{ 6 / 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7.5 % 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 2 ** 0.5 }} {{ true + 1 }}"),
    ("precedence", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ not 1 == 2 }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 2 * 3 ~ 4 }} {{ 'a' ~ 'b' | upper }}"),
    ("string_ops", "{{ 'a' + 'b' }} {{ 'ab' * 3 }} {{ 2 * 'x' }} {{ [1] * 3 }} {{ [1, 2] + [3] }} {{ (1,) + (2,) }} {{ 'a' ~ 1 ~ none ~ true ~ 1.5 ~ missing ~ [1] }}"),
    ("percent_format", "{{ '%s and %r' % ('x', 'y') }}|{{ '%d%%' % 42 }}|{{ '%5.2f|%-4d|%03d|%x|%X|%o' % (3.14159, 7, 5, 255, 255, 8) }}|{{ '%(a)s-%(b)s' % {'a': 1, 'b': 2} }}|{{ '%s' % [1, 2] }}|{{ '%e|%g|%c' % (12345.678, 0.0001, 65) }}"),
    ("comparisons", "{{ 1 == 1.0 }} {{ 'a' == 'a' }} {{ [1, 2] == [1, 2] }} {{ (1, 2) == [1, 2] }} {{ {'a': 1} == {'a': 1} }} {{ none == none }} {{ 1 != 2 }} {{ 'abc' < 'abd' }} {{ [1, 2] < [1, 3] }} {{ true == 1 }} {{ 'é' > 'z' }}"),
    ("in_operator", "{{ 'ell' in 'hello' }} {{ 2 in [1, 2] }} {{ 'a' in d }} {{ 'z' in d }} {{ 'x' not in 'abc' }} {{ 1 in missing }} {{ (1, 2) in [(1, 2)] }}"),
    ("logic_values", "{{ 0 or 'fallback' }}|{{ 'first' or 'second' }}|{{ 1 and 'both' }}|{{ '' and 'never' }}|{{ none or [] }}|{{ not '' }}|{{ not [0] }}"),
    ("truthiness", "{% for v in [0, 1, 0.0, 0.5, '', 'x', [], [0], {}, {'a': 0}, none, true, false] %}{{ 'T' if v else 'F' }}{% endfor %}{{ 'T' if missing else 'F' }}{{ 'T' if namespace() else 'F' }}"),
    ("cond_expr", "{{ 'yes' if t else 'no' }}|{{ 'yes' if n else 'no' }}|{{ 'a' if false else 'b' if true else 'c' }}|[{{ 'x' if false }}]|{{ l | length if l else 0 }}|{{ 'A' ~ 'B' if false else 'C' }}"),
    ("cond_binds_looser_than_filter", "{% set v = d %}{{ v | tojson | safe if v is mapping else v | string }}|{% set v = 3 %}{{ v | tojson | safe if v is mapping else v | string }}"),
    ("unary_filter_binding", "{{ -f|abs }} {{ -(f|abs) }} {{ (-1)|abs }}"),
    ("string_literals", "{{ 'adjacent' \"strings\" 'join' }}|{{ 'esc: \\n\\t\\\\ \\' \\x41\\u00e9\\U0001F600 \\101 \\q' }}|{{ \"dq 'single' \\\"double\\\"\" }}"),
    ("list_dict_literals", "{{ [1, 'two', [3], {'four': 4}, (5,),] }}|{{ {'b': 1, 'a': 2, 1: 'int', none: 'none', true: 'bool'} }}|{{ {'k': 1, 'k': 2} }}"),
    # indexing, attributes, slicing
    ("indexing", "{{ l[0] }} {{ l[-1] }} {{ s[0] }} {{ s[-1] }} {{ d['a'] }} {{ d.a }} {{ d.nested.x.y }} {{ d['nested']['x']['y'] }} {{ msgs[1].role }} {{ users.1.name }} {{ msgs[loop_index] if false else msgs[0]['content'] }}"),
    ("slicing", "{{ l[::-1] }} {{ l[1:] }} {{ l[:-1] }} {{ l[::2] }} {{ l[5:] }} {{ l[-10:1] }} {{ s[::-1] }} {{ s[1:4] }} {{ (1, 2, 3)[1:] }} {{ msgs[::-1] | map(attribute='role') | join(',') }} {{ l[None:2] }} {{ 'abcdef'[-2::-2] }}"),
    ("dict_method_beats_key", "{{ d.items is callable }}|{{ d['items'] }}|{{ d.get('a') }}|{{ d.get('zz') }}|{{ d.get('zz', 'dflt') }}|{{ d.keys() | list }}|{{ d.values() | list | length }}|{{ d.items() | list | first }}"),
    ("attr_on_none_is_undefined", "[{{ n.x }}][{{ n.x is defined }}][{{ n['x'] }}][{{ e.upper() }}]"),
    # statements
    ("if_elif_else", "{% for x in [1, 2, 3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %}{% endfor %}"),
    ("for_loop_vars", "{% for x in ['a', 'b', 'c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}[{{ loop.previtem }}|{{ loop.nextitem }}]{{ loop.depth }}{% endfor %}"),
    ("for_else_and_filter", "{% for x in l if x > 1 %}{{ x }}:{{ loop.index }}/{{ loop.length }} {% else %}none{% endfor %}|{% for x in [] %}x{% else %}empty{% endfor %}|{% for x in l if x > 10 %}x{% else %}filtered-empty{% endfor %}"),
    ("for_over_kinds", "{% for k in d %}{{ k }},{% endfor %}|{% for c in 'hé🌍' %}[{{ c }}]{% endfor %}|{% for x in missing %}never{% endfor %}|{% for a, b in [(1, 2), [3, 4]] %}{{ a }}{{ b }}{% endfor %}"),
    ("for_items_unpacking", "{% for key, value in d | items %}{{ key }}={{ value }};{% endfor %}|{% for key, value in d.items() %}{{ key }};{% endfor %}|{% for k, v in d | items if k != 'a' %}{{ k }}{% endfor %}"),
    ("break_continue", "{% for x in range(10) %}{% if x is odd %}{% continue %}{% endif %}{% if x > 6 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
    ("nested_loops", "{% for a in [1, 2] %}{% for b in ['x', 'y'] %}{{ loop.index }}{{ a }}{{ b }} {% endfor %}{{ loop.index }}|{% endfor %}"),
    ("loop_cycle_changed", "{% for x in [1, 1, 2, 3, 3] %}{{ loop.cycle('o', 'e') }}{% if loop.changed(x) %}*{% endif %}{% endfor %}"),
    ("set_scoping", "{% set x = 0 %}{% for i in range(3) %}{{ x }}{% set x = i + 10 %}{{ x }} {% endfor %}{{ x }}|{% if true %}{% set y = 5 %}{% endif %}{{ y }}|{% for i in [1] %}{% set z = 1 %}{% endfor %}[{{ z }}]"),
    ("set_reassign_loop_var", "{% for m in msgs %}{% if m.role == 'user' %}{% set m = {'role': 'USER'} %}{% endif %}{{ m.role }} {% endfor %}"),
    ("set_tuple_and_block", "{% set a, b = 1, 2 %}{{ a }}{{ b }}|{% set block %}  inner {{ a }}  {% endset %}[{{ block }}]|{% set up | upper | trim %}  shout  {% endset %}[{{ up }}]"),
    ("namespace", "{% set ns = namespace(count=0, found=none) %}{% for m in msgs %}{% set ns.count = ns.count + 1 %}{% if m.role == 'user' %}{% set ns.found = loop.index0 %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.found }} {{ ns.missing is defined }}|{% set ns2 = namespace({'a': 1}, b=2) %}{{ ns2.a }}{{ ns2.b }}"),
    ("macros", "{% macro greet(name, greeting='Hello', punct='!') %}{{ greeting }}, {{ name }}{{ punct }}{% endmacro %}{{ greet('Ann') }}|{{ greet('Bob', 'Hi') }}|{{ greet('Cy', punct='?') }}|{{ greet(greeting='Yo', name='Di') }}|{{ greet() }}"),
    ("macro_scoping", "{% set g = 1 %}{% macro show() %}{{ g }}{% set g = 99 %}{{ g }}{% endmacro %}{% set g = 2 %}{{ show() }}{{ g }}|{% for g in [7] %}{{ show() }}{% endfor %}"),
    ("macro_namespace_counter", "{% set c = namespace(n=0) %}{% macro bump(by=1) %}{% set c.n = c.n + by %}{{ c.n }}{% endmacro %}{{ bump() }}{{ bump(5) }}{{ bump() | trim }}{{ c.n }}"),
    ("macro_varargs_kwargs", "{% macro m(a, b=a ~ '!') %}{{ a }}{{ b }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1) }}|{{ m(1, 2, 3, 4, k='v') }}"),
    ("macro_in_expression", "{% macro wrap(x) %}<{{ x }}>{% endmacro %}{{ wrap('a') ~ wrap('b') }}|{{ (wrap('  c  ') | trim) + '!' }}|{{ wrap(wrap('d')) }}|{{ [1, 2] | map('string') | map('upper') | join }}"),
    ("call_block", "{% macro box(title) %}[{{ title }}: {{ caller() }}]{% endmacro %}{% call box('t') %}body {{ 1 + 1 }}{% endcall %}|{% macro each(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}{% call(x) each([1, 2]) %}<{{ x }}>{% endcall %}"),
    ("filter_block_and_with", "{% filter upper %}shout {{ 'this' }}{% endfilter %}|{% with a = 1, b = 'two' %}{{ a }}{{ b }}{% endwith %}[{{ a }}]"),
    ("print_tag", "{% print 'printed' ~ 1 %}|{% print 1, 2 %}"),
    # tests
    ("tests_types", "{% for v in [1, 1.5, 'a', [1], (1,), {'a': 1}, none, true, false] %}{{ v is number }}{{ v is integer }}{{ v is float }}{{ v is string }}{{ v is mapping }}{{ v is iterable }}{{ v is sequence }}{{ v is none }}{{ v is boolean }}{{ v is true }}{{ v is false }}|{% endfor %}"),
    ("tests_undefined", "{{ missing is defined }}{{ missing is undefined }}{{ missing is iterable }}{{ missing is sequence }}{{ missing is none }}{{ missing is string }}{{ missing is mapping }}{{ n is none }}{{ n is not none }}{{ d.zz is undefined }}"),
    ("tests_misc", "{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(4) }}{{ 'abc' is lower }}{{ 'ABC' is upper }}{{ 1 is eq 1 }}{{ 2 is gt 1 }}{{ 2 is lt(1) }}{{ 1 is in [1, 2] }}{{ 'x' is ne 'y' }}{{ none is sameas none }}{{ true is sameas true }}{{ d is callable }}{{ range is callable }}{{ 'upper' is filter }}{{ 'odd' is test }}{{ 'nope' is filter }}{{ ('<b>'|safe) is escaped }}"),
    # filters
    ("filter_length_string_list", "{{ s | length }} {{ l | count }} {{ d | length }} {{ missing | length }} {{ 'x' | string }} {{ n | string }} {{ t | string }} {{ f | string }} {{ l | string }} {{ users[0] | string }}"),
    ("filter_tojson", "{{ d | tojson }}|{{ 'é \"q\" \\\\ \\n \\u2028 <>&' | tojson }}|{{ [1, 2.5, none, true, 'x'] | tojson }}|{{ {} | tojson }}|{{ [] | tojson }}|{{ (1, 2) | tojson }}|{{ {1: 'a', none: 'b', 1.5: 'c', false: 'd'} | tojson }}"),
    ("filter_tojson_options", "{{ d | tojson(indent=2) }}|{{ users[0] | tojson(sort_keys=true) }}|{{ 'é' | tojson(ensure_ascii=true) }}|{{ l | tojson(separators=(',', ':')) }}|{{ d.b | tojson(indent='\\t') }}|{{ {'a': []} | tojson(indent=0) }}"),
    ("filter_items_list", "{{ d | items | list }}|{{ missing | items | list }}|{{ 'abc' | list }}|{{ d | list }}|{{ (1, 2) | list }}"),
    ("filter_strings", "{{ '  x  ' | trim }}|{{ '--x--' | trim('-') }}|{{ s | upper }}|{{ 'ÀB' | lower }}|{{ 'hello wORLD-foo(bar [baz' | title }}|{{ 'hELLO world' | capitalize }}|{{ 'aXbXc' | replace('X', '-') }}|{{ 'aaa' | replace('a', 'b', 2) }}|{{ n | upper }}|{{ missing | upper }}|{{ 'ß straße' | upper }}"),
    ("filter_join_default", "{{ l | join }}|{{ l | join(', ') }}|{{ users | join(' ', attribute='name') }}|{{ ['a', none, 1] | join('-') }}|{{ missing | default('dflt') }}|{{ n | default('dflt') }}|{{ e | default('dflt', true) }}|{{ e | d('short') }}|{{ 0 | default(5, boolean=true) }}"),
    ("filter_first_last", "{{ l | first }} {{ l | last }} {{ s | first }} {{ s | last }} {{ d | first }} [{{ [] | first }}] {{ msgs | last | tojson }}"),
    ("filter_map_select", "{{ users | map(attribute='name') | list }}|{{ users | map(attribute='admin', default='?') | list }}|{{ users | selectattr('admin') | map(attribute='name') | join }}|{{ users | rejectattr('admin') | map(attribute='name') | join }}|{{ msgs | selectattr('role', 'equalto', 'user') | list | length }}|{{ msgs | selectattr('role', '==', 'assistant') | map(attribute='content') | first }}|{{ [1, 2, 3, 4] | select('odd') | list }}|{{ [1, 0, none, 'a'] | select | list }}|{{ [1, 2, 3] | reject('even') | list }}|{{ users | selectattr('age', 'gt', 26) | map(attribute='name') | join(',') }}|{{ users | map(attribute='name') | map('upper') | list }}"),
    ("filter_numbers", "{{ '42' | int }} {{ '4.7' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ 3.9 | int }} {{ '0x1f' | int(base=16) }} {{ ' 12 ' | int }} {{ '1_000' | int }} {{ true | int }} {{ n | int }} {{ '3.5' | float }} {{ 'x' | float }} {{ 2 | float }} {{ ' 1e3 ' | float }} {{ n | float(1.5) }} {{ -3 | abs }} {{ 2.567 | round(2) }} {{ 2.5 | round }} {{ 3.5 | round }} {{ 2.1 | round(0, 'ceil') }} {{ 2.9 | round(method='floor') }}"),
    ("filter_sort_unique_minmax", "{{ l | sort }}|{{ l | sort(reverse=true) }}|{{ ['b', 'A', 'c'] | sort }}|{{ ['b', 'A', 'c'] | sort(case_sensitive=true) }}|{{ users | sort(attribute='age') | map(attribute='name') | join }}|{{ [1, 2, 1, 3, 2] | unique | list }}|{{ ['a', 'A', 'b'] | unique | list }}|{{ l | min }} {{ l | max }} {{ ['b', 'A'] | max }} {{ users | max(attribute='age') | tojson }}|{{ l | sum }} {{ users | sum(attribute='age') }} {{ [0.5, 1] | sum(start=1) }}|{{ l | reverse | list }} {{ 'abc' | reverse }}"),
    ("filter_misc", "{{ d | dictsort }}|{{ {'b': 1, 'A': 2} | dictsort(by='value', reverse=true) }}|{{ 'a\nb\n\nc' | indent(2) }}|{{ 'a\nb' | indent(2, true) }}|{{ 'a\n\nb' | indent('> ', blank=true) }}|{{ '%s=%d' | format('x', 5) }}|{{ 'abc' | center(9) }}!|{{ 'one two  three' | wordcount }}|{{ '<a href=\"x\">&</a>' | escape }}|{{ '<b>' | e }}|{{ ('<i>' | safe) | escape }}|{{ users[0] | attr('name') }}[{{ d | attr('a') }}]"),
    ("safe_and_markup", "{{ '<b>' | safe }}|{{ ('<b>' | safe) + '<i>' }}|{{ '<i>' + ('<b>' | safe) }}|{{ ('<b>' | safe) ~ '<i>' }}|{{ ('<b>' | safe | trim) + '&' }}|{{ ('<b>' | safe) | string + '&' }}|{{ (1 | safe) + '<' }}"),
    # string methods
    ("str_methods", "{{ s.startswith('hé') }}{{ s.endswith(('x', 'ld')) }}{{ s.startswith('llo', 2) }}|{{ 'a,b,,c'.split(',') }}|{{ '  a  b c '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a b c'.rsplit(' ', 1) }}|{{ '  a b  '.split(none, 1) }}|{{ 'xxhixx'.strip('x') }}|{{ '\\n\\nhi\\n'.lstrip('\\n') }}|{{ 'hi\\n\\n'.rstrip() }}|{{ 'abcab'.replace('ab', 'X') }}|{{ 'ab'.replace('', '-') }}|{{ s.upper() }}|{{ s.title() }}|{{ \"they're bill's\".title() }}|{{ 'ÉCOLE'.lower() }}|{{ 'abc'.capitalize() }}"),
    ("str_methods_more", "{{ 'héllo'.find('l') }}{{ 'hello'.rfind('l') }}{{ 'hello'.find('z') }}{{ 'hello'.count('l') }}{{ 'hello'.index('e') }}|{{ '-'.join(['a', 'b']) }}|{{ '12'.isdigit() }}{{ 'ab'.isalpha() }}{{ 'a1'.isalnum() }}{{ ' \\t'.isspace() }}{{ 'ab'.islower() }}{{ 'AB'.isupper() }}{{ ''.isdigit() }}|{{ 'a\\nb\\r\\nc'.splitlines() }}|{{ 'prefix-body'.removeprefix('prefix-') }}|{{ 'k=v=w'.partition('=') }}|{{ 'k=v=w'.rpartition('=') }}|{{ '7'.zfill(3) }}|{{ 'ab'.center(6, '*') }}|{{ 'ab'.ljust(4, '.') }}|{{ 'ab'.rjust(4) }}"),
    ("string_indexing_unicode", "{{ 'héllo'[1] }}{{ '日本語'[1:] }}{{ '🌍x'[0] }}{{ '🌍x' | length }}{{ 'e\u0301' | length }}"),
    # globals
    ("range_and_dict", "{{ range(3) | list }}{{ range(1, 10, 3) | list }}{{ range(5, 0, -2) | list }}{{ range(0) | list }}|{{ dict(a=1, b='x') }}|{{ dict({'z': 0}, y=1) }}"),
    # undefined behaviour
    ("undefined_chain_in_tests", "{{ (missing.attr is defined) if missing is defined else 'guarded' }}|{{ d.zz is defined }}|{{ (d.zz or 'or-default') }}|{{ d.zz | default('filter-default') }}"),
    ("undefined_comparisons", "{{ missing == missing }}{{ missing == none }}{{ missing != 1 }}{{ missing in [1] }}{{ 'x' in missing }}"),
    # sandbox
    ("sandbox_internals", "[{{ ''.__class__ }}][{{ d.__class__ }}][{{ l.append }}][{{ d.update }}][{{ msgs.pop }}][{{ s.__len__ is defined }}]"),
    # errors (expected to fail in both engines)
    ("error_undefined_attribute", "line1\n{{ missing.attr }}"),
    ("error_undefined_call", "{{ missing() }}"),
    ("error_undefined_arith", "\n\n{{ missing + 1 }}"),
    ("error_none_attr_chain", "{{ n.x.y }}"),
    ("error_list_append", "{{ l.append(4) }}"),
    ("error_dict_update", "{% set _ = d.update({'x': 1}) %}"),
    ("error_dunder_call", "{{ ''.__class__.__mro__ }}"),
    ("error_type_concat", "{{ 'a' + 1 }}"),
    ("error_type_add", "{{ 1 + 'a' }}"),
    ("error_concat_binds_tighter", "{{ 1 + 1 ~ 1 }}"),
    ("error_test_argument_quirk", "{{ x is defined if true else 1 }}"),
    ("error_compare", "{{ 'a' < 1 }}"),
    ("error_division", "{{ 1 / 0 }}"),
    ("error_items_on_list", "{{ l | items | list }}"),
    ("error_tojson_undefined", "{{ missing | tojson }}"),
    ("error_tojson_namespace", "{{ namespace(a=1) | tojson }}"),
    ("error_raise_exception", "{% if true %}\n{{ raise_exception('Custom failure: ' ~ 42) }}\n{% endif %}"),
    ("error_syntax_unclosed", "{% for x in l %}\n{{ x }}"),
    ("error_syntax_bad_end", "{% if true %}\n{% endfor %}"),
    ("error_syntax_expression", "{{ 1 + }}"),
    ("error_syntax_unknown_tag", "{% frobnicate %}"),
    ("error_syntax_unknown_filter", "\n{{ 1 | nosuchfilter }}"),
    ("error_syntax_unknown_test", "{{ 1 is nosuchtest }}"),
    ("error_syntax_unclosed_string", "{{ 'abc }}"),
    ("error_syntax_unclosed_comment", "{# never closed"),
    ("error_unpack", "{% for a, b in [(1, 2, 3)] %}{% endfor %}"),
    ("error_macro_too_many_args", "{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}"),
    ("error_macro_unknown_kwarg", "{% macro m(a) %}{% endmacro %}{{ m(b=1) }}"),
    ("error_range_too_big", "{{ range(200000) | length }}"),
    ("error_int_undefined", "{{ missing | int }}"),
    ("error_not_iterable", "{% for x in 5 %}{% endfor %}"),
    ("error_none_not_iterable", "{{ 'a' in n }}"),
    ("error_set_non_namespace", "{% set x = 1 %}{% set x.a = 2 %}"),
    ("error_slice_step_zero", "{{ l[::0] }}"),
    ("error_str_method_arg", "{{ 'abc'.startswith(1) }}"),
    ("error_first_of_none", "{{ n | first }}"),
    # chat-template idioms
    ("qwen_last_query_index", "{%- set ns = namespace(multi_step_tool=true, last_query_index=msgs|length - 1) %}{%- for message in msgs[::-1] %}{%- set index = (msgs|length - 1) - loop.index0 %}{%- if ns.multi_step_tool and message.role == 'user' %}{%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}{%- endif %}{%- endfor %}{{ ns.last_query_index }}"),
    ("think_split", "{% set c = '<think>\\nreason\\n</think>\\n\\nanswer' %}{{ c.split('</think>')[-1].lstrip('\\n') }}|{{ c.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}"),
]

# --- seeded random templates (differential fuzzing, kept as a corpus) ---

def random_whitespace(rng):
    texts = ["", " ", "  ", "\n", "\n\n", " \n ", "\t", "x", " x ", "x\n", "\n  ", "\u00a0", "\r\n", "  \n  y"]
    signs = ["", "-", "+"]

    def tag():
        k = rng.random()
        left, right = rng.choice(signs), rng.choice(signs)
        if k < 0.3:
            return "{%" + left + " if true " + right + "%}", "{%" + rng.choice(signs) + " endif " + rng.choice(signs) + "%}"
        if k < 0.5:
            return ("{%" + left + " for i in [1, 2] " + right + "%}",
                    "{%" + rng.choice(signs) + " endfor " + rng.choice(signs) + "%}")
        if k < 0.7:
            return "{{" + rng.choice(signs) + " 'v' " + rng.choice(["", "-"]) + "}}", None
        if k < 0.85:
            return "{#" + rng.choice(signs) + " c " + rng.choice(signs) + "#}", None
        if k < 0.92:
            return "{%" + left + " set z = 1 " + right + "%}", None
        return ("{%" + left + " raw " + rng.choice(["", "-"]) + "%}" + rng.choice(texts) + "{{x}}" + rng.choice(texts) + "{%" +
                rng.choice(signs) + " endraw " + rng.choice(signs) + "%}", None)

    def gen(depth):
        out = ""
        for _ in range(rng.randint(1, 5)):
            out += rng.choice(texts)
            opening, closing = tag()
            out += opening
            if closing:
                if depth < 2:
                    out += gen(depth + 1)
                out += rng.choice(texts) + closing
        return out + rng.choice(texts)

    return gen(0)


def random_expression(rng):
    atoms = ["1", "0", "-3", "2.5", "0.1", "1e20", "'a'", "'héllo'", "''", "'a,b'", "' x '", "none", "true", "false",
             "[1, 2]", "[]", "['b', 'a']", "(1,)", "{'k': 1}", "{}", "d", "l", "s", "n", "f", "t", "e", "users", "msgs",
             "missing", "d.a", "d.b", "d.zz", "l[0]", "l[-1]", "users[0]", "msgs[1].content", "'日本'", "3", "10", "'3'"]
    binops = ["+", "-", "*", "/", "//", "%", "**", "~", "==", "!=", "<", ">", "<=", ">=", "in", "not in", "and", "or"]
    filters = ["length", "string", "upper", "lower", "trim", "first", "last", "list", "tojson", "int", "float", "abs",
               "default('D')", "join(',')", "items", "reverse", "sort", "unique", "title", "capitalize", "count",
               "safe", "replace('a', 'b')", "map('string')", "select", "sum", "min", "max", "e", "wordcount",
               "center(6)", "round", "dictsort", "d(1, true)", "tojson(indent=1)"]
    tests = ["defined", "undefined", "none", "string", "number", "integer", "float", "mapping", "iterable", "sequence",
             "odd", "even", "true", "false", "boolean", "callable", "lower", "upper", "eq 1", "in [1, 'a']",
             "divisibleby 2"]
    methods = ["upper()", "lower()", "strip()", "split()", "split(',')", "startswith('a')", "endswith('o')",
               "title()", "replace('l', 'L')", "find('l')", "count('l')", "get('a')", "items()", "keys()", "values()",
               "lstrip('h')", "rstrip('o')", "isdigit()", "capitalize()", "splitlines()", "rsplit(',', 1)", "index(1)"]
    subscripts = ["0", "-1", "1:", "::-1", ":2", '"a"', "5"]

    def expr(depth):
        r = rng.random()
        if depth > 3 or r < 0.25:
            return rng.choice(atoms)
        if r < 0.45:
            return f"({expr(depth + 1)} {rng.choice(binops)} {expr(depth + 1)})"
        if r < 0.6:
            return f"{expr(depth + 1)} | {rng.choice(filters)}"
        if r < 0.7:
            return f"({expr(depth + 1)} is {rng.choice(['', 'not '])}{rng.choice(tests)})"
        if r < 0.8:
            return f"{rng.choice(atoms)}.{rng.choice(methods)}"
        if r < 0.85:
            return f"({expr(depth + 1)} if {expr(depth + 1)} else {expr(depth + 1)})"
        if r < 0.9:
            return rng.choice(atoms) + "[" + rng.choice(subscripts) + "]"
        if r < 0.95:
            return f"(not {expr(depth + 1)})"
        return f"[{expr(depth + 1)}, {expr(depth + 1)}]"

    return "{{ " + expr(0) + " }}"


def random_statements(rng):
    def value():
        return rng.choice(["1", "x", "y", "i", "x ~ 'a'", "[1, 2]", "ns.c", "loop.index if loop is defined else 0",
                           "none", "(x or 0) + 1", "m(2)"])

    def stmt(depth):
        r = rng.random()
        if depth > 3 or r < 0.25:
            return "{{ " + rng.choice(["x", "y", "i", "item", "ns.c", "loop.index0 if loop is defined else '-'",
                                       "loop.previtem if loop is defined else '-'", "m()", "m(1, 2)"]) + " }}"
        if r < 0.4:
            return "{% set " + rng.choice(["x", "y", "i", "item"]) + " = " + value() + " %}"
        if r < 0.5:
            return "{% set ns.c = ns.c + 1 %}"
        if r < 0.65:
            return ("{% for " + rng.choice(["i", "item", "x", "i, y"]) + " in " +
                    rng.choice(["[1, 2, 3]", "range(2)", "[[1, 2], [3, 4]]", "[]", "x|string"]) +
                    (" if i != 2" if rng.random() < 0.2 else "") + " %}" + body(depth + 1) +
                    ("{% break %}" if rng.random() < 0.1 else "") + ("{% else %}E" if rng.random() < 0.2 else "") +
                    "{% endfor %}")
        if r < 0.78:
            return ("{% if " + rng.choice(["x", "i", "y is defined", "loop is defined and loop.first", "not y"]) +
                    " %}" + body(depth + 1) + ("{% else %}" + body(depth + 1) if rng.random() < 0.4 else "") +
                    "{% endif %}")
        if r < 0.86:
            return "{% with y = " + value() + " %}" + body(depth + 1) + "{% endwith %}"
        if r < 0.93:
            return "{% macro m(a=x, b=" + value() + ") %}" + body(depth + 1) + "[{{ a }}{{ b }}]{% endmacro %}"
        return "{% set y %}" + body(depth + 1) + "{% endset %}"

    def body(depth):
        return "".join(stmt(depth) for _ in range(rng.randint(1, 4)))

    return ("{% set ns = namespace(c=0) %}{% set x = 5 %}{% macro m(a=1, b=2) %}<{{ a }}{{ b }}{{ x }}>{% endmacro %}" +
            body(0) + "|{{ x }}{{ y }}{{ ns.c }}")


def render_case(env, source, context):
    try:
        return {"output": env.from_string(source).render(**json.loads(json.dumps(context)))}
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"}


def random_results(env):
    import random
    out = {}
    for kind, make, count, seed in (("whitespace", random_whitespace, 300, 11), ("expressions", random_expression, 600, 12),
                                    ("statements", random_statements, 200, 13)):
        rng = random.Random(seed)
        cases = []
        while len(cases) < count:
            source = make(rng)
            if len(source) > 600:  # keep the corpus small
                continue
            result = render_case(env, source, CONTEXT)
            # Object addresses in reprs of generators cannot be matched; skip such cases.
            if " at 0x" in result.get("output", "") or " at 0x" in result.get("error", ""):
                continue
            cases.append({"template": source, **result})
        out[kind] = cases
    return {"context": CONTEXT, "cases": out}


def snippet_results(env):
    results = []
    for name, source in SNIPPETS:
        case = {"name": name, "template": source}
        case.update(render_case(env, source, CONTEXT))
        results.append(case)
    return {"context": CONTEXT, "cases": results}


def main():
    if not jinja2.__version__.startswith("3.1."):
        print(f"warning: expected Jinja2 3.1.x, have {jinja2.__version__}", file=sys.stderr)
    env = environment()
    EXPECTED.mkdir(parents=True, exist_ok=True)
    for stale in EXPECTED.iterdir():
        stale.unlink()
    tokens = special_tokens(json.loads((DATA / "tokenizer_config.json").read_text()))
    templates = sorted(DATA.glob("*.jinja"))
    requests = sorted((DATA / "requests").glob("*.json"))
    outputs = errors = 0
    for template_path in templates:
        template = env.from_string(template_path.read_text(encoding="utf-8"))
        for request_path in requests:
            request = json.loads(request_path.read_text(encoding="utf-8"))
            stem = f"{template_path.stem}__{request_path.stem}"
            try:
                prompt = render_request(template, request, tokens)
            except Exception as e:  # noqa: BLE001
                (EXPECTED / f"{stem}.error").write_text(f"{type(e).__name__}: {e}\n", encoding="utf-8")
                errors += 1
                continue
            (EXPECTED / f"{stem}.txt").write_bytes(prompt.encode("utf-8"))
            outputs += 1
    snippets = snippet_results(env)
    with open(EXPECTED / "snippets.json", "w", encoding="utf-8") as f:
        json.dump(snippets, f, indent=1, ensure_ascii=False)
        f.write("\n")
    with open(EXPECTED / "random.json", "w", encoding="utf-8") as f:
        json.dump(random_results(env), f, indent=0, ensure_ascii=False)
        f.write("\n")
    print(f"{len(templates)} templates x {len(requests)} requests: {outputs} prompts, {errors} errors; "
          f"{len(snippets['cases'])} snippets ({sum('error' in s for s in snippets['cases'])} errors)")


if __name__ == "__main__":
    main()
