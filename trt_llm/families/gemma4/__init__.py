"""Gemma 4 (`Gemma4ForCausalLM`): a decoder of sliding and global layers of different widths, keys and
values shared by its last layers, and per-layer embeddings (decoder.py; the per-layer table is looked
up by the runtime, runtime/backends/embedding.py)."""

from trt_llm.families.face import Family

DECODER = "trt_llm.families.gemma4.decoder"

FAMILIES = (
    Family("gemma4", "Gemma4ForCausalLM", DECODER, checks="trt_llm.families.gemma4.checks:gemma4"),
)
