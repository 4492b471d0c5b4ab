"""The defaults users expect (issue 47 item 7, and item 6's server messages): context reuse on in
trt-llm-run (off with --no-context-reuse, which warns about a file's explicit policies), one budget
flag at a time and none beyond the machine, `whisper` keys warned about like every other block, the
input file's tools checked as the server's and history arguments that are not JSON refused, the
server taking null where OpenAI does and refusing "yes" for a boolean, duplicate tool names and an
Anthropic tool_use without its tool_result, tool_choice none rendering the tools as auto does, a
forced-call grammar too long said in our words, and no pydantic branch name in an error's param.
Each refusal is one line naming the field; the other requests are answered and the output written."""

import json
import logging

import pytest

from helpers import chat_request
from trt_llm.runtime.app.run_cli import main as run_main
from trt_llm.schemas.input_file import parse_input_dict

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 3}  # several 16-token blocks


@pytest.fixture(scope="module")
def engine(tiny_model, build_engine_for):
    return build_engine_for(tiny_model("qwen3"))


def _run(engine, tmp_path, data, *flags):
    (tmp_path / "in.json").write_text(json.dumps(data))
    status = run_main([str(tmp_path / "in.json"), "--engine-dir", str(engine), "-o", str(tmp_path / "out.json"),
                       "--threads", "1", *flags])
    out = tmp_path / "out.json"
    return status, json.loads(out.read_text())["responses"] if out.exists() else None


def test_context_reuse_is_on_by_default_and_off_says_what_it_ignores(engine, tmp_path, caplog):
    requests = [{"messages": [SYSTEM, {"role": "user", "content": text}]} for text in ("What is 2+2?", "Hi")]
    data = {"temperature": 0.0, "max_generate_length": 6, "requests": requests}
    status, reused = _run(engine, tmp_path, data)
    assert status == 0 and reused[0]["reused_tokens"] == 0 and reused[1]["reused_tokens"] >= 48
    asked = {**data, "context_cache_lookup_policy": "use_cache"}
    with caplog.at_level(logging.WARNING):
        status, off = _run(engine, tmp_path, asked, "--no-context-reuse")
    assert status == 0 and [r["reused_tokens"] for r in off] == [0, 0]
    assert [r["output_token_ids"] for r in off] == [r["output_token_ids"] for r in reused]  # reuse is exact
    warned = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    assert warned == ["top level: context_cache_lookup_policy / _commit_policy ignored: --no-context-reuse turns "
                      "context reuse off (only saved system prompts are reused)"]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert _run(engine, tmp_path, data, "--no-context-reuse")[0] == 0  # asked for nothing: no warning
    assert not [r for r in caplog.records if "ignored" in r.getMessage()]


@pytest.mark.parametrize("flags, message", [
    (["--kv-cache-budget", "512M", "--prompt-cache-budget-mb", "256"],
     "trt-llm-run: error: --prompt-cache-budget-mb: not with --kv-cache-budget (the same budget by its older name; "
     "give one)"),
    (["--kv-cache-budget", "100000T"], "trt-llm-run: error: --kv-cache-budget: 102400000.0 GiB is more than this "
                                       "machine's memory ("),
    (["--prompt-cache-budget-mb", "999999999"], "trt-llm-run: error: --prompt-cache-budget-mb: 976562.5 GiB is more "
                                                "than this machine's memory ("),
])
def test_budget_flags_one_at_a_time_and_within_the_machine(engine, tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit) as exit_:
        _run(engine, tmp_path, {"requests": [chat_request("Hi")]}, *flags)
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and err.startswith(message) and len(err.splitlines()) == 1
    assert not (tmp_path / "out.json").exists()


def test_unknown_whisper_keys_are_warned_about():
    loaded = parse_input_dict({"whisper": {"languge": "en", "vad_parameters": {"treshold": 0.3}},
                               "requests": [chat_request("Hi")]})
    assert loaded.warnings == ["whisper: unknown key 'languge' ignored (did you mean 'language'?)",
                               "whisper.vad_parameters: unknown key 'treshold' ignored (did you mean 'threshold'?)"]


def test_the_input_files_tools_and_call_arguments_are_checked(engine, tmp_path):
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "city=Paris"}}]}
    answer = {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
    data = {"temperature": 0.0, "max_generate_length": 3, "requests": [
        chat_request("Weather?", tools=[WEATHER, WEATHER]),
        chat_request("Weather?", tools=[{"type": "function", "function": {"name": ""}}]),
        {"messages": [{"role": "user", "content": "Weather?"}, call, answer], "tools": [WEATHER]},
        chat_request("Weather?", tools=[WEATHER]),  # fine: answered
    ]}
    status, responses = _run(engine, tmp_path, data)
    assert status == 1 and len(responses) == 4
    assert [r["error"] for r in responses[:3]] == [
        "requests[0].tools: tools[1] repeats the function name 'get_weather' of tools[0]; each function needs a "
        "name of its own",
        "requests[1].tools[0]: function.name: empty string not allowed",
        "requests[2].messages[1].tool_calls[0].function.arguments: not JSON (Expecting value: line 1 column 1 "
        "(char 0)); give the arguments as a JSON object or its text"]
    assert responses[3]["finish_reason"] == "max-length" and responses[3]["generated_tokens"] == 3


# --- the server -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def client(engine):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from trt_llm.runtime.engine_dir import EngineDir
    from trt_llm.runtime.requests.runner import Runner
    from trt_llm.server.app import ServerConfig, create_app

    runner = Runner(EngineDir.open(engine), threads=1, scheduling="continuous")
    with TestClient(create_app(runner, ServerConfig(model_name="tiny", max_rows=2))) as test_client:
        yield test_client


def _chat(client, **extra):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0,
            **extra}
    return client.post("/v1/chat/completions", json=body)


NULLABLE = ["temperature", "top_p", "top_k", "n", "stream", "presence_penalty", "frequency_penalty",
            "repetition_penalty", "min_p", "logprobs", "seed", "max_tokens", "stop", "logit_bias"]


def test_null_is_the_default_where_openai_takes_it(client):
    from trt_llm.server.convert import convert
    from trt_llm.server.protocol import ChatCompletionRequest

    base = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}]}
    nulls = ChatCompletionRequest.model_validate({**base, **dict.fromkeys(NULLABLE), "parallel_tool_calls": None})
    plain = ChatCompletionRequest.model_validate(base)
    assert convert(nulls, {}, 512, None) == convert(plain, {}, 512, None)  # the same request and settings
    greedy = _chat(client, **{**dict.fromkeys(NULLABLE), "temperature": 0, "max_tokens": 3})
    assert greedy.status_code == 200 and greedy.json()["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("extra, param, message", [
    ({"stream": "yes"}, "stream", "stream: expected true or false, got 'yes'"),
    ({"logprobs": 1}, "logprobs", "logprobs: expected true or false, got 1"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls",
     "parallel_tool_calls: expected true or false, got 'yes'"),
    ({"tools": [WEATHER, WEATHER]}, "tools", "tools: tools[1] repeats the function name 'get_weather' of tools[0]; "
                                             "each function needs a name of its own"),
    ({"tools": [WEATHER], "tool_choice": "any"}, "tool_choice",
     "tool_choice: 'any' is not supported; use none, auto or required"),
    ({"tools": [WEATHER], "tool_choice": 5}, "tool_choice", "tool_choice: expected none, auto, required or a named "
                                                            "function (an object with type function and function.name)"),
    ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "[1]"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "sunny"}], "tools": [WEATHER]},
     "messages.1.tool_calls.0.function.arguments",
     "messages.1.tool_calls.0.function.arguments: not a JSON object; send the arguments as a JSON object's text"),
])
def test_the_server_refuses_what_openai_refuses_naming_the_field(client, extra, param, message):
    refused = _chat(client, **extra)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert (error["param"], error["message"]) == (param, message)
    assert _chat(client).status_code == 200  # nothing else lost


@pytest.mark.parametrize("body, message", [
    ({"messages": [{"role": "user", "content": "Weather?"},
                   {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
                   {"role": "user", "content": "And?"}]},
     "messages[1]: tool_use 't1' without a tool_result in the next turn (messages[2]); each tool_use needs its "
     "tool_result there"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t9", "content": "x"}]}]},
     "messages[0]: tool_result for 't9', which no tool_use of the turn before it asked for"),
    ({"tools": [{"name": "f", "input_schema": {"type": "object"}}, {"name": "f", "input_schema": {"type": "object"}}]},
     "tools[1].name: 'f' is also tools[0]'s; tool names must be unique"),
])
def test_anthropic_tool_pairs_and_names_are_checked_as_anthropic_does(client, body, message):
    body = {"model": "tiny", "max_tokens": 3, "messages": [{"role": "user", "content": "Hi"}], **body}
    refused = client.post("/v1/messages", json=body)
    assert refused.status_code == 400 and refused.json()["error"]["message"] == message
    paired = {"model": "tiny", "max_tokens": 3, "messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]}]}
    assert client.post("/v1/messages", json=paired).status_code == 200


def test_tool_choice_none_renders_the_tools_as_auto_does(npm_tokenizer):
    """The oracle: transformers' apply_chat_template with the tools, Qwen3's own template."""
    transformers = pytest.importorskip("transformers")
    from trt_llm.runtime.text.prompt import PromptFormatter
    from trt_llm.runtime.text.tokenizer import Tokenizer
    from trt_llm.server.convert import convert
    from trt_llm.server.protocol import ChatCompletionRequest

    folder = npm_tokenizer("qwen3")
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    formatter = PromptFormatter(Tokenizer.from_dir(folder), True, True, False)
    texts = []
    for choice in ("none", "auto", "required"):
        body = ChatCompletionRequest.model_validate({"model": "m", "messages": messages, "tools": [WEATHER],
                                                     "tool_choice": choice})
        converted = convert(body, {}, 4096, None)
        texts.append(formatter.format(converted.request.messages, converted.request.tools).text)
    want = transformers.AutoTokenizer.from_pretrained(folder).apply_chat_template(
        messages, tools=[WEATHER], add_generation_prompt=True, enable_thinking=False, tokenize=False)
    assert texts == [want] * 3 and "get_weather" in want


def test_a_forced_call_grammar_too_long_is_said_in_our_words(engine):
    from transformers import AutoTokenizer

    from trt_llm.runtime.sampling.grammar import Grammars
    from trt_llm.schemas.input_file import MAX_TEXT_BYTES
    from trt_llm.server.convert import BadRequest, convert, force_tool_calls
    from trt_llm.server.protocol import ChatCompletionRequest

    tokenizer = AutoTokenizer.from_pretrained(engine / "tokenizer")
    grammars = Grammars(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    many = {"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"p": {"enum": [f"value-{i}" for i in range(20000)]}}}}}
    body = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "Hi"}],
                                                 "tools": [many], "tool_choice": "required"})
    with pytest.raises(BadRequest) as refused:
        force_tool_calls(convert(body, {}, 512, None), body, grammars)
    assert refused.value.param == "tools"
    assert str(refused.value).startswith("tools: the grammar that makes the answer calls of these tools would be ")
    assert f"bytes, over the {MAX_TEXT_BYTES} a grammar may have" in str(refused.value)
    assert "validation error" not in str(refused.value) and "\n" not in str(refused.value)


def test_int4_chunked_prefill_gives_whole_prompt_tokens_with_float_activations(tiny_model, build_engine_for,
                                                                                monkeypatch):
    """The README's account of --prefill-chunk on a quantized engine: with the default int8 activations
    (MatMulNBits accuracy level 4) ONNX Runtime's kernels take different paths by the rows in a call,
    so a chunk size can part a greedy token (SmolLM2 int4, chunks of 1: 2 of 4 answers identical,
    measured); with float activations (level 1) every chunk size gives the whole prompts' tokens."""
    from helpers import PROMPTS, run_input
    from trt_llm.runtime.backends import ort_engine
    from trt_llm.runtime.engine_dir import EngineDir
    from trt_llm.runtime.requests.runner import Runner

    engine = build_engine_for(tiny_model("llama"), quantization={"weights": "int4", "group_size": 32})
    monkeypatch.setattr(ort_engine, "MATMUL_ACCURACY_LEVEL", 1)  # the build's optimised graph is level 4's: re-made
    data = {"temperature": 0.0, "max_generate_length": 16, "requests": [chat_request(p) for p in PROMPTS]}
    whole = [r.output_token_ids for r in run_input(engine, data).responses]
    loaded = parse_input_dict(json.loads(json.dumps(data)))
    for chunk in (1, 7):
        runner = Runner(EngineDir.open(engine), threads=1, prefill_chunk=chunk)
        assert [r.output_token_ids for r in runner.run(loaded, loaded.settings).responses] == whole, chunk
