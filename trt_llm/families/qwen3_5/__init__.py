"""Qwen3.5 and Qwen3-Next: hybrids of Gated DeltaNet layers (recurrent states) and gated full attention
(decoder.py, on build/models/hybrid.py); Qwen3-Next's experts with a shared expert. Qwen3.5 is
published with a vision tower, which is Qwen3-VL's (the qwen_vl package's)."""

from trt_llm.families.face import Component, Family

DECODER = "trt_llm.families.qwen3_5.decoder"
CHECKS = "trt_llm.families.qwen3_5.checks"

FAMILIES = (
    Family("qwen3_5", "Qwen3_5ForCausalLM", DECODER, qk_norm=True, checks=f"{CHECKS}:qwen3_5", mtp=True),
    Family("qwen3_next", "Qwen3NextForCausalLM", DECODER, qk_norm=True,  # the same, with experts
           checks=f"{CHECKS}:qwen3_next"),
    # A Qwen3.5 vision-language checkpoint (how Qwen3.5 is published): the decoder on interleaved mRoPE
    # positions, and Qwen3-VL's vision tower without its deepstack features
    Family("qwen3_5_vl", "Qwen3_5ForConditionalGeneration", DECODER, qk_norm=True, mrope="interleaved",
           vision=Component("trt_llm.families.qwen_vl.vision_tower", "qwen3_vl"), checks=f"{CHECKS}:qwen3_5"),
)
