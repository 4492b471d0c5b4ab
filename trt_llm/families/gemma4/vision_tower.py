"""Gemma 4's vision tower and `embed_vision` as our own forward pass over transformers' submodules:
the `vision/` component's graph (transformers 5.25, modeling_gemma4.py: Gemma4VisionModel and
Gemma4Model.get_image_features are the oracle).

Not SigLIP: images of any aspect arrive as 16 x 16 patches already cut (processor.py), each with its
(x, y) place in its image's patch grid. A patch is scaled to [-1, 1], projected, and given the sum
of a learned x row and y row of the position table; the layers are Gemma's (q/k/v norms, the value
norm without a weight, scale 1.0, four plain norms, gated MLP, clipped linears where
`use_clipped_linears`), with a 2-D axial rope (the head's first half turned by x, the second by y,
each half rotate-half) and bidirectional attention within each image.

The images are packed, not padded: the patches of all images one after another, segmented by
cu_seqlens, so the attention is our vision attention op (plugins/vision_attention.py: one segment
per image, nothing spent on padding; transformers pads every image to the budget's patch count and
masks the keys, which gives the same rows for the valid patches). Within an image the patches come
in *pooled order* (processor.py's tower_inputs): the k x k patches of each soft token consecutive,
the soft tokens row-major over the image's (W / k) x (H / k) grid. The encoder does not care about
order (positions travel with the patches, the attention is a set operation), and transformers'
average pooling by position (a one-hot matmul over the padded image) becomes a reshape and a mean
here, with the soft tokens in transformers' order (kernel index x / k + (W / k) * (y / k)).

Then, as transformers: pooled rows x sqrt(hidden) in float32, standardized ((x - std_bias) *
std_scale) where `standardize`, cast back, and embed_vision (weightless RMSNorm, Linear to the text
width).

Inputs:  pixel_values       [N, 3 * P * P] float   the patches (P = patch_size), images one after another,
                                                   each in pooled order, rescaled to [0, 1]
         pixel_position_ids [N, 2] int64           each patch's (x, y) in its image's patch grid
         cu_seqlens         [S + 1] int32          image boundaries in patches: 0, n0, n0 + n1, ...
Output:  image_embeds       [N / k^2, text hidden] the soft-token rows, image by image, in the order of the
                                                   prompt's image tokens (k = pooling_kernel_size)
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

import trt_llm.plugins.vision_attention  # noqa: F401 - registers torch.ops.trt_llm.vision_attention


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class _ClippedLinear(nn.Module):
    """transformers' Gemma4ClippableLinear with its four bounds read once as numbers: the graph then
    holds them as Clip constants, not as scalar buffers (torch.onnx's optimizer, torch 2.10, merges
    equal scalar initializers and leaves some Clip nodes naming ones that no longer exist), and an
    infinite bound (the default: no clip) adds no node."""

    def __init__(self, clippable):
        super().__init__()
        self.linear = clippable.linear
        clipped = clippable.use_clipped_linears
        self.bounds = [float(getattr(clippable, name)) if clipped else sign * float("inf")
                       for name, sign in (("input_min", -1), ("input_max", 1), ("output_min", -1), ("output_max", 1))]

    @staticmethod
    def _clip(x: Tensor, low: float, high: float) -> Tensor:
        if low == float("-inf") and high == float("inf"):
            return x
        return x.clamp(min=None if low == float("-inf") else low, max=None if high == float("inf") else high)

    def forward(self, x: Tensor) -> Tensor:
        return self._clip(self.linear(self._clip(x, *self.bounds[:2])), *self.bounds[2:])


class _Layer(nn.Module):
    """One encoder layer's submodules (Gemma4VisionEncoderLayer), its linears clipped as above."""

    def __init__(self, layer):
        super().__init__()
        attn, mlp = layer.self_attn, layer.mlp
        self.input_layernorm, self.post_attention_layernorm = layer.input_layernorm, layer.post_attention_layernorm
        self.pre_feedforward_layernorm = layer.pre_feedforward_layernorm
        self.post_feedforward_layernorm = layer.post_feedforward_layernorm
        self.q_norm, self.k_norm, self.v_norm = attn.q_norm, attn.k_norm, attn.v_norm
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            _ClippedLinear(p) for p in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj))
        self.gate_proj, self.up_proj, self.down_proj = (
            _ClippedLinear(p) for p in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))
        self.act_fn = mlp.act_fn
        self.scaling = float(attn.scaling)

    def mlp(self, x: Tensor) -> Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class Gemma4Tower(nn.Module):
    """The vision tower and embed_vision of a Gemma4ForConditionalGeneration (see the module docstring)."""

    def __init__(self, hf_model, dtype: torch.dtype):
        super().__init__()
        inner = hf_model.model
        vision, config = inner.vision_tower, hf_model.config.vision_config
        self.input_proj = vision.patch_embedder.input_proj
        self.position_table = vision.patch_embedder.position_embedding_table  # [2, size, D]: x rows, y rows
        self.layers = nn.ModuleList(_Layer(layer) for layer in vision.encoder.layers)
        self.standardize = bool(config.standardize)
        self.embed_vision = inner.embed_vision
        self.head_dim = config.head_dim
        if self.head_dim % 4:
            raise ValueError(f"vision_config.head_dim must be a multiple of 4 (the 2-D rope turns two halves "
                             f"of the head in pairs), got {self.head_dim}")
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.pooling = config.pooling_kernel_size
        self.root_hidden = config.hidden_size ** 0.5  # transformers' python float, as its pooler scales
        self.patch_size = config.patch_size
        self.to(dtype)
        self.dtype = dtype
        # float32 whatever the dtype, as transformers computes the rope angles and standardizes
        self.register_buffer("inv_freq", vision.encoder.rotary_emb.inv_freq.detach().clone().float())
        if self.standardize:
            self.register_buffer("std_bias", vision.std_bias.detach().clone().float())
            self.register_buffer("std_scale", vision.std_scale.detach().clone().float())

    def _rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos, sin [N, 1, head_dim]: transformers' axial layout x-x-y-y (its "recomposition")."""
        freqs = positions[..., None].float() * self.inv_freq  # [N, 2, head_dim / 4]
        fx, fy = freqs[:, 0], freqs[:, 1]
        angles = torch.cat([fx, fx, fy, fy], dim=-1)[:, None, :]
        return angles.cos().to(self.dtype), angles.sin().to(self.dtype)

    def _turn(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """The two halves of each head rotated on their own (apply_multidimensional_rope, ndim 2)."""
        half = self.head_dim // 2
        parts = [x[..., :half] * cos[..., :half] + _rotate_half(x[..., :half]) * sin[..., :half],
                 x[..., half:] * cos[..., half:] + _rotate_half(x[..., half:]) * sin[..., half:]]
        return torch.cat(parts, dim=-1)

    def _attention(self, layer, x: Tensor, cos: Tensor, sin: Tensor, cu_seqlens: Tensor) -> Tensor:
        n = x.shape[0]
        q = self._turn(layer.q_norm(layer.q_proj(x).view(n, -1, self.head_dim)), cos, sin)
        k = self._turn(layer.k_norm(layer.k_proj(x).view(n, -1, self.head_dim)), cos, sin)
        v = layer.v_norm(layer.v_proj(x).view(n, -1, self.head_dim))
        if self.kv_heads != self.heads:  # grouped keys: each shared by heads / kv_heads query heads (repeat_kv)
            k, v = (t.repeat_interleave(self.heads // self.kv_heads, dim=1) for t in (k, v))
        out = torch.ops.trt_llm.vision_attention(q, k, v, cu_seqlens, layer.scaling)
        return layer.o_proj(out.reshape(n, -1))

    def forward(self, pixel_values: Tensor, pixel_position_ids: Tensor, cu_seqlens: Tensor) -> Tensor:
        x = self.input_proj((2 * (pixel_values - 0.5)).to(self.dtype))
        x = x + (self.position_table[0][pixel_position_ids[:, 0]] + self.position_table[1][pixel_position_ids[:, 1]])
        cos, sin = self._rope(pixel_position_ids)
        for layer in self.layers:
            h = layer.post_attention_layernorm(self._attention(layer, layer.input_layernorm(x), cos, sin, cu_seqlens))
            x = x + h
            x = x + layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(x)))
        # each soft token's k x k patches are consecutive (pooled order): their mean, in float32 as
        # transformers pools and scales (sqrt(hidden) can pass float16's range before standardizing)
        k2 = self.pooling * self.pooling
        pooled = x.float().reshape(-1, k2, x.shape[-1]).mean(dim=1) * self.root_hidden
        if self.standardize:
            pooled = (pooled - self.std_bias) * self.std_scale
        return self.embed_vision(pooled.to(self.dtype))


# transformers' Gemma4ImageProcessorPil defaults, where a checkpoint ships no preprocessor_config.json
DEFAULT_PREPROCESSOR = {"gemma4_vl": {  # (by the family's name: build/vision_stage.py)
    "image_processor_type": "Gemma4ImageProcessor", "do_resize": True, "resample": 3, "do_rescale": True,
    "rescale_factor": 1 / 255, "do_normalize": False, "image_mean": [0.0, 0.0, 0.0], "image_std": [1.0, 1.0, 1.0],
    "do_convert_rgb": True, "patch_size": 16, "max_soft_tokens": 280, "pooling_kernel_size": 3}}
DEFAULT_PREPROCESSOR["gemma4"] = DEFAULT_PREPROCESSOR["gemma4_vl"]


def export_tower(tower: Gemma4Tower, path, dtype: torch.dtype):
    """The tower's graph at `path`: patches and images dynamic, so one graph takes any number and size
    of images. The patch count is declared k^2 x the soft tokens (the pooling's reshape needs it whole)."""
    from torch.export import Dim

    from trt_llm.build.export import export_graph

    k2 = tower.pooling * tower.pooling
    grids = [(2 * tower.pooling, tower.pooling), (tower.pooling, tower.pooling)]  # (width, height) in patches
    positions = [torch.stack(torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")[::-1], -1).reshape(-1, 2)
                 for w, h in grids]  # example positions (their order does not shape the graph)
    patches = sum(w * h for w, h in grids)
    example = (torch.zeros(patches, 3 * tower.patch_size ** 2, dtype=dtype), torch.cat(positions).long(),
               torch.tensor([0, grids[0][0] * grids[0][1], patches], dtype=torch.int32))
    n = k2 * Dim("soft_tokens")
    shapes = ({0: n}, {0: n}, {0: Dim("images_plus_one")})
    path = export_graph(tower, example, ["pixel_values", "pixel_position_ids", "cu_seqlens"], ["image_embeds"],
                        shapes, path)
    _rename_dim(path, f"{k2}*soft_tokens", "patches")
    return path


def _rename_dim(path, old: str, new: str) -> None:
    """The exporter names the derived patch dimension by its expression ("9*soft_tokens"): one plain
    name instead, so a TensorRT profile keys it as `patches` whatever the pooling."""
    import onnx

    model = onnx.load(path, load_external_data=False)
    graph = model.graph
    for info in [*graph.input, *graph.output, *graph.value_info]:
        for dim in info.type.tensor_type.shape.dim:
            if dim.dim_param == old:
                dim.dim_param = new
    onnx.save_model(model, path)


def export_vision(hf_model, path, dtype: torch.dtype) -> dict:
    """The vision component's graph at `path` (build/vision_stage.py); returns its config entries: the
    patch geometry, the position table's size (a patch grid side must stay under it) and the ids of the
    prompt's image tokens (`<|image>` + n x `<|image|>` + `<image|>`)."""
    tower = Gemma4Tower(hf_model, dtype)
    export_tower(tower, path, dtype)
    config = hf_model.config
    return {"patch_size": tower.patch_size, "pooling_kernel_size": tower.pooling, "merge_size": tower.pooling,
            "position_embedding_size": config.vision_config.position_embedding_size,
            "out_hidden_size": config.text_config.hidden_size, "image_token_id": config.image_token_id,
            "boi_token_id": config.boi_token_id, "eoi_token_id": config.eoi_token_id}
