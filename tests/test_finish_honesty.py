"""Nothing reported complete that is not (issue 47 item 2): where the grammar library gives up on a
constraint (a regex past its lexer's limits, a grammar that never ends, a schema that refers to
itself) the request fails naming the constraint, in the output file (finish_reason "error", the
answer so far kept) and in the server (a 400 naming the field, an error event in a stream, the
Anthropic route's error), never "end-of-sequence" / "stop" with a cut answer. The other requests are
answered, the output is written whole, the exit status says a request failed. The oracle for "not
complete" is the constraint itself: Python's `re` on the regex, the grammar's language by hand."""

import json
import re

import pytest

from helpers import chat_request
from trt_llm.runtime.app.run_cli import main as run_main

pytest.importorskip("llguidance")

HUGE_REGEX = "a{1000000}"  # llguidance's lexer: "too many expressions constructed"
ENDLESS = 'start: "a" start'  # no finite answer: its parser runs out of items
SELF_ARRAY = {"type": "array", "items": {"$ref": "#"}, "minItems": 1}  # [[[[...: no finite answer either
ONLY_ITSELF = {"$ref": "#"}  # nothing can begin it: refused before any token
GAVE_UP = "the grammar library gave up on it: "


@pytest.fixture(scope="module")
def engine(tiny_model, build_engine_for):
    return build_engine_for(tiny_model("qwen3"))  # the engine test_guided_decoding's default test builds


def test_a_constraint_the_library_gives_up_on_fails_its_request_alone(engine, tmp_path):
    data = {"temperature": 0.0, "max_generate_length": 24, "batch_size": 2, "requests": [
        chat_request("Hi", guided_decoding={"regex": HUGE_REGEX}),
        chat_request("Hi", guided_decoding={"choice": ["ok"]}),          # a constraint that holds
        chat_request("Hi", guided_decoding={"ebnf": ENDLESS}),
        chat_request("Hi"),                                              # free text
        chat_request("Hi", response_format={"type": "json_schema", "json_schema": {"schema": SELF_ARRAY}}),
        chat_request("Hi", guided_decoding={"json_schema": ONLY_ITSELF}),
    ]}
    (tmp_path / "in.json").write_text(json.dumps(data))
    status = run_main([str(tmp_path / "in.json"), "--engine-dir", str(engine), "-o", str(tmp_path / "out.json"),
                       "--threads", "1"])
    assert status == 1  # requests failed: the run says so
    responses = json.loads((tmp_path / "out.json").read_text())["responses"]
    assert [r["request_idx"] for r in responses] == list(range(6))  # written whole
    regex, endless, schema, itself = responses[0], responses[2], responses[4], responses[5]
    assert regex["finish_reason"] == "error" and not re.fullmatch(HUGE_REGEX, regex["output_text"])
    assert regex["error"].startswith(f"requests[0].guided_decoding.regex: {GAVE_UP}lexer error: too many "
                                     "expressions constructed; the answer stops after ")
    assert endless["finish_reason"] == "error" and set(endless["output_text"]) <= {"a"}
    assert endless["error"].startswith(f"requests[2].guided_decoding.ebnf: {GAVE_UP}parser error: Too many items")
    assert schema["finish_reason"] == "error" and schema["output_text"].startswith("[")
    assert schema["error"].startswith(f"requests[4].response_format.json_schema.schema: {GAVE_UP}")
    assert itself["error"] == ("requests[5].guided_decoding.json_schema: cannot be enforced: no answer can "
                               "satisfy it (no token can come next and it is not complete)")
    assert itself["generated_tokens"] == 0
    for r in responses:
        assert "\n" not in r.get("error", "")
    # The others are answered, honestly: "ok" complete, the free text cut by its length.
    assert responses[1]["output_text"] == "ok" and responses[1]["finish_reason"] == "end-of-sequence"
    assert responses[3]["finish_reason"] == "max-length" and responses[3]["generated_tokens"] == 24


def test_a_constraint_cut_by_the_length_says_length(engine, tmp_path):
    """A constraint that holds but is not complete when the tokens run out: max-length, not end-of-sequence
    (the KV capacity's clamp, 512 here, the same: its prompt plus 512 new tokens cannot fit)."""
    data = {"temperature": 0.0, "max_generate_length": 4096, "requests": [
        chat_request("Hi", guided_decoding={"regex": "a{2000}"})]}
    (tmp_path / "in.json").write_text(json.dumps(data))
    assert run_main([str(tmp_path / "in.json"), "--engine-dir", str(engine), "-o", str(tmp_path / "out.json"),
                     "--threads", "1"]) == 0
    [r] = json.loads((tmp_path / "out.json").read_text())["responses"]
    assert r["finish_reason"] == "max-length" and r["prompt_tokens"] + r["generated_tokens"] == 512
    assert set(r["output_text"]) == {"a"} and not re.fullmatch("a{2000}", r["output_text"])


def test_the_server_refuses_what_the_library_gave_up_on(engine):
    from fastapi.testclient import TestClient

    from trt_llm.runtime.engine_dir import EngineDir
    from trt_llm.runtime.requests.runner import Runner
    from trt_llm.server.app import ServerConfig, create_app

    runner = Runner(EngineDir.open(engine), threads=1, scheduling="continuous")
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16, "temperature": 0}
    with TestClient(create_app(runner, ServerConfig(model_name="tiny", max_rows=2))) as client:
        whole = client.post("/v1/chat/completions", json={**body, "guided_decoding": {"regex": HUGE_REGEX}})
        assert whole.status_code == 400
        error = whole.json()["error"]
        assert error["param"] == "guided_decoding.regex" and error["code"] == "constraint_failed"
        assert error["message"].startswith(f"guided_decoding.regex: {GAVE_UP}lexer error")
        schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": SELF_ARRAY}}
        streamed = client.post("/v1/chat/completions", json={**body, "stream": True, "response_format": schema})
        events = [json.loads(line[6:]) for line in streamed.text.splitlines()
                  if line.startswith("data: {")]
        assert all(e.get("choices", [{}])[0].get("finish_reason") in (None,) for e in events[:-1])  # never "stop"
        assert events[-1]["error"]["param"] == "response_format.json_schema.schema"
        assert events[-1]["error"]["message"].startswith(f"response_format.json_schema.schema: {GAVE_UP}")
        itself = client.post("/v1/chat/completions", json={**body, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": ONLY_ITSELF}}})
        assert itself.status_code == 400 and itself.json()["error"]["param"] == "response_format.json_schema.schema"
        anthropic = client.post("/v1/messages", json={
            "model": "tiny", "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}]})
        assert anthropic.status_code == 200  # nothing else lost: the server answers the next request
        free = client.post("/v1/chat/completions", json=body).json()["choices"][0]
        assert free["finish_reason"] == "length"
