"""Qwen3-ASR: a Qwen3 decoder (q/k norms) reading its audio encoder's rows over 100-frame chunks
(audio_tower.py); host.py is the chunking, shared by the build and the runtime. The speech routes
send it a chat request holding the clip."""

from trt_llm.families.face import Component, Family
from trt_llm.families.llama import DECODER

FAMILIES = (
    Family("qwen3_asr", "Qwen3ASRForConditionalGeneration", DECODER, qk_norm=True, transcription="chat",
           audio=Component("trt_llm.families.qwen3_asr.audio_tower", "qwen3_asr")),
)
