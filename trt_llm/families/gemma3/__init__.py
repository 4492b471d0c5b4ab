"""Gemma 3 as published (`Gemma3ForConditionalGeneration`): the Gemma 3 text decoder (build/models/
llama.py's graph over the checkpoint's language model: sliding and global layers, q/k norms, Gemma's
norms) and a SigLIP vision tower whose projector pools each 896-pixel frame into 256 soft tokens
(vision_tower.py). An image's soft tokens see each other both ways in the decoder (transformers'
token_type_ids mask: the face's bidirectional_images), and its `<start_of_image>` becomes the
processor's text around them (prompt.py); pan-and-scan crops, when the processor config asks, are
more frames of the same image (processor.py)."""

from trt_llm.families.face import Component, Family
from trt_llm.families.llama import DECODER

TOWER = "trt_llm.families.gemma3.vision_tower"

FAMILIES = (
    Family("gemma3", "Gemma3ForConditionalGeneration", DECODER, qk_norm=True, gemma=True, bidirectional_images=True,
           vision=Component(TOWER, "gemma3")),
)
