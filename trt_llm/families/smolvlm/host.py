"""The SmolVLM / Idefics3 vision component at run time (torch-free): its image processor (frames of
one size: processor.py), its graph's host inputs (none: the frames are the batch) and its prompt
layout (prompt.py), made from the component's config.json (vision_tower.export_vision)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TiledTower:
    image_size: int
    patch_size: int
    merge: int  # the connector's scale_factor
    tile_tokens: int  # K: rows per frame
    max_image_tokens: int  # per image (the build's vision.max_image_tokens_per_image)
    image_token_id: int
    fake_token_id: int
    global_token_id: int
    row_col_ids: dict  # "r,c" -> id of <row_r_col_c>
    newline_ids: tuple
    double_newline_ids: tuple

    @classmethod
    def from_settings(cls, settings: dict) -> "TiledTower":
        return cls(settings["image_size"], settings["patch_size"], settings["merge_size"], settings["tile_tokens"],
                   settings["max_image_tokens_per_image"], settings["image_token_id"], settings["fake_token_id"],
                   settings["global_token_id"], dict(settings["row_col_ids"]), tuple(settings["newline_ids"]),
                   tuple(settings["double_newline_ids"]))

    @staticmethod
    def tensorrt_profile(config, settings: dict) -> dict[str, tuple[int, int, int]]:
        """The tower's plan: from one frame to as many as the build's max_image_tokens a request fill;
        opt is one image split 4 x 4 with its global view (SmolVLM2's largest)."""
        frames = max(1, config.vision.max_image_tokens // settings["tile_tokens"])
        return {"frames": (1, min(frames, 17), frames)}

    def image_processor(self, preprocessor: dict):
        """The checkpoint's image processor (runtime/media/vision/encoder.py asks its adapter for one)."""
        from trt_llm.families.smolvlm.processor import TileProcessor

        return TileProcessor.from_config(preprocessor, self.image_size, self.patch_size, self.merge,
                                         self.max_image_tokens)

    def feeds(self, grids: list[tuple[int, int, int]]) -> dict[str, np.ndarray]:
        return {}  # the frames are the graph's batch: nothing depends on the images' sizes

    def attach_images(self, vision, messages, prompt, tokenizer, media_dir, where, max_input_len):
        """The prompt expansion (runtime/media/vision/prompt.py hands an engine's prompts to it)."""
        from trt_llm.families.smolvlm.prompt import attach_images

        return attach_images(self, vision, messages, prompt.token_ids, media_dir, where, max_input_len)
