"""A request's images in a SmolVLM / Idefics3 prompt: the chat template writes one `<image>` per image
part, and each becomes the image's prompt text as transformers' processor writes it:

    split into R x C tiles:  (<fake_token_around_image><row_r_col_c><image>*K) per tile, "\\n" after
                             each row, then "\\n<fake_token_around_image><global-img><image>*K<fake_token_around_image>"
    a single frame:          <fake_token_around_image><global-img><image>*K<fake_token_around_image>

K = the tower's rows per frame. The text around it starts and ends with special tokens, so the rest of
the prompt tokenizes as it does around the one `<image>`, and the newlines are the tokenizer's own ids
for "\\n" and "\\n\\n" (read at build time: tokens.py). Each frame's K rows are one entry of the
prompt's media, keyed by the image's content and the frame's index, so the context cache tells
images apart frame by frame. Positions stay 1-D (no mRoPE). Errors name the request and part, as
runtime/media/vision/prompt.py's do.
"""

from __future__ import annotations

from pathlib import Path

from trt_llm.runtime.media.sequence_media import SequenceMedia
from trt_llm.runtime.media.vision.encoder import EncodedImage
from trt_llm.runtime.media.vision.prompt import pending_images


def image_text(rows: int, cols: int, layout) -> tuple[list[int], list[int]]:
    """The token ids one image's `<image>` becomes, and where each frame's K image tokens start in
    them (tiles row by row, then the global view). layout: the host adapter (host.TiledTower)."""
    image, fake = [layout.image_token_id] * layout.tile_tokens, layout.fake_token_id
    ids, starts = [], []
    for r in range(1, rows + 1):
        for c in range(1, cols + 1):
            ids += [fake, layout.row_col_ids[f"{r},{c}"]]
            starts.append(len(ids))
            ids += image
        ids += layout.newline_ids if r < rows else layout.double_newline_ids
    ids += [fake, layout.global_token_id]
    starts.append(len(ids))
    return ids + image + [fake], starts


def attach_images(layout, vision, messages, token_ids: list[int], media_dir: Path | None, where: str,
                  max_input_len: int) -> tuple[list[int], SequenceMedia]:
    """The prompt's token ids with its images' text, and its SequenceMedia; every error is raised
    before any image is encoded."""
    parts, pending, counts = pending_images(vision, messages, token_ids, layout.image_token_id, media_dir, where)
    texts = []
    for (m, c, _), image in zip(parts, pending):
        rows, cols = vision.processor.layout(image.picture.height, image.picture.width)
        if any(f"{r},{q}" not in layout.row_col_ids for r in range(1, rows + 1) for q in range(1, cols + 1)):
            raise ValueError(f"{where}.messages[{m}].content[{c}]: the image splits into {rows}x{cols} tiles, more "
                             "than the tokenizer has <row_i_col_j> tokens for")
        texts.append(image_text(rows, cols, layout))
    widened, frame_starts, next_text = [], [], iter(texts)
    for token in token_ids:
        if token == layout.image_token_id:
            ids, starts = next(next_text)
            frame_starts.append([len(widened) + s for s in starts])
            widened += ids
        else:
            widened.append(token)
    if len(widened) > max_input_len:
        raise ValueError(f"{where}: prompt is {len(widened)} tokens with its images' {sum(counts)}, longer than "
                         f"the engine's max_input_len {max_input_len}")
    rows, keys, k = [], [], layout.tile_tokens
    for image, encoded, starts in zip(pending, vision.encode(pending), frame_starts):
        for f, start in enumerate(starts):
            rows.append((start, EncodedImage((1,) + image.grid[1:], encoded.embeds[f * k:(f + 1) * k], None)))
            keys.append(f"{image.key}/{f}")
    return widened, SequenceMedia(rows, None, keys=tuple(keys))
