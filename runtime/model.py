"""What decoding needs from an engine directory's base model: the engine, the embedding, the dims."""

from __future__ import annotations

import numpy as np

from trt_llm.schemas.graph_spec import FEATURES, TREE_MASK


class Model:
    def __init__(self, engine, embedding: np.ndarray, dims: dict, eos_token_ids: list[int],
                 max_positions: int | None = None, feature_width: int = 0):
        self.engine = engine
        self.embedding = embedding
        self.dims = dims
        self.eos = set(eos_token_ids)
        self.max_positions = max_positions  # rows of the rotary tables
        self.feature_width = feature_width  # > 0: an EAGLE base (tree_mask in, hidden_states out)

    @property
    def vocab_size(self) -> int:
        return self.dims["vocab_size"]

    def eagle_io(self, batch: int, seq: int) -> tuple[dict, dict]:
        """An EAGLE base's extra inputs/outputs for plain causal steps (the features are unused)."""
        if not self.feature_width:
            return {}, {}
        mask = np.broadcast_to(np.tril(np.ones((seq, seq), dtype=bool)), (batch, seq, seq)).copy()
        return {TREE_MASK: mask}, {FEATURES: np.empty((batch, seq, self.feature_width), self.embedding.dtype)}

    def new_cache(self, batch: int, capacity: int):
        # The engine owns its cache's memory (host arrays for ONNX Runtime, device buffers for TensorRT).
        return self.engine.new_cache(batch, capacity)
