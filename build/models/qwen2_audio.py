"""Qwen2-Audio's audio encoder as one graph: transformers' audio tower and multi-modal projector over
a batch of clips, with the padding mask built inside from each clip's length: the `audio/` component's
graph.

Unlike the vision tower (build/models/qwen_vl_vision.py), transformers' Qwen2AudioEncoder exports as
it is: every clip is exactly 3,000 mel frames (30 s, the features padded to the chunk; the tower
raises on any other length), so nothing depends on the data but the mask, and that is a comparison
with an arange. What transformers' Qwen2AudioModel.forward does before calling the tower is repeated
here in the graph: the valid rows after the stride-2 convolution, (L - 1) // 2 + 1 of the 1,500,
become a bidirectional key-padding mask (every query row, padded ones too, attends to the clip's
valid rows only), and the tower's output goes through the projector. Rows past `embed_lengths` are
padding, as in transformers, which drops them before writing the rest at the <|AUDIO|> tokens.

Inputs:  input_features   [clips, 128, 3000] float  WhisperFeatureExtractor's log-mel (runtime/audio_features.py)
         feature_lengths  [clips] int64             the valid mel frames of each clip (the processor's
                                                    feature_attention_mask.sum(-1))
Outputs: audio_embeds     [clips, 750, text_hidden] the projector's output, in the decoder's width
         embed_lengths    [clips] int64             the valid rows of each clip = its <|AUDIO|> tokens
                                                    (runtime/audio_tokens.audio_token_count)

The mask is a float bias [clips, 1, 1, 1500] broadcast over heads and queries (transformers' eager
form: 0 or the dtype's minimum), never a [1500, 1500] tensor per clip.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn
from torch.export import Dim


class AudioTowerGraph(nn.Module):
    """The audio features path of a Qwen2AudioForConditionalGeneration (see the module docstring)."""

    def __init__(self, hf_model, dtype: torch.dtype):
        super().__init__()
        self.input_names = ["input_features", "feature_lengths"]
        self.output_names = ["audio_embeds", "embed_lengths"]
        inner = hf_model.model  # Qwen2AudioModel
        self.tower = inner.audio_tower
        self.projector = inner.multi_modal_projector
        config = self.tower.config
        self.num_mel_bins = config.num_mel_bins
        self.positions = config.max_source_positions  # rows after the convolutions: 1500
        self.mel_frames = self.positions * self.tower.conv1.stride[0] * self.tower.conv2.stride[0]  # 3000
        self.hidden_size = self.projector.linear.out_features
        self.to(dtype)
        self.dtype = dtype

    def forward(self, input_features: Tensor, feature_lengths: Tensor) -> tuple[Tensor, Tensor]:
        # transformers' Qwen2AudioEncoder._get_feat_extract_output_lengths
        conv_lengths = (feature_lengths - 1) // 2 + 1
        embed_lengths = (conv_lengths - 2) // 2 + 1
        rows = torch.arange(self.positions, device=feature_lengths.device, dtype=feature_lengths.dtype)
        padding = rows.unsqueeze(0) >= conv_lengths.unsqueeze(1)  # [clips, 1500]
        bias = torch.zeros(padding.shape, dtype=self.dtype, device=input_features.device)
        bias = bias.masked_fill(padding, torch.finfo(self.dtype).min)[:, None, None, :]
        hidden = self.tower(input_features.to(self.dtype), attention_mask=bias).last_hidden_state
        return self.projector(hidden), embed_lengths


def export_audio_tower(graph: AudioTowerGraph, path: Path, dtype: torch.dtype) -> Path:
    """Write the graph to `path` (+ `path.data`) with the number of clips dynamic; the mel bins and
    the 3,000 frames are fixed, as the tower requires."""
    from trt_llm.build.export import export_graph

    clips = Dim("clips")
    example = (torch.zeros(2, graph.num_mel_bins, graph.mel_frames, dtype=dtype),
               torch.tensor([graph.mel_frames, 1234], dtype=torch.int64))
    return export_graph(graph, example, graph.input_names, graph.output_names, ({0: clips}, {0: clips}), path)


def export_audio(hf_model, path: Path, dtype: torch.dtype) -> dict:
    """The audio component's graph at `path` (build/audio_stage.py); returns its config entries."""
    graph = AudioTowerGraph(hf_model, dtype)
    export_audio_tower(graph, path, dtype)
    return {"kind": "rows", "num_mel_bins": graph.num_mel_bins, "window_frames": graph.mel_frames,
            "out_hidden_size": graph.hidden_size, "audio_token_id": hf_model.config.audio_token_id}
