"""A prompt's media rows: where each image's or audio clip's encoder rows go in the prompt, and a
vision-language prompt's mRoPE positions. The sequence carries it (sequence.Sequence.media); prefill
writes the rows into inputs_embeds at their tokens (model.Model.media_inputs)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trt_llm.runtime.media.sources import MediaError, media_bytes


@dataclass
class SequenceMedia:
    """rows: (index of its first placeholder token, encoded part) per image or clip, the part
    having `embeds` [tokens, H], `tokens` and `deepstack` ([k, tokens, H] Qwen3-VL's early-layer
    features, else None); rope: runtime/mrope.RopePositions, or None for 1-D positions; cross: an
    encoder-decoder's clip, (key, value) [H, frames, D] per decoder layer for its cross-attention;
    keys: each row item's content hash (the encoder cache's key), which the context cache's keys cover."""
    rows: list[tuple[int, object]]
    rope: object | None = None
    cross: list | None = None
    keys: tuple[str, ...] = ()

    def spans(self) -> tuple[tuple[int, int, str], ...]:
        """(first token, tokens, content hash) of each image or clip."""
        return tuple((offset, part.tokens, key) for (offset, part), key in zip(self.rows, self.keys))

    def write_rows(self, embeds: np.ndarray, deepstack: np.ndarray | None, start: int, count: int) -> None:
        """Write the rows of prompt tokens start .. start + count - 1 that are placeholder tokens into
        one row of a step's inputs_embeds [S, H] (and deepstack_embeds [k, S, H])."""
        for offset, part in self.rows:
            first, last = max(offset, start), min(offset + part.tokens, start + count)
            if first >= last:
                continue
            embeds[first - start: last - start] = part.embeds[first - offset: last - offset]
            if deepstack is not None and part.deepstack is not None:
                deepstack[:, first - start: last - start] = part.deepstack[:, first - offset: last - offset]


def widen_placeholders(token_ids: list[int], placeholder: int, counts: list[int]) -> tuple[list[int], list[int]]:
    """The prompt with its i-th `placeholder` token repeated counts[i] times (the chat template writes
    one per image or clip; transformers' processors widen it so), and where each run starts."""
    widened, offsets, sizes = [], [], iter(counts)
    for token in token_ids:
        if token == placeholder:
            offsets.append(len(widened))
            widened += [token] * next(sizes)
        else:
            widened.append(token)
    return widened, offsets


def media_parts(messages, kind: str) -> list[tuple[int, int, object]]:
    """(message index, part index, part) of every `kind` part ("image", "audio"), in prompt order."""
    return [(m, c, part) for m, message in enumerate(messages) for c, part in enumerate(message.parts())
            if part.type == kind]


def read_parts(parts: list[tuple[int, int, object]], kind: str, media_dir: Path | None, where: str,
               decode: Callable[[bytes, str], object]) -> list:
    """decode(file bytes, name) of each part's source (runtime/media/sources.py: a path relative to
    `media_dir`, a file:// or data: URL); a MediaError becomes a ValueError naming the part."""
    decoded = []
    for m, c, part in parts:
        try:
            data, name = media_bytes(getattr(part, kind), media_dir, kind)
            decoded.append(decode(data, name))
        except MediaError as error:
            raise ValueError(f"{where}.messages[{m}].content[{c}]: {error}") from None
    return decoded
