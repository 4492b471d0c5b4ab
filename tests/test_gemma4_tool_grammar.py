"""tool_choice `required` and a named function on Gemma 4's call syntax (server/gemma4_tool_grammar.py,
issue 43). The oracles: calls rendered by a Jinja template that writes arguments as Gemma 4's chat template
does (its format_argument macro: `dictsort`ed unquoted keys, "," with no space, strings between `<|"|>`,
true / false / null, numbers as Jinja prints them), which the Gemma 4 parser (server/gemma4_tool_calls.py)
reads back into the arguments they came from; hand-written calls outside each schema; llguidance's matcher
on the Gemma-4-shaped tokenizer's tokens (tests/family_assets.make_gemma4_tokenizer: the tags are its
special tokens). Through the server, a tiny random Gemma 4 sampled under the grammar answers calls that
parse and validate (jsonschema), streamed as whole."""

import json
import shutil
from pathlib import Path

import jinja2
import pytest

import family_assets
from trt_llm.server.tool_calls import parse_tool_calls
from trt_llm.server.tool_grammar import ToolGrammarError, tool_grammar

Q = '<|"|>'
CACHE = Path("~/.cache/trt-llm-tests").expanduser()
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "description": "a city"}, "days": {"type": "integer", "minimum": 1, "maximum": 16},
        "metric": {"type": "boolean"}}}}}
BOOK = {"type": "function", "function": {"name": "book", "parameters": {
    "type": "object", "required": ["when", "who"], "additionalProperties": False, "properties": {
        "who": {"type": "string", "maxLength": 8},
        "when": {"type": "object", "required": ["day"], "properties": {
            "day": {"enum": ["Mon", "Tue"]}, "slots": {"type": "array", "items": {"type": "integer"},
                                                       "minItems": 1, "maxItems": 3}}},
        "Note": {"anyOf": [{"type": "string"}, {"type": "null"}]},  # (capital: dictsort ignores case)
        "mode": {"enum": ["a", 1, True, None, {"k": [1]}]}}}}}
NOW = {"type": "function", "function": {"name": "now", "parameters": {
    "type": "object", "properties": {}, "additionalProperties": False}}}
FREE = {"type": "function", "function": {"name": "note"}}  # no parameters: any object
OPTIONAL = {"type": "function", "function": {"name": "opts", "parameters": {  # no key required
    "type": "object", "properties": {
        "a": {"type": "boolean"}, "B": {"type": ["number", "null"], "exclusiveMinimum": 0},
        "c": {"type": "array", "items": {"oneOf": [{"type": "string", "minLength": 2}, {"$ref": "#/$defs/pair"}]},
              "maxItems": 2}},
    "$defs": {"pair": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}}}}}
TOOLS = [WEATHER, BOOK, NOW, FREE, OPTIONAL]

# An assistant's calls as Gemma 4's template writes them (its macro's rules, our own Jinja).
CALLS = jinja2.Environment().from_string(
    "{%- macro arg(v) -%}"
    "{%- if v is string -%}<|\"|>{{ v }}<|\"|>{%- elif v is boolean -%}{{ 'true' if v else 'false' }}"
    "{%- elif v is none -%}null"
    "{%- elif v is mapping -%}{{ '{' }}{%- for k, x in v | dictsort -%}{{ ',' if not loop.first }}{{ k }}:{{ arg(x) }}"
    "{%- endfor -%}{{ '}' }}"
    "{%- elif v is sequence -%}[{%- for x in v -%}{{ ',' if not loop.first }}{{ arg(x) }}{%- endfor -%}]"
    "{%- else -%}{{ v }}{%- endif -%}{%- endmacro -%}"
    "{%- for name, args in calls -%}<|tool_call>call:{{ name }}{{ arg(args) }}<tool_call|>{%- endfor -%}")


def rendered(*calls) -> str:
    return CALLS.render(calls=calls)


ARGUMENTS = [  # (function, arguments): each inside its schema
    ("get_weather", {"city": "Paris"}),
    ("get_weather", {"metric": False, "city": 'Saint-Étienne, "centre" {x}: [a]\nnext line', "days": 16}),
    ("book", {"who": "Ann", "when": {"day": "Mon", "slots": [9, -10]}, "Note": None, "mode": 1}),
    ("book", {"when": {"day": "Tue"}, "who": "", "Note": "window, please", "mode": {"k": [1]}}),
    ("book", {"who": "Bo", "when": {"slots": [1, 2, 3], "day": "Tue"}, "mode": None}),
    ("now", {}),
    ("note", {"zeta": [1, "x", {"b": True}, []], "alpha": -0.0025, "m": {}}),
    ("opts", {}),
    ("opts", {"c": ["xy", [1, 2]]}),
    ("opts", {"c": [], "a": True, "B": 2.5}),
    ("opts", {"B": None, "c": ["abc"]}),
]


@pytest.fixture(scope="module")
def grammars(tmp_path_factory):
    """(transformers tokenizer, grammar.Grammars) of the Gemma-4-shaped tokenizer."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("llguidance")
    from trt_llm.runtime.sampling.grammar import Grammars

    try:
        folder = family_assets.make_gemma4_tokenizer(tmp_path_factory.mktemp("gemma4_tokenizer"), CACHE)
    except family_assets.assets.AssetUnavailable as exc:
        pytest.skip(f"the gemma3 tokenizer is unavailable: {exc}")
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    return tokenizer, Grammars(tokenizer, len(tokenizer), [tokenizer.convert_tokens_to_ids("<turn|>")])


def constraint(grammars, name=None, parallel=True, tools=TOOLS):
    tokenizer, compiled = grammars
    return compiled.guided("ebnf", tool_grammar(tools, name, parallel, compiled.literal, "gemma4"))


def takes(grammars, answer, name=None, parallel=True) -> bool:
    """The grammar takes the answer's tokens (text: its special tokens as such; a list: these ids) and then
    the end of the turn."""
    tokenizer, _ = grammars
    ids = tokenizer.encode(answer, add_special_tokens=False) if isinstance(answer, str) else answer
    state = constraint(grammars, name, parallel)
    for token in ids:
        if not state.allowed()[token]:
            return False
        state.accept(token)
    return bool(state.allowed()[tokenizer.convert_tokens_to_ids("<turn|>")])


@pytest.mark.parametrize("function, arguments", ARGUMENTS)
def test_the_grammar_takes_the_calls_the_template_writes(grammars, function, arguments):
    answer = rendered((function, arguments))
    _, calls = parse_tool_calls(answer, name="gemma4")
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [(function, arguments)]  # the oracle is sound
    assert takes(grammars, answer) and takes(grammars, answer, parallel=False)
    assert takes(grammars, answer, name=function)
    assert not takes(grammars, answer, name="now" if function != "now" else "book")


def test_several_calls_in_a_row_only_with_parallel_tool_calls(grammars):
    answer = rendered(*ARGUMENTS[:3])
    assert len(parse_tool_calls(answer, name="gemma4")[1]) == 3
    assert takes(grammars, answer) and not takes(grammars, answer, parallel=False)
    assert not takes(grammars, rendered(ARGUMENTS[0], ARGUMENTS[1]), name="get_weather")  # named: one call


def call(name: str, body: str) -> str:
    return f"<|tool_call>call:{name}{{{body}}}<tool_call|>"


REFUSED = {  # answers outside the schemas (or outside what the template writes)
    "free text": "It is sunny in Paris.",
    "text before the call": "Sure. " + call("get_weather", f"city:{Q}Paris{Q}"),
    "an unknown function": call("get_wether", f"city:{Q}Paris{Q}"),
    "a required key missing": call("get_weather", "days:3"),
    "a nested required key missing": call("book", f"when:{{slots:[1]}},who:{Q}A{Q}"),
    "a string for an integer": call("get_weather", f"city:{Q}Paris{Q},days:{Q}3{Q}"),
    "a fraction for an integer": call("get_weather", f"city:{Q}Paris{Q},days:2.5"),
    "below the minimum": call("get_weather", f"city:{Q}Paris{Q},days:0"),
    "over the maximum": call("get_weather", f"city:{Q}Paris{Q},days:17"),
    "a number for a boolean": call("get_weather", f"city:{Q}Paris{Q},metric:1"),
    "a number for a string": call("get_weather", "city:3"),
    "over maxLength": call("book", f"when:{{day:{Q}Mon{Q}}},who:{Q}Annabelle{Q}"),
    "not in the enum": call("book", f"when:{{day:{Q}Sun{Q}}},who:{Q}A{Q}"),
    "too few items": call("book", f"when:{{day:{Q}Mon{Q},slots:[]}},who:{Q}A{Q}"),
    "too many items": call("book", f"when:{{day:{Q}Mon{Q},slots:[1,2,3,4]}},who:{Q}A{Q}"),
    "a key not in the properties": call("get_weather", f"city:{Q}Paris{Q},wind:true"),
    "keys out of the template's order": call("get_weather", f"days:3,city:{Q}Paris{Q}"),
    "a space the template does not write": call("get_weather", f"city: {Q}Paris{Q}"),
    "a quoted key": call("get_weather", f"{Q}city{Q}:{Q}Paris{Q}"),
    "arguments for a function without": call("now", "x:1"),
    "an unclosed call": "<|tool_call>call:now{}",
    "a key twice": call("opts", "a:true,a:false"),
    "an exclusive minimum": call("opts", "B:0"),
    "an item in neither branch": call("opts", f"c:[{Q}x{Q}]"),
    "a pair of three": call("opts", "c:[[1,2,3]]"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_answers_outside_the_schemas_are_not_taken(grammars, case):
    assert not takes(grammars, REFUSED[case])


def test_the_tags_and_marks_are_the_special_tokens(grammars):
    """After `city:` the one token allowed is the mark's special token; the mark or the end tag spelled
    out in ordinary tokens cannot be inside a string (the parser would end the string or the call there)."""
    tokenizer, _ = grammars
    mark = tokenizer.convert_tokens_to_ids(Q)
    head = tokenizer.encode("<|tool_call>call:get_weather{city:", add_special_tokens=False)
    state = constraint(grammars)
    for token in head:
        state.accept(token)
    assert state.allowed().nonzero()[0].tolist() == [mark]
    tail = tokenizer.encode(f"{Q}}}<tool_call|>", add_special_tokens=False)
    for spelled in (Q, "<tool_call|>"):
        inside = tokenizer.encode(f"a{spelled}b", add_special_tokens=False, split_special_tokens=True)
        assert mark not in inside and not takes(grammars, head + [mark] + inside + tail)
    assert takes(grammars, head + [mark] + tokenizer.encode("a<|b|>", add_special_tokens=False) + tail)


def test_a_local_ref_may_be_recursive(grammars):
    tree = {"type": "function", "function": {"name": "tree", "parameters": {
        "type": "object", "properties": {"root": {"$ref": "#/$defs/node"}}, "required": ["root"],
        "$defs": {"node": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}}}}}
    tokenizer, compiled = grammars
    text = tool_grammar([tree], "tree", False, compiled.literal, "gemma4")
    for answer, ok in ((call("tree", "root:{kids:[{},{kids:[{}]}]}"), True), (call("tree", "root:{kids:[1]}"), False)):
        state = compiled.guided("ebnf", text)
        taken = True
        for token in tokenizer.encode(answer, add_special_tokens=False):
            taken = taken and bool(state.allowed()[token])
            if taken:
                state.accept(token)
        assert taken == ok, answer


def _with(change, tool=WEATHER):
    tool = json.loads(json.dumps(tool))
    change(tool["function"])
    return tool


REFUSED_SCHEMAS = {  # a keyword the grammar cannot enforce: refused naming it, never dropped
    "pattern": (lambda f: f["parameters"]["properties"]["city"].update(pattern="^[A-Z]"),
                "tools[0].function.parameters.properties.city.pattern: "),
    "format": (lambda f: f["parameters"]["properties"]["city"].update(format="date"),
               "tools[0].function.parameters.properties.city.format: "),
    "allOf of two": (lambda f: f["parameters"]["properties"].update(x={"allOf": [{"type": "string"}, {"maxLength": 2}]}),
                     "tools[0].function.parameters.properties.x.allOf: "),
    "other keys beside properties": (lambda f: f["parameters"].update(additionalProperties={"type": "string"}),
                                     "tools[0].function.parameters.additionalProperties: "),
    "a key the syntax cannot write": (lambda f: f["parameters"]["properties"].update({"a:b": {}}),
                                      "tools[0].function.parameters.properties: "),
    "a name the parser cannot read": (lambda f: f.update(name="get weather"), "tools[0].function.name: "),
    "arguments that are not an object": (lambda f: f["parameters"].update(type="string"),
                                         "tools[0].function.parameters.type: "),
    "a ref that is not there": (lambda f: f["parameters"]["properties"].update(x={"$ref": "#/$defs/gone"}),
                                "tools[0].function.parameters.properties.x.$ref: "),
    "a tag in an enum": (lambda f: f["parameters"]["properties"].update(x={"enum": ["a<tool_call|>"]}),
                         "tools[0].function.parameters.properties.x.enum[0]: "),
}


@pytest.mark.parametrize("case", REFUSED_SCHEMAS)
def test_what_cannot_be_enforced_is_refused_naming_the_field(case):
    change, field = REFUSED_SCHEMAS[case]
    with pytest.raises(ToolGrammarError) as error:
        tool_grammar([_with(change)], None, True, json.dumps, "gemma4")
    assert str(error.value).startswith(field) and "\n" not in str(error.value)
    assert error.value.param == field[:-2]


def test_a_syntax_without_a_grammar_is_still_refused():
    with pytest.raises(ToolGrammarError, match="not supported with this model's xml call format yet"):
        tool_grammar([WEATHER], None, True, json.dumps, "xml")


# --- through the server, with the official client --------------------------------------------

@pytest.fixture(scope="module")
def served(family_model, build_engine_for, tmp_path_factory):
    """The tiny random Gemma 4 (family_assets "gemma4") with the Gemma-4-shaped tokenizer and its
    template, behind the server: it parses and forces Gemma 4's calls."""
    openai = pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    from test_server import LiveServer
    from trt_llm.runtime.engine_dir import EngineDir
    from trt_llm.runtime.requests.runner import Runner
    from trt_llm.server.app import ServerConfig, create_app

    source, folder = Path(family_model("gemma4")), tmp_path_factory.mktemp("gemma4_tools")
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        shutil.copy(source / name, folder)
    family_assets.make_gemma4_tokenizer(folder, CACHE)
    engine = build_engine_for(folder, max_input_len=512, max_kv_cache_capacity=1024)
    runner = Runner(EngineDir.open(engine), threads=1, scheduling="continuous")
    live = LiveServer(create_app(runner, ServerConfig(model_name="tiny", max_rows=2)))
    yield openai.OpenAI(base_url=f"{live.url}/v1", api_key="none", max_retries=0)
    live.close()


TABLE = {"type": "function", "function": {"name": "book_table", "parameters": {  # bounded: a random model ends
    "type": "object", "required": ["city", "people", "meal"], "additionalProperties": False, "properties": {
        "city": {"type": "string", "maxLength": 8}, "people": {"type": "integer", "minimum": 1, "maximum": 8},
        "meal": {"enum": ["lunch", "dinner"]}, "vegan": {"type": "boolean"},
        "when": {"type": "object", "required": ["day"], "additionalProperties": False,
                 "properties": {"day": {"enum": ["Mon", "Tue"]},
                                "hours": {"type": "array", "items": {"type": "integer", "minimum": 9, "maximum": 22},
                                          "maxItems": 2}}}}}}}


@pytest.mark.parametrize("choice, parallel", [
    ("required", False), ("required", True), ({"type": "function", "function": {"name": "book_table"}}, True)])
def test_required_and_named_calls_validate_and_stream_as_whole(served, choice, parallel):
    jsonschema = pytest.importorskip("jsonschema")
    from test_tool_calls import _assembled

    tools = [NOW, TABLE]
    kwargs = {"model": "tiny", "messages": [{"role": "user", "content": "Book a table in Paris?"}],
              "tools": tools, "tool_choice": choice, "parallel_tool_calls": parallel,
              "temperature": 0.8, "seed": 3, "max_tokens": 300}
    whole = served.chat.completions.create(**kwargs)
    content, _, calls, finish, _ = _assembled(served.chat.completions.create(stream=True, **kwargs))
    message = whole.choices[0].message
    assert whole.choices[0].finish_reason == "tool_calls" == finish and not message.content and not content, message
    got = [(c.function.name, c.function.arguments) for c in message.tool_calls]
    assert got == [(c["name"], c["arguments"]) for c in calls]
    assert len(got) == 1 if not parallel or isinstance(choice, dict) else len(got) >= 1
    if isinstance(choice, dict):
        assert got[0][0] == "book_table"
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    for name, arguments in got:
        jsonschema.validate(json.loads(arguments), schemas[name])


def test_a_schema_it_cannot_enforce_is_a_400_naming_the_field(served):
    import openai

    tool = _with(lambda f: f["parameters"]["properties"]["city"].update(pattern="^[A-Z]"))
    with pytest.raises(openai.BadRequestError) as error:
        served.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Weather?"}],
                                       tools=[tool], tool_choice="required", max_tokens=8)
    assert "tools[0].function.parameters.properties.city.pattern: " in str(error.value)
    assert error.value.body["param"] == "tools[0].function.parameters.properties.city.pattern"
