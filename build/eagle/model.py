"""The EAGLE3 draft model: its shape and its torch module (graph.py exports it, formats.py reads and
writes published drafts).

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

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trt_llm.build.models.layers import rms_norm
from trt_llm.plugins.attention import rotate_half_rope  # (importing it registers torch.ops.trt_llm.attention)


AUX_KEY = "trt_llm_aux_layer_inputs"  # our config key: input-of-layer ids


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """[2, L // 2, L - 3] as input-of-layer ids (see the module docstring), clamped into 0..L-1."""
    return [min(max(i, 0), num_layers - 1) for i in (2, num_layers // 2, num_layers - 3)]


def config_get(config, key, default=None):
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
        vocab = int(config_get(base_config, "vocab_size"))
        hidden = int(config_get(base_config, "hidden_size"))
        heads = int(config_get(base_config, "num_attention_heads"))
        config = {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": hidden,
            "num_attention_heads": heads,
            "num_key_value_heads": int(config_get(base_config, "num_key_value_heads", heads)),
            "head_dim": int(config_get(base_config, "head_dim", hidden // heads)),
            "intermediate_size": int(config_get(base_config, "intermediate_size")),
            "num_hidden_layers": 1,
            "rms_norm_eps": float(config_get(base_config, "rms_norm_eps", 1e-6)),
            "hidden_act": "silu",
            "vocab_size": vocab,
            "draft_vocab_size": int(draft_vocab_size or vocab),
            "max_position_embeddings": int(config_get(base_config, "max_position_embeddings", 2048)),
            "tie_word_embeddings": False,
            "bos_token_id": config_get(base_config, "bos_token_id"),
            "eos_token_id": config_get(base_config, "eos_token_id"),
            "pad_token_id": config_get(base_config, "pad_token_id"),
        }
        rope = config_get(base_config, "rope_parameters") or {}
        rope = dict(rope) if isinstance(rope, dict) else {}
        theta = rope.pop("rope_theta", None) or config_get(base_config, "rope_theta", 10000.0)
        config["rope_theta"] = float(theta)
        if rope and rope.get("rope_type", rope.get("type", "default")) != "default":
            config["rope_scaling"] = rope
        if aux_layer_ids is None:
            aux_layer_ids = default_aux_layer_ids(int(config_get(base_config, "num_hidden_layers")))
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


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)
