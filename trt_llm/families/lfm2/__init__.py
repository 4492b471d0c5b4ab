"""LFM2: a hybrid of short gated convolutions (recurrent states) and attention (decoder.py, on
build/models/hybrid.py)."""

from trt_llm.families.face import Family

FAMILIES = (
    Family("lfm2", "Lfm2ForCausalLM", "trt_llm.families.lfm2.decoder", qk_norm=True,
           checks="trt_llm.families.lfm2.checks:lfm2"),
)
