"""Load a Hugging Face checkpoint: a local directory, a single .gguf file, or a hub id."""

from __future__ import annotations

import logging
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from trt_llm.families.face import Family as ModelFamily
from trt_llm.families.registry import family_for

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
    # The files the model's weights are read from as the build converts each module (its tensors
    # are on the meta device until then): build/streamed_weights.py. None: the model holds them.
    weights: object | None = None

    def embedding_table(self, dtype: torch.dtype | None = None):
        """The token embedding's weight, in `dtype` when the stored table is converted anyway (a
        streamed one is then read straight into it: the table is never in memory twice)."""
        return self.module_weight(self.model.get_input_embeddings(), dtype)

    def module_weight(self, module, dtype: torch.dtype | None = None):
        """A module's weight (an embedding table's: Gemma 4's per-layer one too), read as embedding_table's."""
        if self.weights is None:
            return module.weight.detach()
        return self.weights.read(f"{self.weights.names[id(module)]}.weight", dtype=dtype)


def _location(model: str) -> tuple[str, dict]:
    """from_pretrained's first argument and extra keywords for `model`. A path that does not exist
    is refused here, at once, rather than tried as a hub id: one that cannot be a hub id ("org/name")
    always, and any when the hub is off (HF_HUB_OFFLINE) and its cache does not hold the model."""
    path = Path(model).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise CheckpointError(f"model: GGUF file {model!r} does not exist")
        return str(path.parent), {"gguf_file": path.name}
    if path.exists():
        if not (path / "config.json").is_file():
            raise CheckpointError(f"model: {model!r} is not a Hugging Face model directory (no config.json)")
        return str(path), {}
    if not _hub_id(model):
        raise CheckpointError(f"model: {model!r} does not exist")
    if _hub_offline() and not _in_hub_cache(model):
        raise CheckpointError(f"model: {model!r} does not exist (no such folder; HF_HUB_OFFLINE is set and "
                              "the hub's cache does not hold it)")
    return model, {}  # a hub id; from_pretrained resolves it (or says why it cannot)


def model_family(model: str, trust_remote_code: bool = False) -> ModelFamily:
    """The family of `model` from its config alone (no weights read): what the build checks the
    config's sections against before it loads the checkpoint."""
    from transformers import AutoConfig

    location, extra = _location(model)
    with _loading(model):
        config = AutoConfig.from_pretrained(location, trust_remote_code=trust_remote_code, **extra)
    return family_for(config)


def _hub_id(model: str) -> bool:
    """Whether `model` can name a hub repository ("name" or "org/name"; not "./name", "~/name",
    "/abs/name" or "a/b/c")."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(model)
    except HFValidationError:
        return False
    return True


def _hub_offline() -> bool:
    import os

    return any(os.environ.get(name, "").strip().upper() in ("1", "ON", "YES", "TRUE")
               for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _in_hub_cache(model: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(model, "config.json"), str)


def _gguf_damage(path: Path) -> str | None:
    """Why the GGUF file `path` is not whole (its header cut short, or shorter than its tensors'
    offsets and sizes say), or None when it is: then something else failed."""
    from gguf import GGUFReader
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    class Extent(GGUFReader):  # the header only: where the tensors end, none of them mapped
        def _build_tensors(self, start_offs, fields):
            self.end = start_offs
            for field in fields:
                _, _, _, dims, raw_dtype, offset = field.parts
                block, size = GGML_QUANT_SIZES[GGMLQuantizationType(int(raw_dtype[0]))]
                count = 1
                for dim in dims.tolist():
                    count *= int(dim)
                self.end = max(self.end, start_offs + int(offset[0]) + count * size // block)

    size = path.stat().st_size
    try:
        end = Extent(path).end
    except Exception as error:  # the header's own reads ran past the end of the file, or it is not GGUF
        if "version" in str(error):  # a GGUF version the reader does not know: whole, not ours to read
            return None
        return f"{size} bytes; its header cannot be read"
    if end > size:
        return f"{size} bytes, its tensors need {end}"
    return None


@contextmanager
def _loading(model: str) -> Iterator[None]:
    """A checkpoint that transformers cannot read (a truncated GGUF or safetensors file, a broken
    config) is one CheckpointError, whatever the loader it failed in raised; a GGUF file shorter
    than its header says is named as damaged."""
    try:
        yield
    except CheckpointError:
        raise
    except Exception as error:  # gguf, safetensors, json and transformers each raise their own kinds
        path = Path(model).expanduser()
        if path.suffix == ".gguf" and path.is_file():
            try:
                damage = _gguf_damage(path)
            except Exception:  # the check is a better message, never a new failure
                damage = None
            if damage is not None:
                raise CheckpointError(f"model: {model!r} is damaged or truncated ({damage})") from None
        if isinstance(error, KeyError) and error.args and isinstance(error.args[0], str):
            where = _config_key_of(path, error.args[0])  # a bare KeyError names a value, not where it is
            if where is not None:
                raise CheckpointError(f"model: {model!r}: config.json: {where}: {error.args[0]!r} is not one "
                                      "transformers knows") from None
        raise CheckpointError(f"model: cannot load {model!r}: {one_line(error)}") from None


def _config_key_of(directory: Path, name: str) -> str | None:
    """Where `name` is a key or a string value in directory/config.json ("rope_parameters.rope_type"), or None."""
    import json

    try:
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None

    def find(node, where: str) -> str | None:
        if isinstance(node, dict):
            for key, value in node.items():
                path = f"{where}.{key}" if where else str(key)
                found = path if key == name or value == name else find(value, path)
                if found is not None:
                    return found
        elif isinstance(node, list):
            for index, value in enumerate(node):
                found = f"{where}[{index}]" if value == name else find(value, f"{where}[{index}]")
                if found is not None:
                    return found
        return None

    return find(config, "")


def one_line(error: BaseException, limit: int = 300) -> str:
    """An exception's message on one line. A first line that ends at a colon ("Class validation error
    for validator 'validate_layer_type':", "Error(s) in loading state_dict for X:") announces what
    follows: the next lines are joined to it, so the message never stops where the reason begins."""
    if isinstance(error, KeyError) and error.args:  # its str() is the argument quoted: a key, or a sentence
        key = error.args[0]
        return (key if isinstance(key, str) and " " in key else f"{type(error).__name__} {key!r}")[:limit]
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    text = lines[0]
    for line in lines[1:3]:
        if not text.endswith(":"):
            break
        text = f"{text} {line}"
    return text[:limit]


def load_checkpoint(model: str, dtype: str, trust_remote_code: bool = False, stream: bool = False) -> Checkpoint:
    """stream: a text decoder's safetensors folder is not loaded but read module by module as the
    build converts it (Checkpoint.weights), where its files allow (build/streamed_weights.py)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    location, extra = _location(model)
    with _loading(model):
        config = AutoConfig.from_pretrained(location, trust_remote_code=trust_remote_code, **extra)
    family = family_for(config)  # refuse an unsupported architecture before loading any weights
    _check_config(model, config, family)  # and a config whose values the graph cannot take
    published, published_config, weights = None, None, None
    if stream and not (extra or trust_remote_code or family.multimodal or family.vision or family.encoder_decoder):
        with _loading(model):
            weights = _streamed(Path(location), config)
        if weights is not None:
            mismatched, unexpected = weights.mismatches()
            check_tensors(model, config, [], mismatched, unexpected)
    with _loading(model):
        # Weights load in fp32 and are cast by the graph builder: GGUF dequantisation and the rotary
        # tables are computed in fp32 either way.
        if not extra:
            from trt_llm.build.quantize.formats import load_published, quantization_config

            published_config = quantization_config(Path(location))
        if published_config is not None:  # GPTQ / AWQ: read without their kernels
            hf_model, published = load_published(Path(location), published_config)
        elif weights is not None:
            hf_model = weights.model
        else:
            if family.vision:  # the decoder and the vision tower
                from transformers import AutoModelForImageTextToText as loader
            elif family.multimodal:  # the decoder and the audio tower: the checkpoint's own class
                import transformers

                loader = getattr(transformers, family.architecture)
            else:
                loader = AutoModelForCausalLM
            # Every tensor the model has must come from the checkpoint: what transformers reports
            # missing it initialised at random, what it reports mismatched it would not load.
            with _without_load_report():
                hf_model, report = loader.from_pretrained(
                    location, dtype=torch.float32, trust_remote_code=trust_remote_code, output_loading_info=True,
                    ignore_mismatched_sizes=True, **extra)
            hf_model.eval()
    if published_config is None and weights is None:
        check_tensors(model, config, report["missing_keys"], report["mismatched_keys"],
                      _same_kind(report["unexpected_keys"], hf_model.state_dict()))
        if report["unexpected_keys"]:  # what a checkpoint carries beside the model (a tower, MTP heads)
            unused = sorted(report["unexpected_keys"])
            logging.getLogger(__name__).info("%s: %d tensors of the checkpoint are not the model's and are not "
                                             "used (e.g. %s)", model, len(unused), unused[0])
    with _loading(model):
        tokenizer = AutoTokenizer.from_pretrained(location, trust_remote_code=trust_remote_code, **extra)
    try:
        generation_config = GenerationConfig.from_pretrained(location, **extra)
    except OSError:
        generation_config = hf_model.generation_config
    return Checkpoint(hf_model, tokenizer, generation_config, family, model, published, published_config,
                      weights)


def _check_config(model: str, config, family) -> None:
    """The check the family's face names (build/config_checks.py), as a CheckpointError naming
    config.json's key."""
    from trt_llm.build.config_checks import ConfigCheckError, check_config

    try:
        check_config(config, family)
    except ConfigCheckError as error:
        raise CheckpointError(f"model: {model!r}: config.json: {error}") from None


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def _shape(shape) -> str:
    return f"[{', '.join(str(int(n)) for n in shape)}]"


def _where(name: str, config, kind: bool = True) -> str:
    """The config key that placed a decoder layer's tensor: a layer count it lies beyond, or (kind:
    a tensor of the wrong kind, not the wrong size) its layer_types entry."""
    found = _LAYER.search(name)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if found is None:
        return ""
    index, layers = int(found.group(1)), getattr(text, "num_hidden_layers", None)
    if isinstance(layers, int) and index >= layers:
        return f"; config.json's num_hidden_layers is {layers}"
    types = getattr(text, "layer_types", None)
    if kind and isinstance(types, (list, tuple)) and index < len(types):
        return f"; config.json's layer_types[{index}] is {types[index]!r}"
    return ""


def check_tensors(model: str, config, missing, mismatched, unexpected) -> None:
    """Refuse a checkpoint whose tensors are not the model its config describes, in one line naming
    the first tensor (and how many more): one the model has and the checkpoint lacks (transformers
    would initialise it at random), one whose shape differs, one of the model's own kinds (a layer's
    weight) that the model has no place for. mismatched: (name, checkpoint shape, model shape)."""
    more = lambda items: f" (and {len(items) - 1} more)" if len(items) > 1 else ""  # noqa: E731
    if missing:
        name = sorted(missing)[0]
        raise CheckpointError(f"model: {model!r}: tensor {name!r} is missing from the checkpoint{more(missing)}; "
                              f"it would be random weights{_where(name, config)}")
    if mismatched:
        name, stored, wanted = sorted(mismatched, key=lambda item: item[0])[0]
        raise CheckpointError(f"model: {model!r}: tensor {name!r} is {_shape(stored)} in the checkpoint, the "
                              f"config makes it {_shape(wanted)}{more(mismatched)}; config.json does not match "
                              f"the weights{_where(name, config, kind=False)}")
    if unexpected:
        name = sorted(unexpected)[0]
        raise CheckpointError(f"model: {model!r}: tensor {name!r} of the checkpoint has no place in the model "
                              f"its config describes{more(unexpected)}{_where(name, config)}")


def _same_kind(unexpected, state_dict) -> list[str]:
    """The unexpected tensors that are of the model's own kinds (its name with every index as '#' is
    one of the model's: a decoder layer's weight past its layer count or of another layer type),
    not what a checkpoint may carry beside it (a vision tower, multi-token-prediction heads)."""
    kinds = {re.sub(r"\.\d+\.", ".#.", key) for key in state_dict}
    return [name for name in unexpected if re.sub(r"\.\d+\.", ".#.", name) in kinds]


@contextmanager
def _without_load_report() -> Iterator[None]:
    """transformers' loading report (a table of missing / unexpected keys) is not printed: the build
    says what matters in check_tensors' one line."""

    class Drop(logging.Filter):
        def filter(self, record):
            return "LOAD REPORT" not in str(record.msg)

    logger, drop = logging.getLogger("transformers.modeling_utils"), Drop()
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


def _streamed(directory: Path, config):
    """The folder's StreamedWeights over a meta-device model of `config` (`.model`), or None when
    it is a GPTQ / AWQ folder or its files do not name every tensor as the model does."""
    from transformers import AutoModelForCausalLM

    from trt_llm.build.quantize.formats import quantization_config
    from trt_llm.build.streamed_weights import StreamedWeights, meta_model

    if quantization_config(directory) is not None:
        return None
    skeleton = meta_model(AutoModelForCausalLM, config)
    return StreamedWeights.open(directory, skeleton)


def eos_token_ids(checkpoint: Checkpoint) -> list[int]:
    """End-of-sequence ids as `generate` uses them: the generation config's, else the tokenizer's."""
    eos = checkpoint.generation_config.eos_token_id
    if eos is None:
        eos = checkpoint.tokenizer.eos_token_id
    if eos is None:
        return []
    return sorted({int(e) for e in ([eos] if isinstance(eos, int) else eos)})
