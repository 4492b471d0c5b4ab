"""SmolVLM2 and Idefics3: a Llama-shaped text decoder (SmolLM2, Llama 3) on plain 1-D positions, and a
SigLIP vision tower whose pixel-shuffle connector turns each square tile of an image into a fixed
number of rows (vision_tower.py). An image is split into tiles plus a downscaled global view, and its
one `<image>` placeholder becomes the tiles' row / column tokens around their image tokens
(host.py, processor.py, prompt.py: transformers' Idefics3 / SmolVLM processors, torch-free).

Both architectures are the same code in transformers (SmolVLM is generated from Idefics3's modules),
so one decoder (build/models/llama.py's graph over the checkpoint's `model.text_model`), one exporter
and one adapter serve both."""

from trt_llm.families.face import Component, Family
from trt_llm.families.llama import DECODER
TOWER = "trt_llm.families.smolvlm.vision_tower"

FAMILIES = (
    Family("smolvlm", "SmolVLMForConditionalGeneration", DECODER, vision=Component(TOWER, "smolvlm")),
    Family("idefics3", "Idefics3ForConditionalGeneration", DECODER, vision=Component(TOWER, "smolvlm")),
)
