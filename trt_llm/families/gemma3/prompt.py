"""A request's images in a Gemma 3 prompt, as transformers' Gemma3Processor lays them out: the chat
template writes one `<start_of_image>` per image part, and the processor replaces each in the prompt's
TEXT with

    "\\n\\n<start_of_image>" + "<image_soft_token>" * K + "<end_of_image>\\n\\n"

(K = mm_tokens_per_image, 256), or, for an image cut into pan-and-scan crops,

    "Here is the original image " + that + " and here are some crops to help you see better "
    + " ".join(that for each crop)

and tokenizes the whole text again: the newlines merge with the template's own ("user\\n" then
"\\n\\n" is one "\\n\\n\\n" token), so the expansion is made on the text, not on the token ids. Each
frame's K soft tokens are one entry of the prompt's media (keyed by the image's content and the
crop's box) and one run of tokens that see each other both ways in the decoder (runtime/engine/
model.py's tree_mask). Positions stay 1-D. Errors name the request and part, as
runtime/media/vision/prompt.py's do.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from trt_llm.families.gemma3.processor import Gemma3ImageProcessor
from trt_llm.runtime.media.sequence_media import SequenceMedia
from trt_llm.runtime.media.sources import to_rgb
from trt_llm.runtime.media.vision.encoder import PendingImage
from trt_llm.runtime.media.vision.prompt import pending_images
from trt_llm.runtime.text.prompt import PromptError

ORIGINAL = "Here is the original image "
CROPS = " and here are some crops to help you see better "


def image_text(crops: int, boi: str, soft: str, eoi: str, tokens: int) -> str:
    """The text one image's `<start_of_image>` becomes (transformers' Gemma3Processor)."""
    frame = f"\n\n{boi}{soft * tokens}{eoi}\n\n"
    if not crops:
        return frame
    return ORIGINAL + frame + CROPS + " ".join([frame] * crops)


def crop_processor(vision):
    """The engine's image processor as its config says (pan-and-scan on or off: a request's default),
    read once; the encoder's own never crops (host.SoftTokenTower.image_processor): crops are frames
    of their own here."""
    processor = getattr(vision, "crop_processor", None)
    if processor is None:
        preprocessor = json.loads(vision.engine_dir.component_path("vision", "preprocessor").read_text())
        a = vision.adapter
        processor = vision.crop_processor = Gemma3ImageProcessor.from_config(preprocessor, a.image_size, a.patch_size,
                                                                              a.pooling)
    return processor


def frames_of(vision, parts, pending) -> list[list[PendingImage]]:
    """Each image's frames, the whole picture then its pan-and-scan crops (where its part or the
    config asks), each its own item of the encoder, keyed by the image's content and the crop's box.
    transformers cuts each crop from the picture and resizes it on its own, as a picture of its own."""
    processor = crop_processor(vision)
    frames = []
    for (_, _, part), image in zip(parts, pending):
        pan = processor.do_pan_and_scan if part.pan_and_scan is None else part.pan_and_scan
        boxes = dataclasses.replace(processor, do_pan_and_scan=pan).crop_boxes(image.picture.height,
                                                                               image.picture.width)
        picture = to_rgb(image.picture) if boxes else image.picture
        frames.append([image] + [PendingImage(f"{image.key}/{box}", picture.crop(box), image.grid) for box in boxes])
    return frames


def attach_images(layout, vision, messages, prompt, tokenizer, media_dir: Path | None, where: str,
                  max_input_len: int) -> tuple[list[int], SequenceMedia]:
    """The prompt's token ids with its images' text, and its SequenceMedia; every error is raised
    before any image is encoded."""
    parts, pending, _ = pending_images(vision, messages, prompt.token_ids, layout.boi_token_id, media_dir, where)
    frames = frames_of(vision, parts, pending)
    counts = [len(own) * layout.tile_tokens for own in frames]
    for (m, c, _), count in zip(parts, counts):
        if count > layout.max_image_tokens:
            raise ValueError(f"{where}.messages[{m}].content[{c}]: the image takes {count} tokens with its pan-and-scan "
                             f"crops, more than the engine's max_image_tokens_per_image {layout.max_image_tokens}")
    if sum(counts) > vision.max_request_tokens:
        raise ValueError(f"{where}.messages: its {len(pending)} image(s) take {sum(counts)} image tokens "
                         f"({', '.join(map(str, counts))}) with their pan-and-scan crops, more than the engine's "
                         f"max_image_tokens {vision.max_request_tokens}")
    boi, soft, eoi = (tokenizer.added_tokens_decoder[i].content
                      for i in (layout.boi_token_id, layout.image_token_id, layout.eoi_token_id))
    pieces = prompt.text.split(boi)
    if len(pieces) != len(pending) + 1:  # (a boi written as text by the user, not by the template)
        raise PromptError(f"{where}.messages: the prompt has {len(pieces) - 1} {boi} for {len(pending)} image part(s)")
    text = pieces[0]
    for own, piece in zip(frames, pieces[1:]):
        text += image_text(len(own) - 1, boi, soft, eoi, layout.tile_tokens) + piece
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) > max_input_len:
        raise ValueError(f"{where}: prompt is {len(ids)} tokens with its images' {sum(counts)}, longer than "
                         f"the engine's max_input_len {max_input_len}")
    starts = [i for i, token in enumerate(ids) if token == layout.image_token_id
              and (i == 0 or ids[i - 1] != layout.image_token_id)]
    flat = [frame for own in frames for frame in own]
    if len(starts) != len(flat):  # (soft tokens the user wrote as text)
        raise PromptError(f"{where}.messages: the prompt has {len(starts)} runs of {soft} for {len(flat)} image "
                          "frames")
    rows = list(zip(starts, vision.encode(flat)))
    return ids, SequenceMedia(rows, None, keys=tuple(frame.key for frame in flat))
