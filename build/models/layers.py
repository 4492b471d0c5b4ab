"""The layers every model family is built from: RMSNorm, the one linear factory, rotary tables (and
mRoPE's per-token rows) and the pre-norm decoder layer with its LoRA hooks.

Projections are packed (q/k/v into one matmul, gate/up into another): fewer, fatter nodes are what
make the graph fast. Attention is our op (plugins/attention.py), which applies rotary itself.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import trt_llm.plugins.attention  # noqa: F401 - registers torch.ops.trt_llm.attention


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    # Written as w * (x / sqrt(mean(x.pow(2)) + eps)): ONNX Runtime fuses exactly this form (with
    # Pow, not Mul(x, x); sqrt and divide, not rsqrt) into (Skip)SimplifiedLayerNormalization.
    return weight * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def frozen(tensor: Tensor) -> nn.Parameter:
    """A weight of the exported graph: a copy, never trained."""
    return nn.Parameter(tensor.detach().clone(), requires_grad=False)


def cast_floats(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """module.to(dtype), except fp8 weights (QuantizedLinear's E4M3 values), which stay fp8:
    `Module.to` would cast every floating-point tensor."""
    return module._apply(lambda t: t.to(dtype) if t.is_floating_point() and t.dtype != torch.float8_e4m3fn else t)


def _with_lora(x: Tensor, y: Tensor, lora: tuple[Tensor, Tensor] | None, bias: Tensor | None = None) -> Tensor:
    """y (+ bias) + the per-row LoRA pair's x A^T B^T."""
    if bias is not None:
        y = y + bias
    if lora is None:
        return y
    # x A^T B^T with A [B, r, in], B [B, out, r]: each row of the batch its own adapter.
    a, b = lora
    return y + torch.matmul(torch.matmul(x, a.transpose(1, 2)), b.transpose(1, 2))


class Linear(nn.Module):
    """y = x W^T + b, plus a per-row LoRA pair when one is given. Made by `linear()` (or a
    quantizing factory, build/quantize/factory.py) only."""

    def __init__(self, weight: Tensor, bias: Tensor | None):
        super().__init__()
        self.weight = frozen(weight)
        self.bias = frozen(bias) if bias is not None else None

    def forward(self, x: Tensor, lora: tuple[Tensor, Tensor] | None = None) -> Tensor:
        return _with_lora(x, F.linear(x, self.weight, self.bias), lora)


class QuantizedLinear(nn.Module):
    """Linear's contract over a quantized weight: the weight-only matmul op
    (plugins/weight_only_matmul.py), then the float bias and LoRA pair. `weight` is a
    build.quantize.QuantizedWeight."""

    def __init__(self, weight, bias: Tensor | None):
        super().__init__()
        self.register_buffer("qweight", weight.qweight.contiguous())
        self.scales = frozen(weight.scales)
        self.register_buffer("zero_points", None if weight.zero_points is None else weight.zero_points.contiguous())
        self.offsets = frozen(weight.offsets) if weight.offsets is not None else None
        self.bias = frozen(bias) if bias is not None else None
        self.register_buffer("input_order", weight.input_order)
        self.bits, self.group_size = weight.bits, weight.group_size

    def forward(self, x: Tensor, lora: tuple[Tensor, Tensor] | None = None) -> Tensor:
        # GPTQ act-order: the input in the order of the weight's rows (a Gather in the graph)
        rows = x if self.input_order is None else x.index_select(-1, self.input_order)
        y = torch.ops.trt_llm.weight_only_matmul(rows, self.qweight, self.scales, self.zero_points, self.offsets,
                                                 self.bits, self.group_size)
        return _with_lora(x, y, lora, self.bias)


class ConcatenatedLinear(nn.Module):
    """A packed projection whose parts cannot share one matmul (GPTQ act-order parts that gather
    their input in different orders): each part on its own, the outputs side by side, then the
    packed bias and LoRA pair as Linear's."""

    def __init__(self, parts: list[nn.Module], bias: Tensor | None):
        super().__init__()
        self.parts = nn.ModuleList(parts)
        self.bias = frozen(bias) if bias is not None else None

    def forward(self, x: Tensor, lora: tuple[Tensor, Tensor] | None = None) -> Tensor:
        return _with_lora(x, torch.cat([part(x) for part in self.parts], dim=-1), lora, self.bias)


def packed_bias(parts) -> Tensor | None:
    """The packed projection's bias: the parts' biases side by side, zeros for a part without one
    where another has one; None when none has one."""
    biases = [p.bias if isinstance(p, nn.Linear) else None for p in parts]
    if all(b is None for b in biases):
        return None
    rows = [p.weight.shape[0] if isinstance(p, nn.Linear) else p.shape[0] for p in parts]
    dtype = next(b.dtype for b in biases if b is not None)
    return torch.cat([b.detach() if b is not None else torch.zeros(n, dtype=dtype) for b, n in zip(biases, rows)])


def linear(*parts: nn.Linear | Tensor) -> Linear:
    """One packed Linear from HF linears (or bare weight tensors) whose outputs are concatenated; a
    part without a bias gets zeros where another part has one."""
    weights = [p.weight if isinstance(p, nn.Linear) else p for p in parts]
    return Linear(torch.cat([w.detach() for w in weights], dim=0), packed_bias(parts))


def rotary_tables(inv_freq: Tensor, attention_scaling: float, positions: int,
                  dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos/sin tables [positions, head_dim/2], computed in fp32 and scaled as transformers does: row
    p is position p's rotation. A family with its own rope type (default, llama3, yarn, ... all
    resolve to inv_freq and a scale) changes only what it passes here.

    The rotary contract of the attention op (plugins/attention.py) is: the op rotates new token
    (b, s) by row `position_ids[b, s]` of its `cos_cache` / `sin_cache` [P, head_dim/2], any P. A text
    family passes these tables and the token positions; mRoPE passes per-token rows
    (`sectioned_rotary`) and their indices, so no facet of the op knows which one it runs."""
    freqs = torch.outer(torch.arange(positions, dtype=torch.float32), inv_freq.detach().float())
    return (freqs.cos() * attention_scaling).to(dtype), (freqs.sin() * attention_scaling).to(dtype)


def mrope_streams(sections: list[int], interleaved: bool, width: int | None = None) -> Tensor:
    """Which position stream (0 temporal, 1 height, 2 width) each of the head_dim/2 rotary frequencies
    reads under mRoPE [head_dim/2] int64. Qwen2-VL / Qwen2.5-VL: consecutive chunks of `sections`
    frequencies (mrope_section [16, 24, 24]); Qwen3-VL (`mrope_interleaved`): frequency j reads height
    when j % 3 == 1 and j < 3 * sections[1], width when j % 3 == 2 and j < 3 * sections[2], else time.
    width: the tables' frequencies, where they are fewer than the sections' sum (Qwen3.5's text config
    keeps its default sections [11, 11, 10] whatever its partial rotary leaves; transformers' slices stop
    at the last frequency)."""
    half = sum(sections) if width is None else width
    if not interleaved:
        return torch.cat([torch.full((n,), i % 3, dtype=torch.int64) for i, n in enumerate(sections)])
    streams = torch.zeros(half, dtype=torch.int64)
    for stream in (1, 2):
        streams[stream: 3 * sections[stream]: 3] = stream
    return streams


def sectioned_rotary(cos_table: Tensor, sin_table: Tensor, positions: Tensor,
                     streams: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """mRoPE under the op's rotary contract: per-token rows and the index of each token's row.

    positions: [3, B, S] the temporal, height and width position of each new token; streams:
    `mrope_streams`. Frequency j of token (b, s) turns by positions[streams[j], b, s], which is
    column j of that position's row in the text tables (the same products cos(p * inv_freq[j])).
    Returns cos, sin [B * S, head_dim/2] and the row index [B, S] int32 to pass as position_ids."""
    _, batch, seq = positions.shape
    pick = streams.view(1, 1, 1, -1).expand(1, batch, seq, streams.numel())
    cos = torch.gather(cos_table[positions], 0, pick).reshape(batch * seq, -1)
    sin = torch.gather(sin_table[positions], 0, pick).reshape(batch * seq, -1)
    index = torch.arange(batch * seq, dtype=torch.int32, device=positions.device).view(batch, seq)
    return cos, sin, index


ACTIVATIONS = {"silu": F.silu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
               "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "gelu": F.gelu}


def activation(config):
    """The gated MLP's activation a HF config names (Gemma's hidden_activation, else hidden_act)."""
    name = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "silu")
    if name not in ACTIVATIONS:
        raise ValueError(f"hidden_act: {name!r} is not supported; supported: {', '.join(sorted(ACTIVATIONS))}")
    return ACTIVATIONS[name]


def norm_weight(norm: nn.Module, gemma: bool) -> nn.Parameter:
    """An RMSNorm's weight as `rms_norm` multiplies by it: Gemma's norms scale by (1 + weight)."""
    return frozen(norm.weight.detach().float() + 1.0 if gemma else norm.weight)


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)), gate and up packed in one matmul (Phi-3's checkpoint packs them
    itself, gate first)."""

    def __init__(self, hf_mlp, act, make_linear=linear):
        super().__init__()
        fused = getattr(hf_mlp, "gate_up_proj", None)
        self.gate_up = make_linear(fused) if isinstance(fused, nn.Linear) else make_linear(hf_mlp.gate_proj,
                                                                                             hf_mlp.up_proj)
        self.down = make_linear(hf_mlp.down_proj)
        self.act = act

    def forward(self, x: Tensor, lora: dict) -> Tensor:
        gate, up = self.gate_up(x, lora.get("gate_up")).chunk(2, dim=-1)
        return self.down(self.act(gate) * up, lora.get("down"))


class DecoderLayer(nn.Module):
    """Pre-norm attention + MLP, the layer of every Llama-shaped family.

    family (trt_llm/families/face.Family): qk_norm (Qwen3, Gemma 3: RMSNorm over head_dim on q and k
    before rotary); gemma (Gemma 2 / 3: every norm scales by 1 + weight, and the attention and MLP
    outputs are normalised too before the residual add: four norms per layer).
    make_linear: builds each packed projection from its HF linears (`linear`, or a quantizing
    build.quantize.factory.LinearFactory). spec: the layer's schemas.layer_spec entry (its window,
    scale, soft-cap). mlp: the layer's MLP module (a GatedMLP, or a mixture of experts)."""

    def __init__(self, hf_layer, dims, family, make_linear=linear, spec=None, mlp: nn.Module | None = None):
        super().__init__()
        attn = hf_layer.self_attn
        gemma = family.gemma
        self.dims = dims
        self.window = getattr(spec, "window", 0) if spec.kind == "sliding" else 0
        self.scale = spec.scale
        self.softcap = float(spec.soft_cap or 0.0)
        self.input_norm = norm_weight(hf_layer.input_layernorm, gemma)
        self.post_norm = norm_weight(hf_layer.post_attention_layernorm, gemma)
        # Gemma: post_norm is the attention output's; these two wrap the MLP.
        self.pre_mlp_norm = norm_weight(hf_layer.pre_feedforward_layernorm, gemma) if gemma else None
        self.post_mlp_norm = norm_weight(hf_layer.post_feedforward_layernorm, gemma) if gemma else None
        fused = getattr(attn, "qkv_proj", None)  # Phi-3 packs q, k, v itself
        self.qkv = make_linear(fused) if fused is not None else make_linear(attn.q_proj, attn.k_proj, attn.v_proj)
        self.o = make_linear(attn.o_proj)
        self.mlp = mlp
        self.q_norm = norm_weight(attn.q_norm, gemma) if family.qk_norm else None
        self.k_norm = norm_weight(attn.k_norm, gemma) if family.qk_norm else None

    def forward(self, hidden, past_key, past_value, past_lengths, query_lengths, position_ids, cos, sin,
                lora: dict | None = None, tree_mask: Tensor | None = None):
        d = self.dims
        lora = lora or {}
        x = rms_norm(hidden, self.input_norm, d.rms_norm_eps)
        qkv = self.qkv(x, lora.get("qkv"))
        if self.q_norm is not None:
            batch, seq = qkv.shape[0], qkv.shape[1]
            q, k, v = qkv.split([d.num_heads * d.head_dim, d.kv_heads * d.head_dim, d.kv_heads * d.head_dim], -1)
            q = rms_norm(q.reshape(batch, seq, d.num_heads, d.head_dim), self.q_norm, d.rms_norm_eps)
            k = rms_norm(k.reshape(batch, seq, d.kv_heads, d.head_dim), self.k_norm, d.rms_norm_eps)
            qkv = torch.cat([q.reshape(batch, seq, -1), k.reshape(batch, seq, -1), v], dim=-1)
        attn, present_key, present_value = torch.ops.trt_llm.attention(
            qkv, past_key, past_value, past_lengths, query_lengths, position_ids, cos, sin, tree_mask,
            d.num_heads, d.kv_heads, self.scale, self.window, self.softcap,
        )
        attn = self.o(attn, lora.get("o"))
        if self.pre_mlp_norm is None:  # Llama: x + attn(norm(x)), then x + mlp(norm(x))
            hidden = hidden + attn
            return hidden + self.mlp(rms_norm(hidden, self.post_norm, d.rms_norm_eps), lora), present_key, present_value
        hidden = hidden + rms_norm(attn, self.post_norm, d.rms_norm_eps)
        out = self.mlp(rms_norm(hidden, self.pre_mlp_norm, d.rms_norm_eps), lora)
        return hidden + rms_norm(out, self.post_mlp_norm, d.rms_norm_eps), present_key, present_value
