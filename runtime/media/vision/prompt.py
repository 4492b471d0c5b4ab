"""A request's images in its prompt: each image part's one placeholder token widened to the image's
tokens, their rows from the vision encoder, and the prompt's mRoPE positions.

The chat template writes one `<|image_pad|>` per image part (inside `<|vision_start|>` ...
`<|vision_end|>`); the processor of transformers widens it to as many as the image has tokens, and so
does this module, so the prompt is token for token transformers'. Errors name the request, message
and part, and the image.
"""

from __future__ import annotations

from pathlib import Path

from trt_llm.runtime.media.vision.mrope import rope_positions
from trt_llm.runtime.text.prompt import PromptError
from trt_llm.runtime.media.sequence_media import SequenceMedia, media_parts, read_parts, widen_placeholders
from trt_llm.runtime.media.vision.encoder import VisionEncoder


def attach_images(vision: VisionEncoder, messages, prompt, tokenizer, media_dir: Path | None,
                  where: str, max_input_len: int) -> tuple[list[int], SequenceMedia]:
    """The prompt's (runtime/text/prompt.Prompt) token ids with the images' tokens, and its
    SequenceMedia. Raises ValueError (PromptError when the template placed the wrong number of image
    tokens) before any image is encoded, so a request that cannot run costs no encoder time."""
    own_layout = getattr(vision.adapter, "attach_images", None)
    if own_layout is not None:  # the family lays its images out itself (SmolVLM's tiles, Gemma 3's text)
        return own_layout(vision, messages, prompt, tokenizer, media_dir, where, max_input_len)
    token_ids, placeholder = prompt.token_ids, vision.image_token_id
    _, pending, counts = pending_images(vision, messages, token_ids, placeholder, media_dir, where)
    widened, offsets = widen_placeholders(token_ids, placeholder, counts)
    if len(widened) > max_input_len:
        raise ValueError(f"{where}: prompt is {len(widened)} tokens with its images' {sum(counts)}, longer than "
                         f"the engine's max_input_len {max_input_len}")
    encoded = vision.encode(pending)
    rope = rope_positions(widened, placeholder, [image.grid for image in encoded], vision.merge)
    return widened, SequenceMedia(list(zip(offsets, encoded)), rope, keys=tuple(image.key for image in pending))


def pending_images(vision: VisionEncoder, messages, token_ids: list[int], placeholder: int, media_dir: Path | None,
                   where: str) -> tuple[list, list, list[int]]:
    """A request's image parts decoded and counted before any is encoded, whatever the family's layout:
    (parts, pending images, each one's tokens). Raises ValueError past the engine's max_image_tokens,
    PromptError when the chat template placed another number of `placeholder` tokens than there are
    image parts."""
    parts = media_parts(messages, "image")
    refuse_pan_and_scan(vision, parts, where)
    pending = read_parts(parts, "image", media_dir, where, vision.pending)
    counts = [vision.tokens_of(image) for image in pending]
    if sum(counts) > vision.max_request_tokens:
        raise ValueError(f"{where}.messages: its {len(pending)} image(s) take {sum(counts)} image tokens "
                         f"({', '.join(map(str, counts))}), more than the engine's max_image_tokens "
                         f"{vision.max_request_tokens}")
    placed = sum(1 for token in token_ids if token == placeholder)
    if placed != len(parts):
        raise PromptError(f"{where}.messages: the chat template placed {placed} image token(s) for "
                          f"{len(parts)} image part(s)")
    return parts, pending, counts


def refuse_pan_and_scan(vision: VisionEncoder, parts, where: str) -> None:
    """An image part's pan_and_scan: true, on a tower that cuts no crops (Gemma 3's does)."""
    if getattr(vision.adapter, "pan_and_scan", False):
        return
    for m, c, part in parts:
        if part.pan_and_scan:
            raise ValueError(f"{where}.messages[{m}].content[{c}].pan_and_scan: the {vision.settings.get('family')} "
                             "vision tower cuts no pan-and-scan crops (Gemma 3's does)")
