"""The Qwen vision towers at run time: each tower's host inputs for a batch of images' patch grids
(vision_tower.py's graph takes them; their values depend on the grids, which the graph cannot loop
over). Qwen2.5-VL attends within windows of patches (window_index, cu_window_seqlens), Qwen3-VL
interpolates learned position embeddings (position_taps, position_weights)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trt_llm.families.qwen_vl import grid as vision_grid


@dataclass(frozen=True)
class _Tower:
    merge: int  # merge_size: patches per side of one decoder row

    def feeds(self, grids: list[tuple[int, int, int]]) -> dict[str, np.ndarray]:
        return {"rotary_ids": vision_grid.rotary_position_ids(grids, self.merge),
                "cu_seqlens": vision_grid.cu_seqlens(grids), **self._positions(grids)}

    @staticmethod
    def tensorrt_profile(config, settings: dict) -> dict[str, tuple[int, int, int]]:
        """The tower's plan: up to `vision.max_image_tokens` image tokens a request (x merge^2
        patches), in up to that many images or windows."""
        merge, tokens = settings["merge_size"], config.vision.max_image_tokens
        bounds = (2, min(tokens, 64) + 1, tokens + 1)  # segment and window boundaries: count + 1
        return {"patches": (merge * merge, min(tokens, 1024) * merge * merge, tokens * merge * merge),
                "image_tokens": (1, min(tokens, 1024), tokens), "segments_plus_one": bounds,
                "windows_plus_one": bounds}


@dataclass(frozen=True)
class WindowedTower(_Tower):
    """Qwen2.5-VL's runtime adapter."""
    window_size: int
    patch_size: int
    # A video is one run of tokens, its temporal positions scaled (runtime/media/video/sampling.py)
    video_timestamps = False

    @classmethod
    def from_settings(cls, settings: dict) -> "WindowedTower":
        return cls(settings["merge_size"], settings["window_size"], settings["patch_size"])

    def _positions(self, grids):
        window_index, cu_window_seqlens = vision_grid.window_index(grids, self.merge, self.window_size,
                                                                   self.patch_size)
        return {"window_index": window_index, "cu_window_seqlens": cu_window_seqlens}


@dataclass(frozen=True)
class InterpolatedTower(_Tower):
    """Qwen3-VL's runtime adapter (and Qwen3.5's: the same tower without deepstack)."""
    grid_per_side: int
    video_timestamps = True  # each temporal patch its own run after its `<t seconds>`

    @classmethod
    def from_settings(cls, settings: dict) -> "InterpolatedTower":
        return cls(settings["merge_size"], settings["grid_per_side"])

    def _positions(self, grids):
        taps, weights = vision_grid.interpolation_taps(grids, self.grid_per_side, self.merge)
        return {"position_taps": taps, "position_weights": weights}
