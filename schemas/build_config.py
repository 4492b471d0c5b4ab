"""The YAML config of ``trt-llm-build``.

Unlike the input file, unknown keys are errors here: a misspelt build option silently falling back
to its default would produce a wrong engine, and a build is expensive to redo.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from ._errors import format_errors, json_type

MAX_BATCH_SIZE = 64
RANGES = {"max_batch_size": f"[1, {MAX_BATCH_SIZE}]"}


LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# qkv_proj and gate_up_proj: Phi-3's packed projections (its adapters' names; the separate names mean them too)
LoraModule = Literal["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "qkv_proj",
                     "gate_up_proj"]


class LoraBuildConfig(BaseModel):
    """LoRA inputs in the graph: adapters become data, switched per request without a rebuild."""
    model_config = ConfigDict(extra="forbid", strict=True)

    max_rank: int = Field(ge=1, le=1024, description="The largest adapter rank the engine accepts.")
    target_modules: list[LoraModule] = Field(
        default_factory=lambda: list(LORA_MODULES), min_length=1,
        description="Projections (PEFT names) that get LoRA inputs.")


class DraftBuildConfig(BaseModel):
    """An EAGLE3 draft model built beside the base, for speculative decoding."""
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str = Field(min_length=1, description="The draft: a folder in the EAGLE authors', SpecForge's "
                       "or ModelOpt's format.")
    max_draft_tree_size: int = Field(60, ge=1, le=1024, description="Most nodes a run may draft per round "
                                     "(draft_top_k x draft_steps).")
    max_verify_tree_size: int = Field(60, ge=2, le=1024, description="Most tokens one verification pass may take.")
    quantization: Literal["auto", "none", "int8", "int4"] = Field(
        "auto", description="The draft's matmul weights in a cpu engine: int8 (dynamic activations) or int4 "
                            "(blocks of 32) take about two thirds of fp32's time per draft step. The base verifies every "
                            "token, so this changes how many tokens a round accepts, never which come out. "
                            "auto: int8 for an fp32 graph, none otherwise (int8 and int4 need dtype fp32).")


class VisionBuildConfig(BaseModel):
    """Image token limits of a vision-language model's engine (the reference's defaults). An image
    is resized (keeping its aspect ratio) to between min_image_tokens and max_image_tokens_per_image
    tokens; a request's images together may take max_image_tokens."""
    model_config = ConfigDict(extra="forbid", strict=True)

    min_image_tokens: int = Field(4, ge=1, le=16384, description="Fewest tokens an image becomes.")
    max_image_tokens: int = Field(1024, ge=1, le=65536, description="Most image tokens in one request.")
    max_image_tokens_per_image: int = Field(512, ge=1, le=16384, description="Most tokens one image becomes.")

    @field_validator("max_image_tokens_per_image")
    @classmethod
    def _per_image_in_range(cls, v: int, info: ValidationInfo) -> int:
        low, total = info.data.get("min_image_tokens"), info.data.get("max_image_tokens")
        if isinstance(low, int) and v < low:
            raise PydanticCustomError("tokens_order", "{v} is smaller than min_image_tokens ({n})", {"v": v, "n": low})
        if isinstance(total, int) and v > total:
            raise PydanticCustomError("tokens_order", "{v} is larger than max_image_tokens ({n})", {"v": v, "n": total})
        return v

    @model_validator(mode="after")
    def _default_per_image_in_range(self) -> "VisionBuildConfig":
        # The field validator checks a per-image limit that was given; against its default, the limits
        # given are checked here, at load (the compile reads the whole section back and would fail then).
        if "max_image_tokens_per_image" not in self.model_fields_set:
            per_image = self.max_image_tokens_per_image
            if self.max_image_tokens < per_image:
                raise PydanticCustomError(
                    "tokens_order", "max_image_tokens {v} is smaller than max_image_tokens_per_image's default "
                    "({n}); set max_image_tokens_per_image too", {"v": self.max_image_tokens, "n": per_image})
            if self.min_image_tokens > per_image:
                raise PydanticCustomError(
                    "tokens_order", "min_image_tokens {v} is larger than max_image_tokens_per_image's default "
                    "({n}); set max_image_tokens_per_image too", {"v": self.min_image_tokens, "n": per_image})
        return self


class AudioBuildConfig(BaseModel):
    """Clip limits of an audio model's engine, in mel frames (10 ms each; the reference's defaults).
    A clip shorter than min_mel_frames or longer than max_mel_frames is refused, as is one longer
    than the encoder's window (30 s: 3000 frames for Qwen2-Audio and Whisper)."""
    model_config = ConfigDict(extra="forbid", strict=True)

    min_mel_frames: int = Field(100, ge=1, le=1_000_000, description="Shortest clip, in mel frames.")
    max_mel_frames: int = Field(6000, ge=1, le=1_000_000, description="Longest clip, in mel frames.")
    max_clips: int = Field(8, ge=1, le=256, description="Most audio clips in one request (the encoder's batch).")

    @field_validator("max_mel_frames")
    @classmethod
    def _frames_in_order(cls, v: int, info: ValidationInfo) -> int:
        low = info.data.get("min_mel_frames")
        if isinstance(low, int) and v < low:
            raise PydanticCustomError("frames_order", "{v} is smaller than min_mel_frames ({n})", {"v": v, "n": low})
        return v

    @model_validator(mode="after")
    def _default_max_in_range(self) -> "AudioBuildConfig":
        # As VisionBuildConfig's: a given min_mel_frames against max_mel_frames' default, at load.
        if "max_mel_frames" not in self.model_fields_set and self.min_mel_frames > self.max_mel_frames:
            raise PydanticCustomError(
                "frames_order", "min_mel_frames {v} is larger than max_mel_frames' default ({n}); set "
                "max_mel_frames too", {"v": self.min_mel_frames, "n": self.max_mel_frames})
        return self


def int8_group_size(backend: str) -> int:
    """The int8 inputs per scale a backend runs: Q8_0's blocks of 32 on cpu (ONNX Runtime's
    MatMulNBits), one scale per output column (0) on the TensorRT ones (their int8 takes no blocks)."""
    return 32 if backend == "cpu" else 0


class QuantizationConfig(BaseModel):
    """Weight quantization of the base model (`quantization: int4` is short for the defaults)."""
    model_config = ConfigDict(extra="forbid", strict=True)

    weights: Literal["none", "int8", "int4", "fp8"] = Field(
        description="The matmul weights: int8, int4 (blocks along the input dimension, a scale each) or "
                    "fp8 (E4M3 with a scale per output column; the TensorRT backends only, on GPUs with fp8: "
                    "SM89 and later); activations stay in the graph's dtype.")
    group_size: Literal[32, 64, 128] | None = Field(
        None, description="Inputs per scale. int4: default 128. int8: default 32 (Q8_0's blocks: the activations "
                          "are quantized per block too, which keeps int8 within 1% of fp32's perplexity), or one "
                          "scale per output column on the TensorRT backends (their int8 weights take no blocks).")
    method: Literal["rtn", "awq"] = Field(
        "rtn", description="rtn: round to nearest. awq: activation-aware scales from a calibration text "
                           "(better int4 at the same size; minutes on the CPU for a small model).")
    zero_point: bool = Field(False, description="Asymmetric blocks (a zero point each); the cpu backend only "
                                                "(TensorRT's dequantize takes symmetric weights).")
    lm_head: bool | Literal["int8"] = Field(
        True, description="Quantize the output projection too (true: as the other weights; int8: in blocks of 32, "
                          "as llama.cpp's files keep it; false: float). It is the largest single matmul of a small "
                          "model, and the one rounding hurts most.")
    embedding: Literal["fp32", "fp16", "int8"] | None = Field(
        None, description="How the embedding table is stored (the runtime looks rows up): default fp16 "
                          "when the weights are quantized (bf16 in a bf16 graph), else the graph's dtype.")
    calibration: str | None = Field(None, min_length=1, description="AWQ: a UTF-8 text file of "
                                    "calibration text; default the built-in prompts.")

    @field_validator("group_size")
    @classmethod
    def _group_for_integers(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v is not None and info.data.get("weights") in ("none", "fp8"):
            raise PydanticCustomError("group_for_fp", "group_size is for int8 and int4 weights, not "
                                      "{w}", {"w": info.data.get("weights")})
        return v

    def effective_group_size(self, backend: str = "cpu") -> int:
        """Inputs per scale; 0 is one scale per output column."""
        if self.group_size is not None:
            return self.group_size
        if self.weights == "int4":
            return 128
        if self.weights == "fp8":
            return 0
        return int8_group_size(backend)

    def effective_embedding(self, dtype: str) -> str:
        if self.embedding is not None:
            return self.embedding
        # fp16 halves an fp32 table; a bf16 graph keeps bf16 (the runtime hands it rows as stored).
        return "fp16" if self.weights != "none" and dtype != "bf16" else dtype


QUANTIZATION_NAMES = ("none", "int8", "int4", "fp8")


class BuildConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str = Field(min_length=1, description="Local HF directory, a .gguf file, or a hub id.")
    output_dir: str = Field(min_length=1, description="Where the engine is written.")
    backend: Literal["cpu", "tensorrt", "tensorrt-rtx"] = "cpu"
    dtype: Literal["fp32", "fp16", "bf16"] = "fp32"
    max_batch_size: int = Field(4, ge=1, le=MAX_BATCH_SIZE)
    max_input_len: int = Field(1024, ge=1, description="Longest prompt, in tokens.")
    max_kv_cache_capacity: int = Field(4096, ge=1, description="Prompt + generated tokens per sequence; "
                                       ">= max_input_len.")
    trust_remote_code: bool = False
    rtx_compute_capability: str = Field(
        "auto", pattern=r"^(auto|SM\d+)$",
        description="tensorrt-rtx only: the GPU architecture the engine is built for ahead of time "
                    "(SM75, SM80, SM86, SM89, SM120, SM121); auto = the GPU present, else SM80.")
    lora: LoraBuildConfig | None = Field(None, description="Off unless set.")
    draft: DraftBuildConfig | None = Field(None, description="EAGLE3 speculative decoding; off unless set.")
    mtp: bool = Field(False, description="Build the checkpoint's multi-token-prediction head as the draft for "
                                         "`--speculation mtp` (Qwen3.5 checkpoints with mtp.* tensors); not with draft:.")
    vision: VisionBuildConfig = Field(default_factory=VisionBuildConfig,
                                      description="Image token limits (vision-language models only).")
    audio: AudioBuildConfig = Field(default_factory=AudioBuildConfig,
                                    description="Audio clip limits (audio models only).")
    quantization: QuantizationConfig = Field(
        default_factory=lambda: QuantizationConfig(weights="none"),
        description="Weight quantization: none, int8, int4, fp8, or a mapping (see QuantizationConfig).")

    @field_validator("quantization", mode="before")
    @classmethod
    def _quantization_name(cls, v: Any) -> Any:
        # `quantization: int4` is short for `quantization: {weights: int4}`.
        if isinstance(v, str):
            if v not in QUANTIZATION_NAMES:
                raise PydanticCustomError("quantization_name", "'{v}' is not one of {names}, or a mapping",
                                          {"v": v, "names": ", ".join(QUANTIZATION_NAMES)})
            return {"weights": v}
        return v

    @field_validator("max_kv_cache_capacity")
    @classmethod
    def _kv_holds_prompt(cls, v: int, info: ValidationInfo) -> int:
        # A field validator (not a model validator) so the error is located at this key.
        max_input = info.data.get("max_input_len")
        if isinstance(max_input, int) and v < max_input:
            raise PydanticCustomError("kv_too_small", "{v} is smaller than max_input_len ({n}); the KV "
                                      "cache must hold at least one full prompt", {"v": v, "n": max_input})
        return v


class ConfigError(ValueError):
    """A build config that cannot be used; the message names the file and each bad key."""


def parse_build_config(data: Any, source: str = "<config>") -> BuildConfig:
    """Validate already-loaded YAML data (paths are taken as given)."""
    if data is None:
        raise ConfigError(f"{source}: empty; at least 'model' and 'output_dir' are required")
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of keys to values, got {json_type(data)}")
    try:
        return BuildConfig.model_validate(data)
    except ValidationError as e:
        lines = format_errors(e, ranges=RANGES, allowed_keys=BuildConfig)
        raise ConfigError(f"{source}: invalid build config:\n  " + "\n  ".join(lines)) from None


def _expand_vars(key: str, value: str, path: Path) -> str:
    """$VAR / ${VAR} in paths, so one config serves machines whose files live in different places."""
    expanded = os.path.expandvars(value)
    unset = re.search(r"\$\{?(\w+)", expanded)
    if unset:
        raise ConfigError(f"{path}: {key}: environment variable {unset.group(1)} is not set")
    return expanded


def load_build_config(path: str | Path) -> BuildConfig:
    """Read and validate a YAML build config; relative paths are taken from the config's folder.

    ``model`` is resolved against the config folder only when it exists there, since it may also be
    a hub id ("HuggingFaceTB/SmolLM2-135M"); ``output_dir`` is always resolved there.
    """
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"{path}: cannot read file: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    config = parse_build_config(data, str(path))
    config = config.model_copy(update={key: _expand_vars(key, getattr(config, key), path)
                                       for key in ("model", "output_dir")})

    base = path.resolve().parent
    output_dir = Path(config.output_dir).expanduser()
    if not output_dir.is_absolute():
        output_dir = base / output_dir
    update = {"model": _in_folder(config.model, base), "output_dir": str(output_dir)}
    if config.quantization.calibration is not None:
        calibration = Path(_expand_vars("quantization.calibration", config.quantization.calibration, path)).expanduser()
        if not calibration.is_absolute():
            calibration = base / calibration
        update["quantization"] = config.quantization.model_copy(update={"calibration": str(calibration)})
    if config.draft is not None:
        draft = _in_folder(_expand_vars("draft.model", config.draft.model, path), base)
        update["draft"] = config.draft.model_copy(update={"model": draft})
    return config.model_copy(update=update)


def _in_folder(value: str, base: Path) -> str:
    """A model or draft path found in the config's folder `base` as its path there; anything else
    as written ("~" expanded): "./name" stays a path that does not exist, not the hub id "name"."""
    path = Path(value).expanduser()
    if not path.is_absolute() and (base / path).exists():
        return str(base / path)
    return os.path.expanduser(value)


__all__ = ["BuildConfig", "DraftBuildConfig", "LoraBuildConfig", "QuantizationConfig", "LORA_MODULES", "ConfigError", "load_build_config",
           "parse_build_config"]
