"""The linear factory a quantized build hands the model family: every packed projection (and the
LM head) becomes a QuantizedLinear, from the checkpoint's own blocks when it has them, else from
the float weights by the configured method."""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn

from trt_llm.build.models.layers import Linear, QuantizedLinear, linear, packed_bias
from trt_llm.build.quantize import QuantizedWeight, QuantSpec, concat
from trt_llm.build.quantize.rtn import quantize_rtn

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
        weight = concat([w.with_scales_in(self.dtype) for w in weights])
        return QuantizedLinear(weight, packed_bias(parts))


def factory_for(config, checkpoint, dtype: torch.dtype):
    """The make_linear of a build config (schemas/build_config.QuantizationConfig): `linear` when
    the weights stay float, else a LinearFactory with the configured method."""
    quantization = config.quantization
    if quantization.weights == "none":
        return linear
    spec = QuantSpec(bits=4 if quantization.weights == "int4" else 8, group_size=quantization.effective_group_size(),
                     symmetric=not quantization.zero_point)
    return LinearFactory(checkpoint.model, dtype, spec, lm_head=quantization.lm_head)


def embedding_tensors(table: Tensor, storage: str) -> dict[str, Tensor]:
    """The embedding file's tensors: the table in fp32 / fp16, or int8 rows with a scale each
    (largest magnitude / 127, as Q8_0), which runtime/embedding.py reads."""
    if storage == "int8":
        scales = (table.float().abs().amax(dim=1, keepdim=True) / 127).clamp(min=torch.finfo(torch.float32).tiny)
        rows = torch.round(table.float() / scales).clamp(-127, 127).to(torch.int8)
        return {"embedding": rows.contiguous(), "scales": scales.contiguous()}
    return {"embedding": table.to({"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[storage])
            .contiguous()}
