"""Structured output (response_format, runtime/sampling/grammar.py): every answer validates against its
schema (checked with `jsonschema`, an independent validator), a keyword the grammar cannot enforce
fails its request alone and names it, and speculation gives the constrained tokens of vanilla."""

import json

import jsonschema
import pytest

from helpers import PROMPTS, chat_request
from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.requests.runner import Runner
from trt_llm.schemas.input_file import parse_input_dict

pytest.importorskip("llguidance")

# Twenty schemas: nested objects, enums, arrays, integers and numbers with bounds, optional keys.
NAME = {"type": "string", "minLength": 1, "maxLength": 24}
SCHEMAS = [
    {"type": "object", "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"],
     "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 9}, "minItems": 2, "maxItems": 4},
    {"type": "object", "properties": {"city": NAME, "country": NAME}, "required": ["city", "country"],
     "additionalProperties": False},
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False},
    {"type": "object", "properties": {"score": {"type": "number", "minimum": 0, "maximum": 1}}, "required": ["score"],
     "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
     "required": ["tags"], "additionalProperties": False},
    {"type": "object", "properties": {"person": {"type": "object", "properties": {"first": NAME, "last": NAME},
                                                 "required": ["first", "last"], "additionalProperties": False}},
     "required": ["person"], "additionalProperties": False},
    {"enum": ["yes", "no", "maybe"]},
    {"type": "object", "properties": {"year": {"type": "integer", "minimum": 1900, "maximum": 2100},
                                      "month": {"type": "integer", "minimum": 1, "maximum": 12}},
     "required": ["year", "month"], "additionalProperties": False},
    {"type": "object", "properties": {"title": NAME, "pages": {"type": "integer", "minimum": 1, "maximum": 999},
                                      "genre": {"enum": ["novel", "poem", "essay"]}},
     "required": ["title", "pages", "genre"], "additionalProperties": False},
    {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}},
                                "required": ["x"], "additionalProperties": False}, "minItems": 1, "maxItems": 3},
    {"type": "object", "properties": {"temperature": {"type": "number", "minimum": -50, "maximum": 60},
                                      "unit": {"enum": ["C", "F"]}},
     "required": ["temperature", "unit"], "additionalProperties": False},
    {"type": "object", "properties": {"answer": NAME, "confidence": {"enum": ["low", "medium", "high"]}},
     "required": ["answer", "confidence"], "additionalProperties": False},
    {"type": "integer", "minimum": 10, "maximum": 99},
    {"type": "object", "properties": {"items": {"type": "array", "items": NAME, "minItems": 1, "maxItems": 3}},
     "required": ["items"], "additionalProperties": False},
    {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "object", "properties": {
        "c": {"type": "integer", "minimum": 0, "maximum": 5}}, "required": ["c"], "additionalProperties": False}},
        "required": ["b"], "additionalProperties": False}}, "required": ["a"], "additionalProperties": False},
    {"type": "object", "properties": {"name": NAME, "nickname": NAME}, "required": ["name"],
     "additionalProperties": False},
    {"type": "object", "properties": {"value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9},
                                                          {"enum": ["none"]}]}},
     "required": ["value"], "additionalProperties": False},
    {"type": "object", "properties": {"lat": {"type": "number", "minimum": -90, "maximum": 90},
                                      "lon": {"type": "number", "minimum": -180, "maximum": 180}},
     "required": ["lat", "lon"], "additionalProperties": False},
]
QUESTIONS = ["Describe a person.", "Pick a color.", "Give some digits.", "Name a place.", "Is water wet?",
             "Rate this answer.", "Tag this text.", "Name a person.", "Will it rain?", "When were you made?",
             "Describe a book.", "List points.", "What is the weather?", "What is 2+2?", "Pick a number.",
             "List fruits.", "Nest something.", "What is your name?", "Give a value.", "Where is Paris?"]


def schema_request(question, schema, **extra):
    return chat_request(f"Answer in JSON. {question}",
                        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
                        **extra)


def run(engine, data, **runner_options):
    loaded = parse_input_dict(json.loads(json.dumps(data)))
    assert not loaded.errors, loaded.errors
    return Runner(EngineDir.open(engine), threads=1, **runner_options).run(loaded, loaded.settings).responses


def test_twenty_schemas_on_smollm2_all_validate(smollm2_engine):
    any_object = chat_request("Reply with a JSON object with two keys, name and age, for a cat.",
                              response_format={"type": "json_object"})
    data = {"batch_size": 4, "temperature": 0.0, "max_generate_length": 96,
            "requests": [schema_request(q, s) for q, s in zip(QUESTIONS, SCHEMAS)] + [any_object]}
    responses = run(smollm2_engine, data)
    for response, schema in zip(responses, SCHEMAS + [{"type": "object"}]):
        assert response.finish_reason == "end-of-sequence", (response.finish_reason, response.output_text)
        jsonschema.validate(json.loads(response.output_text), schema)


def test_a_random_model_writes_valid_json_beside_a_free_request(tiny_model, build_engine_for):
    """A random tiny model, sampled, still writes documents its schema validates; a batch-mate
    without response_format samples exactly what it samples alone."""
    engine = build_engine_for(tiny_model("qwen3"))
    schema = {"type": "object", "properties": {"k": {"enum": ["x", "y"]}, "n": {"type": "integer", "minimum": 0,
                                                                              "maximum": 9}},
              "required": ["k", "n"], "additionalProperties": False}
    data = {"batch_size": 3, "temperature": 0.8, "seed": 3, "max_generate_length": 64,
            "requests": [chat_request(PROMPTS[0]), schema_request("Go.", schema), schema_request("Again.", schema)]}
    constrained, free = run(engine, data), run(engine, {**data, "requests": [chat_request(PROMPTS[0])]})
    for response in constrained[1:]:
        assert response.finish_reason == "end-of-sequence", response.output_text
        jsonschema.validate(json.loads(response.output_text), schema)
    assert constrained[0].output_token_ids == free[0].output_token_ids  # its neighbours change nothing for it


def test_a_keyword_the_grammar_cannot_enforce_fails_that_request_alone(tiny_model, build_engine_for):
    engine = build_engine_for(tiny_model("qwen3"))
    unsupported = {"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}
    data = {"batch_size": 2, "temperature": 0.0, "max_generate_length": 8,
            "requests": [schema_request("Go.", unsupported), chat_request(PROMPTS[1])]}
    bad, good = run(engine, data)
    assert bad.finish_reason == "error" and "requests[0].response_format.json_schema.schema" in bad.error
    assert "if" in bad.error and "then" in bad.error
    assert good.finish_reason != "error"


def test_speculation_gives_the_constrained_tokens_of_vanilla(tiny_model, build_engine_for, tmp_path):
    from assets import make_random_draft

    base = tiny_model("llama", num_hidden_layers=4)
    draft = make_random_draft(base, tmp_path / "draft")
    engine = build_engine_for(base, draft={"model": str(draft), "max_draft_tree_size": 24, "max_verify_tree_size": 16})
    schema = SCHEMAS[10]
    data = {"batch_size": 2, "temperature": 0.7, "seed": 5, "max_generate_length": 80,
            "requests": [schema_request("Go.", schema), schema_request("Book.", schema, num_logprobs=2)]}
    from trt_llm.runtime.decoding.spec_config import SpecConfig

    spec = run(engine, data, spec=SpecConfig(4, 3, 10))
    vanilla = run(engine, data, spec_decode=False)
    for s, v in zip(spec, vanilla):
        assert s.output_token_ids == v.output_token_ids and s.finish_reason == v.finish_reason
        assert s.finish_reason == "end-of-sequence", s.output_text
        jsonschema.validate(json.loads(s.output_text), schema)
