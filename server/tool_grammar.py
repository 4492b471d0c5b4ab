"""tool_choice `required` and a named function, enforced: a grammar (llguidance's Lark syntax) over the
call syntax of the template's parser: the Hermes syntax that Qwen 2.5 / 3's chat templates ask for
and render their own calls in (or Llama 3's JSON, `{"name": ..., "parameters": ...}`),

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

with each function's `parameters` JSON Schema for its arguments (written as the template's `tojson`
writes them: ", " and ": ", no other whitespace). `required`: one call of any of the tools, or with
parallel_tool_calls several, one per line as the template joins them; a named function: exactly one
call of it. The answer is then nothing but calls and end-of-sequence, and the Hermes parser
(tool_calls.py) reads it into `message.tool_calls` as it reads a free answer's. Gemma 4's
`<|tool_call>call:name{key:<|"|>text<|"|>,...}<tool_call|>` is not JSON: server/gemma4_tool_grammar.py
writes its grammar (the schema in its value syntax, keys in the template's order).

The grammar is the request's guided decoding (`ebnf`), so it takes the same path as the input
file's grammars: compiled once per text (the same tools, the same grammar) and cached
(runtime/sampling/grammar.py). The tags are the tokenizer's own special tokens where its vocabulary
has them (Qwen's `<tool_call>`), so the model writes the token its template's examples hold.
"""

from __future__ import annotations

import json

from trt_llm.runtime.sampling.grammar import json_lark
from trt_llm.server.tool_calls import CALL_END, CALL_START


class ToolGrammarError(ValueError):
    """A function whose parameters schema cannot be enforced; `param` names it."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def _arguments_schema(index: int, parameters: dict | None) -> dict:
    """The function's parameters schema (none: any object), checked by the compiler now so that a
    schema it cannot enforce is refused naming the tool."""
    import llguidance

    schema = {"type": "object"} if not parameters else parameters
    param = f"tools[{index}].function.parameters"
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))
    except ValueError as error:
        raise ToolGrammarError(f"{param}: {error}", param) from None
    problem = llguidance.LLMatcher.validate_grammar(grammar)
    if problem and not problem.startswith("WARNING"):
        raise ToolGrammarError(f"{param}: cannot be enforced: {problem}", param)
    return schema


def tool_grammar(tools: list[dict], name: str | None, parallel: bool, literal, syntax: str = "hermes") -> str:
    """The Lark grammar of the calls a request must make. tools: OpenAI's tool dicts ({type,
    function: {name, parameters}}); name: the named function (None: `required`, any tool); parallel:
    several calls allowed (`required` only); literal(text): the Lark terminal of a tag
    (grammar.Grammars.literal: the special token where the vocabulary has one); syntax: the call
    format, "hermes", "llama3_json" (Llama 3's `{"name": ..., "parameters": ...}`, calls joined by
    "; " as vLLM's llama3_json parser reads them) or "gemma4" (server/gemma4_tool_grammar.py)."""
    if syntax == "gemma4":  # call:name{key:value,...}: not JSON, its own schema translation
        from trt_llm.server.gemma4_tool_grammar import gemma4_tool_grammar

        return gemma4_tool_grammar(tools, name, parallel, literal)
    if syntax not in ("hermes", "llama3_json"):
        raise ToolGrammarError(f"tool_choice: {'a named tool' if name else 'required'} is not supported with this "
                               f"model's {syntax} call format yet; use tool_choice auto", "tool_choice")
    functions = [(i, tool["function"]) for i, tool in enumerate(tools)]
    if name is not None:
        functions = [(i, f) for i, f in functions if f["name"] == name]
    llama3 = syntax == "llama3_json"
    start, end, close = literal(CALL_START), literal(CALL_END), json.dumps("}\n")
    rules, alternatives = [], []
    for n, (index, function) in enumerate(functions):
        schema = _arguments_schema(index, function.get("parameters"))
        quoted = json.dumps(function["name"], ensure_ascii=False)
        if llama3:
            head = json.dumps('{"name": ' + quoted + ', "parameters": ')
            rules.append(f'call_{n}: {head} args_{n} "}}"')
        else:
            head = json.dumps('\n{"name": ' + quoted + ', "arguments": ')
            rules.append(f"call_{n}: {start} {head} args_{n} {close} {end}")
        rules.append(f"args_{n}: {json_lark(schema)}")
        alternatives.append(f"call_{n}")
    many = name is None and parallel
    joiner = '"; "' if llama3 else '"\\n"'
    top = [f"start: call ({joiner} call)*" if many else "start: call", "call: " + " | ".join(alternatives)]
    return "\n".join(top + rules) + "\n"
