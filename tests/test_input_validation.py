"""Input-file validation: every limit of the reference, per-request isolation, whole-file errors,
unknown-key warnings, and a property test that the loader never crashes."""

import copy
import json

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trt_llm.schemas import (InputFileError, Request, RequestError, TextContent, load_input_file,
                             parse_input_dict)
from trt_llm.schemas.generate import JSON_DIR

USER = {"role": "user", "content": "hi"}


def one_request_error(request: dict, **top) -> str:
    """Validate a file with one request that must fail; return its message."""
    loaded = parse_input_dict({**top, "requests": [{"messages": [USER]}, request]}, "in.json")
    assert isinstance(loaded.requests[0], Request)
    err = loaded.requests[1]
    assert isinstance(err, RequestError), err
    assert err.index == 1 and err.message.startswith("requests[1]")
    return err.message


def whole_file_error(data) -> str:
    with pytest.raises(InputFileError) as e:
        parse_input_dict(data, "in.json")
    assert str(e.value).startswith("in.json: ")
    return str(e.value)


# --- per-request limits ----------------------------------------------------------------------------

@pytest.mark.parametrize("request_, expected", [
    # messages per request: 1..64
    ({"messages": [USER] * 65}, "requests[1].messages: 65 messages, at most 64 allowed"),
    ({"messages": []}, "requests[1].messages: empty, at least 1 required"),
    ({}, "requests[1].messages: required field missing"),
    ({"messages": "hi"}, "requests[1].messages: expected an array, got 'hi'"),
    # message fields
    ({"messages": [{"role": "robot", "content": "x"}]},
     "requests[1].messages[0].role: 'robot' is not allowed; choose one of system, user, assistant"),
    ({"messages": [{"content": "x"}]}, "requests[1].messages[0].role: required field missing"),
    ({"messages": [{"role": "user"}]}, "requests[1].messages[0].content: required field missing"),
    ({"messages": [{"role": "user", "content": 5}]},
     "requests[1].messages[0].content: expected a string or an array of content items, got 5"),
    ({"messages": ["hi"]}, "requests[1].messages[0]: expected an object, got 'hi'"),
    # content items: <= 16, type text/image/audio/video
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 17}]},
     "requests[1].messages[0].content: 17 content items, at most 16 allowed"),
    ({"messages": [{"role": "user", "content": [{"text": "a"}]}]},
     "requests[1].messages[0].content[0]: missing 'type'"),
    ({"messages": [{"role": "user", "content": [{"type": "gif", "gif": "a"}]}]},
     "requests[1].messages[0].content[0]: type 'gif' is not allowed; choose one of text, image, audio, video"),
    ({"messages": [{"role": "user", "content": [{"type": "image"}]}]},
     "requests[1].messages[0].content[0].image: required field missing"),
    ({"messages": [{"role": "user", "content": [{"type": "audio", "audio": ""}]}]},
     "requests[1].messages[0].content[0].audio: empty string not allowed"),
    ({"messages": [{"role": "user", "content": [{"type": "video", "video": "a.mp4", "fps": 0}]}]},
     "requests[1].messages[0].content[0].fps: 0 must be greater than 0.0"),
    ({"messages": [{"role": "user", "content": [{"type": "video", "video": ["a.png", ""]}]}]},
     "requests[1].messages[0].content[0].video.frames[1]: empty string not allowed"),
    # one text <= 128 KiB of UTF-8 (bytes, not characters), in both content forms
    ({"messages": [USER, {"role": "user", "content": [{"type": "text", "text": "a" * 140000}]}]},
     "requests[1].messages[1].content[0].text: 140000 bytes, at most 131072 allowed"),
    ({"messages": [{"role": "user", "content": "é" * 65537}]},
     "requests[1].messages[0].content: 131074 bytes, at most 131072 allowed"),
    # num_logprobs 0..50
    ({"messages": [USER], "num_logprobs": 51}, "requests[1].num_logprobs: 51 is outside [0, 50]"),
    ({"messages": [USER], "num_logprobs": -1}, "requests[1].num_logprobs: -1 is outside [0, 50]"),
    ({"messages": [USER], "num_logprobs": 1.0}, "requests[1].num_logprobs: expected an integer, got 1.0"),
    # logit_bias: object, <= 1024 entries, int32 token-id keys, finite values in [-100, 100]
    ({"messages": [USER], "logit_bias": {str(i): 1.0 for i in range(1025)}},
     "requests[1].logit_bias: 1025 entries, at most 1024 allowed"),
    ({"messages": [USER], "logit_bias": {"abc": 1.0}}, "requests[1].logit_bias['abc']: key is not a token id"),
    ({"messages": [USER], "logit_bias": {"-1": 1.0}}, "requests[1].logit_bias['-1']: key is not a token id"),
    ({"messages": [USER], "logit_bias": {"2147483648": 1.0}},
     "requests[1].logit_bias['2147483648']: key is not a token id (expected a decimal integer in [0, 2147483647])"),
    ({"messages": [USER], "logit_bias": {"5": 100.5}}, "requests[1].logit_bias['5']: 100.5 is outside [-100, 100]"),
    ({"messages": [USER], "logit_bias": {"5": float("inf")}},
     "requests[1].logit_bias['5']: inf is not a finite number; must be in [-100, 100]"),
    ({"messages": [USER], "logit_bias": {"5": "1"}}, "requests[1].logit_bias['5']: expected a number, got '1'"),
    ({"messages": [USER], "logit_bias": [5]}, "requests[1].logit_bias: expected an object, got an array"),
    # stop: a non-empty string or an array of them
    ({"messages": [USER], "stop": 5}, "requests[1].stop: expected a string or an array of strings, got 5"),
    ({"messages": [USER], "stop": ["###", 3]}, "requests[1].stop[1]: expected a string, got 3"),
    ({"messages": [USER], "stop": [""]}, "requests[1].stop[0]: empty string not allowed"),
    # flags and lora_name types
    ({"messages": [USER], "disable_spec_decode": 1}, "requests[1].disable_spec_decode: expected true or false, got 1"),
    ({"messages": [USER], "lora_name": 5}, "requests[1].lora_name: expected a string, got 5"),
])
def test_request_limit_messages(request_, expected):
    assert expected in one_request_error(request_)


def test_lora_name_must_be_available():
    msg = one_request_error({"messages": [USER], "lora_name": "x"},
                            available_lora_weights={"b": "/b.safetensors", "a": "/a.safetensors"})
    assert msg == "requests[1].lora_name: 'x' is not in available_lora_weights (known: a, b)"
    msg = one_request_error({"messages": [USER], "lora_name": "x"})
    assert msg.endswith("(known: none)")


def test_request_reports_all_its_errors():
    msg = one_request_error({"messages": [{"role": "robot", "content": "x"}], "num_logprobs": 99})
    assert "messages[0].role" in msg and "num_logprobs: 99" in msg


def test_request_not_an_object():
    assert one_request_error([1]) == "requests[1]: expected an object, got an array"


def test_valid_edge_values_pass():
    req = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a" * 131072}]}] * 64,
           "num_logprobs": 50, "logit_bias": {str(i): -100.0 for i in range(1023)} | {"2147483647": 100},
           "stop": "###"}
    loaded = parse_input_dict({"batch_size": 16, "top_p": 1.0, "temperature": 0, "top_k": 0,
                               "requests": [req]}, "in.json")
    assert isinstance(loaded.requests[0], Request), loaded.requests[0]
    assert loaded.settings.temperature == 0.0


# --- top-level limits (whole-file errors) ------------------------------------------------------------

@pytest.mark.parametrize("top, expected", [
    ({"batch_size": 0}, "batch_size: 0 is outside [1, 16]"),
    ({"batch_size": 17}, "batch_size: 17 is outside [1, 16]"),
    ({"max_generate_length": 0}, "max_generate_length: 0 is less than the minimum 1"),
    ({"temperature": -0.5}, "temperature: -0.5 is less than the minimum 0"),
    ({"temperature": "0.7"}, "temperature: expected a number, got '0.7'"),
    ({"top_p": 0}, "top_p: 0 is outside (0, 1]"),
    ({"top_p": 1.5}, "top_p: 1.5 is outside (0, 1]"),
    ({"top_k": -1}, "top_k: -1 is less than the minimum 0"),
    ({"num_logprobs": 51}, "num_logprobs: 51 is outside [0, 50]"),
    ({"logit_bias": {"x": 1}}, "logit_bias['x']: key is not a token id"),
    ({"logit_bias": {"1": -101}}, "logit_bias['1']: -101 is outside [-100, 100]"),
    ({"available_lora_weights": []}, "available_lora_weights: expected an object, got an array"),
    ({"apply_chat_template": "yes"}, "apply_chat_template: expected true or false, got 'yes'"),
])
def test_top_level_limit_messages(top, expected):
    assert expected in whole_file_error({**top, "requests": [{"messages": [USER]}]})


@pytest.mark.parametrize("data, expected", [
    ([], "the top level must be a JSON object, got an array"),
    ({}, "no 'requests' array"),
    ({"requests": {}}, "'requests' must be an array, got an object"),
    ({"requests": []}, "'requests' is empty"),
])
def test_whole_file_shape_errors(data, expected):
    assert expected in whole_file_error(data)


def test_load_errors_name_the_file(tmp_path):
    missing = tmp_path / "missing.json"
    assert "cannot read file" in str(pytest.raises(InputFileError, load_input_file, missing).value)
    bad = tmp_path / "bad.json"
    bad.write_text('{"requests": [\n  {"messages": ]\n}')
    msg = str(pytest.raises(InputFileError, load_input_file, bad).value)
    assert msg.startswith(str(bad)) and "not valid JSON" in msg and "line 2 column" in msg
    nan = tmp_path / "nan.json"
    nan.write_text('{"temperature": NaN, "requests": [{"messages": []}]}')
    assert "NaN is not a JSON number" in str(pytest.raises(InputFileError, load_input_file, nan).value)
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"requests": [{"messages": [{"role": "user", "content": "caf\xe9"}]}]}')
    assert "not UTF-8" in str(pytest.raises(InputFileError, load_input_file, latin).value)


# --- mixing good and bad requests -------------------------------------------------------------------

def test_bad_requests_do_not_fail_good_ones(tmp_path):
    requests = [
        {"messages": [USER]},
        {"messages": [{"role": "robot", "content": "x"}]},
        {"messages": [{"role": "system", "content": "s"}, USER], "stop": "###", "num_logprobs": 3},
        {"messages": [USER], "num_logprobs": 51},
        {"messages": [{"role": "user", "content": [{"type": "image", "image": "a.png"},
                                                   {"type": "text", "text": "what?"}]}]},
    ]
    path = tmp_path / "in.json"
    path.write_text(json.dumps({"num_logprobs": 2, "logit_bias": {"7": 1.5}, "requests": requests}))
    loaded = load_input_file(path)
    kinds = [type(r).__name__ for r in loaded.requests]
    assert kinds == ["Request", "RequestError", "Request", "RequestError", "Request"]
    assert [e.index for e in loaded.errors] == [1, 3]
    assert loaded.errors[0].raw_messages() == requests[1]["messages"]  # for echoing into the output
    assert loaded.raw_requests == requests

    first, _, second, _, fifth = loaded.requests
    assert first.resolved_num_logprobs(loaded.settings) == 2
    assert second.resolved_num_logprobs(loaded.settings) == 3
    assert first.resolved_logit_bias(loaded.settings) == {7: 1.5}
    assert second.stop_list() == ["###"] and first.stop_list() == []
    assert fifth.messages[0].parts()[1].text == "what?"
    assert first.messages[0].parts() == [TextContent(type="text", text="hi")]


def test_request_logit_bias_overrides_top_level():
    loaded = parse_input_dict({"logit_bias": {"1": 1}, "requests": [
        {"messages": [USER], "logit_bias": {"2": -2}}, {"messages": [USER], "logit_bias": {}}]})
    a, b = loaded.requests
    assert a.resolved_logit_bias(loaded.settings) == {2: -2.0}
    assert b.resolved_logit_bias(loaded.settings) == {}  # an explicit empty map disables the default


# --- unknown-key warnings ---------------------------------------------------------------------------

def test_unknown_keys_are_warnings_at_every_level():
    loaded = parse_input_dict({
        "temprature": 0.5,
        "requests": [
            {"messages": [USER]},
            {"messages": [{"role": "user", "content": [{"type": "image", "image": "a.png", "detail": "hi"}],
                           "name": "bob"}],
             "temperature": 0.2, "bogus": 1},
            {"messages": [{"role": "robot", "content": "x", "nmae": 1}]},  # warns even when invalid
        ]}, "in.json")
    assert loaded.warnings == [
        "top level: unknown key 'temprature' ignored (did you mean 'temperature'?)",
        "requests[1]: unknown key 'temperature' ignored ('temperature' is a top-level setting)",
        "requests[1]: unknown key 'bogus' ignored",
        "requests[1].messages[0]: unknown key 'name' ignored",
        "requests[1].messages[0].content[0]: unknown key 'detail' ignored",
        "requests[2].messages[0]: unknown key 'nmae' ignored",
    ]
    assert isinstance(loaded.requests[1], Request)


# --- the loader never crashes ----------------------------------------------------------------------

VALID = {
    "batch_size": 2, "num_logprobs": 1, "logit_bias": {"1": 0.5}, "available_lora_weights": {"a": "/a"},
    "requests": [
        {"messages": [{"role": "system", "content": "s"}, USER], "lora_name": "a", "stop": ["x"]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "t"},
                                                   {"type": "image", "image": "i.png"}]}],
         "logit_bias": {"2": -1}, "num_logprobs": 3},
    ],
}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)
# Keys the models know, so random data often reaches the interesting validators.
KEYS = ["requests", "messages", "role", "content", "type", "text", "image", "logit_bias", "stop",
        "num_logprobs", "lora_name", "batch_size", "top_p", "user", "0", "-1"]
any_key = st.sampled_from(KEYS) | st.text(max_size=5)


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


@st.composite
def mutated_valid_files(draw):
    data = copy.deepcopy(VALID)
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(data) if p]
        path = draw(st.sampled_from(paths))
        parent = data
        for part in path[:-1]:
            parent = parent[part]
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(json_values)
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(any_key)] = draw(json_values)
        else:
            parent.append(draw(json_values))
    return data


SCHEMA = jsonschema.Draft202012Validator(json.loads((JSON_DIR / "input_file.schema.json").read_text()))


def _check_loader(data):
    try:
        loaded = parse_input_dict(data, "fuzz.json")
    except InputFileError:
        return
    assert len(loaded.requests) == len(data["requests"])
    for i, slot in enumerate(loaded.requests):
        assert isinstance(slot, (Request, RequestError))
        if isinstance(slot, RequestError):
            assert slot.index == i and slot.message.startswith(f"requests[{i}]")
    assert all(isinstance(w, str) for w in loaded.warnings)
    if not loaded.errors:
        # The published schema is never stricter than the loader (it may be looser: UTF-8 bytes,
        # lora names and video support are beyond JSON Schema).
        SCHEMA.validate(data)


# 2 x 150 examples: data generation, not the loader, is what takes time (~10 ms an example).
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(json_values | st.dictionaries(st.sampled_from(KEYS), json_values, max_size=5))
def test_arbitrary_json_never_crashes(data):
    _check_loader(data)


@FUZZ
@given(mutated_valid_files())
def test_mutated_valid_file_never_crashes(data):
    _check_loader(data)
