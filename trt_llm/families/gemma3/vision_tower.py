"""Gemma 3's vision tower as our own forward pass over transformers' submodules: the `vision/`
component's graph. A SigLIP encoder (trt_llm/families/siglip.py) over square frames of
`image_size` pixels (896 in the published checkpoints: 64 x 64 patches of 14), then the multimodal
projector: each frame's patches average-pooled `pooling` x `pooling` into mm_tokens_per_image soft
tokens (256), Gemma's RMSNorm and the projection to the text width.

Every frame is whole (an image squeezed to the square, or one of its pan-and-scan crops), so the frames
are the graph's batch and every frame's position ids are the same: the position embedding is a
constant table here, as transformers' SiglipVisionEmbeddings reads it for a full frame.

Input:  pixel_values [F, 3, S, S]  the processor's frames (trt_llm/families/gemma3/processor.py)
Output: image_embeds [F * K, text hidden], K = mm_tokens_per_image rows per frame, frame by frame.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from trt_llm.families.siglip import SiglipEncoder


class SquareTower(nn.Module):
    """The tower and projector of a Gemma3ForConditionalGeneration (see the module docstring)."""

    def __init__(self, hf_model, dtype: torch.dtype):
        super().__init__()
        inner = hf_model.model
        vision = getattr(inner.vision_tower, "vision_model", inner.vision_tower)  # (transformers 5: the model itself)
        embeddings = vision.embeddings
        self.patch_embedding = embeddings.patch_embedding
        self.register_buffer("positions", embeddings.position_embedding.weight.detach()[embeddings.position_ids[0]].clone())
        self.encoder = SiglipEncoder(vision.encoder.layers)
        self.post_layernorm = vision.post_layernorm
        self.projector = inner.multi_modal_projector
        config = hf_model.config
        self.image_size, self.patch_size = config.vision_config.image_size, config.vision_config.patch_size
        self.frame_tokens = config.mm_tokens_per_image
        self.pooling = self.projector.kernel_size
        self.to(dtype)

    def forward(self, pixel_values: Tensor) -> Tensor:
        x = self.patch_embedding(pixel_values).flatten(2).transpose(1, 2) + self.positions  # [F, L, D]
        x = self.projector(self.post_layernorm(self.encoder(x)))  # pooled, normed, projected: [F, K, H]
        return x.reshape(-1, x.shape[-1])


# transformers' Gemma3ImageProcessor defaults, where a checkpoint ships no preprocessor_config.json (the
# frame's size is then the tower's image_size)
DEFAULT_PREPROCESSOR = {"gemma3": {
    "resample": 2, "do_rescale": True, "rescale_factor": 1 / 255,
    "do_normalize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_convert_rgb": True,
    "do_pan_and_scan": False, "pan_and_scan_min_crop_size": 256, "pan_and_scan_max_num_crops": 4,
    "pan_and_scan_min_ratio_to_activate": 1.2}}


def export_vision(hf_model, path, dtype: torch.dtype) -> dict:
    """The vision component's graph at `path` (build/vision_stage.py, any number of frames); returns
    its config entries: the frame geometry and the ids of the prompt's image tokens (host.py)."""
    from torch.export import Dim

    from trt_llm.build.export import export_graph

    tower = SquareTower(hf_model, dtype)
    example = torch.zeros(2, 3, tower.image_size, tower.image_size, dtype=dtype)
    export_graph(tower, (example,), ["pixel_values"], ["image_embeds"], ({0: Dim("frames")},), path)
    config = hf_model.config
    return {"image_size": tower.image_size, "patch_size": tower.patch_size,
            "patches_per_side": tower.image_size // tower.patch_size,
            # the encoder counts a frame's tokens as its patches over merge_size^2 (the pooling)
            "merge_size": tower.pooling, "tile_tokens": tower.frame_tokens,
            "out_hidden_size": config.text_config.hidden_size,
            "image_token_id": config.image_token_id, "boi_token_id": config.boi_token_index,
            "eoi_token_id": config.eoi_token_index}
