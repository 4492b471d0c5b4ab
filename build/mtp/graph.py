"""The MTP head's exported graph: one step over new tokens, with the EAGLE draft graph's interface."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trt_llm.build.models.layers import cast_floats, frozen, linear, rms_norm
from trt_llm.build.models.skeleton import ModelDims, rotary_rows

LAYER = "mtp.layers.0."


def one_layer_config(config):
    """`config` (the text decoder's) as a model of one full-attention layer: what the head's layer
    is made from (vLLM builds it with layer_type full_attention, whatever the base's layer_types)."""
    single = copy.deepcopy(config)
    single.layer_types, single.num_hidden_layers = ["full_attention"], 1
    return single


def hf_mtp_layer(layer_class, config, tensors: dict[str, Tensor]) -> nn.Module:
    """The checkpoint's own decoder layer class (transformers' Qwen3_5DecoderLayer) as a full-attention
    layer holding the mtp.layers.0.* tensors; a missing, extra or misshapen one raises KeyError /
    ValueError naming it."""
    layer = layer_class(config, 0).eval()
    state = {name[len(LAYER):]: t for name, t in tensors.items() if name.startswith(LAYER)}
    wanted = layer.state_dict()
    for name, tensor in wanted.items():
        if name not in state:
            raise KeyError(f"{LAYER}{name}")
        if tuple(state[name].shape) != tuple(tensor.shape):
            raise ValueError(f"{LAYER}{name} is {list(state[name].shape)}, the layer's is {list(tensor.shape)}")
    extra = sorted(set(state) - set(wanted))
    if extra:
        raise ValueError(f"{LAYER}{extra[0]} is not a tensor of a full-attention layer")
    layer.load_state_dict(state, strict=True)
    return layer


class MtpGraph(nn.Module):
    """One MTP step over new tokens with a fixed-capacity KV cache (the exported graph).

    forward(inputs_embeds [B,S,H] (the base's embedding rows of tokens t + 1, unscaled), hidden [B,S,H]
    (the base's final-normed hidden states at t: its final_hidden_states, or this head's own hidden_out
    of the previous step), position_ids [B,S] int32 (t's, as vLLM passes them: rotary turns queries and keys
    alike, so any constant shift gives the same step), past_lengths [B],
    query_lengths [B], tree_mask [B,S,S] bool, logits_indices [B,K] int32, past_key, past_value
    [B,Hkv,L,D])
      -> (logits [B,K,V] float32 (the token after each new token's), hidden_out [B,S,H] (after
          mtp.norm), present_key, present_value)

    The layer is the family's own (its DecoderGraph.make_layer on transformers' layer: Qwen3.5's gated
    attention with q / k norms and partial rotary, on our attention op with the tree_mask), so it is
    the base's attention layer exactly; fc, the three norms and a copy of the base's LM head (the whole
    vocabulary: draft ids are target ids) around it.
    """

    def __init__(self, graphs, hf_layer, config, family, tensors: dict[str, Tensor], lm_head: Tensor, rotary,
                 max_positions: int, dtype: torch.dtype):
        """graphs: the family's graph module (DecoderGraph, layer_specs_of); config: one_layer_config's;
        tensors: the checkpoint's mtp.* tensors; rotary: the base's rotary module (its tables)."""
        super().__init__()
        # What the family's make_layer reads of its graph (self is that graph here)
        self.dims, self.build_dtype, self.weights = ModelDims(config), dtype, None
        self.layer_spec = graphs.DecoderGraph.layer_specs_of(config, family, max_positions)[0]
        self.layer = graphs.DecoderGraph.make_layer(self, hf_layer, self.layer_spec, config, family, linear)
        # The norms' weights as the family's rms_norm multiplies by them (Qwen3.5: 1 + weight)
        norm = graphs.DecoderGraph.norm_weight_of
        self.embedding_norm = norm(_Norm(tensors["mtp.pre_fc_norm_embedding.weight"]), family)
        self.hidden_norm = norm(_Norm(tensors["mtp.pre_fc_norm_hidden.weight"]), family)
        self.final_norm = norm(_Norm(tensors["mtp.norm.weight"]), family)
        self.fc = frozen(tensors["mtp.fc.weight"])  # [H, 2H]: [embedding | hidden] columns, no bias
        self.lm_head = frozen(lm_head)
        cos, sin = rotary_rows(rotary, config, "full_attention", max_positions, torch.float32)
        self.register_buffer("cos_cache", cos)
        self.register_buffer("sin_cache", sin)
        cast_floats(self, dtype)

    def forward(self, inputs_embeds, hidden, position_ids, past_lengths, query_lengths, tree_mask, logits_indices,
                past_key, past_value):
        eps = self.dims.rms_norm_eps
        x = torch.cat([rms_norm(inputs_embeds, self.embedding_norm, eps), rms_norm(hidden, self.hidden_norm, eps)],
                      dim=-1)
        x, present_key, present_value = self.layer(F.linear(x, self.fc), past_key, past_value, past_lengths,
                                                   query_lengths, position_ids, self.cos_cache, self.sin_cache, {},
                                                   tree_mask)
        hidden_out = rms_norm(x, self.final_norm, eps)
        index = logits_indices.long().unsqueeze(-1).expand(-1, -1, hidden_out.shape[-1])
        logits = F.linear(torch.gather(hidden_out, 1, index), self.lm_head).float()
        return logits, hidden_out, present_key, present_value


class _Norm(nn.Module):
    """A checkpoint norm's weight where norm_weight_of wants its module."""

    def __init__(self, weight: Tensor):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
