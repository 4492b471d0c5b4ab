"""Gemma 4's text decoder (transformers' Gemma4TextModel), on the decoder skeleton.

What sets it apart from Gemma 3, each from its config:

- layers of different widths: `per_layer_config[i]` gives each layer its head_dim (the global layers'
  `global_head_dim`, 512 as published, beside the sliding layers' 256) and its kv heads
  (`num_global_key_value_heads` with `attention_k_eq_v`); each layer's spec says its own, so the cache
  groups differ by shape as well as by window;
- KV sharing (`num_kv_shared_layers`): the last layers compute no keys and values but read those of the
  last earlier layer of their type (`kv_sharing_modes`: "store" then "reuse"); such a layer's spec has
  `kv_source` and owns no cache. In the graph it runs our attention op over the source's presents (its
  past) with the source's new keys and values in its packed input: the op's write is then the same
  values into the same slots, and the layer's own presents are dropped (the cpu engine binds them to the
  source's buffer: plugins/attention.py). As transformers does, these layers (and everything after the
  first of them) run only on the rows logits are asked for: they write no cache;
- per-layer inputs (`hidden_size_per_layer_input` P): a second embedding table [vocab, layers * P]
  whose row of each token the runtime looks up (`per_layer_inputs`); the graph adds a projection of the
  token's embedding to it (normed per layer, both scaled by 2**-0.5) and each layer ends with
  `x + norm(proj(gelu(gate(x)) * its slice))`, then multiplies by its `layer_scalar`;
- plain RMSNorms (x * w, not Gemma 3's x * (1 + w)), q / k / v norms over head_dim (v's without a
  weight), an attention scale of 1, `attention_k_eq_v` (a global layer's values are its raw keys, before
  the k norm and rotary), a double-wide MLP on the shared layers (`use_double_wide_mlp`), and the global
  layers' "proportional" rope: a full-width rotation whose frequencies past the first quarter are zero
  (transformers' own tables, so the spec's rotated dims are the head's);
- experts beside the MLP (`enable_moe_block`, 26B-A4B): both read the post-attention residual r; the MLP
  as above, normed (post_feedforward_layernorm_1), plus the experts on pre_feedforward_layernorm_2(r),
  normed (_2), then post_feedforward_layernorm of the sum. The experts are our MoE op with GELU-tanh
  gates; the router's weightless norm stays in the graph, its `scale` * hidden**-0.5 is folded into the
  router's columns and `per_expert_scale` into each expert's down rows (the op's softmax, top k and
  renormalisation are transformers' router).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trt_llm.build.models.layers import GatedMLP, activation, cast_floats, frozen, linear, rms_norm
from trt_llm.build.models.moe import SparseMoe
from trt_llm.build.models.skeleton import DecoderSkeleton, ModelDims, release, rotary_spec, text_decoder
from trt_llm.plugins.moe import GELU_TANH
from trt_llm.schemas.graph_spec import PER_LAYER_INPUTS, TREE_MASK, past, window_lengths
from trt_llm.schemas.layer_spec import FullAttention, SlidingAttention, owns_cache, window_of

# What the build reads of a family's decoder module (build/bundle.py)
__all__ = ["DecoderGraph", "LORA_PER_LAYER", "MLP_BESIDE_EXPERTS", "NO_DRAFT", "ModelDims", "layer_specs",
           "media_token_ids", "per_layer_embedding", "text_decoder"]

MAX_SOFT_TOKENS = 1120  # an image's soft tokens at the image processor's largest budget


# EAGLE: its graph computes the layers that read another's cache on the rows logits are asked for only,
# each row's last (run_layers), which a draft tree's verification is not; and no EAGLE3 draft format for it.
NO_DRAFT = "an EAGLE draft on Gemma 4 (its layers share keys and values) is not supported"

# LoRA: the layers' projections differ in shape from layer to layer (the two head widths, the shared
# layers' q alone, k_eq_v's keys without values, double-wide MLPs): each layer gets its own groups
# (build/lora.layered_layout); the dense MLP beside the experts takes adapters as any MLP.
LORA_PER_LAYER = True
MLP_BESIDE_EXPERTS = True


def kv_sources(config) -> list[int | None]:
    """Per layer, the layer whose keys and values it reads (None: its own): a "reuse" layer reads the
    "store" layer of its type (transformers' kv_sharing_modes)."""
    modes = list(getattr(config, "kv_sharing_modes", None) or [None] * config.num_hidden_layers)
    store = {config.layer_types[i]: i for i, mode in enumerate(modes) if mode == "store"}
    return [store[config.layer_types[i]] if mode == "reuse" else None for i, mode in enumerate(modes)]


def layer_specs(config, max_positions: int | None = None) -> list:
    window = config.sliding_window
    if window and max_positions and window >= max_positions:
        window = None  # a window of the whole capacity is full attention
    specs = []
    for i, (kind, source) in enumerate(zip(config.layer_types, kv_sources(config))):
        layer = config.per_layer_config[i]
        common = dict(kv_heads=layer.num_key_value_heads, head_dim=layer.head_dim, scale=1.0, kv_source=source,
                      # the tables are transformers' own, full width ("proportional": zero frequencies past
                      # the rotated ones), so the op turns the whole head
                      rotary=rotary_spec(config, layer.head_dim, None, kind).model_copy(update={"dims": layer.head_dim}))
        if kind == "sliding_attention" and window:
            specs.append(SlidingAttention(window=int(window), **common))
        else:
            specs.append(FullAttention(**common))
    return specs


def plain_norm(x: Tensor, eps: float) -> Tensor:
    """RMSNorm without a weight (Gemma 4's v norm and router norm)."""
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def experts_of(hf_layer, config, make_linear, dtype: torch.dtype, weights) -> SparseMoe:
    """A layer's experts as the MoE op (float, or quantized as the linears are), its router folded in."""
    router = hf_layer.router
    column_scale = router.scale.detach().float() * config.hidden_size ** -0.5
    routing = dict(router=(router.proj.weight.detach().float() * column_scale, config.top_k_experts, True),
                   activation=GELU_TANH, expert_scale=router.per_expert_scale.detach().float())
    block = SimpleNamespace(experts=hf_layer.experts)
    if hasattr(make_linear, "moe"):  # a quantizing factory
        return make_linear.moe(block, weights, **routing)
    return SparseMoe.from_hf(block, None, dtype, weights, **routing)


class Gemma4Layer(nn.Module):
    """One decoder layer: attention (its own keys and values, or its kv_source's), the MLP, the
    per-layer input, the layer scalar. forward -> (hidden, present_key, present_value, (k, v)): the new
    tokens' normed keys (before rotary) and values, which the layers reading this one's cache take."""

    def __init__(self, hf_layer, spec, config, make_linear, experts: SparseMoe | None = None):
        super().__init__()
        attn = hf_layer.self_attn
        self.eps = config.rms_norm_eps
        self.heads, self.kv_heads, self.head_dim = config.num_attention_heads, spec.kv_heads, spec.head_dim
        self.window, self.scale = window_of(spec), spec.scale
        self.sliding = spec.kind == "sliding"
        self.reads = not owns_cache(spec)
        self.keys_are_values = not self.reads and attn.v_proj is None  # attention_k_eq_v
        parts = [attn.q_proj] if self.reads else [attn.q_proj, attn.k_proj] + ([] if self.keys_are_values
                                                                               else [attn.v_proj])
        self.qkv = make_linear(*parts)
        self.o = make_linear(attn.o_proj)
        self.q_norm = frozen(attn.q_norm.weight)
        self.k_norm = None if self.reads else frozen(attn.k_norm.weight)
        self.input_norm = frozen(hf_layer.input_layernorm.weight)
        self.post_attention_norm = frozen(hf_layer.post_attention_layernorm.weight)
        self.pre_mlp_norm = frozen(hf_layer.pre_feedforward_layernorm.weight)
        self.post_mlp_norm = frozen(hf_layer.post_feedforward_layernorm.weight)
        self.mlp = GatedMLP(hf_layer.mlp, activation(config), make_linear)
        self.experts = experts
        if experts is not None:
            self.post_mlp_norm_1 = frozen(hf_layer.post_feedforward_layernorm_1.weight)
            self.pre_experts_norm = frozen(hf_layer.pre_feedforward_layernorm_2.weight)
            self.post_experts_norm = frozen(hf_layer.post_feedforward_layernorm_2.weight)
        self.act = activation(config)
        self.per_layer = bool(config.hidden_size_per_layer_input)
        if self.per_layer:
            self.per_layer_gate = make_linear(hf_layer.per_layer_input_gate)
            self.per_layer_projection = make_linear(hf_layer.per_layer_projection)
            self.post_per_layer_norm = frozen(hf_layer.post_per_layer_input_norm.weight)
        self.layer_scalar = frozen(hf_layer.layer_scalar.detach().reshape(()))

    def _heads(self, x: Tensor, heads: int) -> Tensor:
        return x.reshape(*x.shape[:2], heads, self.head_dim)

    def forward(self, hidden, past_key, past_value, lengths, query_lengths, position_ids, cos, sin, lora: dict,
                tree_mask, per_layer_input, shared: tuple[Tensor, Tensor] | None):
        batch, seq, _ = hidden.shape
        x = rms_norm(hidden, self.input_norm, self.eps)
        projected = self.qkv(x, lora.get("qkv"))
        q_width, kv_width = self.heads * self.head_dim, self.kv_heads * self.head_dim
        if self.reads:
            q, (k, v) = projected, shared
        else:
            q, k, *rest = projected.split([q_width, kv_width] + ([] if self.keys_are_values else [kv_width]), -1)
            raw_v = k if self.keys_are_values else rest[0]  # k_eq_v: the values are the raw keys
            k = rms_norm(self._heads(k, self.kv_heads), self.k_norm, self.eps).reshape(batch, seq, kv_width)
            v = plain_norm(self._heads(raw_v, self.kv_heads), self.eps).reshape(batch, seq, kv_width)
        q = rms_norm(self._heads(q, self.heads), self.q_norm, self.eps).reshape(batch, seq, q_width)
        attn, present_key, present_value = torch.ops.trt_llm.attention(
            torch.cat([q, k, v], dim=-1), past_key, past_value, lengths, query_lengths, position_ids, cos, sin,
            tree_mask if self.sliding else None,  # (images see each other both ways on sliding layers only)
            self.heads, self.kv_heads, self.scale, self.window, 0.0,
        )
        hidden = hidden + rms_norm(self.o(attn, lora.get("o")), self.post_attention_norm, self.eps)
        out = self.mlp(rms_norm(hidden, self.pre_mlp_norm, self.eps), lora)
        if self.experts is not None:  # beside the MLP, both from the residual
            logits = F.linear(plain_norm(hidden, self.eps), self.experts.router)
            mixed = self.experts.mix(rms_norm(hidden, self.pre_experts_norm, self.eps), logits)
            out = rms_norm(out, self.post_mlp_norm_1, self.eps) + rms_norm(mixed, self.post_experts_norm, self.eps)
        hidden = hidden + rms_norm(out, self.post_mlp_norm, self.eps)
        if self.per_layer:
            gated = self.act(self.per_layer_gate(hidden)) * per_layer_input
            hidden = hidden + rms_norm(self.per_layer_projection(gated), self.post_per_layer_norm, self.eps)
        return hidden * self.layer_scalar, present_key, present_value, (k, v)


class DecoderGraph(DecoderSkeleton):
    """Gemma 4's decoder: the skeleton's inputs, head and hooks, its own layer loop (per-layer inputs,
    layers reading another's keys and values)."""

    def __init__(self, hf_model, family, max_positions: int, dtype: torch.dtype, lora_groups: list[list[str]] = (),
                 feature_layers: list[int] | None = None, make_linear=linear, release_layers: bool = False,
                 weights=None):
        decoder = text_decoder(hf_model)
        config, text = decoder.config, decoder.model
        super().__init__(hf_model, family, max_positions, dtype, lora_groups, feature_layers, make_linear,
                         release_layers, weights)
        # The embedding scale, sqrt(hidden) rounded to the model's dtype, is the runtime's (as Gemma 3's).
        self.embed_scale = float(torch.tensor(self.dims.hidden_size ** 0.5, dtype=dtype))
        # run_layers returns the kept rows only when some layer reads another's cache (see run_layers)
        self.returns_kept = any(not owns_cache(spec) for spec in self.layer_specs)
        # An image's soft tokens see each other both ways (sliding layers only: Gemma4Layer) where the config
        # asks; a run is at most the processor's largest budget
        self.masked = self.masked and config.use_bidirectional_attention == "vision"
        self.bidirectional_block = MAX_SOFT_TOKENS if self.masked else 0
        self.per_layer_size = config.hidden_size_per_layer_input or 0
        self.per_layer_width = config.num_hidden_layers * self.per_layer_size
        if self.per_layer_width:
            modules = (text.per_layer_model_projection, text.per_layer_projection_norm)
            for module in modules:
                if weights is not None:
                    weights.load(module)
            self.per_layer_projection = make_linear(text.per_layer_model_projection)
            self.per_layer_norm = frozen(text.per_layer_projection_norm.weight)
            if release_layers or weights is not None:
                for module in modules:
                    release(module)
            cast_floats(self, dtype)

    @staticmethod
    def layer_specs_of(config, family, max_positions: int) -> list:
        return layer_specs(config, max_positions)

    def make_layer(self, hf_layer, spec, config, family, make_linear) -> nn.Module:
        experts = experts_of(hf_layer, config, make_linear, self.build_dtype, self.weights) \
            if config.enable_moe_block else None
        return Gemma4Layer(hf_layer, spec, config, make_linear, experts)

    @staticmethod
    def final_norm_of(hf_model) -> nn.Module:
        return hf_model.model.norm

    @staticmethod
    def norm_weight_of(norm, family) -> nn.Parameter:
        return frozen(norm.weight)  # plain: x * w

    def per_layer_inputs(self, embeds: Tensor, rows: Tensor) -> Tensor:
        """[B, S, layers, P]: (norm(projection(embeds) / sqrt(H)) + the table's rows) / sqrt(2)."""
        shape = (*embeds.shape[:2], len(self.layers), self.per_layer_size)
        context = self.per_layer_projection(embeds) * self.dims.hidden_size ** -0.5
        context = rms_norm(context.reshape(shape), self.per_layer_norm, self.dims.rms_norm_eps)
        return (context + rows.reshape(shape)) * 2.0 ** -0.5

    def run_layers(self, inputs: dict, position_ids, tables: list) -> tuple:
        """The layers; from the first layer that reads another's cache on, only the rows logits are asked
        for (see `_kept`): those layers write no cache, so nothing else after them is ever read."""
        past_lengths, query_lengths = inputs["past_lengths"], inputs["query_lengths"]
        hidden, mask = inputs["inputs_embeds"], inputs.get(TREE_MASK)
        per_layer = self.per_layer_inputs(hidden, inputs[PER_LAYER_INPUTS]) if self.per_layer_width else None
        presents, entering, written, shift = [], {}, {}, None
        for i, (layer, spec) in enumerate(zip(self.layers, self.layer_specs)):
            source = spec.kv_source
            if source is not None and shift is None:  # the first reader: keep the asked-for rows
                hidden, per_layer, position_ids, mask, query_lengths, shift = self._kept(
                    inputs["logits_indices"], hidden, per_layer, position_ids, mask, query_lengths)
            entering[i] = hidden
            window = window_of(spec)
            lengths = inputs[window_lengths(window)] if window else past_lengths
            if source is None:
                past_key, past_value, new = inputs[past("key", i)], inputs[past("value", i)], None
            else:  # its past is its source's present; its new rows the source's at the kept positions
                past_key, past_value, (keys, values) = written[source]
                new = (_rows(keys, inputs["logits_indices"]), _rows(values, inputs["logits_indices"]))
                lengths = lengths + shift
            hidden, key, value, mine = layer(hidden, past_key, past_value, lengths, query_lengths, position_ids,
                                             *tables[self.table_of[i]], self.lora_of(inputs, i), mask,
                                             None if per_layer is None else per_layer[:, :, i], new)
            if source is None:
                written[i] = (key, value, mine)
                presents += [key, value]
        return hidden, presents, entering

    @staticmethod
    def _kept(kept, hidden, per_layer, position_ids, mask, query_lengths):
        """The step's tensors at the K kept positions of each row (logits_indices [B, K]), which are its last
        min(K, query length) new tokens whenever the runtime asks (a prefill pass: the last; a decode step:
        the one; trt-llm-eval: all): the readers then take those as their new tokens, written after the
        row's `shift` earlier ones (their slots, and what each sees, stay the row's)."""
        queries = torch.minimum(query_lengths, torch.full_like(query_lengths, kept.shape[1]))
        mask = None if mask is None else _rows(_rows(mask, kept).transpose(1, 2), kept).transpose(1, 2)
        return (_rows(hidden, kept), None if per_layer is None else _rows(per_layer, kept),
                torch.gather(position_ids, 1, kept.long()), mask, queries,
                query_lengths - queries)


def _rows(tensor: Tensor, kept: Tensor) -> Tensor:
    """tensor [B, S, ...] at the positions kept [B, K] -> [B, K, ...]."""
    index = kept.long().reshape(*kept.shape, *[1] * (tensor.dim() - 2)).expand(*kept.shape, *tensor.shape[2:])
    return torch.gather(tensor, 1, index)


def per_layer_embedding(hf_model) -> nn.Embedding:
    """The checkpoint's per-layer table [vocab, layers * P] (the bundle writes it for the runtime)."""
    return text_decoder(hf_model).model.embed_tokens_per_layer


def media_token_ids(hf_model) -> tuple[list[int], int]:
    """(the soft tokens' ids of images, audio and video, the pad id): transformers looks up the pad row
    of the per-layer table at those tokens (their rows there are the media's, not a token's), so the bundle
    writes the pad row into theirs and the runtime looks up as for any token."""
    config = hf_model.config
    ids = [getattr(config, f"{kind}_token_id", None) for kind in ("image", "audio", "video")]
    return [i for i in ids if i is not None], text_decoder(hf_model).config.pad_token_id
