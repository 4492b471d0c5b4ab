"""The TensorRT backends as far as this machine reaches: TensorRT-RTX parses our graph (the attention
op's function body inlined) and builds a plan ahead of time without a GPU; a missing TensorRT is a
one-line error; an engine that needs a GPU is refused clearly where there is none."""

import importlib.util
import json

import pytest

from trt_llm.build.cli import main as build_main
from trt_llm.runtime.trt_import import cuda_device_count

HAS_RTX = importlib.util.find_spec("tensorrt_rtx") is not None
needs_rtx = pytest.mark.skipif(not HAS_RTX, reason="TensorRT-RTX is not installed "
                               "(pip install 'trt-llm[tensorrt-rtx]')")


def _tensorrt_importable() -> bool:
    try:
        import tensorrt  # noqa: F401
    except Exception:  # noqa: BLE001 - the PyPI stub raises on import without NVIDIA's libraries
        return False
    return True


@pytest.fixture(scope="module")
def rtx_engine(tiny_model, build_engine_for):
    return build_engine_for(tiny_model("qwen3"), backend="tensorrt-rtx", max_batch_size=2,
                            max_input_len=64, max_kv_cache_capacity=128)


@needs_rtx
def test_rtx_build_writes_a_plan_and_names_the_backend(rtx_engine):
    import tensorrt_rtx as trt

    manifest = json.loads((rtx_engine / "manifest.json").read_text())
    assert manifest["backend"] == "tensorrt-rtx"
    llm = manifest["components"]["llm"]
    assert llm["engine"] == "llm/model.plan" and llm["tensorrt_version"] == trt.__version__
    plan = rtx_engine / "llm" / "model.plan"
    assert plan.is_file() and plan.stat().st_size > 100_000  # the tiny model's weights are inside
    assert not (rtx_engine / "llm" / "model.cpu.onnx").exists()


@needs_rtx
def test_smollm2_builds_for_tensorrt_rtx_without_a_gpu(smollm2_dir, build_engine_for):
    """The real model, not only the tiny one: 30 layers of our op's function body, inlined by the
    parser, in a plan built ahead of time for the default architecture."""
    import tensorrt_rtx as trt

    engine = build_engine_for(smollm2_dir, backend="tensorrt-rtx", max_batch_size=2, max_input_len=256,
                              max_kv_cache_capacity=512)
    manifest = json.loads((engine / "manifest.json").read_text())
    assert manifest["backend"] == "tensorrt-rtx" and manifest["model"]["dims"]["num_layers"] == 30
    assert manifest["components"]["llm"]["tensorrt_version"] == trt.__version__
    plan = engine / "llm" / "model.plan"
    # fp32 weights are ~540 MB; the plan holds them all (no weight streaming, no refit-stripping).
    assert plan.stat().st_size > 500e6


@needs_rtx
def test_rtx_network_io_follows_the_graph_contract(rtx_engine):
    from trt_llm.build.tensorrt_backend import describe_network

    tensors = describe_network(rtx_engine / "llm" / "model.onnx", rtx=True)
    assert tensors["inputs_embeds"] == ((-1, -1, 64), "FLOAT", True)
    assert tensors["position_ids"][:2] == ((-1, -1), "INT32")
    assert tensors["past_lengths"][:2] == ((-1,), "INT32")
    assert tensors["logits"][2] is False and tensors["logits"][1] == "FLOAT"
    for i in range(2):
        for kind in ("key", "value"):
            past, present = tensors[f"past_{kind}_{i}"], tensors[f"present_{kind}_{i}"]
            assert past[0] == present[0] and past[0][0] == -1 and past[0][2] == -1


@needs_rtx
def test_rtx_profiles_cover_prefill_and_decode(rtx_engine):
    from trt_llm.build.tensorrt_backend import DECODE_MAX_SEQ, profile_shapes
    from trt_llm.schemas.build_config import BuildConfig

    config = BuildConfig(**json.loads((rtx_engine / "manifest.json").read_text())["build_config"])
    prefill, decode = profile_shapes(config)
    assert prefill["seq"] == (1, 64, 64) and prefill["batch"] == (1, 2, 2)
    assert decode["seq"][2] == DECODE_MAX_SEQ and decode["capacity"] == (1, 128, 128)
    if cuda_device_count()[0] == 0:
        pytest.skip("deserializing a plan needs a GPU")
    import tensorrt_rtx as trt

    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine((rtx_engine / "llm" / "model.plan").read_bytes())
    assert engine.num_optimization_profiles == 2
    assert tuple(engine.get_tensor_profile_shape("inputs_embeds", 1)[2]) == (2, DECODE_MAX_SEQ, 64)


@needs_rtx
def test_rtx_engine_without_a_gpu_is_refused_clearly(rtx_engine):
    from trt_llm.runtime.engine_dir import EngineDir, EngineDirError

    if cuda_device_count()[0] > 0:
        pytest.skip("this machine has a GPU")
    with pytest.raises(EngineDirError, match="backend 'tensorrt-rtx' cannot run here: .*NVIDIA GPU"):
        EngineDir.open(rtx_engine)


@needs_rtx
@pytest.mark.parametrize("weights,weight_type", [("int4", "INT4"), ("int8", "INT8"), ("fp8", "FLOAT8E4M3FN")])
def test_quantized_plans_build_ahead_of_time(tiny_model, build_engine_for, weights, weight_type):
    """int4 / int8 / fp8 weights (quantization:) in an fp16 plan for Ada (SM89, the first with fp8)
    without a GPU: each matmul's weight is a constant dequantize TensorRT parses as weight-only
    quantization, int4 in blocks along K, int8 and fp8 per output channel."""
    import onnx

    engine = build_engine_for(tiny_model("qwen3"), backend="tensorrt-rtx", dtype="fp16", max_batch_size=2,
                              max_input_len=64, max_kv_cache_capacity=128, quantization=weights,
                              rtx_compute_capability="SM89")
    manifest = json.loads((engine / "manifest.json").read_text())
    assert manifest["model"]["quantization"]["weights"] == weights
    assert (engine / "llm" / "model.plan").stat().st_size > 100_000
    parsed = onnx.load(engine / "llm" / "model.trt.onnx", load_external_data=False)
    types = {t.name: onnx.TensorProto.DataType.Name(t.data_type) for t in parsed.graph.initializer}
    dequantized = [n for n in parsed.graph.node if n.op_type == "DequantizeLinear"]
    assert len(dequantized) == 2 * 4 + 1  # per layer qkv, o, gate_up, down; the LM head
    for node in dequantized:
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert types[node.input[0]] == weight_type
        assert attributes == ({"axis": 0, "block_size": 128} if weights == "int4" else {"axis": 1})  # K = 64: one block


@needs_rtx
def test_unknown_compute_capability_lists_the_choices():
    import tensorrt_rtx as trt

    from trt_llm.build.tensorrt_backend import TensorRTBuildError, compute_capability

    assert compute_capability(trt, "sm86") == trt.ComputeCapability.SM86
    with pytest.raises(TensorRTBuildError, match="rtx_compute_capability: 'SM90' .* SM80, SM86"):
        compute_capability(trt, "SM90")


@pytest.mark.skipif(_tensorrt_importable(), reason="TensorRT is installed here")
def test_tensorrt_missing_is_one_line_naming_the_install(tmp_path, tiny_model, capsys):
    out = tmp_path / "engine"
    config = tmp_path / "config.yaml"
    config.write_text(f"model: {tiny_model('qwen3')}\noutput_dir: {out}\nbackend: tensorrt\n")
    assert build_main([str(config), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "pip install 'trt-llm[tensorrt]'" in err and err.startswith("trt-llm-build: error: backend 'tensorrt'")
    assert not out.exists() and not list(tmp_path.glob(".engine.building-*"))  # no staging folder left


@needs_rtx
def test_a_vision_language_model_builds_its_vision_plan_ahead_of_time(npm_tokenizer, build_engine_for, tmp_path):
    """A tiny Qwen2.5-VL for tensorrt-rtx in fp16: the decoder's plan and the vision tower's (one
    profile over patches, segments and windows, the vision attention's body inlined)."""
    import vlm_assets

    folder = vlm_assets.make_tiny_vlm("qwen2_5_vl", tmp_path / "vlm", npm_tokenizer("qwen3"))
    engine = build_engine_for(folder, backend="tensorrt-rtx", dtype="fp16", max_batch_size=2, max_input_len=256,
                              max_kv_cache_capacity=512)
    vision = json.loads((engine / "manifest.json").read_text())["components"]["vision"]
    assert vision["engine"] == "vision/model.plan" and (engine / vision["engine"]).stat().st_size > 100_000
    assert (engine / vision["preprocessor"]).is_file()
