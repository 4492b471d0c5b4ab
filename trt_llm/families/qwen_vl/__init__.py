"""Qwen2.5-VL and Qwen3-VL: the Llama-shaped decoder on mRoPE positions, and the Qwen vision tower
(vision_tower.py) as the engine's vision/ component."""

from trt_llm.families.face import Component, Family
from trt_llm.families.llama import DECODER

TOWER = "trt_llm.families.qwen_vl.vision_tower"

FAMILIES = (
    Family("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration", DECODER, mrope="sections",
           vision=Component(TOWER, "qwen2_5_vl")),
    Family("qwen3_vl", "Qwen3VLForConditionalGeneration", DECODER, qk_norm=True, mrope="interleaved",
           vision=Component(TOWER, "qwen3_vl")),
)
