"""Chat templates rendered with jinja2 alone, exactly as transformers' `apply_chat_template` renders them.

An engine runs where transformers is not installed, so its jinja environment is rebuilt here: a
sandbox with trim_blocks and lstrip_blocks, the loopcontrols extension and the `{% generation %}`
tag, a `tojson` that keeps non-ASCII characters and takes indent/separators/sort_keys,
`raise_exception`, `strftime_now`, and the guarded `dict` and `namespace`. The special tokens
(bos_token, eos_token, ...) are template variables, and extra keywords (enable_thinking) are
passed through. tests/test_tokenizer.py checks the output against transformers itself.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The template refused the messages (raise_exception) or could not be rendered."""


class _GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant spans for training masks; rendering
    outputs the body unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Jinja's own tojson escapes HTML characters; templates expect plain JSON.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format):
    return datetime.now().strftime(format)


class _TemplateDict:
    """`dict(...)` for templates, without exposing the dict type itself."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """`namespace(...)` that refuses underscore-prefixed attributes (a sandbox escape route)."""

    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed attributes on a namespace, got {name!r}")


@functools.lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationTag, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as error:
        raise ChatTemplateError(f"the chat template does not parse (line {error.lineno}): {error.message}") from None


# A message's reasoning may come under several names; templates read `reasoning_content`, gpt-oss's `thinking`.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _normalize(message: dict) -> dict:
    # transformers drops None-valued keys (templates handle a missing key, not a None) and aliases reasoning.
    message = {key: value for key, value in message.items() if value is not None}
    reasoning = next((message[key] for key in _REASONING_FIELDS if message.get(key) is not None), None)
    if reasoning is not None:
        message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
    return message


def render(source: str, messages: list[dict], *, special_tokens: dict[str, str], add_generation_prompt: bool = False,
           tools: list[dict] | None = None, documents: list[dict] | None = None, **kwargs) -> str:
    """The template's text for `messages`; `special_tokens` (name -> token) become variables, and
    `kwargs` (enable_thinking, ...) override them."""
    if not messages:
        raise ChatTemplateError("cannot apply the chat template to an empty conversation")
    for message in messages:
        if not isinstance(message, dict):
            raise ChatTemplateError(f"chat messages must be dicts, got {message!r}")
    template = compile_template(source)
    variables = {**special_tokens, **kwargs}
    try:
        return template.render(messages=[_normalize(m) for m in messages], tools=tools, documents=documents,
                               add_generation_prompt=add_generation_prompt, **variables)
    except jinja2.exceptions.TemplateError as error:
        raise ChatTemplateError(str(error)) from None
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as error:
        # A template is code: `'a' + none` and the like fail in Python, not in jinja.
        raise ChatTemplateError(f"the chat template failed: {type(error).__name__}: {error}") from None
