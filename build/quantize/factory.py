"""The linear factory a quantized build hands the model family: every packed projection (and the
LM head) becomes a QuantizedLinear, from the checkpoint's own blocks when it has them, else from
the float weights by the configured method."""

from __future__ import annotations

import logging
from typing import Callable

import torch
from torch import Tensor, nn

from trt_llm.build.models.layers import ConcatenatedLinear, Linear, QuantizedLinear, linear, packed_bias
from trt_llm.build.quantize import QuantizedWeight, QuantSpec, concat, same_input_order
from trt_llm.build.quantize.rtn import quantize_rtn

log = logging.getLogger(__name__)

# A method: (HF linear's weight [N, K], its HF name, spec, scale dtype) -> QuantizedWeight.
Method = Callable[[Tensor, str, QuantSpec, torch.dtype], QuantizedWeight]


def rtn_method(weight: Tensor, name: str, spec: QuantSpec, dtype: torch.dtype) -> QuantizedWeight:
    return quantize_rtn(weight, spec, dtype)


class LinearFactory:
    """Called as `make_linear(*hf_linears)` by build/models/ (see layers.linear).

    spec: how float weights are quantized (None: they stay float). published: HF module name ->
    the checkpoint's own QuantizedWeight (GPTQ, AWQ, GGUF blocks), kept bit for bit. lm_head: whether
    the LM head is quantized. method: rtn_method, or AWQ's (build/quantize/awq.py)."""

    def __init__(self, model: nn.Module, dtype: torch.dtype, spec: QuantSpec | None,
                 published: dict[str, QuantizedWeight] | None = None, lm_head: bool = True,
                 method: Method = rtn_method):
        self.names = {id(module): name for name, module in model.named_modules()}
        self.dtype, self.spec, self.method = dtype, spec, method
        self.published = dict(published or {})
        self.lm_head = lm_head
        self.quantized: list[str] = []  # the names of the linears made quantized, in order
        self.embedding_blocks: QuantizedWeight | None = None  # a GGUF's Q8_0 token embedding
        self.kept_types: dict[str, str] = {}  # name -> GGUF type, of the published blocks kept

    def summary(self, quantization, embedding: str) -> dict:
        """The manifest's model.quantization (schemas/manifest.Quantization)."""
        kept: dict[str, int] = {}
        for name in self.quantized:
            if name in self.kept_types:
                kept[self.kept_types[name]] = kept.get(self.kept_types[name], 0) + 1
        if self.embedding_blocks is not None and embedding == "int8":
            kept["Q8_0"] = kept.get("Q8_0", 0) + 1  # the token embedding
        return {"weights": quantization.weights, "group_size": self.spec.group_size, "method": quantization.method,
                "embedding": embedding, "quantized_linears": len(self.quantized), "kept_blocks": kept}

    def __call__(self, *parts: nn.Linear) -> Linear | QuantizedLinear:
        names = [self.names.get(id(p), "") for p in parts]
        kept = [self.published.get(name) for name in names]
        is_head = names == ["lm_head"]
        if any(k is not None for k in kept):
            if any(k is None for k in kept):
                raise ValueError(f"{', '.join(names)}: a packed projection is partly quantized in the checkpoint")
            weights = [k for k in kept]
        elif self.spec is None or (is_head and not self.lm_head):
            return linear(*parts)
        else:
            weights = [self.method(p.weight, name, self.spec, self.dtype) for p, name in zip(parts, names)]
        self.quantized += names
        weights = [w.with_scales_in(self.dtype) for w in weights]
        if not same_input_order(weights):
            return ConcatenatedLinear([QuantizedLinear(w, None) for w in weights], packed_bias(parts))
        return QuantizedLinear(concat(weights), packed_bias(parts))


def spec_of(quantization) -> QuantSpec:
    """schemas/build_config.QuantizationConfig -> how float weights are quantized."""
    return QuantSpec(bits=4 if quantization.weights == "int4" else 8, group_size=quantization.effective_group_size(),
                     symmetric=not quantization.zero_point)


def factory_for(config, checkpoint, dtype: torch.dtype):
    """The make_linear of a build config (schemas/build_config.QuantizationConfig): `linear` when
    the weights stay float, else a LinearFactory with the configured method and, for a GGUF file,
    the file's own blocks wherever the configured quantization holds them."""
    quantization = config.quantization
    if quantization.weights == "none":
        if checkpoint.published:
            log.warning("%s: a %s checkpoint built with quantization: none runs its weights dequantized; "
                        "quantization: {weights: int4, group_size: %s} keeps its blocks", checkpoint.source,
                        checkpoint.published_config["quant_method"].upper(), published_group(checkpoint) or "G")
        return linear
    spec = spec_of(quantization)
    if checkpoint.published and quantization.method == "rtn":
        return LinearFactory(checkpoint.model, dtype, spec, folder_published(checkpoint, spec, config.backend),
                             lm_head=quantization.lm_head)
    gguf = str(checkpoint.source).endswith(".gguf")
    if quantization.method == "awq":
        from trt_llm.build.quantize.awq import apply_awq

        if gguf:
            log.warning("%s: AWQ rescales the weights before quantizing them, so the file's own blocks are not "
                        "kept (method: rtn keeps them)", checkpoint.source)
        text = None
        if quantization.calibration is not None:
            text = read_calibration(quantization.calibration)
        apply_awq(checkpoint.model, checkpoint.tokenizer, spec, text)
        return LinearFactory(checkpoint.model, dtype, spec, lm_head=quantization.lm_head)
    if not gguf:
        return LinearFactory(checkpoint.model, dtype, spec, lm_head=quantization.lm_head)
    from trt_llm.build.quantize.gguf_blocks import read_blocks

    blocks = read_blocks(checkpoint.source, checkpoint.model)
    kept = gguf_published(checkpoint, spec, blocks)
    factory = LinearFactory(checkpoint.model, dtype, spec, kept, lm_head=quantization.lm_head)
    factory.kept_types = {name: blocks[name][0] for name in kept}
    embedding = blocks.get(_embedding_name(checkpoint.model))
    if embedding is not None and embedding[0] == "Q8_0":
        factory.embedding_blocks = embedding[1]
    return factory


def published_group(checkpoint) -> int | None:
    """The group size of a GPTQ / AWQ folder's blocks (0: one per column)."""
    groups = {w.group_size for w in checkpoint.published.values()}
    return groups.pop() if len(groups) == 1 else None


def folder_published(checkpoint, spec: QuantSpec, backend: str) -> dict[str, QuantizedWeight]:
    """The GPTQ / AWQ blocks an int4 build keeps: all of them when it asks for their group size (and,
    on a TensorRT backend, when they are symmetric: its dequantize takes no zero points). Otherwise
    they are requantized from the dequantized weights, and the build says so."""
    fmt = checkpoint.published_config["quant_method"].upper()
    kept = {name: w for name, w in checkpoint.published.items()
            if spec.bits == w.bits and w.group_size == spec.group_for(w.in_features)}
    if backend != "cpu":
        kept = {name: w for name, w in kept.items() if w.zero_points is None}
    if len(kept) < len(checkpoint.published):
        log.warning("%s: %d of its %d %s weights do not fit int%d in groups of %s%s; they are dequantized and "
                    "quantized again", checkpoint.source, len(checkpoint.published) - len(kept),
                    len(checkpoint.published), fmt, spec.bits, spec.group_size or "a column",
                    " with symmetric blocks (TensorRT)" if backend != "cpu" else "")
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


def gguf_published(checkpoint, spec: QuantSpec, blocks: dict) -> dict[str, QuantizedWeight]:
    """The GGUF blocks an int4 / int8 build keeps: Q4_0 / Q4_1 where it asks for int4 in groups of
    32, Q8_0 where it asks for int8 (and for the LM head of an int4 build: llama.cpp's files keep
    that one at 8 bits on purpose, and 4 bits would only lose). The rest is requantized from the
    dequantized weights, and the build says so."""
    def holds(name: str, type_name: str) -> bool:
        if type_name in ("Q4_0", "Q4_1"):
            return spec.bits == 4 and spec.group_size == 32
        return type_name == "Q8_0" and (spec.bits == 8 or name == "lm_head")

    linears = {name for name, module in checkpoint.model.named_modules() if isinstance(module, nn.Linear)}
    blocks = {name: found for name, found in blocks.items() if name in linears}
    kept = {name: weight for name, (type_name, weight) in blocks.items() if holds(name, type_name)}
    requantized = sorted({type_name for name, (type_name, _) in blocks.items() if name not in kept})
    if requantized:
        log.warning("%s: %d of its %d quantized matmul weights (%s) do not fit int%d in groups of %s; they are "
                    "dequantized and quantized again (int4 with group_size 32 keeps Q4_0 / Q4_1 blocks as they "
                    "are, int8 keeps Q8_0)", checkpoint.source, len(blocks) - len(kept), len(blocks),
                    ", ".join(requantized), spec.bits, spec.group_size or "a column")
    return kept


EMBEDDING_BLOCK = 32


def embedding_tensors(table: Tensor, storage: str, blocks: QuantizedWeight | None = None) -> dict[str, Tensor]:
    """The embedding file's tensors, which runtime/embedding.py reads: the table [V, H] in fp32 /
    fp16 / bf16, or int8 "embedding" [V, H] with "scales" [V, H / 32] (Q8_0: blocks of 32 along a row,
    largest magnitude / 127; a row that 32 does not divide is one block). `blocks`: a GGUF's Q8_0
    table ([H, V] as the op's operands), kept as it is."""
    if storage == "int8":
        if blocks is not None:
            q, _ = blocks.values()
            return {"embedding": q.t().to(torch.int8).contiguous(), "scales": blocks.scales.t().float().contiguous()}
        width = table.shape[1]
        group = EMBEDDING_BLOCK if width % EMBEDDING_BLOCK == 0 else width
        grouped = table.float().reshape(table.shape[0], -1, group)
        scales = grouped.abs().amax(dim=-1, keepdim=True) / 127
        scales = torch.where(scales == 0, torch.ones_like(scales), scales)
        rows = torch.round(grouped / scales).clamp(-127, 127).to(torch.int8).reshape(table.shape)
        return {"embedding": rows.contiguous(), "scales": scales[..., 0].contiguous()}
    return {"embedding": table.to({"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[storage])
            .contiguous()}
