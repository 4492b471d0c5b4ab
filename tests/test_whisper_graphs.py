"""The Whisper graphs (trt_llm/families/whisper/graphs.py) on a tiny random WhisperForConditionalGeneration:
the encoder graph on ONNX Runtime against transformers' encoder and cross k/v projections, and a
greedy decode through the exported decoder graph, compiled by the cpu backend (its attention nodes
become GroupQueryAttention with an in-place cache, its cross-attention the inlined body), against
transformers' `generate`, token for token, for a ragged batch of two prompts."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from assets import make_nontrivial
from trt_llm.build.cpu_backend import compile_cpu
from trt_llm.families.whisper.graphs import (
    WhisperDecoderGraph,
    WhisperDims,
    WhisperEncoderGraph,
    export_whisper_decoder,
    export_whisper_encoder,
    layer_specs,
)
from trt_llm.plugins import attention, cross_attention
from trt_llm.schemas.graph_spec import (
    LOGITS,
    cross,
    decoder_spec,
    past,
    present,
    whisper_encoder_spec,
)
from trt_llm.schemas.layer_spec import FullAttention

LAYERS, HEADS, D_MODEL, VOCAB = 2, 4, 64, 150
START, EOS = 148, 147
PROMPTS = ([START, 5, 7], [START, 9])  # ragged: the second row is right-padded in the prefill
NEW_TOKENS, CAPACITY = 10, 24


@pytest.fixture(scope="module")
def whisper():
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    config = WhisperConfig(
        vocab_size=VOCAB, d_model=D_MODEL, encoder_layers=LAYERS, decoder_layers=LAYERS,
        encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, encoder_ffn_dim=128, decoder_ffn_dim=128,
        max_source_positions=32, max_target_positions=64, num_mel_bins=80,
        pad_token_id=149, bos_token_id=START, eos_token_id=EOS, decoder_start_token_id=START,
        suppress_tokens=None, begin_suppress_tokens=None,
        init_std=0.2,  # transformers' 0.02 makes every greedy token the same one
    )
    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(config).eval()
    make_nontrivial(model)
    return model


@pytest.fixture(scope="module")
def features(whisper):
    generator = torch.Generator().manual_seed(1)
    return torch.randn(2, whisper.config.num_mel_bins, 2 * whisper.config.max_source_positions, generator=generator)


@pytest.fixture(scope="module")
def engines(whisper, tmp_path_factory):
    """{"encoder" | "decoder": (portable graph, cpu engine)}: each exported in fp32 and compiled by
    the cpu backend in a folder of its own (the engine's file name is fixed)."""
    built = {}
    for name, graph_class, export in (("encoder", WhisperEncoderGraph, export_whisper_encoder),
                                      ("decoder", WhisperDecoderGraph, export_whisper_decoder)):
        path = tmp_path_factory.mktemp(f"whisper-{name}") / "model.onnx"
        export(graph_class(whisper, torch.float32), path, torch.float32)
        built[name] = (path, compile_cpu(path))
    return built


def session(path):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def test_dims_and_specs(whisper):
    dims = WhisperDims(whisper.config)
    assert dims.to_dict() == {"num_layers": LAYERS, "heads": HEADS, "head_dim": D_MODEL // HEADS, "d_model": D_MODEL,
                              "vocab": VOCAB, "max_target_positions": 64, "frames": 32, "num_mel_bins": 80}
    assert dims.mel_frames == 64 and not whisper.config.scale_embedding
    crosses = [cross(kind, i) for i in range(LAYERS) for kind in ("key", "value")]
    assert crosses[:2] == ["cross_key_0", "cross_value_0"]
    layers = layer_specs(dims)
    assert [layer.kind for layer in layers] == ["cross"] * LAYERS
    full = [FullAttention(kv_heads=HEADS, head_dim=dims.head_dim, scale=dims.head_dim ** -0.5)] * LAYERS
    assert decoder_spec(layers).input_names == decoder_spec(full).input_names + crosses
    assert decoder_spec(layers).output_names == decoder_spec(full).output_names
    assert whisper_encoder_spec(layers).input_names == ["input_features"]
    assert whisper_encoder_spec(layers).output_names == crosses


def test_exported_graphs_follow_the_specs_and_lower(engines, whisper):
    """The graphs' I/O names and dynamic axes are the specs'; the portable graphs hold our nodes,
    the cpu engines none of them (GroupQueryAttention for self-attention)."""
    layers = layer_specs(WhisperDims(whisper.config))
    for name, spec in (("encoder", whisper_encoder_spec(layers)), ("decoder", decoder_spec(layers))):
        portable, engine = (onnx.load(p, load_external_data=False) for p in engines[name])
        assert [i.name for i in portable.graph.input] == spec.input_names
        assert [o.name for o in portable.graph.output] == spec.output_names
        for tensor, info in zip(spec.inputs, portable.graph.input):
            dims = info.type.tensor_type.shape.dim
            assert [d.dim_param or None for d in dims] == list(tensor.dims), tensor.name
        ours = [n.op_type for n in portable.graph.node if n.domain == "trt"]
        expected = [cross_attention.OP_NAME] * LAYERS if name == "encoder" else \
            [attention.OP_NAME, cross_attention.OP_NAME] * LAYERS
        assert ours == expected
        assert not any(n.domain == "trt" for n in engine.graph.node)
        assert [n.op_type for n in engine.graph.node].count("GroupQueryAttention") == (LAYERS if name == "decoder" else 0)


def hf_cross(whisper, features) -> list[np.ndarray]:
    """transformers' encoder, then each decoder layer's cross k / v projection, as [B, H, frames, D]."""
    with torch.no_grad():
        hidden = whisper.model.encoder(features).last_hidden_state
        batch, frames, _ = hidden.shape
        out = []
        for layer in whisper.model.decoder.layers:
            for projection in (layer.encoder_attn.k_proj, layer.encoder_attn.v_proj):
                out.append(projection(hidden).view(batch, frames, HEADS, -1).transpose(1, 2).numpy())
    return out


def test_encoder_equals_transformers(whisper, features, engines):
    expected = hf_cross(whisper, features)
    for path in engines["encoder"]:
        got = session(path).run(None, {"input_features": features.numpy()})
        for name, g, e in zip(whisper_encoder_spec(layer_specs(WhisperDims(whisper.config))).output_names, got, expected):
            assert g.shape == e.shape == (2, HEADS, 32, D_MODEL // HEADS)
            # measured: 4e-6 at values up to 6.5
            np.testing.assert_allclose(g, e, atol=1e-5, rtol=1e-5, err_msg=name)


class CpuDecoder:
    """The cpu engine with its cache bound as past and present at once (the op writes it in place),
    as runtime/ort_engine.OrtEngine binds it."""

    def __init__(self, path, batch: int, cross_inputs: list[np.ndarray]):
        self.session = session(path)
        self.binding = self.session.io_binding()
        shape = (batch, HEADS, CAPACITY, D_MODEL // HEADS)
        self.caches = [np.zeros(shape, np.float32) for _ in range(2 * LAYERS)]
        for i in range(LAYERS):
            for j, kind in enumerate(("key", "value")):
                buffer = self.caches[2 * i + j]
                for name in (past(kind, i), present(kind, i)):
                    bind = self.binding.bind_input if name.startswith("past") else self.binding.bind_output
                    bind(name, "cpu", 0, np.float32, buffer.shape, buffer.ctypes.data)
                array = np.ascontiguousarray(cross_inputs[2 * i + j])
                self.binding.bind_input(cross(kind, i), "cpu", 0, np.float32, array.shape, array.ctypes.data)
        self.cross_inputs = cross_inputs  # keeps the bound memory alive

    def step(self, embeds, positions, past_lengths, query_lengths, logits_indices) -> np.ndarray:
        feeds = {"inputs_embeds": embeds, "position_ids": positions, "past_lengths": past_lengths,
                 "query_lengths": query_lengths, "logits_indices": logits_indices}
        for name, array in feeds.items():
            self.binding.bind_cpu_input(name, np.ascontiguousarray(array))
        logits = np.empty((embeds.shape[0], logits_indices.shape[1], VOCAB), np.float32)
        self.binding.bind_output(LOGITS, "cpu", 0, np.float32, logits.shape, logits.ctypes.data)
        self.session.run_with_iobinding(self.binding)
        return logits


def greedy(decoder: CpuDecoder, table: np.ndarray, prompts, steps: int) -> tuple[list[list[int]], np.ndarray]:
    """A prefill of the right-padded prompts, then one token a row per step: the tokens and every
    step's logits [steps, B, V]."""
    batch, longest = len(prompts), max(len(p) for p in prompts)
    lengths = np.array([len(p) for p in prompts], np.int32)
    ids = np.zeros((batch, longest), np.int64)
    for row, prompt in enumerate(prompts):
        ids[row, :len(prompt)] = prompt
    positions = np.tile(np.arange(longest, dtype=np.int32), (batch, 1))
    logits = decoder.step(table[ids], positions, np.zeros(batch, np.int32), lengths, (lengths - 1)[:, None])
    tokens, history = [[] for _ in prompts], []
    for step in range(steps):
        history.append(logits[:, 0])
        chosen = logits[:, 0].argmax(-1)
        for row, token in enumerate(chosen):
            tokens[row].append(int(token))
        if step + 1 == steps:
            break
        past_lengths = lengths + step
        logits = decoder.step(table[chosen][:, None], past_lengths[:, None].astype(np.int32), past_lengths,
                              np.ones(batch, np.int32), np.zeros((batch, 1), np.int32))
    return tokens, np.stack(history)


def test_greedy_decode_equals_generate(whisper, features, engines):
    """Encoder engine -> cross keys / values -> decoder engine, greedy, batch 2 with prompts of 3 and
    2 tokens, against transformers' generate on each row alone: the same tokens, logits within 1e-4."""
    cross_inputs = session(engines["encoder"][1]).run(None, {"input_features": features.numpy()})
    decoder = CpuDecoder(engines["decoder"][1], len(PROMPTS), cross_inputs)
    table = whisper.model.decoder.embed_tokens.weight.detach().numpy()
    tokens, logits = greedy(decoder, table, PROMPTS, NEW_TOKENS)
    for row, prompt in enumerate(PROMPTS):
        expected = whisper.generate(features[row:row + 1], decoder_input_ids=torch.tensor([prompt]), do_sample=False,
                                    max_new_tokens=NEW_TOKENS, return_dict_in_generate=True, output_logits=True)
        new = expected.sequences[0, len(prompt):].tolist()
        assert len(set(new)) > 2, "a degenerate model: every token the same"
        assert tokens[row][:len(new)] == new  # generate stops early only at end of sequence
        hf_logits = torch.stack(expected.logits)[:, 0].numpy()
        # measured: 4e-6 at logits up to 6
        np.testing.assert_allclose(logits[:len(new), row], hf_logits, atol=1e-4, rtol=0)
    # The cache holds each row's prompt and its tokens but the last, and nothing past them.
    for row, prompt in enumerate(PROMPTS):
        written = len(prompt) + NEW_TOKENS - 1
        for buffer in decoder.caches:
            assert np.abs(buffer[row, :, :written]).sum(-1).min() > 0
            assert not buffer[row, :, written:].any()
