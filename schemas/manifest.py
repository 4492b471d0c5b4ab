"""The manifest of an engine directory or bundle (`manifest.json`), as the runtime reads it.

The build writes it (build/bundle.py, build/compile.py) through these models, so what it writes is
what the runtime reads; `EngineDir.open` and trt-llm-compile validate it before anything else is read, so a corrupt or hand-edited manifest (wrong JSON type, a key
missing or mistyped, a path that leaves the engine directory) is one line naming the key, never a
KeyError later. Unknown keys are allowed: a newer build may add sections this runtime ignores.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from ._errors import format_errors, json_type
from .layer_spec import LayerSpec, kv_source_problem

# The one format version: the build writes it and both the runtime and trt-llm-compile read only it.
FORMAT_VERSION = 1

_LENIENT = ConfigDict(strict=True, extra="allow")
PositiveInt = Annotated[int, Field(ge=1)]


def _inside(value: str) -> str:
    # Every file the runtime opens is named here: none may point outside the engine directory.
    path = PurePosixPath(value)
    if not value or path.is_absolute() or ".." in path.parts or "\\" in value:
        raise PydanticCustomError("outside_engine_dir", "{value} is not a path inside the engine directory",
                                  {"value": repr(value)})
    return value


RelativePath = Annotated[str, AfterValidator(_inside)]


class Dims(BaseModel):
    model_config = _LENIENT
    hidden_size: PositiveInt
    num_layers: PositiveInt
    num_heads: PositiveInt
    kv_heads: PositiveInt
    head_dim: PositiveInt
    vocab_size: PositiveInt
    rms_norm_eps: float


class Eagle(BaseModel):
    model_config = _LENIENT
    feature_layers: list[int]
    feature_width: PositiveInt


class Quantization(BaseModel):
    """What a quantized build made of the weights (absent: all float)."""
    model_config = _LENIENT
    weights: Literal["int8", "int4", "fp8"]
    group_size: int = Field(ge=0)  # 0: one scale per output column
    method: str
    embedding: Literal["fp32", "fp16", "bf16", "int8"]
    quantized_linears: int = Field(ge=0)
    quantized_expert_layers: int = Field(0, ge=0)  # MoE layers whose experts are weight-only blocks
    kept_blocks: dict[str, int] = Field(default_factory=dict)  # a GGUF file's own blocks, by type


class PerLayerInputs(BaseModel):
    """Gemma 4's per-layer embeddings: a second table [vocab, layers * width] whose row of each token
    the runtime looks up and the graph takes as per_layer_inputs (components.llm.per_layer_embedding)."""
    model_config = _LENIENT
    layers: PositiveInt
    width: PositiveInt  # per layer
    vocab_size: PositiveInt
    scale: float = Field(gt=0)  # every row times this (sqrt(width), rounded to the model's dtype)


class ModelSection(BaseModel):
    model_config = _LENIENT
    family: str
    architecture: str | None = None
    dtype: Literal["fp32", "fp16", "bf16"]
    dims: Dims
    eos_token_ids: list[Annotated[int, Field(ge=0)]]
    eagle: Eagle | None = None
    quantization: Quantization | None = None
    mrope: str | None = None  # a vision-language decoder's multimodal rotary: "sections" or "interleaved"
    deepstack_layers: int = Field(0, ge=0)  # Qwen3-VL: early layers that take deepstack_embeds
    # Gemma: the runtime multiplies the token rows it looks up by this (an image's rows stay as they are)
    embedding_scale: float | None = Field(None, gt=0)
    # Gemma 3: an image's soft tokens (at most this many in a run) see each other both ways; the graph
    # takes a tree_mask, and a prefill pass never splits such a run
    bidirectional_block: int = Field(0, ge=0)
    per_layer_inputs: PerLayerInputs | None = None  # Gemma 4's per-layer embeddings
    layers: list[LayerSpec] = Field(min_length=1)  # one per decoder layer, what its cache holds


class Limits(BaseModel):
    model_config = _LENIENT
    max_batch_size: PositiveInt
    max_input_len: PositiveInt
    max_kv_cache_capacity: PositiveInt


class HeadRows(BaseModel):
    """Where an engine's int8 embedding rows are its 8-bit LM head's (build/tied_embedding.py): byte
    offsets in the file components.llm.embedding names, rows [vocab, hidden] uint8 around zero_point,
    scales [vocab, hidden / block] float32."""
    model_config = _LENIENT
    rows_offset: int = Field(ge=0)
    scales_offset: int = Field(ge=0)
    block: PositiveInt  # values of a row per scale
    zero_point: int = Field(ge=0, le=255)


class LlmComponent(BaseModel):
    model_config = _LENIENT
    graph: RelativePath
    engine: RelativePath | None = None  # absent in a bundle
    embedding: RelativePath
    embedding_from_head: HeadRows | None = None  # the embedding file is the engine's weights: where in it
    per_layer_embedding: RelativePath | None = None  # the table model.per_layer_inputs describes
    config: RelativePath
    tensorrt_version: str | None = None


class TreeDefaults(BaseModel):
    model_config = _LENIENT
    draft_top_k: PositiveInt
    draft_steps: PositiveInt
    verify_tree_size: Annotated[int, Field(ge=2)]


class DraftComponent(BaseModel):
    model_config = _LENIENT
    # eagle3: an EAGLE3 draft (tensors: fc, d2t); mtp: the checkpoint's multi-token-prediction head
    # (build/mtp/: its fc in the graph, d2t zeros, hidden = the base's final_hidden_states)
    kind: Literal["eagle3", "mtp"] = "eagle3"
    graph: RelativePath
    engine: RelativePath | None = None
    tensors: RelativePath
    max_draft_tree_size: PositiveInt
    max_verify_tree_size: Annotated[int, Field(ge=2)]
    tree_defaults: TreeDefaults | None = None  # the backend's default tree (runtime/decoding/spec_config.py)
    layers: list[LayerSpec] = Field(min_length=1, max_length=1)  # the draft's one layer


class EncoderComponent(BaseModel):
    """A vision or audio encoder: its graph (and compiled engine) and its preprocessing config."""
    model_config = _LENIENT
    graph: RelativePath
    engine: RelativePath | None = None
    config: RelativePath
    preprocessor: RelativePath | None = None  # the image processor's / feature extractor's settings
    # Its runtime adapter's name (trt_llm/families/adapters.py); absent in an engine built before the
    # families' faces: the family's own adapter then.
    adapter: str | None = None


class TokenizerComponent(BaseModel):
    model_config = _LENIENT
    dir: RelativePath


class Components(BaseModel):
    model_config = _LENIENT
    llm: LlmComponent
    tokenizer: TokenizerComponent
    draft: DraftComponent | None = None
    vision: EncoderComponent | None = None
    audio: EncoderComponent | None = None


class LoraGroup(BaseModel):
    model_config = _LENIENT
    name: str
    modules: list[str]
    in_features: PositiveInt
    out_features: PositiveInt
    out_offsets: dict[str, Annotated[int, Field(ge=0)]]
    module_out_features: dict[str, PositiveInt]


class LoraLayout(BaseModel):
    model_config = _LENIENT
    max_rank: PositiveInt
    target_modules: list[str]
    num_layers: PositiveInt
    groups: list[LoraGroup]  # every layer's, unless layer_groups is set
    layer_groups: list[list[LoraGroup]] | None = None  # each layer its own (layers of different shapes)

    @model_validator(mode="after")
    def _one_list_per_layer(self) -> "LoraLayout":
        if self.layer_groups is not None and len(self.layer_groups) != self.num_layers:
            raise PydanticCustomError("lora_layers", "layer_groups has {got} lists, one per layer of num_layers {want}",
                                      {"got": len(self.layer_groups), "want": self.num_layers})
        return self


class Manifest(BaseModel):
    model_config = _LENIENT
    format_version: int
    kind: Literal["engine", "bundle"] = "engine"
    backend: str | None
    build_config: dict[str, Any]
    model: ModelSection
    limits: Limits
    components: Components
    lora: LoraLayout | None = None
    tool_versions: dict[str, str] = Field(default_factory=dict)


class ManifestError(ValueError):
    """A manifest that does not hold what the runtime reads; the message names the key."""


def validate_manifest(data: Any, source: str) -> Manifest:
    """The manifest's typed view; `ManifestError` names the first bad keys (at most three)."""
    if not isinstance(data, dict):
        raise ManifestError(f"{source}: not a manifest: expected a JSON object, got {json_type(data)}")
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as error:
        messages = format_errors(error)
        more = f" (and {len(messages) - 3} more)" if len(messages) > 3 else ""
        raise ManifestError(f"{source}: corrupt manifest: {'; '.join(messages[:3])}{more}; rebuild the engine "
                            "with trt-llm-build") from None
    why = _inconsistency(manifest)
    if why is not None:
        raise ManifestError(f"{source}: {why}; the manifest no longer describes the engine it came with: undo "
                            "the edit or rebuild the engine with trt-llm-build")
    return manifest


def _inconsistency(manifest: Manifest) -> str | None:
    """What a hand edit makes of a manifest whose every key is well typed: a layer count that is not the
    model's, limits raised past what the engine was built for (build_config, which the build and the
    compile write with them), a prompt longer than the cache, a layer that reads the keys and values of
    one that is not an earlier layer of its kind and geometry."""
    dims, layers = manifest.model.dims, manifest.model.layers
    if dims.num_layers != len(layers):
        return f"model.dims.num_layers: {dims.num_layers}, but model.layers has {len(layers)} layers"
    if why := kv_source_problem(layers):  # a layer reading another's keys and values (Gemma 4)
        return f"model.{why}"
    per_layer = manifest.model.per_layer_inputs
    if per_layer is not None and per_layer.layers != len(layers):
        return f"model.per_layer_inputs.layers: {per_layer.layers}, but model.layers has {len(layers)} layers"
    if (per_layer is None) != (manifest.components.llm.per_layer_embedding is None):
        return ("components.llm.per_layer_embedding: " + ("missing, which model.per_layer_inputs calls for"
                if per_layer is not None else "a table model.per_layer_inputs does not describe"))
    limits = manifest.limits
    for key in ("max_batch_size", "max_input_len", "max_kv_cache_capacity"):
        built = manifest.build_config.get(key)
        if isinstance(built, int) and not isinstance(built, bool) and getattr(limits, key) > built:
            return f"limits.{key}: {getattr(limits, key)}, but the engine was built for {built} (build_config.{key})"
    if limits.max_input_len > limits.max_kv_cache_capacity:
        return (f"limits.max_input_len: {limits.max_input_len} is more than limits.max_kv_cache_capacity "
                f"({limits.max_kv_cache_capacity}), which holds the prompt")
    return None


__all__ = ["FORMAT_VERSION", "Manifest", "ManifestError", "validate_manifest"]
