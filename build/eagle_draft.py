"""The EAGLE3 draft model: its module, its exportable graph, and readers/writers for published drafts.

The math is the EAGLE authors' (`eagle/model/cnets.py`, EAGLE-3; SpecForge's `LlamaForCausalLMEagle3` is
the same): with H the hidden size,

    hidden0 = fc(cat(f_a, f_b, f_c))                  fc: Linear(3H -> H, bias=False), target features
    x       = cat(input_layernorm(embed(token)), hidden_norm(hidden))          2H wide
    h       = hidden + o_proj(attention(q_proj(x), k_proj(x), v_proj(x)))    (rotary on q and k)
    h       = h + down_proj(silu(gate_proj(n)) * up_proj(n)),  n = post_attention_layernorm(h)
    hidden_out = h                                     fed back as `hidden` at the next draft step
    logits  = lm_head(norm(h))                         over the draft vocabulary (draft_vocab_size)
    target_id = draft_id + d2t[draft_id];  t2d[target_id] = that target token is in the draft vocab

(`norm_before_residual: true` in a config, as some vLLM-speculators drafts have, makes the first
residual `hidden_norm(hidden)` instead of `hidden`.)

Aux-layer convention (which base hidden states are the features). Throughout this package
`aux_layer_ids` are *input-of-layer* indices: id `i` is the hidden state entering base decoder layer
`i` (the residual stream before layer i's input norm; id 0 is the embedding output). That is exactly
`hidden_states[i]` of a transformers forward with `output_hidden_states=True` (index 0 = embeddings)
and vLLM's `eagle_aux_hidden_state_layer_ids`. The default is `[2, L // 2, L - 3]` for a base of L
layers (each clamped into 0..L-1, which only matters for bases under 5 layers). The features are
concatenated in that order: `cat(hidden_states[2], hidden_states[L // 2], hidden_states[L - 3])`.
SGLang, SpecForge and ModelOpt configs write `eagle_aux_hidden_state_layer_ids` as *output-of-layer*
ids (the default there is `[1, L // 2 - 1, L - 4]`): `load_draft` adds 1 to those. A vLLM
speculators config (`speculators_config` / `transformer_layer_config`) already uses input-of-layer
ids and is taken as is. Drafts written by `save_draft_eagle_format` carry `trt_llm_aux_layer_inputs`
(input-of-layer, unambiguous; other readers ignore it and use their default, which is ours).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trt_llm.build.decoder import rms_norm
from trt_llm.plugins.attention import rotate_half_rope  # (importing it registers torch.ops.trt_llm.attention)

log = logging.getLogger(__name__)

AUX_KEY = "trt_llm_aux_layer_inputs"  # our config key: input-of-layer ids


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """[2, L // 2, L - 3] as input-of-layer ids (see the module docstring), clamped into 0..L-1."""
    return [min(max(i, 0), num_layers - 1) for i in (2, num_layers // 2, num_layers - 3)]


def _get(config, key, default=None):
    if isinstance(config, dict):
        return config.get(key, default)
    value = getattr(config, key, default)
    return default if value is None else value


# ---------------------------------------------------------------------------------------------------
# The draft's shape, read from a (flattened) LlamaForCausalLM-style config dict.


@dataclass
class DraftDims:
    hidden_size: int
    num_heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    vocab_size: int  # the target vocabulary (t2d's length)
    draft_vocab_size: int
    target_hidden_size: int  # fc in = num_aux * target_hidden_size
    num_aux: int
    norm_before_residual: bool

    @classmethod
    def from_config(cls, config: dict) -> "DraftDims":
        hidden = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        vocab = int(config["vocab_size"])
        return cls(
            hidden_size=hidden,
            num_heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            intermediate_size=int(config["intermediate_size"]),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            vocab_size=vocab,
            draft_vocab_size=int(config.get("draft_vocab_size") or vocab),
            target_hidden_size=int(config.get("target_hidden_size") or hidden),
            num_aux=len(config.get(AUX_KEY) or [0, 0, 0]),
            norm_before_residual=bool(config.get("norm_before_residual", False)),
        )


def _rope(config: dict) -> tuple[Tensor, float]:
    """inv_freq and attention scaling as transformers' Llama rotary computes them for this config."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    keys = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "max_position_embeddings", "rope_theta", "rope_scaling", "rope_parameters")
    kwargs = {k: config[k] for k in keys if config.get(k) is not None}
    rotary = LlamaRotaryEmbedding(LlamaConfig(**kwargs))
    return rotary.inv_freq.detach().float().clone(), float(getattr(rotary, "attention_scaling", 1.0))


# ---------------------------------------------------------------------------------------------------
# The module. Parameter names are the published ones, so `state_dict()` is the EAGLE file layout.


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


class _Attention(nn.Module):
    def __init__(self, d: DraftDims):
        super().__init__()
        self.q_proj = nn.Linear(2 * d.hidden_size, d.num_heads * d.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * d.hidden_size, d.kv_heads * d.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * d.hidden_size, d.kv_heads * d.head_dim, bias=False)
        self.o_proj = nn.Linear(d.num_heads * d.head_dim, d.hidden_size, bias=False)


class _MLP(nn.Module):
    def __init__(self, d: DraftDims):
        super().__init__()
        self.gate_proj = nn.Linear(d.hidden_size, d.intermediate_size, bias=False)
        self.up_proj = nn.Linear(d.hidden_size, d.intermediate_size, bias=False)
        self.down_proj = nn.Linear(d.intermediate_size, d.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _MidLayer(nn.Module):
    def __init__(self, d: DraftDims):
        super().__init__()
        self.hidden_norm = RMSNorm(d.hidden_size, d.rms_norm_eps)
        self.input_layernorm = RMSNorm(d.hidden_size, d.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(d.hidden_size, d.rms_norm_eps)
        self.self_attn = _Attention(d)
        self.mlp = _MLP(d)


class Eagle3Draft(nn.Module):
    """The EAGLE3 draft. `config` is a LlamaForCausalLM-style dict (as in the draft's config.json).

    Attributes set by `load_draft` (defaults here): `aux_layer_ids` (input-of-layer ids of the base,
    see the module docstring), `source_format`, `source_path`.
    """

    def __init__(self, config: dict):
        super().__init__()
        self.config = dict(config)
        d = self.dims = DraftDims.from_config(self.config)
        self.embed_tokens = nn.Embedding(d.vocab_size, d.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)  # the base's, frozen
        self.fc = nn.Linear(d.num_aux * d.target_hidden_size, d.hidden_size, bias=False)
        self.midlayer = _MidLayer(d)
        self.norm = RMSNorm(d.hidden_size, d.rms_norm_eps)
        self.lm_head = nn.Linear(d.hidden_size, d.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(d.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(d.vocab_size, dtype=torch.bool) if d.draft_vocab_size == d.vocab_size
                             else torch.zeros(d.vocab_size, dtype=torch.bool))
        inv_freq, self.attention_scaling = _rope(self.config)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.aux_layer_ids: list[int] | None = self.config.get(AUX_KEY)
        self.source_format = "new"
        self.source_path: str | None = None

    # -- small helpers ---------------------------------------------------------------------------

    @property
    def fc_weight(self) -> Tensor:
        """[H, 3 * target_H]: the runtime applies `features @ fc_weight.T` (+ fc_bias) itself."""
        return self.fc.weight

    @property
    def fc_bias(self) -> Tensor | None:
        """None for every published EAGLE3 draft; ModelOpt can train one."""
        return self.fc.bias

    def set_vocab_map(self, draft_to_target: Tensor) -> None:
        """Set d2t/t2d from the target ids of the draft vocabulary (draft id i -> draft_to_target[i])."""
        ids = torch.as_tensor(draft_to_target, dtype=torch.long)
        if ids.shape != self.d2t.shape:
            raise ValueError(f"draft_to_target has {ids.numel()} ids, the draft vocabulary {self.d2t.numel()}")
        self.d2t.copy_(ids - torch.arange(ids.numel()))
        self.t2d.copy_(t2d_from_d2t(self.d2t, self.dims.vocab_size))

    def draft_to_target(self, draft_ids: Tensor) -> Tensor:
        return draft_ids + self.d2t[draft_ids]

    def project_features(self, features: Tensor) -> Tensor:
        """[.., 3 * target_H] target features -> [.., H] (what the runtime does with `fc_weight`)."""
        return self.fc(features)

    def compute_logits(self, hidden_out: Tensor) -> Tensor:
        return self.lm_head(self.norm(hidden_out))

    def rotary(self, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        """cos, sin [.., D/2] for integer positions (same values as the graph's tables)."""
        freqs = position_ids.float()[..., None] * self.inv_freq
        return freqs.cos() * self.attention_scaling, freqs.sin() * self.attention_scaling

    def _qkv(self, token_embeddings: Tensor, hidden: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """q [B,S,Hq,D], k, v [B,S,Hkv,D] (before rotary) and the residual."""
        d, layer = self.dims, self.midlayer
        normed_hidden = layer.hidden_norm(hidden)
        x = torch.cat([layer.input_layernorm(token_embeddings), normed_hidden], dim=-1)
        b, s = x.shape[:2]
        q = layer.self_attn.q_proj(x).view(b, s, d.num_heads, d.head_dim)
        k = layer.self_attn.k_proj(x).view(b, s, d.kv_heads, d.head_dim)
        v = layer.self_attn.v_proj(x).view(b, s, d.kv_heads, d.head_dim)
        residual = normed_hidden if d.norm_before_residual else hidden
        return q, k, v, residual

    def _finish(self, attn: Tensor, residual: Tensor) -> Tensor:
        layer = self.midlayer
        h = residual + layer.self_attn.o_proj(attn)
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def _hidden_in(self, features_or_hidden: Tensor) -> Tensor:
        if features_or_hidden.shape[-1] == self.fc.in_features and self.fc.in_features != self.dims.hidden_size:
            return self.fc(features_or_hidden)
        if features_or_hidden.shape[-1] != self.dims.hidden_size:
            raise ValueError(f"hidden input is {features_or_hidden.shape[-1]} wide; expected the target features "
                             f"({self.fc.in_features}) or a draft hidden state ({self.dims.hidden_size})")
        return features_or_hidden

    # -- eager forwards --------------------------------------------------------------------------

    def forward_train(self, features_or_hidden: Tensor, token_embeddings: Tensor, position_ids: Tensor,
                      attention_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """One draft step over whole sequences, no cache: -> (logits [B,S,draft_vocab], hidden_out [B,S,H]).

        features_or_hidden: [B,S,3*target_H] target features (fc is applied) or [B,S,H] hidden states.
        token_embeddings: [B,S,H], row t holding the embedding of the token *after* the features' token.
        attention_mask: None (causal), [B,S] (1 = real token; causal over the real keys), or a bool
        [B,S,S] mask (True = query i may see key j; used as is, e.g. a tree mask).
        """
        hidden = self._hidden_in(features_or_hidden)
        q, k, v, residual = self._qkv(token_embeddings, hidden)
        cos, sin = self.rotary(position_ids)
        q, k = rotate_half_rope(q, cos, sin), rotate_half_rope(k, cos, sin)
        s = q.shape[1]
        causal = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
        if attention_mask is None:
            mask = causal[None].expand(q.shape[0], s, s)
        elif attention_mask.dim() == 2:
            mask = causal[None] & attention_mask.bool()[:, None, :]
        else:
            mask = attention_mask.bool().reshape(q.shape[0], s, s)
        out = self._attend(q, k, v, mask)
        hidden_out = self._finish(out, residual)
        return self.compute_logits(hidden_out), hidden_out

    def forward_ttt(self, features: Tensor, token_embeddings: list[Tensor], position_ids: Tensor,
                    key_padding: Tensor | None = None) -> list[tuple[Tensor, Tensor]]:
        """EAGLE3's training-time test: len(token_embeddings) draft steps unrolled, -> [(logits, hidden_out)].

        Formulation (row = training example t, i.e. the base's position t):
          step 0, row t: hidden fc(features_t), token_embeddings[0][t] = embed(x_{t+1}), rotary position
            t; sees step-0 keys of rows <= t (causal).                         predicts x_{t+2}
          step k, row t: hidden = step k-1's hidden_out of row t, token_embeddings[k][t] = embed(x_{t+1+k}),
            rotary position t + k; sees step-0 keys of rows <= t and the step-1..k keys of row t
            (positions t+1 .. t+k).                                            predicts x_{t+2+k}
        In absolute positions: the step-k query at position p = t + k takes the step-(k-1) hidden
        output made at position p - 1, and sees exactly what the runtime's k-th draft token sees: the
        cache of accepted tokens (step-0 entries at positions <= t) and its own tree path. Gradients
        flow through all steps. key_padding [B,S] (1 = real) masks padded step-0 keys.
        """
        hidden = self._hidden_in(features)
        b, s = hidden.shape[:2]
        causal = torch.ones(s, s, dtype=torch.bool, device=hidden.device).tril()[None].expand(b, s, s)
        if key_padding is not None:
            causal = causal & key_padding.bool()[:, None, :]
        eye = torch.eye(s, dtype=torch.bool, device=hidden.device)[None].expand(b, s, s)
        keys, values, results = [], [], []
        for step, embeds in enumerate(token_embeddings):
            q, k, v, residual = self._qkv(embeds, hidden)
            cos, sin = self.rotary(position_ids + step)
            q, k = rotate_half_rope(q, cos, sin), rotate_half_rope(k, cos, sin)
            keys.append(k)
            values.append(v)
            mask = torch.cat([causal] + [eye] * step, dim=-1)  # [B, S, S * (step + 1)]
            out = self._attend(q, torch.cat(keys, 1), torch.cat(values, 1), mask)
            hidden = self._finish(out, residual)
            results.append((self.compute_logits(hidden), hidden))
        return results

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        """q [B,S,Hq,D], k/v [B,T,Hkv,D], mask [B,S,T] bool -> [B,S,Hq*D]. A row that sees nothing gets 0."""
        d = self.dims
        group = d.num_heads // d.kv_heads
        qt = q.transpose(1, 2)
        kt = k.transpose(1, 2).repeat_interleave(group, dim=1)
        vt = v.transpose(1, 2).repeat_interleave(group, dim=1)
        scores = (qt @ kt.transpose(-1, -2)) * (d.head_dim ** -0.5)
        scores = scores.masked_fill(~mask[:, None], torch.finfo(scores.dtype).min)
        probs = scores.softmax(-1) * mask.any(-1)[:, None, :, None]
        out = probs @ vt
        return out.transpose(1, 2).reshape(q.shape[0], q.shape[1], d.num_heads * d.head_dim)

    def forward(self, features_or_hidden, token_embeddings, position_ids, attention_mask=None):
        return self.forward_train(features_or_hidden, token_embeddings, position_ids, attention_mask)

    # -- construction ----------------------------------------------------------------------------

    @classmethod
    def config_for_base(cls, base_config, draft_vocab_size: int | None = None,
                        aux_layer_ids: list[int] | None = None, **overrides) -> dict:
        """A draft config shaped like one layer of `base_config` (HF config object or dict)."""
        vocab = int(_get(base_config, "vocab_size"))
        hidden = int(_get(base_config, "hidden_size"))
        heads = int(_get(base_config, "num_attention_heads"))
        config = {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": hidden,
            "num_attention_heads": heads,
            "num_key_value_heads": int(_get(base_config, "num_key_value_heads", heads)),
            "head_dim": int(_get(base_config, "head_dim", hidden // heads)),
            "intermediate_size": int(_get(base_config, "intermediate_size")),
            "num_hidden_layers": 1,
            "rms_norm_eps": float(_get(base_config, "rms_norm_eps", 1e-6)),
            "hidden_act": "silu",
            "vocab_size": vocab,
            "draft_vocab_size": int(draft_vocab_size or vocab),
            "max_position_embeddings": int(_get(base_config, "max_position_embeddings", 2048)),
            "tie_word_embeddings": False,
            "bos_token_id": _get(base_config, "bos_token_id"),
            "eos_token_id": _get(base_config, "eos_token_id"),
            "pad_token_id": _get(base_config, "pad_token_id"),
        }
        rope = _get(base_config, "rope_parameters") or {}
        rope = dict(rope) if isinstance(rope, dict) else {}
        theta = rope.pop("rope_theta", None) or _get(base_config, "rope_theta", 10000.0)
        config["rope_theta"] = float(theta)
        if rope and rope.get("rope_type", rope.get("type", "default")) != "default":
            config["rope_scaling"] = rope
        if aux_layer_ids is None:
            aux_layer_ids = default_aux_layer_ids(int(_get(base_config, "num_hidden_layers")))
        config[AUX_KEY] = [int(i) for i in aux_layer_ids]
        config.update(overrides)
        return {k: v for k, v in config.items() if v is not None}


def t2d_from_d2t(d2t: Tensor, vocab_size: int) -> Tensor:
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    target = torch.arange(d2t.numel()) + d2t.long()
    if target.numel() and (target.min() < 0 or target.max() >= vocab_size):
        raise ValueError(f"d2t maps to target ids outside 0..{vocab_size - 1}")
    t2d[target] = True
    return t2d


# ---------------------------------------------------------------------------------------------------
# The graph: one draft step over new tokens with a KV cache, through our attention op.


class DraftGraph(nn.Module):
    """One draft step over new tokens with a fixed-capacity KV cache (the exported graph).

    forward(inputs_embeds [B,S,H] (the base's embedding of the tokens), hidden [B,S,H] (fc-projected
    target features, or the draft's own hidden_out of the previous step), position_ids [B,S] int32,
    past_lengths [B] int32, query_lengths [B] int32, tree_mask [B,S,S] bool, logits_indices [B,K] int32,
    past_key [B,Hkv,L,D], past_value [B,Hkv,L,D])
      -> (logits [B,K,draft_vocab] float32, hidden_out [B,S,H] (midlayer output before `norm`),
          present_key, present_value)
    `fc` is not in the graph: the runtime applies `fc_weight` to the target features. Attention is our
    op (torch.ops.trt_llm.attention with its tree_mask): query i of row b sees the cache slots before
    past_lengths[b] and the new tokens j with tree_mask[b, i, j]; build/export.py's export_draft
    writes the ONNX graph.
    """

    def __init__(self, draft: Eagle3Draft, max_positions: int = 4096, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.dims = draft.dims
        layer = draft.midlayer
        frozen = lambda t: nn.Parameter(t.detach().clone(), requires_grad=False)  # noqa: E731
        self.input_norm = frozen(layer.input_layernorm.weight)
        self.hidden_norm = frozen(layer.hidden_norm.weight)
        self.post_norm = frozen(layer.post_attention_layernorm.weight)
        attn, mlp = layer.self_attn, layer.mlp
        self.qkv_weight = frozen(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight], 0))
        self.o_weight = frozen(attn.o_proj.weight)
        self.gate_up_weight = frozen(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight], 0))
        self.down_weight = frozen(mlp.down_proj.weight)
        self.final_norm = frozen(draft.norm.weight)
        self.lm_head = frozen(draft.lm_head.weight)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), draft.inv_freq)
        self.register_buffer("cos_cache", (freqs.cos() * draft.attention_scaling).to(dtype))
        self.register_buffer("sin_cache", (freqs.sin() * draft.attention_scaling).to(dtype))
        self.to(dtype)

    def forward(self, inputs_embeds, hidden, position_ids, past_lengths, query_lengths, tree_mask, logits_indices,
                past_key, past_value):
        d = self.dims
        eps = d.rms_norm_eps
        normed_hidden = rms_norm(hidden, self.hidden_norm, eps)
        x = torch.cat([rms_norm(inputs_embeds, self.input_norm, eps), normed_hidden], dim=-1)
        qkv = F.linear(x, self.qkv_weight)
        attn, present_key, present_value = torch.ops.trt_llm.attention(
            qkv, past_key, past_value, past_lengths, query_lengths, position_ids, self.cos_cache, self.sin_cache,
            tree_mask, d.num_heads, d.kv_heads, d.head_dim ** -0.5,
        )
        residual = normed_hidden if d.norm_before_residual else hidden
        h = residual + F.linear(attn, self.o_weight)
        gate, up = F.linear(rms_norm(h, self.post_norm, eps), self.gate_up_weight).chunk(2, dim=-1)
        hidden_out = h + F.linear(F.silu(gate) * up, self.down_weight)
        index = logits_indices.long().unsqueeze(-1).expand(-1, -1, hidden_out.shape[-1])
        picked = rms_norm(torch.gather(hidden_out, 1, index), self.final_norm, eps)
        logits = F.linear(picked, self.lm_head).float()
        return logits, hidden_out, present_key, present_value


# ---------------------------------------------------------------------------------------------------
# Reading and writing published drafts.

_PREFIXES = ("eagle_module.", "draft_model.", "draft.", "module.", "model.")
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def _canonical_name(name: str) -> str:
    changed = True
    while changed:
        changed = False
        for prefix in _PREFIXES:
            if name.startswith(prefix):
                name, changed = name[len(prefix):], True
    if name.startswith("layers.0."):
        name = "midlayer." + name[len("layers.0."):]
    return name


def _read_tensors(folder: Path) -> dict[str, tuple[Tensor, str]]:
    """name -> (tensor, file name) over every weight file of a draft folder."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        files = sorted(folder.glob("pytorch_model*.bin")) or sorted(folder.glob("*.bin")) or sorted(folder.glob("*.pt"))
    if not files:
        raise FileNotFoundError(f"{folder}: no weights (model.safetensors or pytorch_model.bin)")
    tensors: dict[str, tuple[Tensor, str]] = {}
    for file in files:
        if file.suffix == ".safetensors":
            from safetensors.torch import load_file
            data = load_file(str(file))
        else:
            data = torch.load(str(file), map_location="cpu", weights_only=True)
            if isinstance(data, dict) and "state_dict" in data and isinstance(data["state_dict"], dict):
                data = data["state_dict"]
        for name, tensor in data.items():
            tensors[name] = (tensor, file.name)
    return tensors


def _flatten_config(raw: dict) -> tuple[dict, str]:
    """(a LlamaForCausalLM-style draft config, the format's name) from any of the published configs."""
    architectures = raw.get("architectures") or []
    if "transformer_layer_config" in raw or "speculators_config" in raw:
        config = dict(raw.get("transformer_layer_config") or {})
        for key in ("draft_vocab_size", "target_hidden_size", "norm_before_residual",
                    "eagle_aux_hidden_state_layer_ids", AUX_KEY):
            if key in raw:
                config[key] = raw[key]
        return config, "speculators"
    config = dict(raw)
    if "eagle_config" in raw:
        return config, "modelopt"
    if "LlamaForCausalLMEagle3" in architectures:
        return config, "specforge"
    return config, "eagle"


def _aux_from_config(config: dict, fmt: str) -> list[int] | None:
    if config.get(AUX_KEY) is not None:
        return [int(i) for i in config[AUX_KEY]]
    nested = config.get("eagle_config") if isinstance(config.get("eagle_config"), dict) else {}
    ids = config.get("eagle_aux_hidden_state_layer_ids") or nested.get("eagle_aux_hidden_state_layer_ids")
    if not ids:
        return None
    if fmt == "speculators":
        return [int(i) for i in ids]  # vLLM: already input-of-layer ids
    return [int(i) + 1 for i in ids]  # SGLang / SpecForge / ModelOpt: output-of-layer ids


def load_draft(path, base_config, base_embedding, *, base_lm_head: Tensor | None = None,
               aux_layer_ids: list[int] | None = None, dtype: torch.dtype = torch.float32) -> Eagle3Draft:
    """Read a published EAGLE3 draft folder: the EAGLE authors', SpecForge, ModelOpt or vLLM speculators.

    base_config: the base's HF config (object or dict). base_embedding: its input embedding
    ([vocab, H] tensor or nn.Embedding). base_lm_head: its LM head [vocab, H], used only when the
    draft has none and its vocabulary is the full one (a tied base needs none: the embedding serves).
    The returned draft carries `.aux_layer_ids` (input-of-layer ids into the base; see the module
    docstring), `.source_format` and `.source_path`. Shape mismatches raise a ValueError naming the
    file and the tensor.
    """
    path = Path(path).expanduser()
    folder = path if path.is_dir() else path.parent
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{folder}: no config.json")
    raw = json.loads(config_path.read_text())
    config, fmt = _flatten_config(raw)

    base_vocab = int(_get(base_config, "vocab_size"))
    base_hidden = int(_get(base_config, "hidden_size"))
    base_layers = int(_get(base_config, "num_hidden_layers"))
    if isinstance(base_embedding, nn.Embedding):
        base_embedding = base_embedding.weight
    base_embedding = base_embedding.detach()

    # The aux ids, then the config the module is built from.
    aux = [int(i) for i in aux_layer_ids] if aux_layer_ids is not None else _aux_from_config(config, fmt)
    aux = aux if aux is not None else default_aux_layer_ids(base_layers)
    if any(not 0 <= i < base_layers for i in aux):
        raise ValueError(f"{config_path}: aux layer ids {aux} (input-of-layer) are outside the base's 0..{base_layers - 1}")
    config.setdefault("vocab_size", base_vocab)
    if int(config["vocab_size"]) != base_vocab:
        raise ValueError(f"{config_path}: vocab_size {config['vocab_size']} differs from the base's {base_vocab}")
    if int(config.get("num_hidden_layers", 1)) != 1:
        raise ValueError(f"{config_path}: num_hidden_layers {config['num_hidden_layers']}: only one-layer EAGLE3 "
                         "drafts are supported")
    target_hidden = int(config.get("target_hidden_size") or config["hidden_size"])
    if target_hidden != base_hidden:
        raise ValueError(f"{config_path}: the draft expects target features of width {target_hidden} "
                         f"(target_hidden_size/hidden_size), the base's hidden size is {base_hidden}")
    config[AUX_KEY] = aux
    d = DraftDims.from_config(config)

    # The tensors, under their canonical names.
    tensors: dict[str, tuple[Tensor, str]] = {}
    for name, (tensor, file) in _read_tensors(folder).items():
        if name.endswith(_IGNORED_SUFFIXES):
            continue
        canonical = _canonical_name(name)
        if canonical in tensors:
            raise ValueError(f"{folder / file}: tensor {name!r} duplicates {canonical!r}")
        tensors[canonical] = (tensor, file)

    draft = Eagle3Draft(config)
    expected = {name: tuple(t.shape) for name, t in draft.state_dict().items()}
    why = {
        "fc.weight": f"[H, {d.num_aux} x target hidden {target_hidden}]",
        "embed_tokens.weight": f"[base vocab {base_vocab}, draft hidden {d.hidden_size}]",
        "lm_head.weight": f"[draft_vocab_size {d.draft_vocab_size}, hidden {d.hidden_size}]",
        "d2t": f"[draft_vocab_size {d.draft_vocab_size}]",
        "t2d": f"[base vocab {base_vocab}]",
    }
    for name in ("q_proj", "k_proj", "v_proj"):
        heads = d.num_heads if name == "q_proj" else d.kv_heads
        why[f"midlayer.self_attn.{name}.weight"] = f"[{heads} heads x head_dim {d.head_dim}, 2 x hidden {d.hidden_size}]"
    if "fc.bias" in tensors:
        draft.fc.bias = nn.Parameter(torch.zeros(d.hidden_size))
        expected["fc.bias"] = (d.hidden_size,)
    unexpected = sorted(set(tensors) - set(expected))
    if unexpected:
        name = unexpected[0]
        raise ValueError(f"{folder / tensors[name][1]}: unexpected tensor {name!r} in an EAGLE3 draft "
                         f"({len(unexpected)} such)")
    for name, (tensor, file) in tensors.items():
        if tuple(tensor.shape) != expected[name]:
            detail = why.get(name, f"from {config_path.name}")
            raise ValueError(f"{folder / file}: tensor {name!r} has shape {list(tensor.shape)}, expected "
                             f"{list(expected[name])} {detail}")

    state = {name: tensor for name, (tensor, _) in tensors.items()}
    if "embed_tokens.weight" not in state:
        if tuple(base_embedding.shape) != (base_vocab, d.hidden_size):
            raise ValueError(f"{folder}: the draft has no embed_tokens.weight and the base embedding is "
                             f"{list(base_embedding.shape)}, expected [{base_vocab}, {d.hidden_size}]")
        state["embed_tokens.weight"] = base_embedding
    elif not torch.equal(state["embed_tokens.weight"].to(base_embedding.dtype), base_embedding):
        log.warning("%s: the draft's embed_tokens differ from the base's embedding; the draft graph is fed the "
                    "embedding its inputs_embeds are made with", folder)
    if "lm_head.weight" not in state:
        if d.draft_vocab_size != base_vocab:
            raise ValueError(f"{folder}: no lm_head.weight and the draft vocabulary ({d.draft_vocab_size}) is not the "
                             f"base's ({base_vocab}), so the base's LM head cannot stand in")
        head = base_lm_head if base_lm_head is not None else (
            base_embedding if _get(base_config, "tie_word_embeddings", False) else None)
        if head is None:
            raise ValueError(f"{folder}: no lm_head.weight; pass base_lm_head (the base's LM head)")
        state["lm_head.weight"] = head.detach()
    if "d2t" not in state:
        if d.draft_vocab_size != base_vocab:
            raise ValueError(f"{folder}: no d2t and the draft vocabulary ({d.draft_vocab_size}) is smaller than the "
                             f"base's ({base_vocab})")
        state["d2t"] = torch.zeros(d.draft_vocab_size, dtype=torch.long)
    state["d2t"] = state["d2t"].long()
    try:
        derived = t2d_from_d2t(state["d2t"], base_vocab)
    except ValueError as exc:
        raise ValueError(f"{folder / tensors.get('d2t', (None, 'd2t'))[1]}: tensor 'd2t': {exc}") from None
    if "t2d" in state and not torch.equal(state["t2d"].bool(), derived):
        log.warning("%s: t2d disagrees with d2t; using the one derived from d2t", folder)
    state["t2d"] = derived

    state = {name: t.to(dtype) if t.is_floating_point() else t for name, t in state.items()}
    draft.load_state_dict(state, strict=True)
    draft.to(dtype)
    draft.embed_tokens.weight.requires_grad_(False)
    draft.aux_layer_ids = aux
    draft.source_format = fmt
    draft.source_path = str(folder)
    return draft


def save_draft_eagle_format(draft: Eagle3Draft, out_dir, config: dict | None = None, *,
                            include_embedding: bool = False, dtype: torch.dtype | None = None) -> Path:
    """Write the EAGLE authors' layout: config.json (LlamaForCausalLM-style, with draft_vocab_size) +
    model.safetensors (fc, midlayer.*, norm, lm_head, d2t, t2d; embed_tokens only if asked).

    `config` entries override the draft's own config (e.g. a `_name_or_path` or training notes).
    """
    from safetensors.torch import save_file

    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    cfg = dict(draft.config)
    cfg.pop(AUX_KEY, None)
    cfg.update({"architectures": cfg.get("architectures") or ["LlamaForCausalLM"],
                "draft_vocab_size": draft.dims.draft_vocab_size, "num_hidden_layers": 1})
    if draft.aux_layer_ids is not None:
        cfg[AUX_KEY] = [int(i) for i in draft.aux_layer_ids]
    cfg.update(config or {})
    state = {}
    for name, tensor in draft.state_dict().items():
        if name == "embed_tokens.weight" and not include_embedding:
            continue
        tensor = tensor.detach().contiguous()
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        state[name] = tensor.clone()
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    umask = os.umask(0)
    os.umask(umask)
    (out / "model.safetensors").chmod(0o666 & ~umask)  # save_file leaves it private
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


__all__ = [
    "AUX_KEY", "DraftDims", "DraftGraph", "Eagle3Draft", "default_aux_layer_ids", "load_draft",
    "save_draft_eagle_format", "t2d_from_d2t",
]
