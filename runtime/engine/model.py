"""What decoding needs from an engine directory's base model: the engine, the embedding, the dims."""

from __future__ import annotations

import numpy as np

from trt_llm.schemas.graph_spec import DEEPSTACK, FEATURES, FINAL_HIDDEN, PER_LAYER_INPUTS, TREE_MASK


class Model:
    def __init__(self, engine, embedding: np.ndarray, dims: dict, eos_token_ids: list[int],
                 max_positions: int | None = None, feature_width: int = 0, mrope: bool = False,
                 deepstack: int = 0, long_rope: tuple[int, int] | None = None, bidirectional_block: int = 0,
                 per_layer=None, feature_output: str = FEATURES):
        self.engine = engine
        self.embedding = embedding
        # Gemma 4: the per-layer table (runtime/backends/embedding.py), whose rows of the new tokens the
        # graph takes beside their embeddings (per_layer_inputs); None: the model has none
        self.per_layer = per_layer
        self.dims = dims
        self.eos = set(eos_token_ids)
        self.max_positions = max_positions  # rows of the rotary tables
        self.feature_width = feature_width  # > 0: a draft reads the base's features (decoding/draft.py) ...
        self.feature_output = feature_output  # ... this output: an EAGLE base's taps (with a tree_mask
        # input), or an MTP head's base's final_hidden_states (a causal graph: its drafts are chains)
        self.tree_input = feature_width > 0 and feature_output == FEATURES
        self.mrope = mrope  # a vision-language decoder: position_ids [3, B, S]
        self.deepstack = deepstack  # Qwen3-VL: its first k layers take deepstack_embeds [k, B, S, H]
        # LongRoPE (Phi-3): (original context, first long row): a longer sequence reads the long tables
        self.long_rope = long_rope
        # Gemma 3: each image's soft tokens (runs of at most this many) see each other both ways, through
        # the graph's tree_mask; 0: the prompt is causal
        self.bidirectional_block = bidirectional_block

    def embed(self, token_ids: np.ndarray) -> tuple[np.ndarray, dict]:
        """The rows of token_ids [B, S] (inputs_embeds) and the inputs that come with each token: Gemma
        4's per-layer rows. (An image's or a clip's tokens look up the pad row there: the build wrote it
        into theirs, as transformers looks up pad for them.)"""
        extras = {}
        if self.per_layer is not None:
            extras[PER_LAYER_INPUTS] = self.per_layer[token_ids]
        return self.embedding[token_ids], extras

    @property
    def positions_vary(self) -> bool:
        """Whether position_ids are more than each token's index (mRoPE, LongRoPE's long rows)."""
        return self.mrope or self.long_rope is not None

    def long_context(self, sequence, past: int, width: int) -> bool:
        """LongRoPE: whether a row turns by the long factors. transformers picks them per forward, when
        its sequence is longer than the original context: a prompt's prefill by the whole prompt (so
        every chunk of it here), a decode step by all the tokens so far."""
        length = sequence.length if sequence is not None else past + width
        return self.long_rope is not None and length > self.long_rope[0]

    def positions(self, sequences, past: np.ndarray, width: int) -> np.ndarray:
        """The position_ids of a step whose row b computes tokens past[b] .. past[b] + width - 1 of
        sequences[b]: [B, S], or [3, B, S] for mRoPE (a row without images: its token indices)."""
        flat = past[:, None] + np.arange(width, dtype=np.int32)[None, :]
        if self.long_rope is not None:
            for row, s in enumerate(sequences):
                if self.long_context(s, int(past[row]), width):
                    flat[row] += self.long_rope[1]
        if not self.mrope:
            return flat
        out = np.broadcast_to(flat, (3, *flat.shape)).copy()
        for row, s in enumerate(sequences):
            media = getattr(s, "media", None)
            if media is not None:
                out[:, row] = media.rope.rows(int(past[row]), width)
        return out

    def media_inputs(self, sequences, embeds: np.ndarray, past: np.ndarray, lengths: np.ndarray) -> dict:
        """Prefill: each row's image rows written into `embeds` [B, S, H] over its prompt tokens
        past .. past + length - 1; returns the deepstack input when the decoder takes one, and the
        tree_mask when its images' tokens see each other both ways."""
        extras = {}
        deepstack = None
        if self.deepstack:
            deepstack = extras[DEEPSTACK] = np.zeros((self.deepstack, *embeds.shape), embeds.dtype)
        for row, s in enumerate(sequences):
            media = getattr(s, "media", None)
            if media is not None:
                media.write_rows(embeds[row], None if deepstack is None else deepstack[:, row],
                                 int(past[row]), int(lengths[row]))
        if self.bidirectional_block:
            extras[TREE_MASK] = self._image_blocks_mask(sequences, past, embeds.shape[1])
        return extras

    def _image_blocks_mask(self, sequences, past: np.ndarray, width: int) -> np.ndarray:
        """[B, S, S]: causal, and each image's tokens in this pass see all of its tokens in it
        (transformers' Gemma 3: OR(causal, same image); a pass never splits an image: whole_images)."""
        mask = np.broadcast_to(np.tril(np.ones((width, width), dtype=bool)), (len(sequences), width, width)).copy()
        for row, s in enumerate(sequences):
            media = getattr(s, "media", None)
            for first, tokens in media.blocks() if media is not None else ():
                a, b = max(first - int(past[row]), 0), min(first + tokens - int(past[row]), width)
                if a < b:
                    mask[row, a:b, a:b] = True
        return mask

    def whole_images(self, sequence, start: int, take: int) -> int:
        """How many of a prompt's tokens from `start` a pass computes when `take` are asked for: an
        image whose tokens see each other both ways is never split. A pass that would end inside one
        ends before it, or, when it begins inside or at it (a restored prefix may end there), after it."""
        media = getattr(sequence, "media", None)
        if not self.bidirectional_block or media is None or take <= 0:  # (a row given nothing this pass waits)
            return take
        end = start + take
        for first, tokens in media.blocks():
            if first < end < first + tokens:
                end = first if first > start else first + tokens
        return end - start

    def decode_extras(self, batch: int, width: int = 1) -> dict:
        """A decode step's deepstack input (zeros: generated tokens are text) and tree_mask (causal: a
        step of `width` generated tokens, prompt lookup's verification, sees no image)."""
        extras = {}
        if self.deepstack:
            extras[DEEPSTACK] = np.zeros((self.deepstack, batch, width, self.dims["hidden_size"]), self.embedding.dtype)
        if self.bidirectional_block:
            extras[TREE_MASK] = np.broadcast_to(np.tril(np.ones((width, width), dtype=bool)), (batch, width, width)).copy()
        return extras

    @property
    def vocab_size(self) -> int:
        return self.dims["vocab_size"]

    def eagle_io(self, batch: int, seq: int) -> tuple[dict, dict]:
        """A drafted base's extra inputs/outputs for plain causal steps: an EAGLE base's tree_mask, and
        the features (which a prefill's draft reads; elsewhere unused)."""
        if not self.feature_width:
            return {}, {}
        outputs = {self.feature_output: np.empty((batch, seq, self.feature_width), self.embedding.dtype)}
        if not self.tree_input:
            return {}, outputs
        mask = np.broadcast_to(np.tril(np.ones((seq, seq), dtype=bool)), (batch, seq, seq)).copy()
        return {TREE_MASK: mask}, outputs

    def new_cache(self, batch: int, capacity: int, widest: int | None = None):
        """The engine's cache set (runtime/cache/); widest: the most new tokens a step gives a row.
        The engine owns its memory (host arrays for ONNX Runtime, device buffers for TensorRT)."""
        return self.engine.new_cache(batch, capacity, widest)


def model_of(engine_dir, engine, embedding, per_layer=None) -> Model:
    """The Model of an engine directory's base, given its opened engine and embedding table (and its
    per-layer table, when its manifest has one: backends/embedding.engine_per_layer_table)."""
    section = engine_dir.manifest["model"]
    eagle = section.get("eagle") or {}
    feature_output = FEATURES
    if (engine_dir.manifest["components"].get("draft") or {}).get("kind") == "mtp":
        # its head reads the base's final-normed hidden states (build/mtp/)
        eagle, feature_output = {"feature_width": engine_dir.dims["hidden_size"]}, FINAL_HIDDEN
    rotary = [(layer.get("rotary") or {}) for layer in section["layers"]]
    long_rope = next(((r["original_context"], r["long_rows"]) for r in rotary if r.get("long_rows")), None)
    return Model(engine, embedding, engine_dir.dims, engine_dir.eos_token_ids,
                 engine_dir.limits["max_kv_cache_capacity"], eagle.get("feature_width", 0),
                 mrope=section.get("mrope") is not None, deepstack=section.get("deepstack_layers", 0),
                 long_rope=long_rope, bidirectional_block=section.get("bidirectional_block", 0),
                 per_layer=per_layer, feature_output=feature_output)
