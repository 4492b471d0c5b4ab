"""Whisper: an encoder-decoder. graphs.py exports both graphs (the decoder with cross-attention over
the encoder's keys and values, and the encoder); its requests are transcriptions, decoded window by
window over long recordings."""

from trt_llm.families.face import Component, Family

GRAPHS = "trt_llm.families.whisper.graphs"

FAMILIES = (
    Family("whisper", "WhisperForConditionalGeneration", GRAPHS, task="transcription", transcription="windowed",
           audio=Component(GRAPHS, "whisper"), encoder_decoder=True, checks="trt_llm.families.whisper.checks:whisper"),
)
