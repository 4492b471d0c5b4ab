"""The vision tower of Qwen2.5-VL and Qwen3-VL as our own forward pass over transformers' weights: the
`vision/` component's graph.

transformers' tower cannot be exported as it is (its helpers loop over the grid's values, and its
attention splits q/k/v per image with `.tolist()`), so this module calls its submodules (patch
embedding, norms, MLPs, mergers) and writes the attention itself with our vision attention op
(plugins/vision_attention.py): bidirectional within each image or window, never a mask over all the
patches of a request. Everything that depends on the images' grid sizes comes in as inputs computed
by the runtime adapter (host.py), so one graph serves any number and size of images.

Inputs (N patches of a request, M = N / merge^2 image tokens):
    pixel_values    [N, C*T*P*P]  the image processor's patches, in merge-block order
    rotary_ids      [N, 2] int64  each patch's (row, column) in its image
    cu_seqlens      [S + 1] int32 full attention: one segment per image (frame)
    Qwen2.5-VL: window_index [M] int64, cu_window_seqlens [W + 1] int32 (window attention in the
                blocks not listed in fullatt_block_indexes)
    Qwen3-VL:   position_taps [N, 4] int64, position_weights [N, 4] float (the learned position table
                resampled to each grid)
Outputs: image_embeds [M, out_hidden] in the order of the image tokens; Qwen3-VL also deepstack_embeds
[k, M, out_hidden], the early layers' features the decoder adds after its first k layers.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

import trt_llm.plugins.vision_attention  # noqa: F401 - registers torch.ops.trt_llm.vision_attention


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class VisionAttention(nn.Module):
    """transformers' Qwen-VL vision attention (packed qkv, 2-D rotary in float32, then the output
    projection) with our op in the middle."""

    def __init__(self, hf_attention):
        super().__init__()
        self.qkv, self.proj = hf_attention.qkv, hf_attention.proj
        self.num_heads = hf_attention.num_heads
        self.scale = float(hf_attention.scaling)

    def forward(self, x: Tensor, cu_seqlens: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        n = x.shape[0]
        q, k, v = self.qkv(x).reshape(n, 3, self.num_heads, -1).unbind(1)
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
        q = (q.float() * cos + _rotate_half(q.float()) * sin).to(x.dtype)
        k = (k.float() * cos + _rotate_half(k.float()) * sin).to(x.dtype)
        out = torch.ops.trt_llm.vision_attention(q, k, v, cu_seqlens, self.scale)
        return self.proj(out.reshape(n, -1))


class VisionBlock(nn.Module):
    def __init__(self, hf_block):
        super().__init__()
        self.norm1, self.norm2, self.mlp = hf_block.norm1, hf_block.norm2, hf_block.mlp
        self.attn = VisionAttention(hf_block.attn)

    def forward(self, x: Tensor, cu_seqlens: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x), cu_seqlens, cos, sin)
        return x + self.mlp(self.norm2(x))


class VisionGraph(nn.Module):
    """The tower of a Qwen2_5_VLForConditionalGeneration / Qwen3VLForConditionalGeneration (see the
    module docstring for the inputs and outputs)."""

    def __init__(self, hf_visual, dtype: torch.dtype):
        super().__init__()
        config = hf_visual.config
        self.windowed = hasattr(hf_visual, "fullatt_block_indexes")  # Qwen2.5-VL
        self.full_attention = set(getattr(hf_visual, "fullatt_block_indexes", range(config.depth)))
        self.merge = config.spatial_merge_size
        self.unit = self.merge ** 2
        self.window_size = getattr(config, "window_size", 0)
        self.grid_per_side = int(getattr(config, "num_position_embeddings", 0) ** 0.5)
        self.patch_embed = hf_visual.patch_embed
        self.blocks = nn.ModuleList(VisionBlock(b) for b in hf_visual.blocks)
        self.merger = hf_visual.merger
        self.register_buffer("inv_freq", hf_visual.rotary_pos_emb.inv_freq.detach().float().clone())
        self.pos_embed = getattr(hf_visual, "pos_embed", None)  # Qwen3-VL's learned table
        self.deepstack_layers = list(getattr(hf_visual, "deepstack_visual_indexes", []))
        self.deepstack_mergers = getattr(hf_visual, "deepstack_merger_list", nn.ModuleList())
        self.to(dtype)
        self.inv_freq = self.inv_freq.float()  # the rotary angles stay float32, as in transformers

    @property
    def input_names(self) -> list[str]:
        extra = ["window_index", "cu_window_seqlens"] if self.windowed else ["position_taps", "position_weights"]
        return ["pixel_values", "rotary_ids", "cu_seqlens", *extra]

    @property
    def output_names(self) -> list[str]:
        return ["image_embeds"] + (["deepstack_embeds"] if self.deepstack_layers else [])

    def _by_window(self, x: Tensor, window_index: Tensor) -> Tensor:
        """Rows of x regrouped so each window's merge blocks are together (transformers' order)."""
        return x.reshape(-1, self.unit, x.shape[-1])[window_index].reshape(-1, x.shape[-1])

    def forward(self, pixel_values: Tensor, rotary_ids: Tensor, cu_seqlens: Tensor, *extra: Tensor):
        x = self.patch_embed(pixel_values)
        freqs = rotary_ids.unsqueeze(-1).float() * self.inv_freq  # [N, 2, D/4]
        angles = torch.cat([freqs[:, 0], freqs[:, 1]], dim=-1)
        angles = torch.cat([angles, angles], dim=-1)  # [N, D]
        if self.windowed:
            window_index, cu_window_seqlens = extra
            x, angles = self._by_window(x, window_index), self._by_window(angles, window_index)
        else:
            taps, weights = extra
            x = x + (self.pos_embed(taps) * weights.unsqueeze(-1)).sum(1).to(x.dtype)
        cos, sin = angles.cos(), angles.sin()
        deepstack = []
        for i, block in enumerate(self.blocks):
            segments = cu_seqlens if not self.windowed or i in self.full_attention else cu_window_seqlens
            x = block(x, segments, cos, sin)
            if i in self.deepstack_layers:
                deepstack.append(self.deepstack_mergers[self.deepstack_layers.index(i)](x))
        embeds = self.merger(x)
        if self.windowed:  # back to the image tokens' order
            order = torch.arange(window_index.shape[0], device=window_index.device)
            embeds = embeds[torch.empty_like(window_index).scatter_(0, window_index, order)]
        if deepstack:
            return embeds, torch.stack(deepstack)
        return embeds


# The image processor's settings where a checkpoint ships none (transformers' class defaults are
# Qwen2-VL's, patch 14; Qwen3-VL uses 16 with mean/std 0.5).
DEFAULT_PREPROCESSOR = {
    "qwen2_5_vl": {"patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
                   "image_mean": [0.48145466, 0.4578275, 0.40821073],
                   "image_std": [0.26862954, 0.26130258, 0.27577711], "min_pixels": 3136, "max_pixels": 12845056},
    "qwen3_vl": {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
                 "image_std": [0.5, 0.5, 0.5], "size": {"shortest_edge": 65536, "longest_edge": 16777216}},
}
DEFAULT_PREPROCESSOR["qwen3_5_vl"] = DEFAULT_PREPROCESSOR["qwen3_vl"]  # (Qwen3.5's processor is Qwen3-VL's)


def host_adapter(graph: VisionGraph):
    """The runtime adapter of this tower (host.py): its grid-dependent inputs."""
    from trt_llm.families.qwen_vl.host import InterpolatedTower, WindowedTower

    if graph.windowed:
        return WindowedTower(graph.merge, graph.window_size, graph.patch_embed.patch_size)
    return InterpolatedTower(graph.merge, graph.grid_per_side)


def export_tower(graph: VisionGraph, path, dtype: torch.dtype):
    """The tower's graph at `path`: patches, segments and windows all dynamic, so one graph takes any
    number and size of images. Its example inputs are the runtime adapter's own (host.py)."""
    from torch.export import Dim

    from trt_llm.build.export import export_graph

    config_grid = [(1, 8, 12), (1, 4, 4)]  # 112 patches, 28 tokens, 2 images: distinct example sizes
    visual = graph.patch_embed
    width = visual.in_channels * visual.temporal_patch_size * visual.patch_size ** 2
    patches = sum(t * h * w for t, h, w in config_grid)
    feeds = host_adapter(graph).feeds(config_grid)
    example = [torch.zeros(patches, width, dtype=dtype)] + [torch.from_numpy(feeds[name])
                                                            for name in graph.input_names[1:]]
    n, segments = Dim("patches"), Dim("segments_plus_one")
    shapes = [{0: n}, {0: n}, {0: segments}]
    if graph.windowed:
        shapes += [{0: Dim("image_tokens")}, {0: Dim("windows_plus_one")}]
    else:
        shapes += [{0: n}, {0: n}]
    # forward(pixel_values, rotary_ids, cu_seqlens, *extra): *extra is one entry holding a tuple
    return export_graph(graph, tuple(example), graph.input_names, graph.output_names,
                        (*shapes[:3], tuple(shapes[3:])), path)


def export_vision(hf_model, path, dtype: torch.dtype) -> dict:
    """The vision component's graph at `path` (build/vision_stage.py); returns its config entries."""
    graph = VisionGraph(hf_model.model.visual, dtype)
    export_tower(graph, path, dtype)
    config = hf_model.config
    return {"patch_size": graph.patch_embed.patch_size, "temporal_patch_size": graph.patch_embed.temporal_patch_size,
            "in_channels": graph.patch_embed.in_channels, "merge_size": graph.merge,
            "window_size": graph.window_size, "grid_per_side": graph.grid_per_side,
            "out_hidden_size": config.vision_config.out_hidden_size,
            "deepstack_layers": len(graph.deepstack_layers), "image_token_id": config.image_token_id,
            "video_token_id": getattr(config, "video_token_id", None),
            "vision_start_token_id": config.vision_start_token_id}
