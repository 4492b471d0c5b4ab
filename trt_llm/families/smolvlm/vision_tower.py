"""The SigLIP vision tower and pixel-shuffle connector of SmolVLM / Idefics3 as our own forward pass
over transformers' submodules: the `vision/` component's graph.

Every frame the image processor makes (each tile of a split image, and its global view) is one
square of `image_size` pixels, all of the same size, so the graph takes them as a batch of frames
and attends within each frame with plain batched attention: no mask, no per-image segments, no host
inputs beyond the pixels. transformers' tower takes a pixel mask for padded frames; the processor
never pads a frame it sends (a split image's tiles and its global view are whole squares), so the
mask is all ones and the position ids are the same for every frame: computed here once, as
transformers' embeddings compute them for a full frame, and kept as a constant table.

Input:  pixel_values [F, C, S, S]  the processor's frames, S = vision_config.image_size
Output: image_embeds [F * K, text hidden], K = (S / patch)^2 / scale_factor^2 rows per frame, in the
        order of the prompt's `<image>` tokens (frame by frame).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from trt_llm.families.siglip import SiglipEncoder


def full_frame_position_ids(embeddings) -> Tensor:
    """transformers' SmolVLMVisionEmbeddings / Idefics3VisionEmbeddings position ids for one frame
    whose patches are all valid (the same ops, so the same buckets)."""
    per_side = embeddings.num_patches_per_side
    boundaries = torch.arange(1 / per_side, 1.0, 1 / per_side)
    step = 1.0 / torch.tensor([per_side])
    coords = torch.clamp(torch.arange(per_side, dtype=torch.float32)[None, :] * step[:, None], max=1.0 - 1e-6)
    buckets = torch.bucketize(coords, boundaries, right=True)[0]
    return (buckets[:, None] * per_side + buckets[None, :]).reshape(-1)


class TiledTower(nn.Module):
    """The tower and connector of a SmolVLMForConditionalGeneration / Idefics3ForConditionalGeneration
    (see the module docstring for the input and output)."""

    def __init__(self, hf_model, dtype: torch.dtype):
        super().__init__()
        inner = hf_model.model
        vision = inner.vision_model
        self.patch_embedding = vision.embeddings.patch_embedding
        positions = full_frame_position_ids(vision.embeddings)
        self.register_buffer("positions", vision.embeddings.position_embedding.weight.detach()[positions].clone())
        self.encoder = SiglipEncoder(vision.encoder.layers)
        self.post_layernorm = vision.post_layernorm
        self.connector = inner.connector
        config = hf_model.config
        self.image_size, self.patch_size = config.vision_config.image_size, config.vision_config.patch_size
        self.scale_factor = config.scale_factor
        self.tile_tokens = (self.image_size // self.patch_size) ** 2 // self.scale_factor ** 2
        self.to(dtype)

    def forward(self, pixel_values: Tensor) -> Tensor:
        x = self.patch_embedding(pixel_values).flatten(2).transpose(1, 2) + self.positions  # [F, L, D]
        x = self.encoder(x)
        x = self.connector(self.post_layernorm(x))  # pixel shuffle, then the projection: [F, K, H]
        return x.reshape(-1, x.shape[-1])


# The image processor's settings where a checkpoint ships none: transformers' SmolVLM / Idefics3 class
# defaults (tiles of 364 pixels, images brought to 4 tiles a side, Lanczos, mean and std 0.5).
DEFAULT_PREPROCESSOR = {
    name: {"do_image_splitting": True, "max_image_size": {"longest_edge": 364}, "size": {"longest_edge": 4 * 364},
           "resample": 1, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "rescale_factor": 1 / 255}
    for name in ("smolvlm", "idefics3")
}


def export_tower(tower: TiledTower, path, dtype: torch.dtype):
    """The tower's graph at `path`, any number of frames."""
    from torch.export import Dim

    from trt_llm.build.export import export_graph

    example = torch.zeros(2, 3, tower.image_size, tower.image_size, dtype=dtype)
    return export_graph(tower, (example,), ["pixel_values"], ["image_embeds"], ({0: Dim("frames")},), path)


def export_vision(hf_model, path, dtype: torch.dtype) -> dict:
    """The vision component's graph at `path` (build/vision_stage.py); returns its config entries:
    the frame geometry and the prompt's special tokens (host.py)."""
    from trt_llm.families.smolvlm.tokens import special_token_ids

    tower = TiledTower(hf_model, dtype)
    export_tower(tower, path, dtype)
    side = tower.image_size // tower.patch_size
    return {"image_size": tower.image_size, "patch_size": tower.patch_size, "patches_per_side": side,
            # a frame is `merge_size`^2 patches a row, as Qwen's merge blocks: the encoder counts so
            "merge_size": tower.scale_factor, "tile_tokens": tower.tile_tokens,
            "out_hidden_size": hf_model.config.text_config.hidden_size,
            "image_token_id": hf_model.config.image_token_id,
            **special_token_ids(hf_model.config)}
