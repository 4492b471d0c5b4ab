"""Qwen2-Audio's audio encoder as one graph over the valid rows of a batch of clips: transformers'
audio tower (its convolutions, layers, pooling and norm) and multi-modal projector, with the attention
written with our vision attention op (plugins/vision_attention.py: bidirectional within each packed
segment): the `audio/` component's graph.

Every clip is 3,000 mel frames (30 s, the features padded to the chunk; the tower raises on any other
length) and transformers runs the tower's layers on all 1,500 rows after the stride-2 convolution,
masking the keys past each clip's (L - 1) // 2 + 1 valid rows. A padded row never feeds a valid one
(the mask removes it from every valid row's attention, and the other ops work row by row), so this
graph runs the layers on the valid rows only, packed clip after clip, each clip one attention segment:
the same values up to the order of float sums, at a fraction of the cost for a short clip (one
layer at the real width, 1,280, measured on 2 cores: 702 ms over 1,500 rows, 113 ms over a 5 s
clip's 250). The convolutions still see the whole padded window, as in transformers (a valid row's
receptive field reaches a frame past the clip). The average pool (kernel 2, stride 2) pairs rows
2j and 2j + 1 of a clip, both valid for its (conv - 2) // 2 + 1 output rows.

Inputs (computed on the host by trt_llm/families/qwen2_audio/host.py from the clips' valid mel frames):
    input_features  [clips, 128, 3000] float  WhisperFeatureExtractor's log-mel (runtime/media/audio/features.py)
    row_index       [N] int64                 each valid row's clip * 1500 + row, clip after clip
    cu_seqlens      [clips + 1] int32         the clips' segments of the N packed rows
    pool_index      [M] int64                 the packed row of each output row's first pooled row
Output: audio_embeds [M, text_hidden], the projector's output for every clip's <|AUDIO|> tokens, clip
after clip (M = their count, runtime/audio_tokens.audio_token_count per clip).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.export import Dim

import trt_llm.plugins.vision_attention  # noqa: F401 - registers torch.ops.trt_llm.vision_attention


class EncoderLayer(nn.Module):
    """transformers' Qwen2AudioEncoderLayer (and Qwen3ASRAudioEncoderLayer, the same layer) on packed
    rows [N, d], its attention through our op. prescale: q is scaled before the product and the
    attention runs with scale 1.0, as Qwen2-Audio's transformers code rounds it; else the scale goes
    to the attention, as Qwen3-ASR's does."""

    def __init__(self, hf_layer, prescale: bool = True):
        super().__init__()
        self.prescale = prescale
        attention = hf_layer.self_attn
        self.heads, self.scaling = attention.num_heads, float(attention.scaling)
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (attention.q_proj, attention.k_proj, attention.v_proj,
                                                                attention.out_proj)
        self.norm1, self.norm2 = hf_layer.self_attn_layer_norm, hf_layer.final_layer_norm
        self.fc1, self.fc2, self.activation = hf_layer.fc1, hf_layer.fc2, hf_layer.activation_fn

    def forward(self, x: Tensor, cu_seqlens: Tensor) -> Tensor:
        n = x.shape[0]
        h = self.norm1(x)
        q = self.q_proj(h) * self.scaling if self.prescale else self.q_proj(h)  # (transformers' rounding)
        q = q.reshape(n, self.heads, -1)
        k, v = self.k_proj(h).reshape(n, self.heads, -1), self.v_proj(h).reshape(n, self.heads, -1)
        scale = 1.0 if self.prescale else self.scaling
        x = x + self.out_proj(torch.ops.trt_llm.vision_attention(q, k, v, cu_seqlens, scale).reshape(n, -1))
        x = x + self.fc2(self.activation(self.fc1(self.norm2(x))))
        if x.dtype == torch.float16:  # transformers' clamp against fp16 overflow
            limit = torch.finfo(torch.float16).max - 1000
            x = x.clamp(-limit, limit)
        return x


class AudioTowerGraph(nn.Module):
    """The audio features path of a Qwen2AudioForConditionalGeneration (see the module docstring)."""

    def __init__(self, hf_model, dtype: torch.dtype):
        super().__init__()
        self.input_names = ["input_features", "row_index", "cu_seqlens", "pool_index"]
        self.output_names = ["audio_embeds"]
        inner = hf_model.model  # Qwen2AudioModel
        tower = inner.audio_tower
        self.conv1, self.conv2 = tower.conv1, tower.conv2
        self.positions = tower.embed_positions
        self.layers = nn.ModuleList(EncoderLayer(layer) for layer in tower.layers)
        self.norm = tower.layer_norm
        self.projector = inner.multi_modal_projector
        config = tower.config
        self.num_mel_bins = config.num_mel_bins
        self.rows = config.max_source_positions  # rows after the convolutions: 1500
        self.mel_frames = self.rows * self.conv1.stride[0] * self.conv2.stride[0]  # 3000
        self.hidden_size = self.projector.linear.out_features
        self.to(dtype)
        self.dtype = dtype

    def forward(self, input_features: Tensor, row_index: Tensor, cu_seqlens: Tensor, pool_index: Tensor) -> Tensor:
        x = F.gelu(self.conv1(input_features.to(self.dtype)))
        x = F.gelu(self.conv2(x)).permute(0, 2, 1) + self.positions.weight  # [clips, 1500, d]
        x = x.reshape(-1, x.shape[-1])[row_index]  # the valid rows, packed
        for layer in self.layers:
            x = layer(x, cu_seqlens)
        pooled = (x[pool_index] + x[pool_index + 1]) / 2  # AvgPool1d(2, 2) within each clip
        return self.projector(self.norm(pooled))


def export_audio_tower(graph: AudioTowerGraph, path: Path, dtype: torch.dtype) -> Path:
    """Write the graph to `path` (+ `path.data`) with the clips, rows and tokens dynamic; the mel
    bins and the 3,000 frames are fixed, as the tower requires."""
    from trt_llm.build.export import export_graph
    from trt_llm.families.qwen2_audio.host import packing

    frames = [graph.mel_frames, 1234]  # distinct example sizes
    row_index, cu_seqlens, pool_index = packing(frames, graph.rows)
    example = (torch.zeros(len(frames), graph.num_mel_bins, graph.mel_frames, dtype=dtype),
               torch.from_numpy(row_index), torch.from_numpy(cu_seqlens), torch.from_numpy(pool_index))
    shapes = ({0: Dim("clips")}, {0: Dim("audio_rows")}, {0: Dim("clips_plus_one")}, {0: Dim("audio_tokens")})
    return export_graph(graph, example, graph.input_names, graph.output_names, shapes, path)


def export_audio(hf_model, path: Path, dtype: torch.dtype) -> dict:
    """The audio component's graph at `path` (build/audio_stage.py); returns its config entries."""
    graph = AudioTowerGraph(hf_model, dtype)
    export_audio_tower(graph, path, dtype)
    return {"num_mel_bins": graph.num_mel_bins, "window_frames": graph.mel_frames,
            "out_hidden_size": graph.hidden_size, "audio_token_id": hf_model.config.audio_token_id}
