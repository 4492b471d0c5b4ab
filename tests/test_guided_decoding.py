"""Guided decoding (the input file's guided_decoding, the server's extension of the same name and its
response_format, runtime/sampling/grammar.py): each mode's answers on SmolLM2 conform, checked by an
independent oracle (Python's `re`, `jsonschema`, a hand-written parser of the grammar's language);
a default is overridden per request; a bad pattern fails its request alone, naming the field and
the request; compiled grammars are cached by their text."""

import json
import re

import jsonschema
import pytest

from helpers import chat_request
from trt_llm.runtime.app.run_cli import main as run_main
from trt_llm.runtime.sampling.grammar import Grammars
from trt_llm.schemas.input_file import parse_input_dict

pytest.importorskip("llguidance")

REGEX = r"(Mon|Tue|Wed)day, [1-9][0-9]? (May|June)"
CHOICES = ["red", "green", "blue"]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
# A context-free language (nested sums), in llguidance's Lark syntax and as a llama.cpp GBNF grammar.
LARK = 'start: expr\nexpr: DIGIT | "(" expr " + " expr ")"\nDIGIT: /[0-9]/\n'
GBNF = 'root ::= "yes" | "no" | "maybe"'


def is_sum(text: str) -> bool:
    """The oracle for LARK: a hand-written recursive-descent parser of its language."""
    def expr(i):
        if i < len(text) and text[i].isdigit():
            return i + 1
        if not text.startswith("(", i):
            return None
        i = expr(i + 1)
        if i is None or not text.startswith(" + ", i):
            return None
        i = expr(i + 3)
        return i + 1 if i is not None and text.startswith(")", i) else None
    return expr(0) == len(text)


def test_exactly_one_mode_and_which_constraint_a_request_gets():
    m = [{"role": "user", "content": "hi"}]
    loaded = parse_input_dict({"guided_decoding": {"regex": "[0-9]+"}, "requests": [
        {"messages": m},                                                    # the default
        {"messages": m, "guided_decoding": {"choice": ["a", "b"]}},          # its own replaces it
        {"messages": m, "guided_decoding": None},                            # explicit null: none
        {"messages": m, "response_format": {"type": "text"}},                # a response_format replaces it
        {"messages": m, "guided_decoding": {"regex": "a", "choice": ["x"]}},
        {"messages": m, "guided_decoding": {}},
        {"messages": m, "guided_decoding": {"json_object": False}},
        {"messages": m, "guided_decoding": {"json_object": True}, "response_format": {"type": "json_object"}},
        {"messages": m, "guided_decoding": {"choice": []}},
        {"messages": m, "guided_decoding": {"regexp": "a"}},
    ]})
    own = [r.resolved_guided_decoding(loaded.settings) for r in loaded.requests[:4]]
    assert [(g.mode()[0] if g else None, default) for g, default in own] == [
        ("regex", True), ("choice", False), (None, False), (None, False)]
    errors = [r.message for r in loaded.requests[4:]]
    assert errors[0] == ("requests[4].guided_decoding: expected exactly one of json_schema, json_object, regex, "
                         "choice or ebnf, got regex and choice")
    assert errors[1].endswith("got none") and errors[5].endswith("got none")
    assert errors[2] == "requests[6].guided_decoding.json_object: must be true (leave guided_decoding out for free text)"
    assert errors[3].startswith("requests[7]: response_format and guided_decoding both given")
    assert errors[4] == "requests[8].guided_decoding.choice: empty, at least 1 required"
    assert "requests[9].guided_decoding: unknown key 'regexp' ignored (did you mean 'regex'?)" in loaded.warnings


def test_compiled_grammars_are_cached_by_their_text_and_each_request_has_its_own_state(smollm2_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    grammars = Grammars(tokenizer, len(tokenizer), [tokenizer.convert_tokens_to_ids("<|im_end|>")])
    first, second = grammars.guided("choice", CHOICES), grammars.guided("choice", CHOICES)
    assert grammars.stats == {"compiled": 1, "hits": 1}
    token = tokenizer.encode("red", add_special_tokens=False)[0]
    first.accept(token)
    assert not first.allowed()[token] and second.allowed()[token]  # the copy is untouched by the first
    for _ in range(2):  # a failure is cached too, and says what failed
        with pytest.raises(ValueError, match=r"(?s)^regex: does not compile: .*unclosed character class"):
            grammars.guided("regex", "[a-")
    assert grammars.stats == {"compiled": 2, "hits": 2}
    grammars.cache_size = 1
    grammars.guided("json_object", True)
    grammars.guided("choice", CHOICES)  # evicted by the one after it: compiled again
    assert grammars.stats["compiled"] == 4


def test_several_rows_masks_in_one_call_equal_each_rows_own(smollm2_dir):
    """mask_logits computes several grammar rows' masks in one llguidance call; each row must be what
    its constraint alone allows, the model's logits kept where allowed, an unconstrained row untouched."""
    import numpy as np
    from transformers import AutoTokenizer

    from trt_llm.runtime.sampling.grammar import mask_logits

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    grammars = Grammars(tokenizer, len(tokenizer), [tokenizer.convert_tokens_to_ids("<|im_end|>")])
    constraints = [grammars.guided("choice", CHOICES), None, grammars.guided("regex", REGEX),
                   grammars.guided("json_schema", SCHEMA)]
    constraints[2].accept(tokenizer.encode("Mon", add_special_tokens=False)[0])  # rows in different states
    logits = np.random.default_rng(0).standard_normal((4, len(tokenizer))).astype(np.float32)
    masked = mask_logits(logits, constraints)
    for row, constraint in enumerate(constraints):
        allowed = constraint.allowed() if constraint else np.ones(len(tokenizer), bool)
        assert (np.isfinite(masked[row]) == allowed).all() and (masked[row][allowed] == logits[row][allowed]).all()
    assert 0 < np.isfinite(masked[0]).sum() < 20 and np.isfinite(logits).all()  # the caller's logits unchanged


def _guided(text: str, mode: dict, **extra) -> dict:
    return chat_request(text, guided_decoding=mode, **extra)


def test_every_mode_conforms_in_the_input_file_and_a_bad_pattern_fails_alone(smollm2_engine, tmp_path):
    data = {"batch_size": 4, "temperature": 0.0, "max_generate_length": 96,
            "guided_decoding": {"choice": CHOICES},  # the default: the requests without their own
            "requests": [
                _guided("When is the meeting?", {"regex": REGEX}),
                chat_request("What is your favourite colour?"),  # the default's choice
                _guided("Describe a person as JSON.", {"json_schema": SCHEMA}),
                _guided("Reply with a JSON object with two keys, name and age, for a cat.", {"json_object": True}),
                _guided("Write a sum of digits.", {"ebnf": LARK}),
                _guided("Is the sky green?", {"grammar": GBNF}),
                _guided("Hello", {"regex": "[a-"}),  # does not compile: this request fails alone
                chat_request("Say hello.", guided_decoding=None),  # no constraint at all
            ]}
    (tmp_path / "in.json").write_text(json.dumps(data))
    status = run_main([str(tmp_path / "in.json"), "--engine-dir", str(smollm2_engine), "-o",
                       str(tmp_path / "out.json"), "--threads", "1"])
    assert status == 1  # a request failed
    responses = json.loads((tmp_path / "out.json").read_text())["responses"]
    out = [r["output_text"] for r in responses]
    assert re.fullmatch(REGEX, out[0]), out[0]
    assert out[1] in CHOICES
    jsonschema.validate(json.loads(out[2]), SCHEMA)
    assert isinstance(json.loads(out[3]), dict)
    assert is_sum(out[4]), out[4]
    assert out[5] in ("yes", "no", "maybe")
    bad = responses[6]
    assert bad["finish_reason"] == "error" and bad["error"].startswith("requests[6].guided_decoding.regex: does not compile")
    assert "unclosed character class" in bad["error"] and "\n" not in bad["error"]
    assert out[7] not in CHOICES  # free text (the default is not applied)
    for r in responses[:6]:
        assert r["finish_reason"] == "end-of-sequence", r


def test_a_default_that_does_not_compile_fails_the_requests_that_use_it(tiny_model, build_engine_for):
    from helpers import run_input

    engine = build_engine_for(tiny_model("qwen3"))
    loaded_data = {"temperature": 0.0, "max_generate_length": 4, "guided_decoding": {"ebnf": "start: nowhere"},
                   "requests": [chat_request("Hi"), _guided("Hi", {"choice": ["ok"]})]}
    responses = run_input(engine, loaded_data).responses
    assert responses[0].error.startswith("requests[0].guided_decoding.ebnf: does not compile")
    assert responses[0].error.endswith("(the top-level guided_decoding)") and "nowhere" in responses[0].error
    assert responses[1].output_text == "ok" and responses[1].finish_reason == "end-of-sequence"


# --- the server: the same modes, with the official client ---------------------------------------

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")


@pytest.fixture(scope="module")
def smollm2_server(smollm2_engine):
    from test_server import LiveServer
    from trt_llm.runtime.engine_dir import EngineDir
    from trt_llm.runtime.requests.runner import Runner
    from trt_llm.server.app import ServerConfig, create_app

    runner = Runner(EngineDir.open(smollm2_engine), threads=1, scheduling="continuous")
    live = LiveServer(create_app(runner, ServerConfig(model_name="smollm2", max_rows=4)))
    yield live
    live.close()


def test_every_mode_conforms_in_the_server(smollm2_server):
    client = openai.OpenAI(base_url=f"{smollm2_server.url}/v1", api_key="none", max_retries=0)

    def ask(text, **kwargs):
        return client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": text}],
                                              temperature=0, max_tokens=96, **kwargs).choices[0]

    schema = ask("Describe a person as JSON.", response_format={
        "type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}})
    jsonschema.validate(json.loads(schema.message.content), SCHEMA)
    assert schema.finish_reason == "stop"
    assert isinstance(json.loads(ask("Reply with a JSON object with two keys, name and age, for a cat.",
                                     response_format={"type": "json_object"})
                                 .message.content), dict)
    assert re.fullmatch(REGEX, ask("When is the meeting?", extra_body={"guided_decoding": {"regex": REGEX}})
                        .message.content)
    assert ask("Your favourite colour?", extra_body={"guided_decoding": {"choice": CHOICES}}).message.content in CHOICES
    assert is_sum(ask("Write a sum.", extra_body={"guided_decoding": {"ebnf": LARK}}).message.content)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Write a sum."}], temperature=0, max_tokens=48,
        stream=True, extra_body={"guided_decoding": {"ebnf": LARK}}) if chunk.choices)
    assert is_sum(streamed)
    completion = client.completions.create(model="smollm2", prompt="The colour of grass is", temperature=0,
                                           max_tokens=8, extra_body={"guided_decoding": {"grammar": GBNF}})
    assert completion.choices[0].text in ("yes", "no", "maybe")


def test_the_server_refuses_what_cannot_be_enforced_naming_the_field(smollm2_server):
    client = openai.OpenAI(base_url=f"{smollm2_server.url}/v1", api_key="none", max_retries=0)
    messages = [{"role": "user", "content": "hi"}]
    cases = [({"guided_decoding": {"regex": "(unclosed"}}, "guided_decoding", "guided_decoding.regex: does not compile"),
             ({"guided_decoding": {"regex": "a", "choice": ["b"]}}, "guided_decoding", "exactly one"),
             ({"guided_decoding": {"regex": "a"}, "response_format": {"type": "json_object"}}, "guided_decoding",
              "not with response_format")]
    for extra, param, words in cases:
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model="smollm2", messages=messages, max_tokens=4, extra_body=extra)
        assert refused.value.body["param"].startswith(param) and words in refused.value.body["message"], extra
