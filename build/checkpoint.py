"""Load a Hugging Face checkpoint: a local directory, a single .gguf file, or a hub id."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from trt_llm.build.models import ModelFamily, family_for

TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class CheckpointError(ValueError):
    pass


@dataclass
class Checkpoint:
    model: object  # a transformers PreTrainedModel
    tokenizer: object
    generation_config: object
    family: ModelFamily
    source: str
    # A GPTQ / AWQ folder's own blocks ({module name: QuantizedWeight}; the model holds them
    # dequantized) and its quantization_config; build/quantize/formats.py.
    published: dict | None = None
    published_config: dict | None = None


def _location(model: str) -> tuple[str, dict]:
    """from_pretrained's first argument and extra keywords for `model`."""
    path = Path(model).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise CheckpointError(f"model: GGUF file {model!r} does not exist")
        return str(path.parent), {"gguf_file": path.name}
    if path.exists():
        if not (path / "config.json").is_file():
            raise CheckpointError(f"model: {model!r} is not a Hugging Face model directory (no config.json)")
        return str(path), {}
    return model, {}  # a hub id; from_pretrained resolves it (or says why it cannot)


@contextmanager
def _loading(model: str) -> Iterator[None]:
    """A checkpoint that transformers cannot read (a truncated GGUF or safetensors file, a broken
    config) is one CheckpointError, whatever the loader it failed in raised."""
    try:
        yield
    except CheckpointError:
        raise
    except Exception as error:  # gguf, safetensors, json and transformers each raise their own kinds
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise CheckpointError(f"model: cannot load {model!r}: {first[:300]}") from None


def load_checkpoint(model: str, dtype: str, trust_remote_code: bool = False) -> Checkpoint:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    location, extra = _location(model)
    with _loading(model):
        config = AutoConfig.from_pretrained(location, trust_remote_code=trust_remote_code, **extra)
    family = family_for(config)  # refuse an unsupported architecture before loading any weights
    published, published_config = None, None
    with _loading(model):
        # Weights load in fp32 and are cast by the graph builder: GGUF dequantisation and the rotary
        # tables are computed in fp32 either way.
        if not extra:
            from trt_llm.build.quantize.formats import load_published, quantization_config

            published_config = quantization_config(Path(location))
        if published_config is not None:  # GPTQ / AWQ: read without their kernels
            hf_model, published = load_published(Path(location), published_config)
        else:
            if family.vision:  # the decoder and the vision tower
                from transformers import AutoModelForImageTextToText as loader
            elif family.multimodal:  # the decoder and the audio tower: the checkpoint's own class
                import transformers

                loader = getattr(transformers, family.architecture)
            else:
                loader = AutoModelForCausalLM
            hf_model = loader.from_pretrained(
                location, dtype=torch.float32, trust_remote_code=trust_remote_code, **extra
            ).eval()
        tokenizer = AutoTokenizer.from_pretrained(location, trust_remote_code=trust_remote_code, **extra)
    try:
        generation_config = GenerationConfig.from_pretrained(location, **extra)
    except OSError:
        generation_config = hf_model.generation_config
    return Checkpoint(hf_model, tokenizer, generation_config, family, model, published, published_config)


def eos_token_ids(checkpoint: Checkpoint) -> list[int]:
    """End-of-sequence ids as `generate` uses them: the generation config's, else the tokenizer's."""
    eos = checkpoint.generation_config.eos_token_id
    if eos is None:
        eos = checkpoint.tokenizer.eos_token_id
    if eos is None:
        return []
    return sorted({int(e) for e in ([eos] if isinstance(eos, int) else eos)})
