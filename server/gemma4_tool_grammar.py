"""tool_choice `required` and a named function on Gemma 4's call syntax (server/gemma4_tool_calls.py),

    <|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>

as a grammar (llguidance's Lark syntax) that writes each function's arguments as Gemma 4's chat template
writes an assistant's calls (its `format_argument` macro), so that a model trained on the template writes
what the grammar allows:

- keys unquoted (`key:value`), pairs joined by "," with no whitespace anywhere; an object's keys in the
  template's order, `dictsort`: sorted by their lower-cased text (ties in the properties' order). An
  object with `properties` takes those keys only (the sorted order leaves no place for others), the
  `required` ones always; one without (`{"type": "object"}`, or an `additionalProperties` schema) takes any
  keys (letters, digits, `_ - .`) in any order, each value of that schema;
- strings between `<|"|>` marks, their text as is (no escapes): any text without the mark and without
  `<tool_call|>` (either, spelled out in ordinary tokens, would end the string or the call for the parser);
  `minLength` / `maxLength`, `enum`, `const`;
- numbers and integers as JSON writes them (the template's `{{ value }}` of a Python number), their bounds
  (`minimum`, `exclusiveMaximum`, `multipleOf`, ...) enforced by llguidance's JSON Schema compiler (`%json`);
  true / false; null;
- arrays `[a,b]` of `items`, `minItems` / `maxItems`; `anyOf` / `oneOf` (as anyOf: a value both branches take
  is allowed, as llguidance's JSON compiler does), a list of types, `enum` of mixed literals (objects and
  arrays rendered as the template renders them), local `$ref`s (`#/$defs/...`, `#/definitions/...`).

A keyword this cannot enforce (`pattern`, `format`, `allOf` of several, `patternProperties`, ...) is refused in
one line naming it (`tools[0].function.parameters.properties.city.pattern: ...`), never dropped: the grammar
is never looser than the schema. The tags and the string mark are Gemma 4's special tokens: `literal` (the
engine's grammar.Grammars.literal) names them so, and the model writes the token its template's calls hold
(a string's text, an ordinary-token lexeme, cannot hold the special token).
"""

from __future__ import annotations

import json
import re

from trt_llm.runtime.sampling.grammar import json_lark
from trt_llm.server.gemma4_tool_calls import STRING, TOOL_CALL_END, TOOL_CALL_START
from trt_llm.server.tool_grammar import ToolGrammarError

ANNOTATIONS = {"description", "title", "default", "examples", "$schema", "$comment", "deprecated", "readOnly",
               "writeOnly"}
KINDS = ("string", "number", "integer", "boolean", "null", "array", "object")
KEYWORDS = {  # what each kind of value reads; any other keyword is refused
    "string": {"minLength", "maxLength"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
    "array": {"items", "minItems", "maxItems"},
    "object": {"properties", "required", "additionalProperties"},
}
KNOWN = ANNOTATIONS | {"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions"} \
    | set().union(*KEYWORDS.values())
# A key the parser reads back as written (gemma4_tool_calls._Arguments._key): none of : , { } [ ], no
# surrounding whitespace; the tags' text would end a call.
_KEY = re.compile(r"[^\s:,{}\[\]](?:[^:,{}\[\]]*[^\s:,{}\[\]])?")
_FREE_KEY = r"/[A-Za-z0-9_][A-Za-z0-9_.\-]*/"
_NAME = re.compile(r"[\w.\-]+")  # gemma4_tool_calls._CALL's name
_BANNED = (STRING, TOOL_CALL_END, TOOL_CALL_START)
# a string's text: no mark and no end tag, spelled out in ordinary tokens
_NO_TAGS = r'~/(?s:.*(<\|"\|>|<tool_call\|>).*)/'


def gemma4_tool_grammar(tools: list[dict], name: str | None, parallel: bool, literal) -> str:
    """tool_grammar.tool_grammar for syntax "gemma4": the Lark grammar of one call of `name` (None: one
    call of any tool, or several in a row with `parallel`)."""
    writer = _Writer(literal)
    alternatives = []
    for index, tool in enumerate(tools):
        function = tool["function"]
        if name is not None and function["name"] != name:
            continue
        if not _NAME.fullmatch(function["name"]):
            raise ToolGrammarError(f"tools[{index}].function.name: {function['name']!r} cannot be written in Gemma "
                                   "4's call syntax (letters, digits, _ . - only)", f"tools[{index}].function.name")
        rule = f"call_{index}"
        writer.root, writer.prefix = function.get("parameters") or {}, f"t{index}"
        arguments = writer.arguments(f"tools[{index}].function.parameters")
        head = json.dumps("call:" + function["name"])
        writer.rules[rule] = f"{writer.start} {head} {arguments} {writer.end}"
        alternatives.append(rule)
    top = ["start: call+" if name is None and parallel else "start: call", "call: " + " | ".join(alternatives)]
    return "\n".join(top + [f"{rule}: {body}" for rule, body in writer.rules.items()]) + "\n"


def render(value) -> list[str]:
    """A literal value as the template's format_argument writes it, as Lark pieces: quoted text and
    STRING marks (a placeholder the writer replaces with the mark's terminal)."""
    if isinstance(value, str):
        return [STRING] + ([json.dumps(value, ensure_ascii=False)] if value else []) + [STRING]
    if isinstance(value, bool) or value is None:
        return [json.dumps({True: "true", False: "false", None: "null"}[value])]
    if isinstance(value, (int, float)):
        return [json.dumps(json.dumps(value))]
    if isinstance(value, list):
        pieces = ['"["']
        for n, item in enumerate(value):
            pieces += (['","'] if n else []) + render(item)
        return pieces + ['"]"']
    if isinstance(value, dict):
        pieces = ['"{"']
        for n, key in enumerate(sorted(value, key=str.lower)):
            pieces += (['","'] if n else []) + [json.dumps(f"{key}:", ensure_ascii=False)] + render(value[key])
        return pieces + ['"}"']
    raise TypeError(type(value).__name__)


class _Writer:
    """Lark rules for JSON Schemas in Gemma 4's value syntax; `rules` collects them by name."""

    def __init__(self, literal):
        self.start, self.end, self.mark = literal(TOOL_CALL_START), literal(TOOL_CALL_END), literal(STRING)
        self.rules: dict[str, str] = {}
        self.root: dict = {}
        self.prefix = ""
        self.refs: dict[str, str] = {}  # a $ref of the current tool -> its rule
        self.count = 0
        self.rules["g4_any"] = self._any()

    def _rule(self, body: str) -> str:
        self.count += 1
        name = f"{self.prefix}_{self.count}"
        self.rules[name] = body
        return name

    def _refuse(self, path: str, why: str):
        raise ToolGrammarError(f"{path}: {why} (tool_choice required / named on Gemma 4's call syntax; use "
                               "tool_choice auto to send it as is)", path)

    def arguments(self, path: str) -> str:
        """The call's `{...}`: the parameters schema as an object (none: any object)."""
        self.refs = {}
        schema = self.root
        if not isinstance(schema, dict):
            self._refuse(path, "expected a JSON Schema object")
        kinds = schema.get("type", "object")
        if "object" not in ([kinds] if isinstance(kinds, str) else kinds if isinstance(kinds, list) else []):
            self._refuse(f"{path}.type", f"{kinds!r}: a call's arguments are an object")
        return self.value({**schema, "type": "object"}, path)

    def value(self, schema, path: str) -> str:
        """A Lark expression of the values `schema` takes."""
        if schema is True or schema == {}:
            return "g4_any"
        if not isinstance(schema, dict):
            self._refuse(path, "expected a JSON Schema object" if schema is not False else "allows no value")
        for key in schema:
            if key not in KNOWN:
                self._refuse(f"{path}.{key}", "this keyword cannot be enforced")
        rest = {k: v for k, v in schema.items() if k not in ANNOTATIONS and k not in ("$defs", "definitions")}
        if not rest:
            return "g4_any"
        if "$ref" in rest:
            if len(rest) > 1:
                self._refuse(f"{path}.$ref", "a $ref beside other keywords cannot be enforced")
            return self._ref(rest["$ref"], f"{path}.$ref")
        if "allOf" in rest:
            parts = rest.pop("allOf")
            if not isinstance(parts, list) or len(parts) != 1 or rest:
                self._refuse(f"{path}.allOf", "only an allOf of one schema, alone, can be enforced")
            return self.value(parts[0], f"{path}.allOf[0]")
        for key in ("anyOf", "oneOf"):
            if key in rest:
                branches = rest.pop(key)
                if not isinstance(branches, list) or not branches or rest:
                    self._refuse(f"{path}.{key}", "expected a non-empty list of schemas, alone")
                return "(" + " | ".join(self.value(b, f"{path}.{key}[{n}]") for n, b in enumerate(branches)) + ")"
        kinds = rest.pop("type", list(KINDS))
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if not isinstance(kinds, list) or not kinds or any(k not in KINDS for k in kinds):
            self._refuse(f"{path}.type", f"{schema.get('type')!r} is not a JSON Schema type or list of them")
        if "enum" in rest or "const" in rest:
            return self._literals(rest, kinds, path)
        alternatives = []
        for kind in dict.fromkeys(kinds):
            if kind == "string":
                alternatives.append(self._string(rest, path))
            elif kind in ("number", "integer"):
                alternatives.append(self._number(kind, rest, path))
            elif kind == "boolean":
                alternatives.append('("true" | "false")')
            elif kind == "null":
                alternatives.append('"null"')
            elif kind == "array":
                alternatives.append(self._array(rest, path))
            else:
                alternatives.append(self._object(rest, path))
        return alternatives[0] if len(alternatives) == 1 else "(" + " | ".join(alternatives) + ")"

    def _ref(self, ref, path: str) -> str:
        if ref not in self.refs:
            match = re.fullmatch(r"#/(\$defs|definitions)/([^/~]+)", ref) if isinstance(ref, str) else None
            target = (self.root.get(match.group(1)) or {}).get(match.group(2)) if match else None
            if target is None:
                self._refuse(path, f"{ref!r}: only a local #/$defs/<name> or #/definitions/<name> that exists")
            self.refs[ref] = rule = self._rule("")  # named first: a schema may refer to itself
            self.rules[rule] = self.value(target, f"{path}({ref})")
        return self.refs[ref]

    def _literals(self, rest: dict, kinds: list[str], path: str) -> str:
        others = set(rest) - {"enum", "const"}
        if others:
            self._refuse(f"{path}.{sorted(others)[0]}", "cannot be enforced beside enum / const")
        values = rest["enum"] if "enum" in rest else [rest["const"]]
        if not isinstance(values, list) or not values:
            self._refuse(f"{path}.enum", "expected a non-empty list")
        if "enum" in rest and "const" in rest:
            values = [v for v in values if v == rest["const"]]
        values = [v for v in values if _kind_of(v) in kinds or (_kind_of(v) == "integer" and "number" in kinds)
                  or (isinstance(v, float) and v.is_integer() and "integer" in kinds)]
        if not values:
            self._refuse(f"{path}.enum", "allows no value of its type")
        out = []
        for n, value in enumerate(values):
            if any(banned in text for text in _texts(value) for banned in _BANNED):
                self._refuse(f"{path}.enum[{n}]", "a string holding a Gemma 4 tag cannot be written in its call syntax")
            bad = [k for k in _keys(value) if not _KEY.fullmatch(k)]
            if bad:
                self._refuse(f"{path}.enum[{n}]", f"the key {bad[0]!r} cannot be written in Gemma 4's call syntax")
            out.append(" ".join(self.mark if p == STRING else p for p in render(value)))
        return "(" + " | ".join(f"({v})" for v in dict.fromkeys(out)) + ")"

    def _string(self, rest: dict, path: str) -> str:
        low, high = rest.get("minLength", 0), rest.get("maxLength")
        for key, bound in (("minLength", low), ("maxLength", high)):
            if bound is not None and (not isinstance(bound, int) or isinstance(bound, bool) or bound < 0):
                self._refuse(f"{path}.{key}", "expected a non-negative integer")
        if high is not None and low > high:
            self._refuse(f"{path}.minLength", "is over maxLength: no string is allowed")
        terminal = "G4_TEXT" if (low, high) == (0, None) else f"G4_TEXT_{low}_{'' if high is None else high}"
        if terminal not in self.rules:
            self.rules[terminal] = f"/(?s:.{{{low},{'' if high is None else high}}})/ & {_NO_TAGS}"
        return f"{self.mark} {terminal} {self.mark}"

    def _number(self, kind: str, rest: dict, path: str) -> str:
        """JSON's number syntax is the template's: llguidance's JSON compiler enforces the bounds."""
        import llguidance

        schema = {"type": kind, **{k: v for k, v in rest.items() if k in KEYWORDS["number"]}}
        try:
            problem = llguidance.LLMatcher.validate_grammar(
                llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema)))
        except ValueError as error:
            problem = str(error)
        if problem and not problem.startswith("WARNING"):
            self._refuse(path, f"cannot be enforced: {problem.splitlines()[0]}")
        return self._rule(json_lark(schema))

    def _array(self, rest: dict, path: str) -> str:
        items = rest.get("items", True)
        if isinstance(items, list):
            self._refuse(f"{path}.items", "a list of item schemas cannot be enforced")
        item = self.value(items, f"{path}.items")
        low, high = rest.get("minItems", 0), rest.get("maxItems")
        for key, bound in (("minItems", low), ("maxItems", high)):
            if bound is not None and (not isinstance(bound, int) or isinstance(bound, bool) or bound < 0):
                self._refuse(f"{path}.{key}", "expected a non-negative integer")
        if high is not None and low > high:
            self._refuse(f"{path}.minItems", "is over maxItems: no array is allowed")
        if high == 0:
            return '"[]"'
        more = f'("," {item})' + ("*" if high is None and low <= 1 else
                                  f"{{{max(low - 1, 0)},{'' if high is None else high - 1}}}")
        body = f"{item} {more}"
        return f'"[" {body if low else f"({body})?"} "]"'

    def _object(self, rest: dict, path: str) -> str:
        properties, required = rest.get("properties", {}), rest.get("required", [])
        extra = rest.get("additionalProperties", True)
        if not isinstance(properties, dict):
            self._refuse(f"{path}.properties", "expected an object")
        if not isinstance(required, list) or not all(isinstance(k, str) for k in required):
            self._refuse(f"{path}.required", "expected a list of property names")
        if not properties:
            if required:
                self._refuse(f"{path}.required", "required keys without properties cannot be enforced")
            if extra is False:
                return '"{}"'
            pair = f'{_FREE_KEY} ":" {self.value(extra, f"{path}.additionalProperties")}'
            return f'"{{" ({pair} ("," {pair})*)? "}}"'
        if extra not in (True, False, {}):
            self._refuse(f"{path}.additionalProperties", "a schema beside properties cannot be enforced (the "
                         "template's key order leaves no place for other keys)")
        missing = [k for k in required if k not in properties]
        if missing:
            self._refuse(f"{path}.required", f"{missing[0]!r} is not one of the properties")
        keys = sorted(properties, key=str.lower)  # the template's dictsort
        pairs = {}
        for key in keys:
            if not _KEY.fullmatch(key) or any(banned in key for banned in _BANNED):
                self._refuse(f"{path}.properties", f"the key {key!r} cannot be written in Gemma 4's call syntax")
            pairs[key] = f'{json.dumps(key + ":", ensure_ascii=False)} {self.value(properties[key], f"{path}.properties.{key}")}'
        # rests[k]: the pairs from the k-th on once one is written (each after a ","); the object is its first
        # pair (at or before the first required key) and the rest after it, or {} when none is required
        rests = [""] * (len(keys) + 1)
        for k in range(len(keys) - 1, 0, -1):  # (rests[0] is never needed: a first pair comes before)
            pair = f'"," {pairs[keys[k]]}' if keys[k] in required else f'("," {pairs[keys[k]]})?'
            rests[k] = self._rule(f"{pair} {rests[k + 1]}".strip())
        firsts = []
        for k, key in enumerate(keys):
            firsts.append(f"({pairs[key]} {rests[k + 1]})" if rests[k + 1] else f"({pairs[key]})")
            if key in required:
                break
        body = " | ".join(firsts)
        if not any(key in required for key in keys):
            return f'"{{" ({body})? "}}"'
        return f'"{{" ({body}) "}}"'

    def _any(self) -> str:
        """Any value (a schema of `{}` or true), objects' keys in any order."""
        text = f"{self.mark} G4_TEXT {self.mark}"
        self.rules["G4_TEXT"] = f"/(?s:.*)/ & {_NO_TAGS}"
        self.rules["g4_number"] = json_lark({"type": "number"})
        pair = f'{_FREE_KEY} ":" g4_any'
        return (f'{text} | g4_number | "true" | "false" | "null" | "[" (g4_any ("," g4_any)*)? "]" '
                f'| "{{" ({pair} ("," {pair})*)? "}}"')


def _kind_of(value) -> str:
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    if isinstance(value, int):
        return "integer"
    return {str: "string", float: "number", list: "array", dict: "object"}.get(type(value), "?")


def _texts(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _texts(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _texts(item)


def _keys(value):
    if isinstance(value, list):
        for item in value:
            yield from _keys(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _keys(item)
