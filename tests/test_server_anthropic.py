"""POST /v1/messages (server/anthropic.py) with the official `anthropic` client: the answer is the chat
route's for the same conversation (greedy tokens, usage), stop reasons (max_tokens, stop_sequence,
end_turn, tool_use), the streamed events in Anthropic's published order assembling to the whole
message, tool_use answers and a tool_result history rendered as transformers renders the same
conversation, thinking blocks, an image block on a tiny VLM, and refusals in Anthropic's error shape
naming the field. The tiny Qwen3 engine answers from a script where an answer must hold a call or a
<think> block (tests/scripted.py)."""

import base64
import json

import httpx
import pytest

from helpers import PROMPTS
from scripted import scripted_answers
from trt_llm.runtime.text.prompt import PromptFormatter
from trt_llm.runtime.text.tokenizer import Tokenizer
from trt_llm.server.anthropic_convert import to_chat
from trt_llm.server.anthropic_protocol import MessagesRequest
from trt_llm.server.convert import convert

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

KEY = "anthropic-test-key"
WEATHER = {"name": "get_weather", "description": "The weather in a city now.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CLOCK = {"name": "get_time", "description": "The time.", "input_schema": {"type": "object", "properties": {}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
GREEDY = {"temperature": 0}  # the client (2.x) has no temperature argument: sent as an extra body field


@pytest.fixture(scope="module")
def served(tiny_model, build_engine_for, npm_tokenizer):
    """The tiny Qwen3 engine (the one tests/test_tool_calls.py builds) behind a server with a key, its
    template Qwen3's own (tools, <tool_call>, <think>): (server, runner)."""
    from test_server import LiveServer
    from trt_llm.runtime.engine_dir import EngineDir
    from trt_llm.runtime.requests.runner import Runner
    from trt_llm.server.app import ServerConfig, create_app

    qwen3_template = Tokenizer.from_dir(npm_tokenizer("qwen3")).chat_template
    engine = build_engine_for(tiny_model("qwen3"), max_input_len=1536, max_kv_cache_capacity=2048)
    runner = Runner(EngineDir.open(engine), threads=1, scheduling="continuous")
    runner.tokenizer.templates = {"default": qwen3_template}
    live = LiveServer(create_app(runner, ServerConfig(model_name="tiny", max_rows=2, api_keys=(KEY,))))
    yield live, runner
    live.close()


def _clients(live):
    return (anthropic.Anthropic(base_url=live.url, api_key=KEY, max_retries=0),
            openai.OpenAI(base_url=f"{live.url}/v1", api_key=KEY, max_retries=0))


def _script(runner, text):
    tok = runner.tokenizer
    return tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]


def _ask(client, **kwargs):
    kwargs = {"model": "tiny", "max_tokens": 64, "messages": [{"role": "user", "content": PROMPTS[1]}], **kwargs}
    kwargs["extra_body"] = {**GREEDY, **kwargs.get("extra_body", {})}
    return client.messages.create(**kwargs)


def _streamed(client, **kwargs):
    kwargs = {"model": "tiny", "max_tokens": 64, "messages": [{"role": "user", "content": PROMPTS[1]}], **kwargs}
    kwargs["extra_body"] = {**GREEDY, **kwargs.get("extra_body", {})}
    with client.messages.stream(**kwargs) as stream:
        return stream.get_final_message()


def _same_message(streamed, whole):
    a, b = streamed.model_dump(exclude={"id"}), whole.model_dump(exclude={"id"})
    for block in a["content"] + b["content"]:
        if block["type"] == "tool_use":
            block.pop("id")  # each answer's own
    assert a == b


@pytest.mark.parametrize("system", [None, "You are terse.", [{"type": "text", "text": "You are "},
                                                             {"type": "text", "text": "terse."}]])
def test_text_is_the_chat_routes_answer(served, system):
    live, _ = served
    claude, gpt = _clients(live)
    chat_messages = [{"role": "user", "content": PROMPTS[1]}]
    if system is not None:  # blocks join as the chat route's text parts join
        chat_messages.insert(0, {"role": "system", "content": system if isinstance(system, str) else "You are terse."})
    want = gpt.chat.completions.create(model="tiny", messages=chat_messages, max_tokens=24, temperature=0)
    got = _ask(claude, max_tokens=24, **({"system": system} if system is not None else {}))
    assert got.type == "message" and got.role == "assistant" and got.id.startswith("msg_") and got.model == "tiny"
    assert [b.type for b in got.content] == ["text"] and got.content[0].text == want.choices[0].message.content
    assert got.usage.input_tokens == want.usage.prompt_tokens
    assert got.usage.output_tokens == want.usage.completion_tokens
    assert got.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[want.choices[0].finish_reason]
    assert got.stop_sequence is None


def test_max_tokens_stop_sequences_and_end_turn(served, monkeypatch):
    live, runner = served
    claude, _ = _clients(live)
    with scripted_answers(monkeypatch, _script(runner, "Hello world. Goodbye.")):
        whole = _ask(claude)
        cut = _ask(claude, max_tokens=2)
        stopped = _ask(claude, stop_sequences=["nothing", "world"])
        streamed = _streamed(claude, stop_sequences=["world"])
    assert (whole.content[0].text, whole.stop_reason, whole.stop_sequence) == ("Hello world. Goodbye.", "end_turn", None)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 2
    assert "Hello world".startswith(cut.content[0].text)
    assert (stopped.content[0].text, stopped.stop_reason, stopped.stop_sequence) == ("Hello ", "stop_sequence", "world")
    _same_message(streamed, stopped)


def _events(live, body):
    """The raw stream: (event line, data) pairs, checked to be Anthropic's SSE framing."""
    events = []
    with httpx.stream("POST", f"{live.url}/v1/messages", json={**body, "stream": True, **GREEDY},
                      headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"}, timeout=60) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        text = "".join(response.iter_text())
    for frame in text.split("\n\n")[:-1]:
        event, data = frame.split("\n")
        assert event.startswith("event: ") and data.startswith("data: ")
        payload = json.loads(data.removeprefix("data: "))
        assert payload["type"] == event.removeprefix("event: ")
        events.append(payload)
    assert text.endswith("\n\n")
    return events


def test_the_stream_is_anthropics_event_sequence(served, monkeypatch):
    """Thinking, text and a call: each block opened, written and closed in turn, a ping after the
    first block's start, then message_delta and message_stop; assembled by the client, the whole
    message."""
    live, runner = served
    claude, _ = _clients(live)
    answer = f"<think>\nThe user wants the weather.\n</think>\n\nLet me check.\n{CALL}"
    body = {"model": "tiny", "max_tokens": 200, "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "tools": [WEATHER], "thinking": {"type": "enabled", "budget_tokens": 1024}}
    with scripted_answers(monkeypatch, _script(runner, answer)):
        events = _events(live, {**body, "max_tokens": 2000})
        whole = _ask(claude, **{**body, "max_tokens": 2000})
        streamed = _streamed(claude, **{**body, "max_tokens": 2000})
    kinds = [(e["type"], e.get("index"), (e.get("content_block") or e.get("delta") or {}).get("type")) for e in events]
    head = [k for k in kinds if k[0] != "content_block_delta"]
    assert head == [("message_start", None, None),
                    ("content_block_start", 0, "thinking"), ("ping", None, None), ("content_block_stop", 0, None),
                    ("content_block_start", 1, "text"), ("content_block_stop", 1, None),
                    ("content_block_start", 2, "tool_use"), ("content_block_stop", 2, None),
                    ("message_delta", None, None), ("message_stop", None, None)]
    deltas = {index: {t for (kind, i, t) in kinds if kind == "content_block_delta" and i == index} for index in range(3)}
    assert deltas == {0: {"thinking_delta"}, 1: {"text_delta"}, 2: {"input_json_delta"}}
    start, delta = events[0]["message"], events[-2]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] > 0
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == whole.usage.output_tokens == len(_script(runner, answer))
    assert [b.type for b in whole.content] == ["thinking", "text", "tool_use"]
    assert whole.content[0].thinking == "\nThe user wants the weather.\n" and whole.content[0].signature == ""
    assert whole.content[1].text == "Let me check."
    call = whole.content[2]
    assert call.id.startswith("toolu_") and (call.name, call.input) == ("get_weather", {"city": "Paris"})
    assert whole.stop_reason == "tool_use"
    _same_message(streamed, whole)


CONVERSATION = [
    {"role": "user", "content": "Weather and time in Paris?"},
    {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "Both tools.", "signature": ""},
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "toolu_2", "name": "get_time", "input": {}}]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": '{"sky": "sunny", "celsius": 21}'},
        {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": "12:30"}]},
        {"type": "text", "text": "And tomorrow?", "cache_control": {"type": "ephemeral"}}]},
]
# The same conversation as transformers' apply_chat_template documents it.
AS_TRANSFORMERS = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Weather and time in Paris?"},
    {"role": "assistant", "content": "Let me check.", "reasoning_content": "Both tools.", "tool_calls": [
        {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
        {"id": "toolu_2", "type": "function", "function": {"name": "get_time", "arguments": {}}}]},
    {"role": "tool", "tool_call_id": "toolu_1", "content": '{"sky": "sunny", "celsius": 21}'},
    {"role": "tool", "tool_call_id": "toolu_2", "content": "12:30"},
    {"role": "user", "content": "And tomorrow?"},
]


def _as_openai(messages):
    """The conversation as OpenAI's API takes it: a call's arguments as a JSON string."""
    return [{**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
                                 for c in m["tool_calls"]]} if "tool_calls" in m else m for m in messages]


def _openai_tool(tool):
    return {"type": "function", "function": {"name": tool["name"], "description": tool["description"],
                                             "parameters": tool["input_schema"]}}


@pytest.mark.parametrize("thinking", [True, False])
def test_a_tool_result_history_renders_as_transformers_renders_it(npm_tokenizer, thinking):
    transformers = pytest.importorskip("transformers")
    folder = npm_tokenizer("qwen3")
    body = MessagesRequest.model_validate({
        "model": "m", "max_tokens": 2000, "system": "You are helpful.", "messages": CONVERSATION,
        "tools": [WEATHER, CLOCK], "thinking": {"type": "enabled" if thinking else "disabled",
                                                **({"budget_tokens": 1024} if thinking else {})}})
    chat, _ = to_chat(body, None)
    converted = convert(chat, {}, 4096, None)
    ours = PromptFormatter(Tokenizer.from_dir(folder), True, True, thinking).format(
        converted.request.messages, converted.request.tools)
    want = transformers.AutoTokenizer.from_pretrained(folder).apply_chat_template(
        AS_TRANSFORMERS, tools=[_openai_tool(WEATHER), _openai_tool(CLOCK)], add_generation_prompt=True,
        enable_thinking=thinking, tokenize=False)
    assert ours.text == want
    assert "<tool_response>\n12:30\n</tool_response>" in want and '"arguments": {"city": "Paris"}' in want


def test_tool_use_answers_and_tool_choice(served, monkeypatch):
    live, runner = served
    claude, gpt = _clients(live)
    tools = [WEATHER, CLOCK]
    with scripted_answers(monkeypatch, _script(runner, "Sunny, 21 °C.")):
        after = _ask(claude, system="You are helpful.", messages=CONVERSATION, tools=tools, max_tokens=2000)
        same = gpt.chat.completions.create(model="tiny", messages=_as_openai(AS_TRANSFORMERS), max_tokens=2000,
                                           temperature=0,
                                           tools=[_openai_tool(t) for t in tools])
    assert after.content[0].text == "Sunny, 21 °C." and after.stop_reason == "end_turn"
    assert after.usage.input_tokens == same.usage.prompt_tokens  # the same prompt as the chat route's
    two = f"{CALL}\n" + '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    with scripted_answers(monkeypatch, _script(runner, two)):
        both = _ask(claude, tools=tools, max_tokens=200)
        first = _ask(claude, tools=tools, max_tokens=200, tool_choice={"type": "auto", "disable_parallel_tool_use": True})
        none = _ask(claude, tools=tools, max_tokens=200, tool_choice={"type": "none"})
        named = _ask(claude, tools=tools, max_tokens=200, tool_choice={"type": "tool", "name": "get_weather"})
        anyone = _ask(claude, tools=tools, max_tokens=200, tool_choice={"type": "any"})
    assert [(b.type, b.name, b.input) for b in both.content] == [("tool_use", "get_weather", {"city": "Paris"}),
                                                                 ("tool_use", "get_time", {})]
    assert both.stop_reason == "tool_use" and len({b.id for b in both.content}) == 2
    assert [b.name for b in first.content] == ["get_weather"]
    assert [b.type for b in none.content] == ["text"] and none.content[0].text == two and none.stop_reason == "end_turn"
    # any and tool are the chat route's required and named function (a grammar forces the call; the
    # scripted sampler writes it regardless)
    assert named.stop_reason == anyone.stop_reason == "tool_use"
    assert named.content[0].name == anyone.content[0].name == "get_weather"


def test_tool_choice_maps_onto_the_chat_routes():
    def chat(choice):
        body = MessagesRequest.model_validate({"model": "m", "max_tokens": 8, "tools": [WEATHER], "tool_choice": choice,
                                               "messages": [{"role": "user", "content": "hi"}]})
        return to_chat(body, None)[0]

    assert chat({"type": "auto"}).tool_choice == "auto" and chat({"type": "auto"}).parallel_tool_calls
    assert chat({"type": "none"}).tool_choice == "none"
    assert chat({"type": "any", "disable_parallel_tool_use": True}).tool_choice == "required"
    assert not chat({"type": "any", "disable_parallel_tool_use": True}).parallel_tool_calls
    named = chat({"type": "tool", "name": "get_weather"}).tool_choice
    assert (named.type, named.function.name) == ("function", "get_weather")
    assert chat({"type": "auto"}).tools[0].function.parameters == WEATHER["input_schema"]


def test_thinking_blocks_and_display_omitted(served, monkeypatch):
    live, runner = served
    claude, _ = _clients(live)
    answer = "<think>\nShort.\n</think>\n\nFour."
    thinking = {"type": "enabled", "budget_tokens": 1024}
    with scripted_answers(monkeypatch, _script(runner, answer)):
        shown = _ask(claude, max_tokens=1100, thinking=thinking)
        hidden = _ask(claude, max_tokens=1100, thinking={**thinking, "display": "omitted"})
        adaptive = _streamed(claude, max_tokens=1100, thinking={"type": "adaptive"})
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in shown.content] == [
        ("thinking", "\nShort.\n"), ("text", "Four.")]  # the newlines between them separate the blocks
    assert [b.type for b in hidden.content] == ["thinking", "text"] and hidden.content[0].thinking == ""
    _same_message(adaptive, shown)


@pytest.mark.parametrize("body, status, kind, starts", [
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
     400, "invalid_request_error", "messages[0].content[0]: type 'document' is not allowed"),
    ({"messages": [{"role": "user", "content": "hi"}]}, 400, "invalid_request_error", "max_tokens: required"),
    ({"max_tokens": 8, "temperature": 1.5, "messages": [{"role": "user", "content": "hi"}]},
     400, "invalid_request_error", "temperature: 1.5 is greater than the maximum 1"),
    ({"max_tokens": 8, "max_token": 8, "messages": [{"role": "user", "content": "hi"}]},
     400, "invalid_request_error", "max_token: unknown or unsupported parameter (did you mean 'max_tokens'?)"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "thinking", "thinking": "x"}]}]},
     400, "invalid_request_error", "messages[0].content[0]: a user turn has no thinking blocks"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "The"}]},
     400, "invalid_request_error", "messages[1]: a final assistant turn"),
    ({"max_tokens": 8, "thinking": {"type": "enabled", "budget_tokens": 100},
      "messages": [{"role": "user", "content": "hi"}]},
     400, "invalid_request_error", "thinking.budget_tokens: 100 is less than the minimum 1024"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "see"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]},
     400, "invalid_request_error", "messages[0].content[1]: this engine has no image encoder"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "not base64!"}}]}]},
     400, "invalid_request_error", "messages[0].content[0].source.data: the data URL's payload is not base64"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}]},
     400, "invalid_request_error", "messages[0].content[0].source.url: this server fetches nothing"),
    ({"model": "claude-opus-4", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
     404, "not_found_error", "model 'claude-opus-4' is not served here"),
])
def test_bad_requests_get_anthropics_error_naming_the_field(served, body, status, kind, starts):
    live, _ = served
    refused = httpx.post(f"{live.url}/v1/messages", json={"model": "tiny", **body}, headers={"x-api-key": KEY},
                         timeout=60)
    assert refused.status_code == status
    error = refused.json()
    assert set(error) == {"type", "error"} and error["type"] == "error" and set(error["error"]) == {"type", "message"}
    assert error["error"]["type"] == kind
    assert error["error"]["message"].startswith(starts), error["error"]["message"]


def test_the_client_raises_the_refusal(served):
    live, _ = served
    claude, _ = _clients(live)
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.create(model="tiny", max_tokens=8, messages=[{"role": "user", "content": "hi"}],
                               stop_sequences=[""])
    assert refused.value.body["error"]["message"].startswith("stop_sequences[0]: empty string not allowed")


def test_keys_x_api_key_and_bearer_and_the_metrics(served):
    live, _ = served
    body = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    url = f"{live.url}/v1/messages"
    assert httpx.post(url, json=body, headers={"x-api-key": KEY}, timeout=60).status_code == 200
    assert httpx.post(url, json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60).status_code == 200
    for headers in ({}, {"x-api-key": "wrong"}):
        refused = httpx.post(url, json=body, headers=headers, timeout=60)
        assert refused.status_code == 401
        assert refused.json() == {"type": "error", "error": {"type": "authentication_error", "message": (
            "a valid API key is needed: Authorization: Bearer <key> (or x-api-key: <key>)")}}
    broken = httpx.post(url, content=b"{not json", headers={"x-api-key": KEY}, timeout=60)
    assert broken.status_code == 400 and broken.json()["error"]["message"].startswith("the body is not valid JSON")
    metrics = httpx.get(f"{live.url}/metrics", headers={"x-api-key": KEY}).text
    assert 'trt_llm_requests_total{route="/v1/messages",status="200"}' in metrics
    assert 'trt_llm_requests_total{route="/v1/messages",status="401"}' in metrics
    schema = httpx.get(f"{live.url}/openapi.json", headers={"x-api-key": KEY}).json()
    assert schema["paths"]["/v1/messages"]["post"]["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/AnthropicMessagesRequest"}
    assert "AnthropicImageBlock" in schema["components"]["schemas"]


def test_an_image_block_is_the_chat_routes_image(npm_tokenizer, build_engine_for, tmp_path_factory):
    """A base64 image block on a tiny Qwen2.5-VL: the chat route's answer to the same image as a data URL."""
    import numpy as np
    import vlm_assets
    from PIL import Image

    from test_server import LiveServer
    from trt_llm.runtime.engine_dir import EngineDir
    from trt_llm.runtime.requests.runner import Runner
    from trt_llm.server.app import ServerConfig, create_app

    folder = vlm_assets.make_tiny_vlm("qwen2_5_vl", tmp_path_factory.mktemp("vlm"), npm_tokenizer("qwen3"))
    engine = build_engine_for(folder, max_batch_size=2, max_input_len=256, max_kv_cache_capacity=320)
    picture = tmp_path_factory.mktemp("picture") / "p.png"
    Image.fromarray((np.random.default_rng(0).random((56, 84, 3)) * 255).astype(np.uint8)).save(picture)
    data = base64.b64encode(picture.read_bytes()).decode()
    live = LiveServer(create_app(Runner(EngineDir.open(engine), threads=1, scheduling="continuous"),
                                 ServerConfig(model_name="tiny", max_rows=2)))
    try:
        claude = anthropic.Anthropic(base_url=live.url, api_key="none", max_retries=0)
        got = claude.messages.create(model="tiny", max_tokens=8, extra_body=GREEDY, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}},
            {"type": "text", "text": "What is it?"}]}])
        want = openai.OpenAI(base_url=f"{live.url}/v1", api_key="none", max_retries=0).chat.completions.create(
            model="tiny", max_tokens=8, temperature=0, messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}},
                {"type": "text", "text": "What is it?"}]}])
    finally:
        live.close()
    assert got.content[0].text == want.choices[0].message.content
    assert got.usage.input_tokens == want.usage.prompt_tokens > 12  # the image's tokens are in the prompt


def test_a_request_past_its_timeout_is_an_error_whole_or_mid_stream(tiny_model, build_engine_for):
    """--request-timeout: 504 timeout_error for a whole message; once streaming began, an `error`
    event after message_start (the client raises it)."""
    from test_server import LiveServer
    from trt_llm.runtime.engine_dir import EngineDir
    from trt_llm.runtime.requests.runner import Runner
    from trt_llm.server.app import ServerConfig, create_app

    engine = build_engine_for(tiny_model("qwen3"), max_input_len=1536, max_kv_cache_capacity=2048)
    live = LiveServer(create_app(Runner(EngineDir.open(engine), threads=1, scheduling="continuous"),
                                 ServerConfig(model_name="tiny", max_rows=2, request_timeout_s=1e-6)))
    try:
        body = {"model": "tiny", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
        whole = httpx.post(f"{live.url}/v1/messages", json=body, timeout=60)
        events = _events(live, body)
        claude = anthropic.Anthropic(base_url=live.url, api_key="none", max_retries=0)
        with pytest.raises(anthropic.APIStatusError) as raised:
            with claude.messages.stream(**body) as stream:
                stream.get_final_message()
    finally:
        live.close()
    assert whole.status_code == 504 and whole.json()["error"]["type"] == "timeout_error"
    assert [e["type"] for e in events] == ["message_start", "error"]
    assert events[1]["error"]["type"] == "timeout_error" and "--request-timeout" in events[1]["error"]["message"]
    assert raised.value.body["error"]["type"] == "timeout_error"
