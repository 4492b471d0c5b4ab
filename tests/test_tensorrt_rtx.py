"""The TensorRT backends as far as this machine reaches: TensorRT-RTX parses our graph (the attention
op's function body inlined) and builds a plan ahead of time without a GPU; a missing TensorRT is a
one-line error; an engine that needs a GPU is refused clearly where there is none."""

import importlib.util
import json

import numpy as np
import pytest
from trt_llm.build.cli import main as build_main
from trt_llm.common.trt_import import cuda_device_count

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
@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_5_vl"])
def test_a_vision_language_model_builds_its_vision_plan_ahead_of_time(family, npm_tokenizer, build_engine_for,
                                                                      tmp_path):
    """A tiny Qwen2.5-VL (and Qwen3.5 as published: its hybrid decoder and Qwen3-VL's tower) for
    tensorrt-rtx in fp16: the decoder's plan and the vision tower's (one profile over patches, segments
    and windows, the vision attention's body inlined)."""
    import vlm_assets

    folder = vlm_assets.make_tiny_vlm(family, tmp_path / "vlm", npm_tokenizer("qwen3"))
    engine = build_engine_for(folder, backend="tensorrt-rtx", dtype="fp16", max_batch_size=2, max_input_len=256,
                              max_kv_cache_capacity=512)
    vision = json.loads((engine / "manifest.json").read_text())["components"]["vision"]
    assert vision["engine"] == "vision/model.plan" and (engine / vision["engine"]).stat().st_size > 100_000
    assert (engine / vision["preprocessor"]).is_file()


# --- audio engines: Whisper (an encoder-decoder) and Qwen2-Audio (audio rows) -------------------------


def _profiles_of(engine, component: str):
    """The (min, opt, max) shapes per input of each optimization profile the compile gave a component's
    plan (what _add_profiles set), and the build config they were made from."""
    from trt_llm.build.tensorrt_backend import encoder_profiles, input_profiles
    from trt_llm.schemas.build_config import BuildConfig

    manifest = json.loads((engine / "manifest.json").read_text())
    config, entry = BuildConfig(**manifest["build_config"]), manifest["components"][component]
    profiles = encoder_profiles(entry["adapter"], config, engine / entry["config"]) if component != "llm" else None
    return input_profiles(engine / entry["graph"], config, profiles), config


def _plan_profiles_match(plan, profiles) -> None:
    """With a GPU: the plan's own profiles are those (deserializing a plan needs one)."""
    if cuda_device_count()[0] == 0:
        return
    import tensorrt_rtx as trt

    engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(plan.read_bytes())
    assert engine.num_optimization_profiles == len(profiles)
    for index, shapes in enumerate(profiles):
        for name, bounds in shapes.items():
            assert tuple(tuple(s) for s in engine.get_tensor_profile_shape(name, index)) == bounds, (index, name)


def _covers(profile, feeds) -> None:
    """The profile has a range for every input fed, and each fed shape lies within it."""
    assert set(feeds) == set(profile)
    for name, array in feeds.items():
        low, _, high = profile[name]
        shape = np.shape(array)
        assert len(shape) == len(low) and all(a <= d <= b for a, d, b in zip(low, shape, high)), (name, shape, low, high)


def _audio_feeds(engine, frames: list[int], outputs) -> tuple[list[dict], list]:
    """What the runtime's AudioEncoder feeds the audio plan for clips of `frames` valid mel frames,
    recorded by a session standing in for the plan (which needs a GPU), and the clips it makes of
    `outputs(feeds)`."""
    from trt_llm.families.adapters import adapter
    from trt_llm.runtime.media.audio.encoder import AudioEncoder, PendingClip

    settings = json.loads((engine / "audio" / "config.json").read_text())
    fed = []

    class Recorder:
        def input_dtype(self, name):
            return np.dtype(np.float16)

        def run(self, feeds):
            fed.append(feeds)
            return outputs(feeds)

    encoder = AudioEncoder.__new__(AudioEncoder)
    encoder.settings, encoder.session = settings, Recorder()
    encoder.adapter = adapter(json.loads((engine / "manifest.json").read_text())["components"]["audio"]["adapter"],
                              settings)
    features = np.zeros((settings["num_mel_bins"], settings["window_frames"]), np.float32)
    clips = encoder._run([PendingClip(f"clip{i}", "clip", features, n, n / 100) for i, n in enumerate(frames)])
    return fed, clips


@pytest.fixture(scope="module")
def whisper_rtx_engine(build_engine_for):
    """The real Whisper tiny.en (tests/whisper_assets.py) for tensorrt-rtx in fp16, ahead of time: about
    15 s to export and 15 s to compile both plans here (a random tiny Whisper would need this tokenizer
    and generation config anyway, and only the real one has the real 1,500 encoder frames)."""
    import whisper_assets
    from assets import AssetUnavailable

    try:
        folder = whisper_assets.whisper_tiny_en_dir()
    except AssetUnavailable as error:
        pytest.skip(f"whisper tiny.en unavailable: {error}")
    return build_engine_for(folder, backend="tensorrt-rtx", dtype="fp16", max_batch_size=2)


@needs_rtx
def test_whisper_builds_its_decoder_and_encoder_plans_ahead_of_time(whisper_rtx_engine):
    """Both plans, and profiles that take what the runtime feeds them: the encoder one request's clip at
    a time, the decoder its batch of rows with each row's clip encoded, whose `frames` is one number in
    both profiles, the encoder's output length (1,500)."""
    import onnx
    from trt_llm.runtime.cache.cache_set import cache_set
    from trt_llm.schemas.layer_spec import parse_layers

    engine = whisper_rtx_engine
    components = json.loads((engine / "manifest.json").read_text())["components"]
    for name in ("llm", "audio"):
        assert components[name]["engine"] == f"{name}/model.plan"
        assert (engine / components[name]["engine"]).stat().st_size > 1_000_000  # fp16 weights inside
    encoder = onnx.load(engine / components["audio"]["graph"], load_external_data=False)
    encoded = {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] for o in encoder.graph.output}
    assert encoded["cross_key_0"] == ["batch", 6, 1500, 64]

    (audio,), _ = _profiles_of(engine, "audio")
    fed, clips = _audio_feeds(engine, [3000], lambda feeds: [np.zeros((1, 6, 1500, 64), np.float16)] * len(encoded))
    _covers(audio, fed[0])
    _plan_profiles_match(engine / "audio" / "model.plan", [audio])

    profiles, config = _profiles_of(engine, "llm")
    assert config.max_kv_cache_capacity == 448 and config.max_batch_size == 2  # cut to the decoder's positions
    layers = parse_layers(json.loads((engine / "manifest.json").read_text())["model"]["layers"])
    cache = cache_set(layers, config.max_batch_size, 448, np.float16)
    for row in range(config.max_batch_size):
        cache.write_row(row, clips[0].cross)  # what prefill writes, then binds at every step
    prefill, decode = profiles
    for batch in (1, config.max_batch_size):
        cache.batch = batch
        for shapes in profiles:
            _covers({name: bounds for name, bounds in shapes.items() if name.startswith("cross_")},
                    {name: array for name, output, array in cache.tensors() if output is None})
            assert shapes["cross_key_3"][0][2] == shapes["cross_key_3"][2][2] == 1500
    assert prefill["inputs_embeds"][2] == (2, config.max_input_len, 384) and decode["inputs_embeds"][0] == (1, 1, 384)
    assert decode["past_key_0"][2] == (2, 6, 448, 64)
    _plan_profiles_match(engine / "llm" / "model.plan", profiles)


@needs_rtx
def test_qwen2_audio_builds_its_audio_plan_ahead_of_time(npm_tokenizer, build_engine_for, tmp_path):
    """A tiny Qwen2-Audio for tensorrt-rtx in fp16: the decoder's plan and the audio tower's, whose one
    profile takes what the runtime feeds it for one clip of min_mel_frames up to max_clips clips of 30 s
    (the packed graph's clips, valid rows, segments and tokens)."""
    import audio_llm_assets
    from trt_llm.families.qwen2_audio.host import audio_token_count

    folder = audio_llm_assets.make_tiny_qwen2_audio(tmp_path / "qwen2_audio", tokenizer_dir=npm_tokenizer("qwen3"))
    engine = build_engine_for(folder, backend="tensorrt-rtx", dtype="fp16", max_batch_size=2, max_input_len=1024,
                              max_kv_cache_capacity=1100)
    audio_entry = json.loads((engine / "manifest.json").read_text())["components"]["audio"]
    assert audio_entry["engine"] == "audio/model.plan" and (engine / audio_entry["engine"]).stat().st_size > 100_000
    (audio,), config = _profiles_of(engine, "audio")

    def embeds(feeds):
        return [np.zeros((sum(audio_token_count(n) for n in frames), 64), np.float16)]

    for frames in ([config.audio.min_mel_frames], [3000] * config.audio.max_clips, [100, 3000, 1234]):
        fed, clips = _audio_feeds(engine, frames, embeds)
        _covers(audio, fed[0])
        assert [c.tokens for c in clips] == [audio_token_count(n) for n in frames]
    _plan_profiles_match(engine / "audio" / "model.plan", [audio])
    prefill, _ = _profiles_of(engine, "llm")[0]
    assert prefill["inputs_embeds"][2] == (2, 1024, 64)  # a clip's 750 audio rows fit one prompt


@needs_rtx
def test_qwen3_asr_builds_its_audio_plan_ahead_of_time(npm_tokenizer, build_engine_for, tmp_path):
    """A tiny Qwen3-ASR for tensorrt-rtx in fp16: its encoder's plan has its adapter's profile (chunks of
    100 frames, their kept rows, the attention windows: not Qwen2-Audio's packed rows), which takes what
    the runtime's adapter feeds for one clip of min_mel_frames up to max_clips clips of max_mel_frames."""
    import audio_llm_assets
    from trt_llm.families.adapters import adapter

    folder = audio_llm_assets.make_tiny_qwen3_asr(tmp_path / "qwen3_asr", tokenizer_dir=npm_tokenizer("qwen3"))
    engine = build_engine_for(folder, backend="tensorrt-rtx", dtype="fp16", max_batch_size=2, max_input_len=512,
                              max_kv_cache_capacity=640, audio={"max_mel_frames": 3000, "max_clips": 2})
    entry = json.loads((engine / "manifest.json").read_text())["components"]["audio"]
    assert entry["adapter"] == "qwen3_asr"
    assert entry["engine"] == "audio/model.plan" and (engine / entry["engine"]).stat().st_size > 100_000
    (audio,), config = _profiles_of(engine, "audio")
    settings = json.loads((engine / entry["config"]).read_text())
    chunks = adapter("qwen3_asr", settings)
    for frames in ([config.audio.min_mel_frames], [3000] * config.audio.max_clips, [100, 2345]):
        features = [np.zeros((settings["num_mel_bins"], chunks.layout.chunks(n) * 100), np.float32) for n in frames]
        _covers(audio, chunks.feeds(features, frames, np.float16))
    _plan_profiles_match(engine / "audio" / "model.plan", [audio])


def test_decoder_frames_come_from_the_checkpoint_config(tmp_path):
    """Without the encoder's output length the decoder's profiles cannot be made: one line that says
    where it is read from."""
    from trt_llm.build.tensorrt_backend import TensorRTBuildError, decoder_frames, profile_shapes
    from trt_llm.schemas.build_config import BuildConfig

    graph = tmp_path / "model.onnx"
    with pytest.raises(TensorRTBuildError, match="max_source_positions"):
        decoder_frames(graph)
    (tmp_path / "config.json").write_text(json.dumps({"max_source_positions": 1500}))
    assert decoder_frames(graph) == 1500
    config = BuildConfig(model="m", output_dir=str(tmp_path / "out"), max_batch_size=2)
    assert [p["frames"] for p in profile_shapes(config, frames=1500)] == [(1500, 1500, 1500)] * 2
    assert "frames" not in profile_shapes(config)[0]


@needs_rtx
def test_a_sliding_window_model_builds_with_window_caches(tiny_model, build_engine_for):
    """A model with sliding-window layers: its plan takes each window group's own lengths input and
    caches of capacity_w<W> slots, whose profile spans window - 1 + the widest step."""
    model = tiny_model("qwen3", num_hidden_layers=3, use_sliding_window=True, sliding_window=8, max_window_layers=1)
    engine = build_engine_for(model, backend="tensorrt-rtx", max_batch_size=2, max_input_len=64,
                              max_kv_cache_capacity=128)
    (prefill, decode), config = _profiles_of(engine, "llm")
    assert prefill["past_lengths_w8"] == ((1,), (2,), (2,))
    assert prefill["past_key_0"][2][2] == 128 and prefill["past_key_1"][2][2] == 8 - 1 + 64
    assert decode["past_key_2"][2][2] == 8 - 1 + 64
    _plan_profiles_match(engine / "llm" / "model.plan", [prefill, decode])
