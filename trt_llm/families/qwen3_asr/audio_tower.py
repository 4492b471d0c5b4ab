"""Qwen3-ASR's audio encoder as one graph over the chunks of a batch of clips: transformers'
Qwen3ASREncoder (its three stride-2 convolutions, layers and final norm) and multi-modal projector,
with the attention written with our vision attention op (plugins/vision_attention.py: bidirectional
within each packed segment): the `audio/` component's graph.

transformers cuts each clip's log-mel features (runtime/media/audio/features.py's qwen3_asr: padded
with zeros to a multiple of 100 frames) into chunks of 2 * n_window = 100 frames, runs the
convolutions on every chunk alone (13 rows each, the sinusoidal positions restarting at 0 in every
chunk), keeps the rows that hold the clip (all 13 of a full chunk, fewer of the last one) and
attends within windows of n_window_infer frames (104 rows: 8 chunks) of each clip. This graph does
the same: the host (trt_llm/families/qwen3_asr/host.py) cuts the chunks, and gives the rows to
keep and the windows, so one graph serves any number and length of clips.

Inputs:
    input_features  [chunks, 128, 100] float  every clip's chunks, clip after clip
    row_index       [N] int64                 each kept row's chunk * 13 + row, clip after clip
    cu_seqlens      [windows + 1] int32       the attention windows of the N packed rows
Output: audio_embeds [N, text_hidden], the projector's output for every clip's <|audio_pad|> tokens,
clip after clip (one per kept row: trt_llm/families/qwen3_asr/host.audio_token_count).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.export import Dim

import trt_llm.plugins.vision_attention  # noqa: F401 - registers torch.ops.trt_llm.vision_attention
from trt_llm.families.qwen2_audio.audio_tower import EncoderLayer


class AudioEncoderGraph(nn.Module):
    """The audio features path of a Qwen3ASRForConditionalGeneration (see the module docstring)."""

    def __init__(self, hf_model, dtype: torch.dtype):
        super().__init__()
        self.input_names = ["input_features", "row_index", "cu_seqlens"]
        self.output_names = ["audio_embeds"]
        inner = hf_model.model  # Qwen3ASRModel
        tower = inner.audio_tower
        config = tower.config
        self.conv1, self.conv2, self.conv3 = tower.conv2d1, tower.conv2d2, tower.conv2d3
        self.conv_out = tower.conv_out
        # Qwen2-Audio's layer; transformers passes Qwen3-ASR's scale to its attention (q not pre-scaled)
        self.layers = nn.ModuleList(EncoderLayer(layer, prescale=False) for layer in tower.layers)
        self.norm = tower.ln_post
        self.projector = inner.multi_modal_projector
        self.num_mel_bins = config.num_mel_bins
        self.n_window, self.n_window_infer = config.n_window, config.n_window_infer
        self.chunk_frames = 2 * config.n_window
        self.rows_per_chunk = _post_conv(self.chunk_frames)
        if config.n_window_infer % self.chunk_frames:
            raise ValueError(f"qwen3_asr: n_window_infer {config.n_window_infer} is not a multiple of the chunk's "
                             f"{self.chunk_frames} frames (2 * n_window)")
        # the positions of a chunk's rows (transformers adds rows 0..12 of its sinusoid table to every chunk)
        self.register_buffer("positions", tower.positional_embedding.positional_embedding[:self.rows_per_chunk].clone(),
                             persistent=False)
        self.hidden_size = self.projector.linear_2.out_features
        self.to(dtype)
        self.dtype = dtype

    def forward(self, input_features: Tensor, row_index: Tensor, cu_seqlens: Tensor) -> Tensor:
        x = F.gelu(self.conv1(input_features.to(self.dtype).unsqueeze(1)))
        x = F.gelu(self.conv2(x))
        x = F.gelu(self.conv3(x))  # [chunks, channels, mel / 8, 13]
        chunks, channels, bins, rows = x.shape
        x = self.conv_out(x.permute(0, 3, 1, 2).reshape(chunks, rows, channels * bins)) + self.positions
        x = x.reshape(-1, x.shape[-1])[row_index]  # the rows that hold the clips, packed
        for layer in self.layers:
            x = layer(x, cu_seqlens)
        return self.projector(self.norm(x))


def _post_conv(frames: int) -> int:
    """Rows after the three (kernel 3, stride 2, padding 1) convolutions."""
    for _ in range(3):
        frames = (frames - 1) // 2 + 1
    return frames


def export_audio_encoder(graph: AudioEncoderGraph, path: Path, dtype: torch.dtype) -> Path:
    """Write the graph to `path` (+ `path.data`) with the chunks, rows and windows dynamic; the mel
    bins and the chunk's 100 frames are fixed."""
    from trt_llm.build.export import export_graph
    from trt_llm.families.qwen3_asr.host import Qwen3ASRLayout

    layout = Qwen3ASRLayout(graph.n_window, graph.n_window_infer)
    frames = [1234, 345]  # distinct example sizes: 13 + 4 chunks, two windows in the first clip
    row_index, cu_seqlens, chunks = layout.packing(frames)
    example = (torch.zeros(chunks, graph.num_mel_bins, graph.chunk_frames, dtype=dtype),
               torch.from_numpy(row_index), torch.from_numpy(cu_seqlens))
    shapes = ({0: Dim("audio_chunks")}, {0: Dim("audio_rows")}, {0: Dim("windows_plus_one")})
    return export_graph(graph, example, graph.input_names, graph.output_names, shapes, path)


def export_audio(hf_model, path: Path, dtype: torch.dtype) -> dict:
    """The audio component's graph at `path` (build/audio_stage.py); returns its config entries."""
    graph = AudioEncoderGraph(hf_model, dtype)
    export_audio_encoder(graph, path, dtype)
    # No window bounds a clip: the encoder takes any number of chunks; `audio:`'s max_mel_frames does.
    return {"num_mel_bins": graph.num_mel_bins,
            "window_frames": WINDOW_FRAMES, "n_window": graph.n_window, "n_window_infer": graph.n_window_infer,
            "out_hidden_size": graph.hidden_size, "audio_token_id": hf_model.config.audio_token_id}


WINDOW_FRAMES = 1_000_000  # the build config's own ceiling on max_mel_frames (schemas/build_config.py)
