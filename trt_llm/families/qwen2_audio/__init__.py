"""Qwen2-Audio: the Llama-shaped decoder reading its audio tower's rows (audio_tower.py) at the
<|AUDIO|> tokens; host.py is the tower's token count and packing, shared by the build and the runtime."""

from trt_llm.families.face import Component, Family
from trt_llm.families.llama import DECODER

FAMILIES = (
    Family("qwen2_audio", "Qwen2AudioForConditionalGeneration", DECODER,
           audio=Component("trt_llm.families.qwen2_audio.audio_tower", "qwen2_audio")),
)
