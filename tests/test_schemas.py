"""The file-format models: committed JSON Schemas, defaults, build-config errors, output file."""

import json

import jsonschema
import pytest

from trt_llm.schemas import (BuildConfig, ConfigError, InputSettings, LogprobCandidate, OutputFile,
                             Response, load_build_config)
from trt_llm.schemas import generate

# --- generated JSON Schemas ----------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(generate.SCHEMAS))
def test_committed_schema_matches_models(name):
    committed = (generate.JSON_DIR / name).read_text(encoding="utf-8")
    fresh = generate.expected_files()[name]
    assert committed == fresh, f"{name} drifted; run python -m trt_llm.schemas.generate"


def test_generate_check_reports_drift(tmp_path, capsys):
    assert generate.main(["--dir", str(tmp_path)]) == 0
    assert generate.main(["--check", "--dir", str(tmp_path)]) == 0
    (tmp_path / "input_file.schema.json").write_text("{}\n")
    assert generate.main(["--check", "--dir", str(tmp_path)]) == 1
    assert "input_file.schema.json" in capsys.readouterr().err


def test_schema_output_is_deterministic():
    assert generate.expected_files() == generate.expected_files()
    for text in generate.expected_files().values():
        assert text.endswith("}\n")
        assert json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) + "\n" == text


def test_input_schema_carries_limits():
    schema = json.loads((generate.JSON_DIR / "input_file.schema.json").read_text())
    props = schema["properties"]
    assert (props["batch_size"]["minimum"], props["batch_size"]["maximum"]) == (1, 16)
    assert props["top_p"]["exclusiveMinimum"] == 0 and props["top_p"]["maximum"] == 1
    req = schema["$defs"]["Request"]["properties"]
    assert (req["messages"]["minItems"], req["messages"]["maxItems"]) == (1, 64)
    bias = req["logit_bias"]["anyOf"][0]
    assert bias["maxProperties"] == 1024 and bias["additionalProperties"] is False


# --- defaults -------------------------------------------------------------------------------------

def test_input_defaults_match_spec():
    s = InputSettings()
    assert (s.batch_size, s.temperature, s.top_p, s.top_k, s.max_generate_length) == (1, 1.0, 0.8, 50, 256)
    assert (s.apply_chat_template, s.add_generation_prompt, s.enable_thinking) == (True, True, False)
    assert (s.num_logprobs, s.available_lora_weights, s.logit_bias, s.seed) == (0, {}, None, None)


def test_build_defaults_match_spec():
    c = BuildConfig(model="m", output_dir="o")
    assert (c.backend, c.dtype, c.trust_remote_code) == ("cpu", "fp32", False)
    assert (c.max_batch_size, c.max_input_len, c.max_kv_cache_capacity) == (4, 1024, 4096)


# --- build config -----------------------------------------------------------------------------------

def _write(tmp_path, text, name="config.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_build_config_resolves_paths_against_config_folder(tmp_path, monkeypatch):
    (tmp_path / "ckpt").mkdir()
    monkeypatch.chdir("/")
    c = load_build_config(_write(tmp_path, "model: ckpt\noutput_dir: engines/x\ndtype: fp16\n"))
    assert c.model == str(tmp_path / "ckpt")
    assert c.output_dir == str(tmp_path / "engines/x")
    assert c.dtype == "fp16"


def test_build_config_keeps_hub_id(tmp_path):
    c = load_build_config(_write(tmp_path, "model: HuggingFaceTB/SmolLM2-135M\noutput_dir: /abs/out\n"))
    assert c.model == "HuggingFaceTB/SmolLM2-135M"
    assert c.output_dir == "/abs/out"


@pytest.mark.parametrize("yaml_text, expected", [
    ("backend: cuda", "backend: 'cuda' is not allowed; choose one of cpu, tensorrt, tensorrt-rtx"),
    ("dtype: int8", "dtype: 'int8' is not allowed; choose one of fp32, fp16, bf16"),
    ("max_batch: 8", "unknown key 'max_batch' (did you mean 'max_batch_size'?): allowed keys are audio, backend, draft, dtype,"),
    ("max_batch_size: 65", "max_batch_size: 65 is outside [1, 64]"),
    ("max_input_len: 0", "max_input_len: 0 is less than the minimum 1"),
    ("max_input_len: 2048\nmax_kv_cache_capacity: 1024",
     "max_kv_cache_capacity: 1024 is smaller than max_input_len (2048)"),
    ("max_batch_size: four", "max_batch_size: expected an integer, got 'four'"),
])
def test_build_config_errors_name_key_and_limit(tmp_path, yaml_text, expected):
    p = _write(tmp_path, "model: m\noutput_dir: o\n" + yaml_text + "\n")
    with pytest.raises(ConfigError) as e:
        load_build_config(p)
    assert str(p) in str(e.value)
    assert expected in str(e.value)


def test_build_config_reports_every_bad_key(tmp_path):
    p = _write(tmp_path, "output_dir: o\nbackend: cuda\nfoo: 1\n")
    msg = str(pytest.raises(ConfigError, load_build_config, p).value)
    assert "model: required field missing" in msg and "backend:" in msg and "unknown key 'foo'" in msg


@pytest.mark.parametrize("text, expected", [
    (None, "cannot read file"),
    ("model: [unclosed\n", "not valid YAML"),
    ("", "empty"),
    ("- a\n- b\n", "expected a mapping"),
])
def test_build_config_whole_file_errors(tmp_path, text, expected):
    p = tmp_path / "config.yaml"
    if text is not None:
        p.write_text(text)
    msg = str(pytest.raises(ConfigError, load_build_config, p).value)
    assert str(p) in msg and expected in msg


# --- output file ------------------------------------------------------------------------------------

def _output():
    cand = LogprobCandidate(token_id=3681, token=" Paris", bytes=list(b" Paris"), logprob=-0.041)
    return OutputFile(input_file="in.json", responses=[
        Response(request_idx=0, batch_idx=0, output_text="Paris é", finish_reason="stop-words",
                 logprobs=[[cand]], messages=[{"role": "user", "content": "x", "extra": None}],
                 prompt_tokens=5, generated_tokens=1, output_token_ids=[3681], time_to_first_token_ms=1.5),
        Response(request_idx=1, batch_idx=0, output_text="", finish_reason="error", error="requests[1]: bad"),
    ])


def test_output_file_round_trips_and_validates_against_schema():
    out = _output()
    text = out.to_json()
    data = json.loads(text)
    schema = json.loads((generate.JSON_DIR / "output_file.schema.json").read_text())
    jsonschema.validate(data, schema)
    assert OutputFile.model_validate_json(text) == out


def test_output_file_omits_none_fields_but_keeps_raw_messages():
    ok, failed = json.loads(_output().to_json())["responses"]
    assert "error" not in ok and "logprobs" in ok
    assert ok["messages"] == [{"role": "user", "content": "x", "extra": None}]
    assert "logprobs" not in failed and "time_to_first_token_ms" not in failed
    assert failed["error"] == "requests[1]: bad"
    assert "é" in _output().to_json()  # UTF-8 kept readable, not \u-escaped


def test_error_response_needs_a_reason():
    with pytest.raises(ValueError, match="needs an 'error' message"):
        Response(request_idx=0, batch_idx=0, output_text="", finish_reason="error")


def test_schema_rejects_bad_output():
    schema = json.loads((generate.JSON_DIR / "output_file.schema.json").read_text())
    data = json.loads(_output().to_json())
    data["responses"][0]["finish_reason"] = "done"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, schema)


def test_input_schema_accepts_spec_example():
    # The "Basic Structure" example of the input format doc.
    example = {
        "batch_size": 1, "temperature": 1.0, "top_p": 0.8, "top_k": 50, "logit_bias": {"123": -100.0},
        "max_generate_length": 256, "num_logprobs": 0, "apply_chat_template": True, "enable_thinking": False,
        "available_lora_weights": {}, "requests": [{
            "messages": [{"role": "user", "content": "Your message here"}],
            "lora_name": "optional_lora_name", "save_system_prompt_kv_cache": False,
            "disable_spec_decode": False, "logit_bias": {"456": 5.0}, "num_logprobs": 0,
            "stop": ["optional_stop_string"]}]}
    schema = json.loads((generate.JSON_DIR / "input_file.schema.json").read_text())
    jsonschema.validate(example, schema)
