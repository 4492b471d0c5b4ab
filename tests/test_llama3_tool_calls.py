"""Llama 3's JSON tool calls (server/llama3_tool_calls.py): the parser on hand-written answers, whole
and cut into deltas everywhere; the parser chosen from a template that renders calls as Llama 3.1 /
3.2's do; the forcing grammar taking exactly the calls such a template renders; and through the
server with the official `openai` client, tool_choice required and named on the tiny engine give
calls whose arguments validate, streamed as whole.

The template here is our own, in Llama 3.1's shape (its headers, its instruction and its rendering
of an assistant's call as {"name": ..., "parameters": ...} and of results as ipython turns): no
Llama 3.1 tokenizer with its tool template ships offline."""

import json

import pytest

from trt_llm.server.llama3_tool_calls import Llama3JsonParser
from trt_llm.server.tool_calls import parse_tool_calls, tool_parser_for

LLAMA3_TEMPLATE = (
    "{{- bos_token }}{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{%- if tools %}{{- 'Environment: ipython\\n' }}"
    "{{- 'You have access to the following functions. To call a function, please respond with JSON for a '"
    " + 'function call. Respond in the format {\"name\": function name, \"parameters\": dictionary of '"
    " + 'argument name and its value}. Do not use variables.\\n\\n' }}"
    "{%- for t in tools %}{{- t | tojson }}{{- '\\n\\n' }}{%- endfor %}{%- endif %}{{- '<|eot_id|>' }}"
    "{%- for message in messages %}"
    "{%- if message.tool_calls %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- for call in message.tool_calls %}{%- if not loop.first %}{{- '; ' }}{%- endif %}"
    "{{- '{\"name\": \"' + call.function.name + '\", \"parameters\": ' }}{{- call.function.arguments | tojson }}"
    "{{- '}' }}{%- endfor %}{{- '<|eot_id|>' }}"
    "{%- elif message.role == 'tool' %}{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message.content"
    " + '<|eot_id|>' }}"
    "{%- else %}{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + message.content"
    " + '<|eot_id|>' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "description": "The time.",
                                          "parameters": {"type": "object", "properties": {}}}}
CALL = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
TIME = '{"name": "get_time", "parameters": {}}'


@pytest.mark.parametrize("text, content, calls", [
    (CALL, "", [("get_weather", {"city": "Paris"})]),
    ("  <|python_tag|>" + CALL, "", [("get_weather", {"city": "Paris"})]),
    (CALL + "; " + TIME, "", [("get_weather", {"city": "Paris"}), ("get_time", {})]),
    ('{"name": "get_time", "arguments": {}}', "", [("get_time", {})]),
    ("It is sunny in Paris.", "It is sunny in Paris.", []),
    ("{not a call at all", "{not a call at all", []),
    ('{"weather": "sunny"}', '{"weather": "sunny"}', []),
    (CALL + " and then some words", "and then some words", [("get_weather", {"city": "Paris"})]),
    ("<b>bold</b>", "<b>bold</b>", []),
])
def test_the_parser_whole_and_in_every_pair_of_cuts(text, content, calls):
    want = (content, calls)
    got_content, got_calls = parse_tool_calls(text, name="llama3_json")
    assert (got_content, [(c.name, json.loads(c.arguments)) for c in got_calls]) == want
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1):
            parser = Llama3JsonParser()
            parts = [parser.feed(piece) for piece in (text[:i], text[i:j], text[j:])] + [parser.finish()]
            assert ("".join(p[0] for p in parts), [(c.name, json.loads(c.arguments)) for p in parts for c in p[1]]) \
                == want, (i, j)


def test_parallel_tool_calls_false_keeps_the_first_call():
    content, calls = parse_tool_calls(CALL + "; " + TIME, parallel=False, name="llama3_json")
    assert content == "" and [c.name for c in calls] == ["get_weather"]


def test_the_parser_is_chosen_from_the_template():
    assert tool_parser_for(LLAMA3_TEMPLATE) == "llama3_json"
    assert tool_parser_for("... <tool_call> ... tool_calls ... \"parameters\"") == "hermes"
    assert tool_parser_for(LLAMA3_TEMPLATE, "none") is None and tool_parser_for("{{ x }}", "llama3_json") == "llama3_json"


def _as_transformers_gets_it(messages):
    """OpenAI's arguments are a JSON string; transformers' templates want the object."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                               for c in m["tool_calls"]]
        out.append(m)
    return out


def test_the_forcing_grammar_takes_the_calls_as_the_template_writes_them(npm_tokenizer):
    """The oracle is the template: an assistant turn's calls rendered by it (transformers'
    apply_chat_template, on the real Llama 3.1 tokenizer), whose tokens the grammar takes whole."""
    transformers = pytest.importorskip("transformers")
    from trt_llm.runtime.sampling.grammar import Grammars
    from trt_llm.server.tool_grammar import tool_grammar

    tokenizer = transformers.AutoTokenizer.from_pretrained(npm_tokenizer("llama3_1"))
    tokenizer.chat_template = LLAMA3_TEMPLATE
    eos = tokenizer.convert_tokens_to_ids("<|eot_id|>")
    grammars = Grammars(tokenizer, len(tokenizer), [eos])
    calls = [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
             {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]
    messages = [{"role": "user", "content": "Weather and time?"}, {"role": "assistant", "content": "", "tool_calls": calls}]
    rendered = tokenizer.apply_chat_template(_as_transformers_gets_it(messages), tools=[WEATHER, CLOCK], tokenize=False)
    head = "<|start_header_id|>assistant<|end_header_id|>\n\n"
    answer = rendered[rendered.rindex(head) + len(head): rendered.rindex("<|eot_id|>")]
    assert answer == CALL + "; " + TIME

    def takes(text, name=None, parallel=True):
        constraint = grammars.guided("ebnf", tool_grammar([WEATHER, CLOCK], name, parallel, grammars.literal,
                                                          "llama3_json"))
        for token in tokenizer.encode(text, add_special_tokens=False):
            if not constraint.allowed()[token]:
                return False
            constraint.accept(token)
        return bool(constraint.allowed()[eos])

    assert takes(answer) and takes(CALL) and takes(CALL, parallel=False) and not takes(answer, parallel=False)
    assert takes(CALL, name="get_weather") and not takes(CALL, name="get_time")
    assert not takes(CALL.replace('"Paris"', "7"))  # arguments outside the schema


# --- through the server, with the official client ------------------------------------------

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")


@pytest.fixture(scope="module")
def served(tiny_model, build_engine_for):
    """test_tool_calls' tiny Qwen3 engine behind the server, its template swapped for the Llama 3
    style one: the server then parses and forces Llama 3's JSON calls."""
    from test_server import LiveServer
    from trt_llm.runtime.engine_dir import EngineDir
    from trt_llm.runtime.requests.runner import Runner
    from trt_llm.server.app import ServerConfig, create_app

    engine = build_engine_for(tiny_model("qwen3"), max_input_len=1536, max_kv_cache_capacity=2048)
    runner = Runner(EngineDir.open(engine), threads=1, scheduling="continuous")
    runner.tokenizer.templates = {"default": LLAMA3_TEMPLATE}
    live = LiveServer(create_app(runner, ServerConfig(model_name="tiny", max_rows=2)))
    yield live
    live.close()


@pytest.mark.parametrize("choice, parallel", [
    ("required", False), ("required", True), ({"type": "function", "function": {"name": "book_table"}}, True)])
def test_required_and_named_calls_validate_and_stream_as_whole(served, choice, parallel):
    jsonschema = pytest.importorskip("jsonschema")
    from test_tool_calls import _assembled

    from test_tool_calls import BOOKING, STRICT_CLOCK

    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="none", max_retries=0)
    tools = [STRICT_CLOCK, BOOKING]  # bounded arguments: a random model's calls end within max_tokens
    kwargs = {"model": "tiny", "messages": [{"role": "user", "content": "Book a table in Paris?"}],
              "tools": tools, "tool_choice": choice, "parallel_tool_calls": parallel,
              "temperature": 0.8, "seed": 3, "max_tokens": 400}
    whole = client.chat.completions.create(**kwargs)
    content, _, calls, finish, _ = _assembled(client.chat.completions.create(stream=True, **kwargs))
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
