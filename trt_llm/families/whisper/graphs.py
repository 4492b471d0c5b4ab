"""Whisper (WhisperForConditionalGeneration): our forward pass over transformers' weights, as two graphs.

The encoder runs once per request; the decoder is a decoder graph like any other (schemas/graph_spec.py
`decoder_spec`: ragged right-padded rows, a fixed-capacity cache written in place, logits only where
asked) with the encoder's keys and values as extra inputs.

- `WhisperEncoderGraph`: input_features [batch, num_mel_bins, 2 * frames] -> cross_key_i / cross_value_i
  [batch, H, frames, D] for every decoder layer i: the decoder's cross-attention k_proj / v_proj
  applied to the encoder's final hidden states (one packed matmul for all layers), so no decoder step
  recomputes them. The mel axis is fixed at 2 * max_source_positions (3,000 frames for the real models,
  which were trained on 30 s windows only and which transformers refuses anything else for); batch
  is dynamic. Its self-attention is our cross-attention op (plugins/cross_attention.py: every key
  visible, no mask), which is what the encoder's attention is.
- `WhisperDecoderGraph`: the decoder graph contract (`decoder_spec` of its `cross` layers): inputs_embeds (the
  runtime looks the token embeddings up on the host: Whisper's embed_scale is 1.0, scale_embedding
  False in every checkpoint; another scale would be applied here), position_ids, past_lengths,
  query_lengths, logits_indices, the self-attention caches, then the encoder's cross keys / values.
  The learned position embedding is a gather of embed_positions by position_ids inside the graph.
  Self-attention is our attention op (plugins/attention.py) with identity rotation tables (cos 1,
  sin 0, [max_target_positions, D/2]: Whisper has no rotary; ONNX Runtime's GroupQueryAttention
  then rotates by exactly nothing), so a cache's capacity must not exceed max_target_positions
  (Whisper has no positions past it anyway). Cross-attention is our cross-attention op over the
  cross_key / cross_value inputs. Logits: proj_out (tied to embed_tokens), float32.

Whisper scales q by head_dim ** -0.5 after its projection; both ops take that scale (the attention
op applies it to the scores: equal up to rounding). q and v have biases, k none (the packed
projection gets zeros there).

Quantized (`quantization:`, the cpu backend): every linear of both graphs is the build's linear
factory's (build/quantize/factory.py, as a text decoder's): the decoder's self-attention q/k/v and
out, cross-attention q and out, fc1 and fc2; the encoder's q/k/v, out, fc1, fc2 and the packed cross
k / v projection of every decoder layer; proj_out is the LM head (`lm_head:`). The encoder's two
convolutions and the norms stay float (CTranslate2's int8 keeps its convolutions float too).
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import torch
import torch.nn.functional as F
import trt_llm.plugins.attention  # registers torch.ops.trt_llm.attention
import trt_llm.plugins.cross_attention  # noqa: F401 - registers torch.ops.trt_llm.cross_attention
from torch import Tensor, nn
from trt_llm.build.export import _dynamic_axes, export_graph
from trt_llm.build.models.layers import cast_floats, frozen, linear
from trt_llm.schemas.graph_spec import decoder_spec, whisper_encoder_spec
from trt_llm.schemas.layer_spec import CrossAttention


class WhisperDims:
    """The numbers the graphs and the runtime agree on, read from a WhisperConfig.

    num_layers, heads: the decoder's (its caches and cross inputs are per decoder layer; Hkv = heads);
    frames: the encoder's output length (max_source_positions, 1,500), the cross keys' L; the encoder
    takes 2 * frames mel frames of num_mel_bins."""

    def __init__(self, config):
        self.num_layers = config.decoder_layers
        self.heads = config.decoder_attention_heads
        self.head_dim = config.d_model // self.heads
        self.d_model = config.d_model
        self.vocab = config.vocab_size
        self.max_target_positions = config.max_target_positions
        self.frames = config.max_source_positions
        self.num_mel_bins = config.num_mel_bins

    @property
    def mel_frames(self) -> int:
        return 2 * self.frames

    def to_dict(self) -> dict:
        return dict(vars(self))


def _copy(module: nn.Module) -> nn.Module:
    """transformers' submodule, copied: casting the graph must not cast the caller's model."""
    return copy.deepcopy(module).requires_grad_(False)


def _heads(x: Tensor, heads: int) -> Tensor:
    """[B, L, H * D] -> [B, H, L, D], the cross-attention op's key / value layout."""
    batch, length, _ = x.shape
    return x.view(batch, length, heads, -1).transpose(1, 2)


class _FeedForward(nn.Module):
    """The pre-norm MLP block both stacks end their layers with: x + fc2(gelu(fc1(norm(x))))."""

    def __init__(self, hf_layer, make_linear=linear):
        super().__init__()
        self.norm = _copy(hf_layer.final_layer_norm)
        self.fc1, self.fc2 = make_linear(hf_layer.fc1), make_linear(hf_layer.fc2)

    def forward(self, hidden: Tensor) -> Tensor:
        return hidden + self.fc2(F.gelu(self.fc1(self.norm(hidden))))


class EncoderLayer(nn.Module):
    """transformers' WhisperEncoderLayer: packed q/k/v, unmasked attention, out_proj, MLP."""

    def __init__(self, hf_layer, heads: int, make_linear=linear):
        super().__init__()
        attn = hf_layer.self_attn
        self.heads, self.scale = heads, float(attn.scaling)
        self.norm = _copy(hf_layer.self_attn_layer_norm)
        self.qkv = make_linear(attn.q_proj, attn.k_proj, attn.v_proj)
        self.out = make_linear(attn.out_proj)
        self.mlp = _FeedForward(hf_layer, make_linear)

    def forward(self, hidden: Tensor) -> Tensor:
        q, k, v = self.qkv(self.norm(hidden)).chunk(3, dim=-1)
        attn = torch.ops.trt_llm.cross_attention(q, _heads(k, self.heads), _heads(v, self.heads), self.heads,
                                                 self.scale)
        hidden = self.mlp(hidden + self.out(attn))
        if hidden.dtype == torch.float16:  # as transformers' layer: keep fp16 activations finite
            limit = torch.finfo(torch.float16).max - 1000
            hidden = hidden.clamp(-limit, limit)
        return hidden


class WhisperEncoderGraph(nn.Module):
    """input_features -> cross_key_i, cross_value_i per decoder layer (see the module docstring)."""

    def __init__(self, hf_model, dtype: torch.dtype, make_linear=linear):
        super().__init__()
        config = hf_model.config
        encoder = hf_model.model.encoder
        decoder_layers = hf_model.model.decoder.layers
        self.dims = WhisperDims(config)
        self.conv1, self.conv2 = _copy(encoder.conv1), _copy(encoder.conv2)
        self.positions = frozen(encoder.embed_positions.weight)
        self.layers = nn.ModuleList(EncoderLayer(layer, config.encoder_attention_heads, make_linear)
                                    for layer in encoder.layers)
        self.norm = _copy(encoder.layer_norm)
        # Every decoder layer's cross k / v projection as one matmul: [d_model, 2 * layers * d_model].
        self.cross = make_linear(*(p for layer in decoder_layers for p in (layer.encoder_attn.k_proj,
                                                                            layer.encoder_attn.v_proj)))
        cast_floats(self, dtype)

    def forward(self, input_features: Tensor) -> tuple[Tensor, ...]:
        x = F.gelu(self.conv1(input_features))
        x = F.gelu(self.conv2(x)).transpose(1, 2)  # [B, frames, d_model]
        hidden = x + self.positions
        for layer in self.layers:
            hidden = layer(hidden)
        projected = self.cross(self.norm(hidden)).chunk(2 * self.dims.num_layers, dim=-1)
        return tuple(_heads(p, self.dims.heads).contiguous() for p in projected)


class DecoderLayer(nn.Module):
    """transformers' WhisperDecoderLayer: self-attention over the in-place cache (our attention op,
    identity rotary), cross-attention over the encoder's keys / values (our cross-attention op), MLP."""

    def __init__(self, hf_layer, dims: WhisperDims, make_linear=linear):
        super().__init__()
        self.dims = dims
        attn, cross = hf_layer.self_attn, hf_layer.encoder_attn
        self.scale = float(attn.scaling)
        self.self_norm = _copy(hf_layer.self_attn_layer_norm)
        self.qkv = make_linear(attn.q_proj, attn.k_proj, attn.v_proj)
        self.self_out = make_linear(attn.out_proj)
        self.cross_norm = _copy(hf_layer.encoder_attn_layer_norm)
        self.cross_q = make_linear(cross.q_proj)
        self.cross_out = make_linear(cross.out_proj)
        self.mlp = _FeedForward(hf_layer, make_linear)

    def forward(self, hidden, past_key, past_value, cross_key, cross_value, past_lengths, query_lengths,
                position_ids, cos, sin):
        d = self.dims
        attn, present_key, present_value = torch.ops.trt_llm.attention(
            self.qkv(self.self_norm(hidden)), past_key, past_value, past_lengths, query_lengths, position_ids,
            cos, sin, None, d.heads, d.heads, self.scale)
        hidden = hidden + self.self_out(attn)
        q = self.cross_q(self.cross_norm(hidden))
        hidden = hidden + self.cross_out(torch.ops.trt_llm.cross_attention(q, cross_key, cross_value, d.heads,
                                                                           self.scale))
        return self.mlp(hidden), present_key, present_value


class WhisperDecoderGraph(nn.Module):
    """inputs_embeds, position_ids, past_lengths, query_lengths, logits_indices, caches, cross keys /
    values -> logits, caches (see the module docstring)."""

    def __init__(self, hf_model, dtype: torch.dtype, make_linear=linear):
        super().__init__()
        config = hf_model.config
        decoder = hf_model.model.decoder
        self.dims = WhisperDims(config)
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.positions = frozen(decoder.embed_positions.weight)
        self.layers = nn.ModuleList(DecoderLayer(layer, self.dims, make_linear) for layer in decoder.layers)
        self.norm = _copy(decoder.layer_norm)
        # The LM head: the factory treats it as the model's output embedding (`lm_head:` applies).
        self.proj_out = make_linear(hf_model.proj_out)
        # Identity rotation: the attention op turns every token by row position_ids of these.
        rows = (self.dims.max_target_positions, self.dims.head_dim // 2)
        self.register_buffer("cos_cache", torch.ones(rows))
        self.register_buffer("sin_cache", torch.zeros(rows))
        cast_floats(self, dtype)

    def forward(self, inputs_embeds, position_ids, past_lengths, query_lengths, logits_indices, *tensors):
        """tensors: past_key_i, past_value_i per layer, then cross_key_i, cross_value_i per layer."""
        layers = len(self.layers)
        caches, cross = tensors[: 2 * layers], tensors[2 * layers: 4 * layers]
        if self.embed_scale != 1.0:
            inputs_embeds = inputs_embeds * self.embed_scale
        hidden = inputs_embeds + self.positions[position_ids.long()]
        presents = []
        for i, layer in enumerate(self.layers):
            hidden, key, value = layer(hidden, caches[2 * i], caches[2 * i + 1], cross[2 * i], cross[2 * i + 1],
                                       past_lengths, query_lengths, position_ids, self.cos_cache, self.sin_cache)
            presents += [key, value]
        # The final norm at every position (final_hidden_states), the head only where logits are asked for.
        hidden = self.norm(hidden)
        index = logits_indices.long().unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
        return (self.proj_out(torch.gather(hidden, 1, index)).float(), hidden, *presents)


# ---------------------------------------------------------------------------------------------------
# Export. Example sizes are distinct per dimension, so the tracer cannot mistake one dynamic
# dimension for another.


def export_whisper_encoder(graph: WhisperEncoderGraph, path: Path, dtype: torch.dtype) -> Path:
    """Write `path` (+ `path.data`); batch dynamic, the mel axis fixed at 2 * frames."""
    d = graph.dims
    spec = whisper_encoder_spec(layer_specs(d))
    example = (torch.zeros(2, d.num_mel_bins, d.mel_frames, dtype=dtype),)
    return export_graph(graph, example, spec.input_names, spec.output_names, tuple(_dynamic_axes(spec.inputs)), path)


def export_whisper_decoder(graph: WhisperDecoderGraph, path: Path, dtype: torch.dtype) -> Path:
    """Write `path` (+ `path.data`); batch, seq, kept, capacity and frames dynamic."""
    d = graph.dims
    spec = decoder_spec(layer_specs(d))
    batch, seq, kept, capacity, frames = 2, 5, 3, 16, 7
    # One tensor object per cache: the tracer would merge inputs that are the same object.
    caches = [torch.zeros(batch, d.heads, capacity, d.head_dim, dtype=dtype) for _ in range(2 * d.num_layers)]
    cross = [torch.zeros(batch, d.heads, frames, d.head_dim, dtype=dtype) for _ in range(2 * d.num_layers)]
    example = (torch.zeros(batch, seq, d.d_model, dtype=dtype), torch.arange(seq, dtype=torch.int32).repeat(batch, 1),
               torch.zeros(batch, dtype=torch.int32), torch.full((batch,), seq, dtype=torch.int32),
               torch.zeros(batch, kept, dtype=torch.int32), *caches, *cross)
    axes = _dynamic_axes(spec.inputs)
    # forward(inputs_embeds, position_ids, past_lengths, query_lengths, logits_indices, *tensors)
    return export_graph(graph, example, spec.input_names, spec.output_names, (*axes[:5], tuple(axes[5:])), path)


# ---------------------------------------------------------------------------------------------------
# The build's entry points (build/bundle.py for the llm/ component, build/audio_stage.py for audio/).


def layer_specs(dims: WhisperDims) -> list[CrossAttention]:
    """Every decoder layer: self-attention over its cache (no rotary: learned positions), then
    cross-attention over the encoder's frames (the same heads), both scaled by head_dim ** -0.5."""
    return [CrossAttention(kv_heads=dims.heads, head_dim=dims.head_dim, scale=dims.head_dim ** -0.5,
                           cross_heads=dims.heads, cross_head_dim=dims.head_dim) for _ in range(dims.num_layers)]


def export_llm(hf_model, path: Path, dtype: torch.dtype, make_linear=linear) -> tuple[dict, list]:
    """The decoder graph at `path`; returns the manifest's dims (kv_heads = heads: no GQA) and layer specs.
    make_linear: the build's linear factory (build/quantize/factory.py), `linear` when unquantized."""
    graph = WhisperDecoderGraph(hf_model, dtype, make_linear)
    export_whisper_decoder(graph, path, dtype)
    d = graph.dims
    return ({"hidden_size": d.d_model, "num_layers": d.num_layers, "num_heads": d.heads, "kv_heads": d.heads,
             "head_dim": d.head_dim, "vocab_size": d.vocab, "rms_norm_eps": hf_model.model.decoder.layer_norm.eps},
            layer_specs(d))


def export_audio(hf_model, path: Path, dtype: torch.dtype, make_linear=linear) -> dict:
    """The encoder graph at `path`; returns the audio config's entries: the encoder's geometry and
    the generation config's prompt tokens and token rules (runtime/media/audio/transcription.py).
    make_linear: the decoder's factory, so that `quantization:` covers the encoder's linears too."""
    graph = WhisperEncoderGraph(hf_model, dtype, make_linear)
    export_whisper_encoder(graph, path, dtype)
    g = hf_model.generation_config
    missing = [k for k in ("decoder_start_token_id", "no_timestamps_token_id", "prev_sot_token_id")
               if getattr(g, k, None) is None]
    if missing:
        raise ValueError(f"generation_config.json: Whisper needs {', '.join(missing)} (the published checkpoints "
                         "have them)")
    multilingual = bool(getattr(g, "is_multilingual", False))
    # A multilingual prompt is <|startoftranscript|><|en|><|transcribe|><|notimestamps|>: refuse now
    # what would fail every request later.
    if multilingual and "<|en|>" not in (getattr(g, "lang_to_id", None) or {}):
        raise ValueError("generation_config.json: a multilingual Whisper needs lang_to_id with <|en|>")
    if multilingual and "transcribe" not in (getattr(g, "task_to_id", None) or {}):
        raise ValueError("generation_config.json: a multilingual Whisper needs task_to_id with transcribe")
    return {"num_mel_bins": graph.dims.num_mel_bins,
            "window_frames": graph.dims.mel_frames, "max_target_positions": graph.dims.max_target_positions,
            "decoder_start_token_id": g.decoder_start_token_id, "no_timestamps_token_id": g.no_timestamps_token_id,
            "prev_token_id": g.prev_sot_token_id, "suppress_tokens": list(g.suppress_tokens or []),
            "begin_suppress_tokens": list(g.begin_suppress_tokens or []), "is_multilingual": multilingual,
            "lang_to_id": dict(getattr(g, "lang_to_id", None) or {}),
            "task_to_id": dict(getattr(g, "task_to_id", None) or {})}
