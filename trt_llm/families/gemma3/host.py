"""The Gemma 3 vision component at run time (torch-free): its image processor (an image squeezed to one
square frame, and its pan-and-scan crops when the image part or the processor config asks: processor.py,
prompt.py), its graph's
host inputs (none: the frames are the batch) and its prompt layout (prompt.py), made from the
component's config.json (vision_tower.export_vision)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SoftTokenTower:
    image_size: int
    patch_size: int
    pooling: int  # patches a side per soft token
    tile_tokens: int  # K: soft tokens per frame (mm_tokens_per_image)
    max_image_tokens: int  # per image (the build's vision.max_image_tokens_per_image)
    image_token_id: int  # <image_soft_token>
    boi_token_id: int  # <start_of_image>: the chat template's one per image
    eoi_token_id: int
    pan_and_scan = True  # (not a field) an image part may ask for crops: prompt.py cuts them

    @classmethod
    def from_settings(cls, settings: dict) -> "SoftTokenTower":
        return cls(settings["image_size"], settings["patch_size"], settings["merge_size"], settings["tile_tokens"],
                   settings["max_image_tokens_per_image"], settings["image_token_id"], settings["boi_token_id"],
                   settings["eoi_token_id"])

    @staticmethod
    def tensorrt_profile(config, settings: dict) -> dict[str, tuple[int, int, int]]:
        """The tower's plan: from one frame to as many as the build's max_image_tokens a request fill;
        opt is one image with 4 pan-and-scan crops (the processor's default most)."""
        frames = max(1, config.vision.max_image_tokens // settings["tile_tokens"])
        return {"frames": (1, min(frames, 5), frames)}

    def image_processor(self, preprocessor: dict):
        """The checkpoint's image processor (runtime/media/vision/encoder.py asks its adapter for one),
        one frame a picture: a pan-and-scan crop is a picture of its own (prompt.py)."""
        import dataclasses

        from trt_llm.families.gemma3.processor import Gemma3ImageProcessor

        processor = Gemma3ImageProcessor.from_config(preprocessor, self.image_size, self.patch_size, self.pooling)
        return dataclasses.replace(processor, do_pan_and_scan=False)

    def feeds(self, grids: list[tuple[int, int, int]]) -> dict[str, np.ndarray]:
        return {}  # the frames are the graph's batch: nothing depends on the images' sizes

    def attach_images(self, vision, messages, prompt, tokenizer, media_dir, where, max_input_len):
        """The prompt expansion (runtime/media/vision/prompt.py hands an engine's prompts to it)."""
        from trt_llm.families.gemma3.prompt import attach_images

        return attach_images(self, vision, messages, prompt, tokenizer, media_dir, where, max_input_len)
