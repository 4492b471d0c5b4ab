"""The linear factory a quantized build hands the model family: every packed projection (and the
LM head) becomes a QuantizedLinear, from the checkpoint's own blocks when it has them, else from
the float weights by the configured method."""

from __future__ import annotations

import logging

import torch
from torch import nn

from trt_llm.build.models.layers import ConcatenatedLinear, Linear, QuantizedLinear, linear, packed_bias
from trt_llm.build.quantize import QuantizedWeight, QuantSpec, concat, same_input_order
from trt_llm.build.quantize.rtn import quantize_rtn
from trt_llm.schemas.build_config import int8_group_size

log = logging.getLogger(__name__)

class LinearFactory:
    """Called as `make_linear(*hf_linears)` by build/models/ (see layers.linear).

    spec: how float weights are quantized (round to nearest; AWQ has scaled the model's weights
    before, build/quantize/awq.py). published: HF module name -> the checkpoint's own
    QuantizedWeight (GPTQ, AWQ, GGUF blocks), kept bit for bit. head_spec: how the LM head is
    quantized (None: it stays float; default `spec`)."""

    def __init__(self, model: nn.Module, dtype: torch.dtype, spec: QuantSpec,
                 published: dict[str, QuantizedWeight] | None = None, head_spec: QuantSpec | None | str = "spec"):
        self.names = {id(module): name for name, module in model.named_modules()}
        # The LM head: lm_head, or the model's output embedding by its own name (Whisper's proj_out)
        output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        self.head = self.names.get(id(output), "lm_head") if output is not None else "lm_head"
        self.dtype, self.spec = dtype, spec
        self.published = dict(published or {})
        self.head_spec = spec if head_spec == "spec" else head_spec
        self.quantized: list[str] = []  # the names of the linears made quantized, in order
        self.embedding_blocks: QuantizedWeight | None = None  # a GGUF's Q8_0 token embedding
        self.kept_types: dict[str, str] = {}  # name -> GGUF type, of the published blocks kept
        # A GPTQ / AWQ MoE's experts kept as they are: experts module name -> each expert's
        # (gate, up, down) QuantizedWeights (build/models/moe.SparseMoe.from_hf)
        self.experts: dict[str, list] = {}
        self.quantized_experts: list[str] = []  # the experts modules made quantized, in order

    def summary(self, quantization, embedding: str) -> dict:
        """The manifest's model.quantization (schemas/manifest.Quantization)."""
        kept: dict[str, int] = {}
        for name in self.quantized:
            if name in self.kept_types:
                kept[self.kept_types[name]] = kept.get(self.kept_types[name], 0) + 1
        if self.embedding_blocks is not None and embedding == "int8":
            kept["Q8_0"] = kept.get("Q8_0", 0) + 1  # the token embedding
        return {"weights": quantization.weights, "group_size": self.spec.group_size, "method": quantization.method,
                "embedding": embedding, "quantized_linears": len(self.quantized),
                "quantized_expert_layers": len(self.quantized_experts), "kept_blocks": kept}

    def moe(self, block: nn.Module, weights=None, **routing) -> nn.Module:
        """A MoE block (transformers' sparse block) as build/models/moe.SparseMoe with its experts
        quantized as `spec` says, or the checkpoint's own expert blocks (`experts`) where it has them.
        weights: the streamed checkpoint the experts are read from (build/streamed_weights.py);
        routing: SparseMoe.from_hf's router, activation and expert_scale (Gemma 4's)."""
        from trt_llm.build.models.moe import SparseMoe

        name = self.names.get(id(block.experts), "")
        moe = SparseMoe.from_hf(block, self.spec, self.dtype, weights, self.experts.get(name), **routing)
        self.quantized_experts.append(name)
        return moe

    def __call__(self, *parts: nn.Linear) -> Linear | QuantizedLinear | ConcatenatedLinear:
        names = [self.names.get(id(p), "") for p in parts]
        kept = [self.published.get(name) for name in names]
        is_head = names == [self.head]
        if any(k is not None for k in kept):
            if any(k is None for k in kept):
                from trt_llm.build.checkpoint import CheckpointError

                raise CheckpointError(f"model: {', '.join(names)}: a packed projection is partly quantized in the "
                                      "checkpoint; quantize all its parts or none")
            weights = kept
        elif is_head and self.head_spec is None:
            return linear(*parts)
        else:
            spec = self.head_spec if is_head else self.spec
            weights = [quantize_rtn(p.weight, spec, self.dtype) for p in parts]
        self.quantized += names
        weights = [w.with_scales_in(self.dtype) for w in weights]
        if not same_input_order(weights):
            return ConcatenatedLinear([QuantizedLinear(w, None) for w in weights], packed_bias(parts))
        return QuantizedLinear(concat(weights), packed_bias(parts))


def spec_of(quantization, backend: str = "cpu") -> QuantSpec:
    """schemas/build_config.QuantizationConfig -> how float weights are quantized."""
    return QuantSpec(bits=4 if quantization.weights == "int4" else 8,
                     group_size=quantization.effective_group_size(backend), symmetric=not quantization.zero_point,
                     fp8=quantization.weights == "fp8")


def head_spec_of(quantization, backend: str = "cpu") -> QuantSpec | None:
    """How the LM head is quantized (None: float). lm_head: int8 is llama.cpp's blocks of 32 on the
    cpu backend, one scale per column on the TensorRT ones (their int8 weights take no blocks)."""
    if quantization.lm_head == "int8":
        return QuantSpec(8, int8_group_size(backend))
    return spec_of(quantization, backend) if quantization.lm_head else None


def factory_for(config, checkpoint, dtype: torch.dtype):
    """The make_linear of a build config (schemas/build_config.QuantizationConfig): `linear` when
    the weights stay float, else a LinearFactory that keeps the checkpoint's own blocks (a GGUF file,
    a GPTQ / AWQ folder) wherever the configured quantization holds them and quantizes the rest."""
    quantization = config.quantization
    if quantization.weights == "none":
        if checkpoint.published:
            log.warning("%s: a %s checkpoint built with quantization: none runs its weights dequantized; "
                        "quantization: {weights: int4, group_size: %s} keeps its blocks", checkpoint.source,
                        checkpoint.published_config["quant_method"].upper(), published_group(checkpoint) or "G")
        return linear
    spec, head_spec = spec_of(quantization, config.backend), head_spec_of(quantization, config.backend)
    gguf = str(checkpoint.source).endswith(".gguf")
    if quantization.method == "awq":
        from trt_llm.build.quantize.awq import apply_awq

        if gguf or checkpoint.published:
            log.warning("%s: AWQ rescales the weights before quantizing them, so the checkpoint's own blocks "
                        "are not kept (method: rtn keeps them)", checkpoint.source)
        text = read_calibration(quantization.calibration) if quantization.calibration is not None else None
        apply_awq(checkpoint.model, checkpoint.tokenizer, spec, text)
        return LinearFactory(checkpoint.model, dtype, spec, head_spec=head_spec)
    if checkpoint.published:
        factory = LinearFactory(checkpoint.model, dtype, spec, folder_published(checkpoint, spec, config.backend),
                                head_spec=head_spec)
        factory.experts = experts_published(checkpoint, spec)
        return factory
    if gguf:
        return gguf_factory(checkpoint, dtype, spec, head_spec, config.backend)
    return LinearFactory(checkpoint.model, dtype, spec, head_spec=head_spec)


def gguf_factory(checkpoint, dtype: torch.dtype, spec: QuantSpec, head_spec: QuantSpec | None,
                 backend: str = "cpu") -> LinearFactory:
    """A GGUF file's factory: its blocks that `spec` holds, and its Q8_0 embedding table."""
    from trt_llm.build.quantize.gguf_blocks import read_blocks

    blocks = read_blocks(checkpoint.source, checkpoint.model)
    kept = gguf_published(checkpoint, spec, blocks, backend)
    if head_spec is None:
        kept.pop("lm_head", None)
    factory = LinearFactory(checkpoint.model, dtype, spec, kept, head_spec=head_spec)
    factory.kept_types = {name: blocks[name][0] for name in kept}
    embedding = blocks.get(_embedding_name(checkpoint.model))
    if embedding is not None and embedding[0] == "Q8_0":
        factory.embedding_blocks = embedding[1]
    return factory


def published_group(checkpoint) -> int | None:
    """The group size of a GPTQ / AWQ folder's blocks (0: one per column)."""
    groups = {w.group_size for w in _linears(checkpoint.published).values()}
    return groups.pop() if len(groups) == 1 else None


def _linears(published: dict) -> dict[str, QuantizedWeight]:
    """A folder's published linears (without a MoE's experts, which are lists of them)."""
    return {name: w for name, w in published.items() if isinstance(w, QuantizedWeight)}


def experts_published(checkpoint, spec: QuantSpec) -> dict[str, list]:
    """The MoE experts a GPTQ / AWQ folder has blocks for that the MoE op takes as they are
    (build/models/moe.fits_the_op: symmetric, no act-order, the build's bits and block size); the
    others are quantized again from their dequantized weights, and the build says so."""
    from trt_llm.build.models.moe import fits_the_op

    experts = {name: w for name, w in checkpoint.published.items() if not isinstance(w, QuantizedWeight)}
    kept = {name: blocks for name, blocks in experts.items() if all(fits_the_op(parts, spec) for parts in blocks)}
    if len(kept) < len(experts):
        log.warning("%s: the experts of %d of its %d MoE layers are not symmetric %s blocks in input order; "
                    "they are dequantized and quantized again", checkpoint.source, len(experts) - len(kept),
                    len(experts), spec.describe())
    return kept


def folder_published(checkpoint, spec: QuantSpec, backend: str) -> dict[str, QuantizedWeight]:
    """The GPTQ / AWQ blocks an int4 build keeps: all of them when it asks for their group size (and,
    on a TensorRT backend, when they are symmetric: its dequantize takes no zero points). Otherwise
    they are requantized from the dequantized weights, and the build says so."""
    fmt = checkpoint.published_config["quant_method"].upper()
    linears = _linears(checkpoint.published)
    kept = {name: w for name, w in linears.items()
            if not spec.fp8 and spec.bits == w.bits and w.group_size == spec.group_for(w.in_features)}
    if backend != "cpu":
        kept = {name: w for name, w in kept.items() if w.zero_points is None}
    if len(kept) < len(linears):
        log.warning("%s: %d of its %d %s weights do not fit %s%s; they are dequantized and quantized again",
                    checkpoint.source, len(linears) - len(kept), len(linears), fmt,
                    spec.describe(), " with symmetric blocks (TensorRT)" if backend != "cpu" else "")
    return kept


def read_calibration(path: str) -> str:
    """quantization.calibration: a UTF-8 text file; a bad one is a ValueError naming the key."""
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as error:
        raise ValueError(f"quantization.calibration: cannot read {path!r}: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise ValueError(f"quantization.calibration: {path!r} is not UTF-8 text (byte {error.start})") from None
    if not text.strip():
        raise ValueError(f"quantization.calibration: {path!r} is empty")
    return text


def _embedding_name(model: nn.Module) -> str:
    table = model.get_input_embeddings()
    return next(name for name, module in model.named_modules() if module is table)


def gguf_published(checkpoint, spec: QuantSpec, blocks: dict, backend: str = "cpu") -> dict[str, QuantizedWeight]:
    """The GGUF blocks an int4 / int8 build keeps: Q4_0 / Q4_1 where it asks for int4 in groups of
    32, Q8_0 where it asks for int8 in blocks of 32 (and for the LM head of an int4 build: llama.cpp's
    files keep that one at 8 bits on purpose, and 4 bits would only lose) on the backend that runs
    int8 blocks (cpu). The rest is requantized from the dequantized weights, and the build says so."""
    def holds(name: str, type_name: str) -> bool:
        if spec.fp8:
            return False
        if type_name in ("Q4_0", "Q4_1"):
            return spec.bits == 4 and spec.group_size == 32
        int8 = (spec.bits == 8 and spec.group_size == 32) or name == "lm_head"
        return type_name == "Q8_0" and int8 and int8_group_size(backend) == 32

    linears = {name for name, module in checkpoint.model.named_modules() if isinstance(module, nn.Linear)}
    blocks = {name: found for name, found in blocks.items() if name in linears}
    kept = {name: weight for name, (type_name, weight) in blocks.items() if holds(name, type_name)}
    requantized = sorted({type_name for name, (type_name, _) in blocks.items() if name not in kept})
    if requantized:
        log.warning("%s: %d of its %d quantized matmul weights (%s) do not fit %s; they are dequantized and "
                    "quantized again (int4 with group_size 32 keeps Q4_0 / Q4_1 blocks as they are, int8 on the "
                    "cpu backend keeps Q8_0)", checkpoint.source, len(blocks) - len(kept), len(blocks),
                    ", ".join(requantized), spec.describe())
    return kept
