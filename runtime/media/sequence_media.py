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

    def blocks(self) -> tuple[tuple[int, int], ...]:
        """(first token, tokens) of each part whose tokens may see each other both ways (an image's, on a
        model that asks for it; never an audio clip's: EncodedClip.both_ways)."""
        return tuple((offset, part.tokens) for offset, part in self.rows if getattr(part, "both_ways", True))

    def joined(self, later: "SequenceMedia", moved: Callable[[int], int]) -> "SequenceMedia":
        """These rows, each moved where `moved` says its first token went when the prompt was widened for
        `later`'s parts (a prompt with images and audio clips: Gemma 4's), with `later`'s rows, in
        prompt order. 1-D positions only (neither has mRoPE positions or cross-attention)."""
        if self.rope is not None or later.rope is not None or self.cross or later.cross:
            raise ValueError("media: images and audio clips in one prompt take 1-D positions")
        items = sorted([((moved(offset), part), key) for (offset, part), key in zip(self.rows, self.keys)]
                       + list(zip(later.rows, later.keys)), key=lambda item: item[0][0])
        return SequenceMedia([row for row, _ in items], keys=tuple(key for _, key in items))

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


def widen_placeholders(token_ids: list[int], placeholder: int, counts: list[int],
                       wrap: tuple[int, int] | None = None) -> tuple[list[int], list[int]]:
    """The prompt with its i-th `placeholder` token repeated counts[i] times (the chat template writes
    one per image or clip; transformers' processors widen it so), between wrap's (begin, end) tokens
    where given (Gemma 4's <|audio> ... <audio|>), and where each run of placeholders starts."""
    widened, offsets, sizes = [], [], iter(counts)
    for token in token_ids:
        if token == placeholder:
            widened += [wrap[0]] if wrap else []
            offsets.append(len(widened))
            widened += [token] * next(sizes) + ([wrap[1]] if wrap else [])
        else:
            widened.append(token)
    return widened, offsets


def widened_position(token_ids: list[int], placeholder: int, widths: list[int]) -> Callable[[int], int]:
    """Where a token of `token_ids` lands once its i-th `placeholder` became widths[i] tokens."""
    growth = list(zip([i for i, token in enumerate(token_ids) if token == placeholder], [w - 1 for w in widths]))
    return lambda position: position + sum(g for at, g in growth if at < position)


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
