"""Cold start and memory (issue 33, items 2 and 3): the KV pool sized to the run, a quantized engine's
graph optimised at build time, the profile's startup figures. benchmarks/cold_start.py measures them."""

import json
import shutil
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from helpers import PROMPTS, chat_request
from trt_llm.runtime.app.run_cli import main as run_main
from trt_llm.runtime.backends import ort_engine
from trt_llm.runtime.backends.ort_engine import OrtEngine
from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.requests.runner import Runner
from trt_llm.schemas.input_file import parse_input_dict


def run(engine, data: dict, scheduling: str = "static"):
    """Run `data` on an engine directory, or on a Runner (its scheduling set for this run)."""
    loaded = parse_input_dict(json.loads(json.dumps(data)), source="<test>")
    assert not loaded.errors, loaded.errors
    runner = engine if isinstance(engine, Runner) else Runner(EngineDir.open(engine), threads=1)
    runner.scheduling, runner.prefill_chunk = scheduling, (64 if scheduling == "continuous" else None)
    return runner.run(loaded, loaded.settings)


@pytest.fixture(scope="module")
def smollm2(smollm2_engine):
    """One Runner for the SmolLM2 tests (each pool is made per run; the session once)."""
    return Runner(EngineDir.open(smollm2_engine), threads=2)


@pytest.fixture
def pools(monkeypatch):
    """The (rows, capacity) of every KV pool made while the test runs."""
    made = []
    real = OrtEngine.new_cache

    def recording(self, batch, capacity, widest=None):
        made.append((batch, capacity))
        return real(self, batch, capacity, widest)

    monkeypatch.setattr(OrtEngine, "new_cache", recording)
    return made


def test_a_short_request_holds_a_pool_of_its_size(smollm2, pools, monkeypatch):
    """A one-request file offered batch_size = max_batch_size rows gets a pool of one row of what the
    request can reach, not max_batch_size x max_kv_cache_capacity, under both schedulings; its
    tokens are a full pool's."""
    limits = smollm2.limits
    data = {"batch_size": limits["max_batch_size"], "temperature": 0.0, "max_generate_length": 8,
            "requests": [chat_request("What is the capital of France?")]}
    small = {s: run(smollm2, data, s).responses[0] for s in ("static", "continuous")}
    assert [rows for rows, _ in pools] == [1, 1]
    assert [capacity for _, capacity in pools] == [small["static"].prompt_tokens + 8] * 2
    assert pools[0][0] * pools[0][1] < limits["max_batch_size"] * limits["max_kv_cache_capacity"]

    real = OrtEngine.new_cache  # the pool every run held before: max_batch_size x max_kv_cache_capacity
    monkeypatch.setattr(OrtEngine, "new_cache", lambda self, batch, capacity, widest=None: real(
        self, limits["max_batch_size"], limits["max_kv_cache_capacity"], widest))
    for scheduling, response in small.items():
        assert run(smollm2, data, scheduling).responses[0].output_token_ids == response.output_token_ids
    assert small["static"].generated_tokens > 0


def test_continuous_pool_rows_are_what_the_file_can_fill(smollm2, pools):
    """Three requests offered four rows: three rows; the outputs are the static run's."""
    data = {"batch_size": 4, "temperature": 0.0, "max_generate_length": 6,
            "requests": [chat_request(p) for p in PROMPTS[:3]]}
    continuous = run(smollm2, data, "continuous")
    assert pools[0][0] == 3
    static = run(smollm2, data)
    assert [r.output_token_ids for r in continuous.responses] == [r.output_token_ids for r in static.responses]


@pytest.fixture(scope="module")
def int4_engine(tiny_model, build_engine_for):
    return build_engine_for(tiny_model("llama"), quantization={"weights": "int4", "group_size": 32})


def test_quantized_engine_is_optimised_at_build_time(int4_engine, tmp_path, monkeypatch):
    """The build writes ONNX Runtime's optimised graph (MatMulNBits already fused) and its key as the
    engine, with every weight it reads in its own file (the bundle's graphs are not in the engine); the
    runtime loads it unoptimised. A key of another ONNX Runtime or accuracy level, or OFFLINE_ENV=0,
    has it optimised again as it loads, at this runtime's accuracy level: the same tokens."""
    import onnx
    import onnxruntime as ort

    from trt_llm.runtime.backends import cpu_kernels

    # The graph on ONNX Runtime's own kernels, loaded by its path (ours, where built, swap its matmuls
    # in a copy: tests/test_cpu_kernels.py).
    monkeypatch.setenv(cpu_kernels.ENV, "0")
    engine = EngineDir.open(int4_engine).component_path("llm", "engine")
    record = engine.with_name("model.cpu.opt.json")
    assert engine.name == "model.cpu.opt.onnx" and json.loads(record.read_text()) == ort_engine.offline_key()
    assert not any((engine.parent / name).exists() for name in ("model.cpu.onnx", "model.onnx", "model.onnx.data"))
    graph = onnx.load(engine, load_external_data=False)
    ops = {n.op_type for n in graph.graph.node}
    assert "MatMulNBits" in ops and "DequantizeLinear" not in ops
    locations = {entry.value for t in graph.graph.initializer for entry in t.external_data if entry.key == "location"}
    assert locations == {engine.name + ".data"}

    opened = []  # (what each session was made from, its optimisation level)
    session = ort_engine._session
    monkeypatch.setattr(ort_engine, "_session", lambda graph, options: (
        opened.append((graph if isinstance(graph, str) else "bytes", options.graph_optimization_level)),
        session(graph, options))[1])
    layers = EngineDir.open(int4_engine).layers()
    assert OrtEngine(engine, layers, threads=1).graph_path == engine
    assert opened.pop() == (str(engine), ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    data = {"temperature": 0.0, "max_generate_length": 8, "requests": [chat_request(PROMPTS[0])]}
    tokens = run(int4_engine, data).responses[0].output_token_ids

    monkeypatch.setenv(ort_engine.OFFLINE_ENV, "0")
    assert run(int4_engine, data).responses[0].output_token_ids == tokens
    assert opened.pop() == (str(engine), ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    monkeypatch.delenv(ort_engine.OFFLINE_ENV)

    copy = tmp_path / "engine"
    shutil.copytree(int4_engine, copy)
    copy_record = copy / "llm" / record.name
    copy_record.write_text(json.dumps({**ort_engine.offline_key(), "onnxruntime": "0.0.0"}))
    assert run(copy, data).responses[0].output_token_ids == tokens
    assert opened.pop() == (str(copy / "llm" / engine.name), ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    # Made at another accuracy level: its matmuls are set to this runtime's in the graph it loads
    copy_record.write_text(json.dumps({**ort_engine.offline_key(), "matmul_accuracy_level": 1}))
    loaded = onnx.load_from_string(ort_engine._at_accuracy_level(copy / "llm" / engine.name, ort.SessionOptions()))
    levels = {a.i for n in loaded.graph.node if n.op_type == "MatMulNBits" for a in n.attribute if a.name == "accuracy_level"}
    assert levels == {ort_engine.MATMUL_ACCURACY_LEVEL}
    assert run(copy, data).responses[0].output_token_ids == tokens
    assert opened.pop()[0] == "bytes"


def test_a_float_engine_has_no_optimised_copy(smollm2_engine):
    """Its optimisation at session creation costs little (its time is prepacking): no second copy of
    its weights on disk; the lowered graph reads the bundle's weight file."""
    assert EngineDir.open(smollm2_engine).component_path("llm", "engine").name == "model.cpu.onnx"
    optimised, record = ort_engine.offline_paths(smollm2_engine / "llm" / "model.cpu.onnx")
    assert not optimised.exists() and not record.exists()


def test_session_options_from_the_environment():
    import onnxruntime as ort

    options = ort.SessionOptions()
    ort_engine.apply_env_options(options, "session.disable_prepacking=1, enable_cpu_mem_arena=0,"
                                          "graph_optimization_level=1")
    assert options.get_session_config_entry("session.disable_prepacking") == "1"
    assert options.enable_cpu_mem_arena is False
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    for bad in ("nonsense", "no_such_option=1"):
        with pytest.raises(ValueError, match=ort_engine.OPTIONS_ENV):
            ort_engine.apply_env_options(ort.SessionOptions(), bad)


def test_profile_reports_startup_and_loads(int4_engine, tmp_path):
    data = {"temperature": 0.0, "max_generate_length": 4, "requests": [chat_request(PROMPTS[0])]}
    (tmp_path / "in.json").write_text(json.dumps(data))
    profile_path = tmp_path / "profile.json"
    assert run_main([str(tmp_path / "in.json"), "--engine-dir", str(int4_engine), "-o", str(tmp_path / "out.json"),
                     "--threads", "1", "--profile-output", str(profile_path)]) == 0
    profile = json.loads(profile_path.read_text())
    jsonschema.validate(profile, json.loads((Path(__file__).parent.parent / "schemas/json/profile.schema.json")
                                            .read_text()))
    startup, stages = profile["startup"], profile["stages"]
    # In this test process the "start" is pytest's: long before the run, and before its first token.
    assert 0 < startup["before_run_ms"] < startup["to_first_token_ms"]
    loads = [stages[name]["total_ms"] for name in ("load_engine_dir", "load_embedding", "load_session",
                                                   "load_tokenizer")]
    assert all(ms > 0 for ms in loads)
    ttft = profile["time_to_first_token"]["max_ms"]
    assert startup["to_first_token_ms"] >= startup["before_run_ms"] + sum(loads) + ttft - 1
    assert profile["peak_memory_mb"] > 0
    assert np.isfinite(profile["wall_time_s"])
