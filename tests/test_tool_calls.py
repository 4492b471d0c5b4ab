"""Tool calling on /v1/chat/completions: the prompt of a tools conversation (tools, an assistant turn
with tool_calls, tool results) equals transformers' apply_chat_template on Qwen3's own template; the
Hermes parser (server/tool_calls.py) on hand-written answers, whole and cut into deltas everywhere;
and the official `openai` client against the server, streamed against whole, with the tiny engine
answering from a script (tests/scripted.py: the engine runs, its sampler follows the script)."""

import itertools
import json

import pytest

from scripted import scripted_answers
from trt_llm.runtime.text.prompt import PromptFormatter
from trt_llm.runtime.text.tokenizer import Tokenizer
from trt_llm.server.convert import BadRequest, convert
from trt_llm.server.protocol import ChatCompletionRequest
from trt_llm.server.tool_calls import HermesParser, parse_tool_calls, tool_parser_for

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "description": "The time.",
                                          "parameters": {"type": "object", "properties": {}}}}
CONVERSATION = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Weather and time in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "sunny", "celsius": 21}'},
    {"role": "tool", "tool_call_id": "call_2", "content": "12:30"},
    {"role": "assistant", "content": "Sunny, 21 °C, at 12:30.", "reasoning_content": "Both tools answered."},
    {"role": "user", "content": "And tomorrow?"},
]


def _as_transformers_gets_it(messages):
    """The same conversation in transformers' documented form: arguments as objects, content strings."""
    out = []
    for m in messages:
        m = {**m, "content": m["content"] or ""}
        if "tool_calls" in m:
            m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                               for c in m["tool_calls"]]
        out.append(m)
    return out


@pytest.mark.parametrize("thinking", [True, False])
def test_a_tools_conversation_renders_as_transformers_renders_it(npm_tokenizer, thinking):
    transformers = pytest.importorskip("transformers")
    folder = npm_tokenizer("qwen3")
    body = ChatCompletionRequest.model_validate({"model": "m", "messages": CONVERSATION, "tools": [WEATHER, CLOCK],
                                                 "enable_thinking": thinking})
    converted = convert(body, {}, 4096, None)
    assert converted.tool_calls
    ours = PromptFormatter(Tokenizer.from_dir(folder), True, True, thinking).format(
        converted.request.messages, converted.request.tools)
    want = transformers.AutoTokenizer.from_pretrained(folder).apply_chat_template(
        _as_transformers_gets_it(CONVERSATION), tools=[WEATHER, CLOCK], add_generation_prompt=True,
        enable_thinking=thinking, tokenize=False)
    assert ours.text == want
    assert "<tools>" in want and '"arguments": {"city": "Paris"}' in want and "<tool_response>" in want


def test_tool_choice_none_keeps_the_tools_in_the_prompt_and_required_or_named_forces_calls():
    base = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER]}

    def converted(**extra):
        return convert(ChatCompletionRequest.model_validate({**base, **extra}), {}, 64, None)

    none = converted(tool_choice="none")
    # vLLM's default: the prompt shows the tools under every choice; none only parses no call.
    assert none.request.tools == [WEATHER] and not none.tool_calls and none.forced is None
    assert converted(tool_choice="required").forced == "required"
    named = converted(tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert named.forced == "named" and named.request.tools and named.request.guided_decoding is None  # added later
    refusals = [({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
                ({"tool_choice": "required", "tools": None}, "tool_choice"),
                ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
                ({"tool_choice": "required", "guided_decoding": {"regex": "a"}}, "guided_decoding")]
    for extra, param in refusals:
        with pytest.raises(BadRequest) as refused:
            converted(**extra)
        assert refused.value.param == param, extra


def test_the_forcing_grammar_takes_the_calls_as_qwen3s_template_writes_them(npm_tokenizer):
    """The oracle is the template itself: an assistant turn's calls rendered by Qwen3's own template
    (transformers' apply_chat_template), whose tokens the grammar must take whole, then only EOS."""
    transformers = pytest.importorskip("transformers")
    from trt_llm.runtime.sampling.grammar import Grammars
    from trt_llm.server.tool_grammar import tool_grammar

    tokenizer = transformers.AutoTokenizer.from_pretrained(npm_tokenizer("qwen3"))
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    grammars = Grammars(tokenizer, len(tokenizer), [eos])
    calls = CONVERSATION[2]["tool_calls"]
    rendered = tokenizer.apply_chat_template(
        _as_transformers_gets_it(CONVERSATION[1:3]), tools=[WEATHER, CLOCK], tokenize=False)
    answer = rendered[rendered.rindex("<|im_start|>assistant\n") + len("<|im_start|>assistant\n"):
                      rendered.rindex("<|im_end|>")]
    answer = answer[answer.index("<tool_call>"):]
    assert answer.count("<tool_call>") == 2

    def takes(text, name=None, parallel=True):
        constraint = grammars.guided("ebnf", tool_grammar([WEATHER, CLOCK], name, parallel, grammars.literal))
        for token in tokenizer.encode(text, add_special_tokens=False):
            if not constraint.allowed()[token]:
                return False
            constraint.accept(token)
        return bool(constraint.allowed()[eos])

    first = answer[:answer.index("</tool_call>") + len("</tool_call>")]
    assert takes(answer) and takes(first) and takes(first, parallel=False) and not takes(answer, parallel=False)
    assert takes(first, name="get_weather") and not takes(first, name="get_time")
    assert not takes(first.replace('"Paris"', "7"))  # arguments outside the schema
    assert '"arguments": {"city": "Paris"}' in first and calls[0]["function"]["name"] in first
    # the tags are Qwen's special tokens: the grammar names them, so their spelled-out bytes are refused
    assert grammars.literal("<tool_call>") == "<tool_call>" and grammars.literal("{") == '"{"'


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TIME = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'


@pytest.mark.parametrize("text, content, calls", [
    (f"Let me check.\n{CALL}", "Let me check.", [("get_weather", '{"city": "Paris"}')]),
    (f"{CALL}\n{TIME}\n", "", [("get_weather", '{"city": "Paris"}'), ("get_time", "{}")]),  # two parallel calls
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": </tool_call> sorry',
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": </tool_call> sorry', []),  # malformed: content
    ('<tool_call>{"arguments": {}}</tool_call>', '<tool_call>{"arguments": {}}</tool_call>', []),  # no name
    ('<tool_call>\n{"name": "get_time", "arguments": {}}', "", [("get_time", "{}")]),  # cut short, body whole
    ("Plain answer.\n\n", "Plain answer.\n\n", []),  # no call: the text untouched
    ("a <tool_call", "a <tool_call", []),  # a tag cut short is text
    ('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>', "", [("f", '{"x": 1}')]),  # string args
])
def test_hermes_parser_whole_and_in_every_pair_of_cuts(text, content, calls):
    got_content, got_calls = parse_tool_calls(text)
    assert (got_content, [(c.name, c.arguments) for c in got_calls]) == (content, calls)
    assert all(c.id.startswith("call_") and len(c.id) > 10 for c in got_calls)
    assert [c.index for c in got_calls] == list(range(len(calls)))
    for cuts in itertools.combinations_with_replacement(range(len(text) + 1), 2):
        parser, streamed, made = HermesParser(), "", []
        bounds = [0, *cuts, len(text)]
        for start, stop in zip(bounds, bounds[1:]):
            piece, new = parser.feed(text[start:stop])
            streamed, made = streamed + piece, made + new
        piece, new = parser.finish()
        assert (streamed + piece, [(c.name, c.arguments) for c in made + new]) == (content, calls), cuts


def test_parallel_tool_calls_false_keeps_the_first_call():
    content, calls = parse_tool_calls(f"{CALL}\n{TIME}", parallel=False)
    assert [c.name for c in calls] == ["get_weather"] and content == ""


def test_the_parser_is_chosen_from_the_template():
    assert tool_parser_for("... <tool_call> ...") == "hermes"
    assert tool_parser_for("{{ messages }}") is None and tool_parser_for(None) is None
    assert tool_parser_for("{{ messages }}", "hermes") == "hermes"
    assert tool_parser_for("<tool_call>", "none") is None


# --- through the server, with the official client ------------------------------------------

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")


@pytest.fixture(scope="module")
def served(tiny_model, build_engine_for, npm_tokenizer):
    """The tiny Qwen3 engine behind the server, its tokenizer's template swapped for Qwen3's own
    (tools, <tool_call>, <think>): (server, runner, Qwen3's template)."""
    from test_server import LiveServer
    from trt_llm.runtime.engine_dir import EngineDir
    from trt_llm.runtime.requests.runner import Runner
    from trt_llm.server.app import ServerConfig, create_app

    qwen3_template = Tokenizer.from_dir(npm_tokenizer("qwen3")).chat_template
    engine = build_engine_for(tiny_model("qwen3"), max_input_len=1536, max_kv_cache_capacity=2048)
    runner = Runner(EngineDir.open(engine), threads=1, scheduling="continuous")
    tiny_template = runner.tokenizer.templates
    runner.tokenizer.templates = {"default": qwen3_template}
    live = LiveServer(create_app(runner, ServerConfig(model_name="tiny", max_rows=2)))
    yield live, runner, tiny_template
    live.close()


def _script(runner, text):
    tok = runner.tokenizer
    return tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]


def _ask(client, stream=False, **kwargs):
    kwargs = {"model": "tiny", "messages": [{"role": "user", "content": "Weather and time in Paris?"}],
              "tools": [WEATHER, CLOCK], "max_tokens": 200, "temperature": 0, **kwargs}
    return client.chat.completions.create(stream=stream, **kwargs)


def _assembled(chunks):
    """A stream's chunks joined as a client joins them: content, reasoning, calls by index."""
    content, reasoning, calls, finish, order = "", "", {}, None, []
    for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
            for call in delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"id": None, "name": "", "arguments": ""})
                if call.id:
                    entry["id"] = call.id
                    order.append(("head", call.index))
                if call.function and call.function.name:
                    entry["name"] += call.function.name
                if call.function and call.function.arguments:
                    entry["arguments"] += call.function.arguments
                    order.append(("arguments", call.index))
            finish = choice.finish_reason or finish
    return content, reasoning, [calls[i] for i in sorted(calls)], finish, order


def test_calls_streamed_and_whole_are_the_same_answer(served, monkeypatch):
    live, runner, _ = served
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="none", max_retries=0)
    answer = f"Let me check.\n{CALL}\n{TIME}"
    with scripted_answers(monkeypatch, _script(runner, answer)):
        whole = _ask(client)
        content, reasoning, calls, finish, order = _assembled(_ask(client, stream=True))
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and finish == "tool_calls"
    assert choice.message.content == "Let me check." == content
    got = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    assert got == [("get_weather", '{"city": "Paris"}'), ("get_time", "{}")]
    assert [(c["name"], c["arguments"]) for c in calls] == got
    assert all(c.id.startswith("call_") for c in choice.message.tool_calls) and all(c["id"] for c in calls)
    assert order == [("head", 0), ("arguments", 0), ("head", 1), ("arguments", 1)]  # OpenAI's delta order
    assert json.loads(got[0][1]) == {"city": "Paris"}


def test_a_conversation_with_tool_results_goes_through(served, monkeypatch):
    live, runner, _ = served
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="none", max_retries=0)
    with scripted_answers(monkeypatch, _script(runner, "Sunny, 21 °C.")):
        got = _ask(client, messages=CONVERSATION[:5])
    assert got.choices[0].message.content == "Sunny, 21 °C." and got.choices[0].message.tool_calls is None
    assert got.choices[0].finish_reason == "stop"


def test_malformed_calls_are_content_and_choices_are_honoured(served, monkeypatch):
    live, runner, _ = served
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="none", max_retries=0)
    broken = '<tool_call>\n{"name": "get_weather", "arguments": {"city": </tool_call>'
    with scripted_answers(monkeypatch, _script(runner, broken)):
        got = _ask(client)
        streamed = _assembled(_ask(client, stream=True))
    assert got.choices[0].message.content == broken == streamed[0] and got.choices[0].finish_reason == "stop"
    with scripted_answers(monkeypatch, _script(runner, f"{CALL}\n{TIME}")):
        first_only = _ask(client, parallel_tool_calls=False)
        none = _ask(client, tool_choice="none")
    assert [c.function.name for c in first_only.choices[0].message.tool_calls] == ["get_weather"]
    assert none.choices[0].message.content == f"{CALL}\n{TIME}" and none.choices[0].message.tool_calls is None


def test_a_template_without_a_call_format_refuses_tools(served):
    live, runner, tiny_template = served
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="none", max_retries=0)
    qwen3_template = runner.tokenizer.templates
    runner.tokenizer.templates = tiny_template
    try:
        with pytest.raises(openai.BadRequestError) as refused:
            _ask(client)
    finally:
        runner.tokenizer.templates = qwen3_template
    assert refused.value.body["param"] == "tools" and "--tool-call-parser" in refused.value.body["message"]
    runner.tokenizer.templates = tiny_template
    try:  # a forced call needs a call syntax to force
        with pytest.raises(openai.BadRequestError) as refused:
            _ask(client, tool_choice="required")
    finally:
        runner.tokenizer.templates = qwen3_template
    assert refused.value.body["param"] == "tool_choice"


def test_reasoning_then_a_call_streamed_and_whole(served, monkeypatch):
    live, runner, _ = served
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="none", max_retries=0)
    answer = f"<think>\nThe user wants the weather.\n</think>\n\n{CALL}"
    with scripted_answers(monkeypatch, _script(runner, answer)):
        whole = _ask(client, extra_body={"enable_thinking": True})
        content, reasoning, calls, finish, _ = _assembled(_ask(client, stream=True, extra_body={"enable_thinking": True}))
        no_tools = _ask(client, tools=None, extra_body={"enable_thinking": True})
    message = whole.choices[0].message
    assert message.model_extra["reasoning_content"] == "\nThe user wants the weather.\n" == reasoning
    assert message.content is None and content == ""
    assert [c.function.name for c in message.tool_calls] == ["get_weather"] == [c["name"] for c in calls]
    assert finish == "tool_calls"
    plain = no_tools.choices[0].message  # without tools the call is text, the reasoning still split
    assert plain.content == f"\n\n{CALL}" and plain.model_extra["reasoning_content"] == "\nThe user wants the weather.\n"


# Bounded arguments: a random model's calls end within max_tokens.
BOOKING = {"type": "function", "function": {
    "name": "book_table", "description": "Book a table.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                                   "people": {"type": "integer", "minimum": 1, "maximum": 8},
                                                   "meal": {"enum": ["lunch", "dinner"]}},
                   "required": ["city", "people", "meal"], "additionalProperties": False}}}
STRICT_CLOCK = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}}
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in (STRICT_CLOCK, BOOKING)}


@pytest.mark.parametrize("choice, parallel", [
    ("required", False), ("required", True), ({"type": "function", "function": {"name": "book_table"}}, True)])
def test_required_and_named_calls_validate_and_stream_as_whole(served, choice, parallel):
    """A random tiny Qwen3, sampled: the grammar makes its answer calls whose arguments validate
    against their function's schema (jsonschema), streamed deltas assembling to the whole answer."""
    jsonschema = pytest.importorskip("jsonschema")
    live, _, _ = served
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="none", max_retries=0)
    kwargs = {"tools": [STRICT_CLOCK, BOOKING], "tool_choice": choice, "parallel_tool_calls": parallel,
              "temperature": 0.8, "seed": 11, "max_tokens": 400}
    whole = _ask(client, **kwargs)
    content, _, calls, finish, _ = _assembled(_ask(client, stream=True, **kwargs))
    message = whole.choices[0].message
    assert whole.choices[0].finish_reason == "tool_calls" == finish and not message.content and not content, (
        message, whole.usage)
    got = [(c.function.name, c.function.arguments) for c in message.tool_calls]
    assert got == [(c["name"], c["arguments"]) for c in calls]
    assert len(got) == 1 if not parallel or isinstance(choice, dict) else len(got) >= 1
    if isinstance(choice, dict):
        assert got[0][0] == "book_table"
    for name, arguments in got:
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])
