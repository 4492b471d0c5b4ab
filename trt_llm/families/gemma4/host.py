"""The Gemma 4 vision component at run time (torch-free): its image processor (processor.py: an image
resized for its soft-token budget, cut in 16-pixel patches), its graph's host inputs (each patch's (x, y)
and each image's bounds, from the images' grids) and its prompt layout, made from the component's
config.json (vision_tower.export_vision).

The processor gives each image's patches in pooled order: the k x k patches of each soft token together,
soft tokens row by row (the graph pools by a reshape); `feeds` gives the positions in that same order.

Prompt: the chat template writes one `<|image|>` per image part, and transformers' Gemma4Processor makes
it `<|image>` + n x `<|image|>` + `<image|>` (n: the image's soft tokens); all three are special tokens,
so the widening is made on the token ids. Each image's soft tokens are one run that sees itself both
ways on the decoder's sliding layers (the face's bidirectional_images, when the config asks for it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


class _Patches(NamedTuple):
    pixel_values: np.ndarray  # [patches, 3 * P * P], every image's in pooled order
    image_grid_thw: np.ndarray  # [images, 3]: (1, rows, columns) of patches


@dataclass(frozen=True)
class _Processor:
    """The encoder's view of the image processor: each picture's grid, and its patches."""
    processor: object  # processor.Gemma4ImageProcessor

    def grid_thw(self, height: int, width: int) -> tuple[int, int, int]:
        rows, columns = self.processor.target_size(height, width)
        return 1, rows // self.processor.patch_size, columns // self.processor.patch_size

    def preprocess(self, pictures: list) -> _Patches:
        inputs = self.processor.tower_inputs(pictures)
        grids = [self.grid_thw(p.height, p.width) for p in pictures]
        return _Patches(inputs.pixel_values, np.asarray(grids, np.int64).reshape(-1, 3))


def pooled_positions(rows: int, columns: int, k: int) -> np.ndarray:
    """(x, y) of a grid's patches in pooled order [rows * columns, 2] (processor.tower_inputs' order)."""
    x, y = np.meshgrid(np.arange(columns), np.arange(rows), indexing="xy")
    places = np.stack([x, y], axis=-1).reshape(-1, 2)
    order = np.arange(rows * columns).reshape(rows // k, k, columns // k, k).transpose(0, 2, 1, 3).reshape(-1)
    return places[order].astype(np.int64)


@dataclass(frozen=True)
class PatchTower:
    patch_size: int
    pooling: int  # k: patches a side per soft token
    position_table: int  # position_embedding_size: a grid side must stay under it
    max_image_tokens: int  # per image (the build's vision.max_image_tokens_per_image)
    image_token_id: int  # <|image|>
    boi_token_id: int  # <|image>
    eoi_token_id: int  # <image|>

    @classmethod
    def from_settings(cls, settings: dict) -> "PatchTower":
        return cls(settings["patch_size"], settings["merge_size"], settings["position_embedding_size"],
                   settings["max_image_tokens_per_image"], settings["image_token_id"], settings["boi_token_id"],
                   settings["eoi_token_id"])

    @staticmethod
    def tensorrt_profile(config, settings: dict) -> dict[str, tuple[int, int, int]]:
        """Up to vision.max_image_tokens soft tokens a request (k^2 patches each), in up to that many images."""
        area, tokens = settings["merge_size"] ** 2, config.vision.max_image_tokens
        return {"patches": (area, min(tokens, 280) * area, tokens * area),
                "images_plus_one": (2, 2, min(tokens, 64) + 1)}

    def image_processor(self, preprocessor: dict):
        """The checkpoint's image processor (runtime/media/vision/encoder.py asks its adapter for one)."""
        from trt_llm.families.gemma4.processor import Gemma4ImageProcessor

        return _Processor(Gemma4ImageProcessor.from_config(preprocessor))

    def feeds(self, grids: list[tuple[int, int, int]]) -> dict[str, np.ndarray]:
        for _, rows, columns in grids:
            if max(rows, columns) >= self.position_table:
                raise ValueError(f"an image of {rows} x {columns} patches: past the tower's position table "
                                 f"({self.position_table} a side)")
        positions = [pooled_positions(rows, columns, self.pooling) for _, rows, columns in grids]
        bounds = np.cumsum([0] + [len(p) for p in positions]).astype(np.int32)
        return {"pixel_position_ids": np.concatenate(positions) if positions else np.zeros((0, 2), np.int64),
                "cu_seqlens": bounds}

    def attach_images(self, vision, messages, prompt, tokenizer, media_dir, where, max_input_len):
        """The prompt expansion (runtime/media/vision/prompt.py hands an engine's prompts to it)."""
        from trt_llm.runtime.media.sequence_media import SequenceMedia
        from trt_llm.runtime.media.vision.prompt import pending_images

        parts, pending, counts = pending_images(vision, messages, prompt.token_ids, self.image_token_id, media_dir,
                                                where)
        for (m, c, _), count in zip(parts, counts):
            if count > self.max_image_tokens:
                raise ValueError(f"{where}.messages[{m}].content[{c}]: the image takes {count} soft tokens, more than "
                                 f"the engine's max_image_tokens_per_image {self.max_image_tokens}")
        ids, starts, images = [], [], iter(counts)
        for token in prompt.token_ids:
            if token != self.image_token_id:
                ids.append(token)
                continue
            count = next(images)
            starts.append(len(ids) + 1)
            ids += [self.boi_token_id] + [self.image_token_id] * count + [self.eoi_token_id]
        if len(ids) > max_input_len:
            raise ValueError(f"{where}: prompt is {len(ids)} tokens with its images' {sum(counts)}, longer than the "
                             f"engine's max_input_len {max_input_len}")
        rows = list(zip(starts, vision.encode(pending)))
        return ids, SequenceMedia(rows, None, keys=tuple(image.key for image in pending))
