"""Gemma 4's audio tower and `embed_audio` as our own forward pass over transformers' submodules: the
`audio/` component's graph (transformers 5.25, modeling_gemma4.py: Gemma4AudioModel and
Gemma4Model.get_audio_features are the oracle).

A USM conformer. Subsampling: two Conv2d (3 x 3, stride 2 over time and mel, no bias) each with a
LayerNorm over its channels and a ReLU, the input zeroed past the clip's frames before each; the
[mel / 4 x channels] of each row projected to the width. Then each layer: a macaron feed-forward
(clamped, RMS-normed before and after, x residual_weight), chunked local attention, a causal
depthwise convolution with a GLU before it, a second feed-forward, a last norm; then output_proj
(with a bias) and embed_audio (a weightless RMSNorm, a Linear to the text width).

The attention. transformers cuts the rows into blocks of attention_chunk_size queries, each reading
a context of keys around its block, and masks what the sliding window (keys 0 to context_left - 2
rows back, or up to context_right - 1 rows ahead) and the clip's valid rows do not allow; the
block's context always holds the whole window, so the block structure changes nothing but the
cost. Here each query reads its window as a band instead: its W keys gathered ([B, R, W, heads, head_dim]:
W = 12 copies of the keys and of the values, some 300 MB each a layer for 8 clips of 30 s at the
default width 1024 in float32, where transformers' blocks hold 2 copies and compute 24 logits a query
to our 12). One gather and three einsums a layer: the per-distance loop exported three times slower.
Its terms are transformers': q x q_scale x softplus(per_dim_scale) (head_dim^-0.5 / ln 2),
k x k_scale (ln(1 + e) / ln 2), in float32; the logit q.k plus q . relative_k_proj(sinusoid) at the
row of the table its rel-shift gives distance d (`_bias_rows`, zero where that shift reads past
the table); soft-capped (tanh(x / cap) x cap); a key before the clip, past the batch or past the
clip's rows is attention_invalid_logits_value (-1e9), so its weight is exactly 0, as transformers'
entries outside the window are.

Several clips in one run, padded to the longest (not packed): the subsampling's stride-2 convolutions
and the causal convolution read rows across a clip's ends, so packing would need gaps and a mask at
every stage; padded, each clip is computed exactly as transformers' own batch does (zeroed input
past the clip at both subsampling convolutions, its padded keys masked), and a clip's valid rows
never read a padded row (the attention masks them, the convolution only looks back), so they equal
the clip's rows run alone. A request's clips are few (`audio.max_clips`) and at most 30 s.

Inputs (trt_llm/families/gemma4/audio_host.py makes them from the clips' valid frames):
    input_features  [clips, audio_frames, mel bins] float  each clip's log-mel (runtime/media/audio/
                                                           gemma4_features.py), zero-padded to the longest
    frame_counts    [clips] int64                          each clip's valid frames
    row_index       [audio_tokens] int64                   each soft token's clip * rows + row, clip after
                                                           clip (rows = ceil(audio_frames / 4))
Output:  audio_embeds [audio_tokens, text hidden]  the rows transformers scatters at the prompt's
                                                   <|audio|> tokens: ceil(frames / 4) per clip, in order
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trt_llm.families.gemma4.vision_tower import _ClippedLinear

# transformers' Gemma4AudioFeatureExtractor cuts a clip at 480,000 samples (its call's max_length): 30 s,
# 3,000 frames of 10 ms (the last is never whole: 2,999 are the clip's)
WINDOW_FRAMES = 3000


def _bias_rows(config) -> list[int | None]:
    """For each distance d of the window (first to last: context_right - 1 ahead to context_left - 2
    back), the row of the relative position table transformers' rel-shift gives it, None for zero."""
    chunk, left, right = config.attention_chunk_size, config.attention_context_left, config.attention_context_right
    max_past = left - 1
    table = (chunk + max_past + right) // 2 + 1  # Gemma4AudioRelPositionalEncoding's positions
    # query i of a block, its context's key j: the shifted entry is column j - i = max_past - d of the
    # product with the table (its rows: positions table - 1 down to 0), zero past its last column
    return [max_past - d if 0 <= max_past - d < table else None for d in _distances(config)]


def _distances(config) -> list[int]:
    """The query-key distances (q - kv) the sliding window allows (sliding_window_mask_function: up to
    context_left - 2 back, context_right - 1 ahead)."""
    return list(range(-max(0, config.attention_context_right - 1), config.attention_context_left - 1))


class _FeedForward(nn.Module):
    """Gemma4AudioFeedForward, its linears clipped as numbers (vision_tower._ClippedLinear)."""

    def __init__(self, ff, clip: float):
        super().__init__()
        self.ffw_layer_1, self.ffw_layer_2 = _ClippedLinear(ff.ffw_layer_1), _ClippedLinear(ff.ffw_layer_2)
        self.pre_layer_norm, self.post_layer_norm, self.act_fn = ff.pre_layer_norm, ff.post_layer_norm, ff.act_fn
        self.scale, self.clip = float(ff.post_layer_scale), clip

    def forward(self, x: Tensor) -> Tensor:
        h = self.pre_layer_norm(x.clamp(-self.clip, self.clip))
        h = self.ffw_layer_2(self.act_fn(self.ffw_layer_1(h))).clamp(-self.clip, self.clip)
        return self.post_layer_norm(h) * self.scale + x


class _LightConv(nn.Module):
    """Gemma4AudioLightConv1d: GLU, a causal depthwise convolution (zeros before the clip), norm, act."""

    def __init__(self, lconv, clip: float):
        super().__init__()
        self.linear_start, self.linear_end = _ClippedLinear(lconv.linear_start), _ClippedLinear(lconv.linear_end)
        self.pre_layer_norm, self.conv_norm, self.act_fn = lconv.pre_layer_norm, lconv.conv_norm, lconv.act_fn
        self.conv = conv = lconv.depthwise_conv1d
        if conv.stride[0] != 1 or conv.bias is not None or conv.padding[0] != 0:
            raise ValueError("audio tower: the depthwise convolution must have stride 1 and no bias")
        self.left = (conv.kernel_size[0] - 1) * conv.dilation[0]
        self.clip = clip

    def forward(self, x: Tensor) -> Tensor:
        h = F.glu(self.linear_start(self.pre_layer_norm(x)), dim=-1)
        h = F.conv1d(F.pad(h.transpose(1, 2), (self.left, 0)), self.conv.weight, None, 1, 0, self.conv.dilation,
                     self.conv.groups).transpose(1, 2)
        h = self.act_fn(self.conv_norm(h.clamp(-self.clip, self.clip)))
        return self.linear_end(h) + x


class _Attention(nn.Module):
    """Gemma4AudioAttention as a band (see the module docstring)."""

    def __init__(self, attn, config):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.post = (_ClippedLinear(p) for p in
                                                            (attn.q_proj, attn.k_proj, attn.v_proj, attn.post))
        self.relative_k_proj, self.per_dim_scale = attn.relative_k_proj, attn.per_dim_scale
        self.heads, self.head_dim = attn.num_heads, attn.head_dim
        self.q_scale, self.k_scale = float(attn.q_scale), float(attn.k_scale)
        self.cap = float(config.attention_logit_cap)
        self.invalid = float(config.attention_invalid_logits_value)
        distances, rows = _distances(config), _bias_rows(config)
        self.back, self.ahead = max(0, distances[-1]), max(0, -distances[0])
        # per window slot w (distance d): the padded key row q + back - d, and its table row (or none)
        self.register_buffer("offsets", torch.tensor([self.back - d for d in distances]), persistent=False)
        self.register_buffer("table_rows", torch.tensor([row or 0 for row in rows]), persistent=False)
        self.register_buffer("has_row", torch.tensor([float(row is not None) for row in rows]), persistent=False)

    def forward(self, x: Tensor, positions: Tensor, valid: Tensor) -> Tensor:
        """x [B, R, hidden], positions: the sinusoid table [P, hidden], valid [B, R] bool."""
        b, r, _ = x.shape
        shape = (b, r, self.heads, self.head_dim)
        q = self.q_proj(x).float().view(shape) * self.q_scale * F.softplus(self.per_dim_scale)
        k = self.k_proj(x).float().view(shape) * self.k_scale
        v = self.v_proj(x).float().view(shape)
        relative = self.relative_k_proj(positions).view(-1, self.heads, self.head_dim).float()  # [P, H, D]
        relative = relative[self.table_rows] * self.has_row[:, None, None]  # [W, H, D]
        # each query's window of keys, [B, R, W, H, D]: row q + offset of the padded rows is key q - d
        band = torch.arange(r, device=x.device)[:, None] + self.offsets  # [R, W]
        k, v = (F.pad(t, (0, 0, 0, 0, self.back, self.ahead))[:, band] for t in (k, v))
        keep = F.pad(valid, (self.back, self.ahead))[:, band]  # [B, R, W]: a key of the clip
        logits = torch.einsum("brhd,brwhd->brhw", q, k) + torch.einsum("brhd,whd->brhw", q, relative)
        logits = torch.tanh(logits / self.cap) * self.cap
        logits = logits.masked_fill(~keep[:, :, None, :], self.invalid)
        out = torch.einsum("brhw,brwhd->brhd", torch.softmax(logits, dim=-1), v)
        return self.post(out.reshape(b, r, -1).to(x.dtype))


class _Layer(nn.Module):
    """Gemma4AudioLayer."""

    def __init__(self, layer, config, clip: float):
        super().__init__()
        self.feed_forward1, self.feed_forward2 = _FeedForward(layer.feed_forward1, clip), _FeedForward(
            layer.feed_forward2, clip)
        self.self_attn = _Attention(layer.self_attn, config)
        self.lconv1d = _LightConv(layer.lconv1d, clip)
        self.norm_pre_attn, self.norm_post_attn, self.norm_out = layer.norm_pre_attn, layer.norm_post_attn, layer.norm_out
        self.clip = clip

    def forward(self, x: Tensor, positions: Tensor, valid: Tensor) -> Tensor:
        x = self.feed_forward1(x)
        h = self.self_attn(self.norm_pre_attn(x.clamp(-self.clip, self.clip)), positions, valid)
        x = self.norm_post_attn(h.clamp(-self.clip, self.clip)) + x
        x = self.feed_forward2(self.lconv1d(x))
        return self.norm_out(x.clamp(-self.clip, self.clip))


class Gemma4AudioTower(nn.Module):
    """The audio tower, output_proj and embed_audio of a Gemma4ForConditionalGeneration (the module docstring)."""

    input_names = ["input_features", "frame_counts", "row_index"]
    output_names = ["audio_embeds"]

    def __init__(self, hf_model, dtype: torch.dtype):
        super().__init__()
        inner = hf_model.model
        tower, config = inner.audio_tower, hf_model.config.audio_config
        if tower is None:
            raise ValueError("the checkpoint has no audio tower (its config has no audio_config)")
        sub = tower.subsample_conv_projection
        if len(config.subsampling_conv_channels) != 2:
            raise ValueError(f"audio_config.subsampling_conv_channels: two layers, got {config.subsampling_conv_channels}")
        self.conv0, self.norm0 = sub.layer0.conv, sub.layer0.norm
        self.conv1, self.norm1 = sub.layer1.conv, sub.layer1.norm
        self.input_proj = sub.input_proj_linear
        # transformers' clamps: min(gradient_clipping, the dtype's largest)
        clip = float(min(config.gradient_clipping, torch.finfo(dtype).max))
        self.layers = nn.ModuleList(_Layer(layer, config, clip) for layer in tower.layers[:config.num_hidden_layers])
        self.output_proj = tower.output_proj
        self.embed_audio = inner.embed_audio
        # the mel bins: transformers sizes input_proj as channels[0] // 4 x channels[1] inputs, the mel
        # axis a quarter of the bins after the convolutions: the bins are channels[0] (128)
        self.num_mel_bins = config.subsampling_conv_channels[0]
        self.hidden_size = inner.embed_audio.embedding_projection.out_features
        # the sinusoid table (Gemma4AudioRelPositionalEncoding): positions P - 1 down to 0, [sin, cos]
        encoding = tower.rel_pos_enc
        steps = torch.arange(encoding.context_size // 2, -1, -1)[:, None] * encoding.inv_timescales.reshape(1, -1)
        self.to(dtype)
        self.dtype = dtype
        self.register_buffer("positions", torch.cat([steps.sin(), steps.cos()], dim=-1).to(dtype))

    def _subsample(self, conv, norm, x: Tensor, valid: Tensor) -> Tensor:
        """Gemma4AudioSubSampleConvProjectionLayer: rows past the clip zeroed, then conv, LayerNorm, ReLU."""
        x = conv((x * valid[:, None, :, None]).to(self.dtype))
        return torch.relu(norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2))

    @staticmethod
    def _valid(counts: Tensor, rows: int, stride: int) -> Tensor:
        """[B, rows] bool: row j holds frame j * stride of the clip (transformers' mask[:, ::2] twice)."""
        return (torch.arange(rows, device=counts.device) * stride)[None, :] < counts[:, None]

    def forward(self, input_features: Tensor, frame_counts: Tensor, row_index: Tensor) -> Tensor:
        x = input_features.to(self.dtype)[:, None]  # [B, 1, T, mel]
        x = self._subsample(self.conv0, self.norm0, x, self._valid(frame_counts, x.shape[2], 1))
        x = self._subsample(self.conv1, self.norm1, x, self._valid(frame_counts, x.shape[2], 2))
        b, _, rows, _ = x.shape
        x = self.input_proj(x.permute(0, 2, 3, 1).reshape(b, rows, -1))
        valid = self._valid(frame_counts, rows, 4)
        for layer in self.layers:
            x = layer(x, self.positions, valid)
        # only the soft tokens' rows go on: output_proj and embed_audio work row by row
        x = x.reshape(b * rows, -1)[row_index]
        return self.embed_audio(self.output_proj(x))


def tower_rows(frames: int) -> int:
    """Rows after the two stride-2 subsampling convolutions of `frames` frames: ceil(frames / 4)."""
    return (frames + 3) // 4


def export_tower(tower: Gemma4AudioTower, path, dtype: torch.dtype) -> Path:
    """The tower's graph at `path` (+ `path.data`): clips, frames and soft tokens dynamic."""
    from torch.export import Dim

    from trt_llm.build.export import export_graph
    from trt_llm.families.gemma4.audio_host import feeds

    counts = [97, 45]  # distinct example sizes, neither a multiple of 4
    example = feeds([torch.zeros(n, tower.num_mel_bins).numpy() for n in counts], counts, "float32")
    example = (torch.zeros(len(counts), max(counts), tower.num_mel_bins, dtype=dtype),
               torch.from_numpy(example["frame_counts"]), torch.from_numpy(example["row_index"]))
    shapes = ({0: Dim("clips"), 1: Dim("audio_frames")}, {0: Dim("clips")}, {0: Dim("audio_tokens")})
    return export_graph(tower, example, tower.input_names, tower.output_names, shapes, path)


def export_audio(hf_model, path: Path, dtype: torch.dtype) -> dict:
    """The audio component's graph at `path` (build/audio_stage.py); returns its config entries: the
    mel bins, the frames a clip may have (30 s: the extractor cuts there), the text width and the ids of
    the prompt's audio tokens (`<|audio>` + n x `<|audio|>` + `<audio|>`)."""
    tower = Gemma4AudioTower(hf_model, dtype)
    export_tower(tower, path, dtype)
    config = hf_model.config
    return {"num_mel_bins": tower.num_mel_bins, "window_frames": WINDOW_FRAMES, "out_hidden_size": tower.hidden_size,
            "audio_token_id": config.audio_token_id, "boa_token_id": config.boa_token_id,
            "eoa_token_id": config.eoa_token_index}

