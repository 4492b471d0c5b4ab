"""Published int4 checkpoints read as they are: GPTQ (AutoGPTQ / GPTQModel, with and without
act-order) and AWQ (AutoAWQ's GEMM packing), both safetensors folders whose config.json carries a
`quantization_config`. Their blocks become the weight-only op's operands exactly; the float model
transformers would build is made from the config, with the dequantized weights (for the linears a
build does not keep, and for the oracle of the tests).

    GPTQ  qweight int32 [K/8, N]: value k of column n in bits 4(k % 8) of row k // 8
          qzeros  int32 [G, N/8]: zero of (g, n) in bits 4(n % 8) of column n // 8
          scales  fp16  [G, N];  g_idx int32 [K]: the group of each input row
          w[k, n] = scales[g, n] * (q[k, n] - zero[g, n] - 1), g = g_idx[k]   ("gptq"; "gptq_v2" has no - 1)
    AWQ   qweight int32 [K, N/8], qzeros int32 [G, N/8]: 8 columns a word in the order 0 2 4 6 1 3 5 7
          scales fp16 [G, N];  w[k, n] = scales[k // g, n] * (q[k, n] - zero[k // g, n])

Act-order (GPTQ desc_act) puts a group's rows anywhere along K: sorted by group, they are the op's
contiguous blocks, and the linear gathers its input in that order (QuantizedWeight.input_order).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor, nn

from trt_llm.build.quantize import QuantizedWeight

FORMATS = ("gptq", "awq")
AWQ_SLOTS = (0, 4, 1, 5, 2, 6, 3, 7)  # natural column c of 8 sits in slot AWQ_SLOTS[c] of its word


class FormatError(ValueError):
    """A quantized checkpoint this reader cannot take; the message names the file and the field."""


def quantization_config(model_dir: Path) -> dict | None:
    """config.json's quantization_config when it is GPTQ or AWQ, else None."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    found = config.get("quantization_config")
    if isinstance(found, dict) and found.get("quant_method") in FORMATS:
        return found
    return None


def _nibbles(words: Tensor, dim: int) -> Tensor:
    """int32 words -> their 8 nibbles (bits 0-3 first) along `dim`, as int16 (8x that dimension)."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    values = (words.unsqueeze(-1) >> shifts) & 0xF  # [..., 8]
    if dim == 0:  # [R, C, 8] -> [R, 8, C] -> [8R, C]
        return values.permute(0, 2, 1).reshape(-1, words.shape[1]).to(torch.int16)
    return values.reshape(words.shape[0], -1).to(torch.int16)


def gptq_weight(tensors: dict[str, Tensor], config: dict, name: str) -> QuantizedWeight:
    """One GPTQ linear's blocks; `config` is its quantization_config."""
    if config.get("bits", 4) != 4:
        raise FormatError(f"{name}: GPTQ with {config.get('bits')} bits; only 4-bit GPTQ is read")
    q = _nibbles(tensors["qweight"], dim=0)  # [K, N]
    zeros = _nibbles(tensors["qzeros"], dim=1)  # [G, N]
    if config.get("checkpoint_format", "gptq") == "gptq":
        zeros = (zeros + 1) & 0xF  # v1 stores zero - 1 (the 4-bit wrap included, as its kernels read it)
    scales = tensors["scales"].float()
    in_features, groups = q.shape[0], scales.shape[0]
    g_idx = tensors.get("g_idx")
    group = in_features // groups
    natural = torch.arange(in_features, dtype=torch.int64) // group
    order = None
    if g_idx is not None and not torch.equal(g_idx.long(), natural):
        order = torch.argsort(g_idx.long(), stable=True)  # act-order: rows sorted by group
        if not torch.equal(g_idx.long()[order], natural):
            raise FormatError(f"{name}: g_idx does not give every group {group} rows")
        q = q[order]
    weight = QuantizedWeight.from_values(q, scales, zeros, 4, group)
    weight.input_order = order
    return weight.to_signed()


def awq_weight(tensors: dict[str, Tensor], config: dict, name: str) -> QuantizedWeight:
    """One AutoAWQ GEMM linear's blocks."""
    if config.get("bits", 4) != 4 or str(config.get("version", "gemm")).lower() != "gemm":
        raise FormatError(f"{name}: AWQ {config.get('bits')}-bit {config.get('version')!r}; only 4-bit GEMM is read")

    def columns(words):
        slots = _nibbles(words, dim=1).view(words.shape[0], -1, 8)
        return slots[:, :, list(AWQ_SLOTS)].reshape(words.shape[0], -1)

    q, zeros = columns(tensors["qweight"]), columns(tensors["qzeros"])
    scales = tensors["scales"].float()
    group = q.shape[0] // scales.shape[0]
    if not config.get("zero_point", True):
        zeros = torch.full_like(zeros, 8)
    return QuantizedWeight.from_values(q, scales, zeros, 4, group).to_signed()


def load_published(model_dir: Path, config: dict, dtype: torch.dtype = torch.float32):
    """(the float HF model with dequantized linears, {module name: QuantizedWeight}) of a GPTQ / AWQ
    folder. The model is built from its config (transformers would want the format's own kernels).
    A mixture of experts' stacked experts module maps to a list of each expert's (gate, up, down)
    QuantizedWeights (published checkpoints quantize every expert's three linears)."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from trt_llm.build.streamed_weights import EXPERT_PARTS, is_experts

    model_dir = Path(model_dir)
    hf_config = AutoConfig.from_pretrained(model_dir)
    if hasattr(hf_config, "quantization_config"):
        del hf_config.quantization_config
    model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype).eval()
    state: dict[str, Tensor] = {}
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FormatError(f"{model_dir}: no .safetensors files")
    for file in files:
        state.update(load_file(str(file)))
    read = gptq_weight if config["quant_method"] == "gptq" else awq_weight

    def blocks_of(name: str) -> QuantizedWeight:
        parts = {key: state.pop(f"{name}.{key}") for key in ("qweight", "qzeros", "scales", "g_idx")
                 if f"{name}.{key}" in state}
        return read(parts, config, name)

    published, plain = {}, {}
    for name, module in model.named_modules():
        if is_experts(module) and f"{name}.0.gate_proj.qweight" in state:
            # A MoE's experts, one linear each in the file: (gate, up, down) per expert; the model's
            # stacked tensors get their dequantized weights (gate_up_proj is [gate | up]).
            experts = [tuple(blocks_of(f"{name}.{e}.{part}") for part in EXPERT_PARTS)
                       for e in range(module.gate_up_proj.shape[0])]
            published[name] = experts
            plain[f"{name}.gate_up_proj"] = torch.stack([torch.cat([g.dequantize(), u.dequantize()])
                                                         for g, u, _ in experts])
            plain[f"{name}.down_proj"] = torch.stack([d.dequantize() for *_, d in experts])
        if not isinstance(module, nn.Linear) or f"{name}.qweight" not in state:
            continue
        published[name] = blocks_of(name)
        plain[f"{name}.weight"] = published[name].dequantize()
    missing, unexpected = model.load_state_dict({**state, **plain}, strict=False)
    missing = [key for key in missing if not key.endswith("rotary_emb.inv_freq")]
    if model.config.tie_word_embeddings:
        missing = [key for key in missing if key != "lm_head.weight"]
        model.tie_weights()
    if missing or unexpected:
        raise FormatError(f"{model_dir}: tensors missing {missing[:3]} or not understood {unexpected[:3]}")
    return model, published
