"""int8 Whisper engines (`quantization: int8`, the cpu backend): the real Whisper tiny.en
(tests/whisper_assets.py) built once with every linear of its decoder and encoder as the weight-only
op, against the fp32 engine on Debian's LibriVox clips. The oracle is the fp32 engine (itself token
identical to transformers' generate, tests/test_whisper.py) and the clips' own transcripts: the
int8 engine's word error rate, after Whisper's English normaliser, within one percentage point of
fp32's, and its greedy tokens fp32's on every clip. Its graphs hold ONNX Runtime's int8 MatMulNBits
where the linears were, optimised at build time; what an encoder-decoder does not support is still
refused in one line.
"""

from __future__ import annotations

import json
from collections import Counter

import onnx
import pytest
from test_whisper import run_file, transcribe_request

from trt_llm.build.compile import BuildError
from trt_llm.runtime.backends.ort_engine import OPTIMISED_SUFFIX

# tiny.en: 4 decoder layers of q/k/v (one packed matmul), out, cross q, cross out, fc1, fc2, plus
# proj_out (the LM head); 4 encoder layers of q/k/v, out, fc1, fc2, plus every decoder layer's cross
# k / v projection as one packed matmul.
DECODER_MATMULS = 4 * 6 + 1
ENCODER_MATMULS = 4 * 4 + 1
# The names of the HF linears quantized (a packed matmul counts each part): 4 x 8 + 1 and 4 x 6 + 4 x 2.
QUANTIZED_LINEARS = 33 + 32


@pytest.fixture(scope="module")
def whisper_dir(whisper_tiny_en_dir):
    return whisper_tiny_en_dir


@pytest.fixture(scope="module")
def engines(whisper_dir, build_engine_for):
    """fp32 (test_whisper.py's, built once per session) and int8, each built once."""
    return {"fp32": build_engine_for(whisper_dir, max_batch_size=4),
            "int8": build_engine_for(whisper_dir, max_batch_size=4, quantization="int8")}


@pytest.fixture(scope="module")
def transcripts(engines, librivox_clips, tmp_path_factory):
    """{precision: responses} for the five LibriVox clips, one static batch of 4 and one of 1 each."""
    requests = [transcribe_request(clip.path) for clip in librivox_clips]
    return {name: run_file(engine, tmp_path_factory.mktemp(name), requests).responses
            for name, engine in engines.items()}


def _word_error_rate(whisper_dir, references: list[str], hypotheses: list[str]) -> float:
    """jiwer's WER after Whisper's English normaliser (the tokenizer's, with the spelling table), as
    tests/test_whisper_assets.py and benchmarks/whisper_speed.py score transcripts."""
    jiwer = pytest.importorskip("jiwer")
    from transformers import AutoTokenizer

    normalize = AutoTokenizer.from_pretrained(whisper_dir).normalize
    return jiwer.wer([normalize(text) for text in references], [normalize(text) for text in hypotheses])


def test_int8_transcribes_as_well_as_fp32(transcripts, librivox_clips, whisper_dir):
    for name, responses in transcripts.items():
        assert all(r.finish_reason == "end-of-sequence" for r in responses), (name, [r.error for r in responses])
    references = [clip.transcript for clip in librivox_clips]
    wer = {name: _word_error_rate(whisper_dir, references, [r.output_text for r in responses])
           for name, responses in transcripts.items()}
    assert wer["int8"] <= wer["fp32"] + 0.01, wer
    # Measured (ONNX Runtime 1.32, int8 activations per block of 32): all five token for token.
    same = sum(a.output_token_ids == b.output_token_ids for a, b in zip(transcripts["int8"], transcripts["fp32"]))
    assert same == len(librivox_clips), f"{same} of {len(librivox_clips)} clips decode fp32's tokens"


def _matmuls(path) -> Counter:
    """MatMulNBits nodes of a graph by their bits."""
    graph = onnx.load(str(path), load_external_data=False).graph
    return Counter(next(a.i for a in node.attribute if a.name == "bits") for node in graph.node
                   if node.op_type == "MatMulNBits")


def test_the_graphs_run_int8_matmuls_optimised_at_build_time(engines):
    engine = engines["int8"]
    manifest = json.loads((engine / "manifest.json").read_text())
    summary = manifest["model"]["quantization"]
    assert (summary["weights"], summary["group_size"], summary["method"]) == ("int8", 32, "rtn")
    assert summary["quantized_linears"] == QUANTIZED_LINEARS
    for component, expected in (("llm", DECODER_MATMULS), ("audio", ENCODER_MATMULS)):
        # The engine is ONNX Runtime's fusion, done by the build for this runtime (tests/test_cold_start.py)
        optimised = engine / manifest["components"][component]["engine"]
        assert optimised.name.endswith(OPTIMISED_SUFFIX), component
        assert _matmuls(optimised) == {8: expected}, component
        graph = onnx.load(str(optimised), load_external_data=False)
        weights = {t.name for t in graph.graph.initializer}
        # Every remaining MatMul is attention's (activations on both sides), no float weight left.
        assert not [n.name for n in graph.graph.node if n.op_type == "MatMul" and n.input[1] in weights]
    audio = onnx.load(str(engine / manifest["components"]["audio"]["engine"]), load_external_data=False)
    assert Counter(n.op_type for n in audio.graph.node)["Conv"] == 2  # the convolutions stay float
    assert json.loads((engines["fp32"] / "manifest.json").read_text())["model"]["quantization"] is None


@pytest.mark.parametrize("extra, message", [
    ({"lora": {"max_rank": 8}}, "lora: not supported for WhisperForConditionalGeneration (an encoder-decoder); "
                                "build without it"),
    ({"draft": {"model": "DRAFT"}}, "draft: not supported for WhisperForConditionalGeneration (an "
                                    "encoder-decoder); build without it"),
    ({"backend": "tensorrt"}, "quantization: a quantized WhisperForConditionalGeneration is built for the cpu "
                              "backend only (on 'tensorrt': quantization: none)"),
    ({"quantization": {"weights": "int8", "method": "awq"}}, "quantization.method: awq calibrates a text decoder "
                                                             "on text, not WhisperForConditionalGeneration; use rtn"),
], ids=["lora", "draft", "tensorrt", "awq"])
def test_what_an_int8_whisper_cannot_have_is_refused_in_one_line(whisper_dir, tmp_path, extra, message):
    from trt_llm.build.cli import build_engine
    from trt_llm.schemas.build_config import BuildConfig

    if "draft" in extra:
        extra = {"draft": {"model": str(tmp_path)}}  # a folder that exists: refused before it is read
    config = BuildConfig(model=str(whisper_dir), output_dir=str(tmp_path / "engine"),
                         **{"quantization": "int8", **extra})
    # export_only: the TensorRT refusal is the export's (no TensorRT needed to see it)
    with pytest.raises(BuildError) as error:
        build_engine(config, progress=False, export_only=True)
    assert str(error.value) == message
    assert not (tmp_path / "engine").exists()


def test_proj_out_is_the_lm_head_that_lm_head_false_keeps_float():
    """The factory's LM head is the model's output embedding: Whisper's proj_out, not a module named lm_head."""
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    from trt_llm.build.models.layers import Linear, QuantizedLinear
    from trt_llm.build.quantize import QuantSpec
    from trt_llm.build.quantize.factory import LinearFactory

    config = WhisperConfig(vocab_size=96, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                           decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=8,
                           max_source_positions=16, max_target_positions=16, pad_token_id=0, bos_token_id=1,
                           eos_token_id=2, decoder_start_token_id=1)
    model = WhisperForConditionalGeneration(config).eval()
    float_head = LinearFactory(model, torch.float32, QuantSpec(8, 32), head_spec=None)
    assert float_head.head == "proj_out"
    assert type(float_head(model.proj_out)) is Linear
    assert isinstance(float_head(model.model.decoder.layers[0].fc1), QuantizedLinear)
    assert float_head.quantized == ["model.decoder.layers.0.fc1"]
