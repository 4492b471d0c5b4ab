"""Gemma 4 (`Gemma4ForCausalLM`): a decoder of sliding and global layers of different widths, keys and
values shared by its last layers, and per-layer embeddings (decoder.py; the per-layer table is looked
up by the runtime, runtime/backends/embedding.py). As published (`Gemma4ForConditionalGeneration`), with
its vision tower (vision_tower.py, processor.py, host.py): an image's soft tokens see each other both ways
on the sliding layers when the config asks (use_bidirectional_attention "vision"); and its audio tower
(audio_tower.py, audio_host.py; the features runtime/media/audio/gemma4_features.py), whose clips' soft
tokens are plain causal ones."""

from trt_llm.families.face import Component, Family

DECODER = "trt_llm.families.gemma4.decoder"
CHECKS = "trt_llm.families.gemma4.checks:gemma4"

FAMILIES = (
    Family("gemma4", "Gemma4ForCausalLM", DECODER, checks=CHECKS),
    Family("gemma4_vl", "Gemma4ForConditionalGeneration", DECODER, bidirectional_images=True,
           vision=Component("trt_llm.families.gemma4.vision_tower", "gemma4"),
           audio=Component("trt_llm.families.gemma4.audio_tower", "gemma4_audio"), checks=CHECKS),
)
