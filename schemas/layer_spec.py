"""What each decoder layer is: its kind and what its cache holds, declared by the model family and
recorded in the manifest (`model.layers`, one per layer, and the draft's `components.draft.layers`).

Everything per layer is derived from these: the graph's cache inputs and outputs
(schemas/graph_spec.py), the exporter's example tensors and dynamic dimensions, the TensorRT
optimisation profiles, and the runtime's cache set (runtime/cache/). Nothing else spells a
per-layer input.

    full       attention over every earlier token: a key and a value buffer of `capacity` slots
    sliding    attention over the last `window` tokens (itself included): a key / value buffer that
               needs only the window (plus the widest step) where the backend allows
    cross      an encoder-decoder's decoder layer (Whisper): self-attention as `full`, plus keys and
               values of the encoder's output that the layer reads and never writes
    recurrent  a fixed-size state per sequence (named tensors) that each token updates, whatever the
               length (Gated DeltaNet, Mamba)

An attention layer with `kv_source` (Gemma 4's KV sharing) computes no keys and values: it reads those of
the earlier layer it names, which owns them (`owns_cache`), so it has no cache tensors, no place in a
cache group and nothing in a context record; its source is of its kind and geometry.

Layers of the same kind and geometry form a cache group (`group_key`): one block of buffers in the
runtime, one lengths input in the graph for a sliding group.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

_STRICT = ConfigDict(strict=True, extra="forbid", frozen=True)
PositiveInt = Annotated[int, Field(ge=1)]


class RotarySpec(BaseModel):
    """How a layer turns q and k. The tables themselves are in the graph (the family computes them
    with transformers' own rotary module); this records what they are."""
    model_config = _STRICT
    base: float  # theta
    dims: PositiveInt  # rotated dimensions per head (head_dim, or fewer with partial rotary)
    scaling: str = "default"  # the rope type: default, linear, dynamic, yarn, llama3, longrope, ...
    mrope: Literal["sections", "interleaved"] | None = None  # a VLM's multimodal positions
    # LongRoPE (Phi-3): a sequence longer than `original_context` tokens (its whole prompt, or all it
    # holds) turns by the long factors, whose rows start at `long_rows` in the tables (row
    # long_rows + p for position p), as transformers switches: per forward, by its longest sequence.
    original_context: PositiveInt | None = None
    long_rows: PositiveInt | None = None


class _Attention(BaseModel):
    model_config = _STRICT
    kv_heads: PositiveInt
    head_dim: PositiveInt
    scale: float  # the softmax scale of q k^T
    rotary: RotarySpec | None = None  # None: no rotary (Whisper's learned positions)
    soft_cap: float | None = None  # scores -> soft_cap * tanh(scores / soft_cap) (Gemma 2)
    kv_source: int | None = Field(None, ge=0)  # the earlier layer whose keys and values it reads (owns none)


class FullAttention(_Attention):
    kind: Literal["full"] = "full"


class SlidingAttention(_Attention):
    kind: Literal["sliding"] = "sliding"
    window: PositiveInt  # a token sees itself and the window - 1 tokens before it


class CrossAttention(_Attention):
    """Self-attention (kv_heads, head_dim) as a full layer, plus cross-attention over the encoder's
    `frames` outputs, which the encoder computes once per request."""
    kind: Literal["cross"] = "cross"
    cross_heads: PositiveInt
    cross_head_dim: PositiveInt


class StateTensor(BaseModel):
    model_config = _STRICT
    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")  # the graph's past_<name>_<layer> / present_<name>_<layer>
    shape: list[PositiveInt]  # one sequence's state, without the batch dimension
    dtype: Literal["model", "float32"] = "model"


class Recurrent(BaseModel):
    model_config = _STRICT
    kind: Literal["recurrent"] = "recurrent"
    states: list[StateTensor] = Field(min_length=1)


LayerSpec = Annotated[Union[FullAttention, SlidingAttention, CrossAttention, Recurrent], Field(discriminator="kind")]
ATTENTION_KINDS = ("full", "sliding", "cross")


def owns_cache(layer) -> bool:
    """Whether the layer holds a cache of its own (every layer but one that reads another's: kv_source)."""
    return getattr(layer, "kv_source", None) is None


def kv_source_problem(layers) -> str | None:
    """Why the layers' kv_source entries cannot be, naming the key, or None: a layer reads an earlier
    one that owns its cache, of its own kind, window and geometry."""
    for index, layer in enumerate(layers):
        source = getattr(layer, "kv_source", None)
        if source is None:
            continue
        where = f"layers[{index}].kv_source"
        if source >= index:
            return f"{where}: {source}, not an earlier layer"
        owner = layers[source]
        if owner.kind != layer.kind or not owns_cache(owner):
            return f"{where}: layer {source} is {'a reader itself' if owner.kind == layer.kind else owner.kind}"
        if group_key(owner) != group_key(layer):
            return f"{where}: layer {source}'s cache is {group_key(owner)[1:]}, this layer's {group_key(layer)[1:]}"
    return None


def group_key(layer) -> tuple:
    """Layers with equal keys share one cache group (and, sliding, one lengths input)."""
    if layer.kind == "recurrent":
        return ("recurrent", tuple((s.name, tuple(s.shape), s.dtype) for s in layer.states))
    window = layer.window if layer.kind == "sliding" else 0
    return ("attention", window, layer.kv_heads, layer.head_dim)


def window_of(layer) -> int:
    """A layer's attention window (0: every earlier token)."""
    return layer.window if layer.kind == "sliding" else 0


def full_layers(count: int, kv_heads: int, head_dim: int) -> list:
    """`count` full attention layers of one geometry (an engine given a layer count, not specs: tests
    and tools that open a graph by itself)."""
    return [FullAttention(kv_heads=kv_heads, head_dim=head_dim, scale=head_dim ** -0.5)] * count


def parse_layers(data: list[dict]) -> list:
    """The typed layer specs of a manifest's list (validated there already)."""
    from pydantic import TypeAdapter

    return TypeAdapter(list[LayerSpec]).validate_python(data)


__all__ = ["ATTENTION_KINDS", "CrossAttention", "FullAttention", "LayerSpec", "Recurrent", "RotarySpec",
           "SlidingAttention", "StateTensor", "full_layers", "group_key", "kv_source_problem", "owns_cache",
           "parse_layers", "window_of"]
