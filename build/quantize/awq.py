"""AWQ (activation-aware weight quantization, Lin et al. 2023): before round-to-nearest, each
linear's input channels are scaled by s (and its input divided by s, folded into the op before it),
with s = mean|x|^alpha searched per group of linears that share an input, so that the channels the
activations lean on lose less to rounding. The model computes exactly the same function after the
scaling; only what rounding does to it changes.

Per decoder layer, as AutoAWQ groups them (the input each group shares, and where 1/s goes):
    q, k, v      <- input norm          (its weight / s)
    o            <- v's rows            (grouped-query: s shared by the query heads of a kv head)
    gate, up     <- post-attention norm (its weight / s)
    down         <- up's rows           (silu(gate) * up is linear in up)
Then, as AutoAWQ does, each scaled linear but q and k (whose errors the softmax amplifies) gets its
blocks clipped: per block and output, the range max|w| * r with r in 1, 0.975, ..., 0.525 that
makes the block's share of the output closest to the float one. The LM head keeps round-to-nearest
(its weight is the tied embedding table in most small models).

Calibration: the activations of one float forward pass over the calibration text (a file, or the
built-in chat prompts of draft_training/prompts.py), at most CALIBRATION_TOKENS tokens; the loss of
a candidate s is the squared error of the group's outputs on SEARCH_TOKENS of them.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from trt_llm.build.quantize import QuantSpec
from trt_llm.build.quantize.rtn import quantize_rtn

log = logging.getLogger(__name__)
CALIBRATION_TOKENS = 2048
SEQUENCE = 512  # tokens per calibration row
SEARCH_TOKENS = 1024
CLIP_TOKENS = 512
GRID = 20  # alpha in 0, 1/20, ..., 19/20; clip ratios 1 - r / 40 for r < 20


def calibration_ids(tokenizer, text: str | None) -> Tensor:
    """[rows, SEQUENCE] token ids: the file's text, or the built-in prompts chat-formatted."""
    if text is None:
        from trt_llm.draft_training.prompts import HANDWRITTEN

        chats = [[{"role": "user", "content": prompt}] for prompt in HANDWRITTEN]
        try:
            text = "".join(tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
                           for chat in chats)
        except (ValueError, AttributeError):  # a tokenizer without a chat template
            text = "\n".join(HANDWRITTEN)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][:CALIBRATION_TOKENS]
    rows = max(1, len(ids) // SEQUENCE)
    if len(ids) < SEQUENCE:
        return torch.tensor([ids])
    return torch.tensor(ids[: rows * SEQUENCE]).view(rows, SEQUENCE)


@contextmanager
def _capturing(modules: dict[str, nn.Module]):
    """The input of each module over the forward passes run inside: {name: [tokens, K]}."""
    seen: dict[str, list[Tensor]] = {name: [] for name in modules}
    hooks = [module.register_forward_pre_hook(lambda _, args, name=name: seen[name].append(
        args[0].detach().reshape(-1, args[0].shape[-1]))) for name, module in modules.items()]
    try:
        yield seen
    finally:
        for hook in hooks:
            hook.remove()


def _loss(x: Tensor, weight: Tensor, scale: Tensor, spec: QuantSpec, reference: Tensor) -> float:
    quantized = quantize_rtn(weight * scale, spec, torch.float32).dequantize() / scale
    return float(((x @ quantized.t() - reference) ** 2).mean())


def search_scale(x: Tensor, weight: Tensor, spec: QuantSpec,
                 heads: tuple[int, int, int] | None = None) -> tuple[Tensor, float, float]:
    """The per-input-channel scale s [K] minimising the output error of RTN(weight * s) / s on the
    inputs x [T, K]. heads = (query heads, kv heads, head dim) ties s across the query heads that
    read one kv head (o's input, whose 1/s goes into v's rows): s is searched per kv channel.
    Returns s [K], its loss and plain round-to-nearest's."""
    mean = x.abs().mean(dim=0)
    expand = (lambda v: v)
    if heads is not None:
        query, kv, dim = heads
        group = query // kv
        mean = mean.view(kv, group, dim).mean(dim=1).reshape(-1)
        expand = (lambda v: v.view(kv, 1, dim).expand(kv, group, dim).reshape(-1))
    reference = x @ weight.t()
    ones = torch.ones_like(mean)
    plain = _loss(x, weight, expand(ones), spec, reference)
    best, best_scale = plain, ones
    for step in range(1, GRID):
        scale = mean.pow(step / GRID).clamp(min=1e-4)
        scale = scale / (scale.max() * scale.min()).sqrt()
        loss = _loss(x, weight, expand(scale), spec, reference)
        if loss < best:
            best, best_scale = loss, scale
    return best_scale, best, plain


def search_clip(x: Tensor, weight: Tensor, spec: QuantSpec) -> Tensor:
    """The weight [N, K] with each block (G inputs of one output) clipped to the range whose round-
    to-nearest best reproduces that block's part of the output on the inputs x [T, K]."""
    out_features, in_features = weight.shape
    group = spec.group_for(in_features)
    count = -(-in_features // group)
    pad = count * group - in_features
    w = torch.nn.functional.pad(weight, (0, pad)).view(out_features, count, group)
    xb = torch.nn.functional.pad(x, (0, pad)).view(x.shape[0], count, group)
    reference = torch.einsum("tbg,nbg->nbt", xb, w)
    largest = w.abs().amax(dim=-1, keepdim=True)
    best_error = torch.full((out_features, count, 1), float("inf"))
    best = largest.clone()
    for step in range(GRID):
        limit = largest * (1 - step / (2 * GRID))
        clipped = torch.maximum(torch.minimum(w, limit), -limit)
        rounded = quantize_rtn(clipped.reshape(out_features, -1)[:, :in_features], spec, torch.float32).dequantize()
        rounded = torch.nn.functional.pad(rounded, (0, pad)).view(out_features, count, group)
        error = ((torch.einsum("tbg,nbg->nbt", xb, rounded) - reference) ** 2).mean(dim=-1, keepdim=True)
        better = error < best_error
        best_error = torch.where(better, error, best_error)
        best = torch.where(better, limit, best)
    clipped = torch.maximum(torch.minimum(w, best), -best)
    return clipped.reshape(out_features, -1)[:, :in_features]


def _scale_inputs(linears: list[nn.Linear], scale: Tensor) -> None:
    for linear in linears:
        linear.weight.mul_(scale)


def _scale_rows(module: nn.Module, scale: Tensor) -> None:
    """An op whose output rows (channels) are divided by scale: a norm's weight, a linear's rows."""
    module.weight.div_(scale.view(-1, *([1] * (module.weight.dim() - 1))))
    if getattr(module, "bias", None) is not None:
        module.bias.div_(scale)


@torch.no_grad()
def apply_awq(model: nn.Module, tokenizer, spec: QuantSpec, text: str | None = None, clip: bool = True) -> dict:
    """Scale (and clip) the decoder layers' linears of a Llama-shaped HF model in place (see the
    module docstring); returns the summed output errors {"awq": ..., "rtn": ...} of the scale search.
    clip=False: the scaling only, which leaves the float model's function as it was."""
    layers = model.model.layers
    config = model.config
    query, kv = config.num_attention_heads, getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // query
    watched = {}
    for i, layer in enumerate(layers):
        watched.update({f"{i}.qkv": layer.self_attn.q_proj, f"{i}.o": layer.self_attn.o_proj,
                        f"{i}.gate_up": layer.mlp.gate_proj, f"{i}.down": layer.mlp.down_proj})
    ids = calibration_ids(tokenizer, text)
    with _capturing(watched) as seen:
        for row in ids:
            model(row[None])
    totals = {"awq": 0.0, "rtn": 0.0}
    generator = torch.Generator().manual_seed(0)
    for i, layer in enumerate(layers):
        attn, mlp = layer.self_attn, layer.mlp
        groups = [  # (captured input, the linears reading it, the op before them, tied heads)
            ("qkv", [attn.q_proj, attn.k_proj, attn.v_proj], layer.input_layernorm, None),
            ("o", [attn.o_proj], attn.v_proj, (query, kv, dim)),
            ("gate_up", [mlp.gate_proj, mlp.up_proj], layer.post_attention_layernorm, None),
            ("down", [mlp.down_proj], mlp.up_proj, None),
        ]
        scaled_inputs = []  # (the linears, their inputs after the scaling: x / s)
        for name, linears, before, heads in groups:
            x = torch.cat(seen.pop(f"{i}.{name}")).float()
            if x.shape[0] > SEARCH_TOKENS:
                x = x[torch.randperm(x.shape[0], generator=generator)[:SEARCH_TOKENS]]
            weight = torch.cat([linear.weight for linear in linears]).float()
            scale, loss, plain = search_scale(x, weight, spec, heads)
            totals["awq"] += loss
            totals["rtn"] += plain
            _scale_rows(before, scale)
            if heads is not None:  # per kv channel -> per o input
                scale = scale.view(kv, 1, dim).expand(kv, query // kv, dim).reshape(-1)
            _scale_inputs(linears, scale)
            scaled_inputs.append((linears, x[:CLIP_TOKENS] / scale))
        for linears, x in scaled_inputs if clip else ():  # after the layer's scalings (down's changed up's rows)
            for linear in linears:
                if linear not in (attn.q_proj, attn.k_proj):
                    linear.weight.copy_(search_clip(x, linear.weight.float(), spec))
    log.info("AWQ: output error %.4g (round-to-nearest alone: %.4g) over %d calibration tokens",
             totals["awq"], totals["rtn"], ids.numel())
    return totals
