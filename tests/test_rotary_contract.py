"""The attention op's rotary contract (plugins/attention.py): token (b, s) turns by row
position_ids[b, s] of the op's cos/sin tables, any number of rows. Text models pass their position
tables; mRoPE (Qwen2.5-VL, Qwen3-VL) passes per-token rows (build/models/layers.sectioned_rotary).
Checked here against transformers' own mRoPE on every facet of the op: the torch op, its ONNX
function body, the ONNX Runtime lowering (GroupQueryAttention) and the TensorRT plugin's kernel."""

import copy

import numpy as np
import pytest
import torch
from torch.export import Dim

from test_attention_plugin import CAPACITY, HEAD_DIM, HEADS, KV_HEADS, POSITIONS, session
from trt_llm.build.export import ONNX_OPSET, finish_custom_nodes
from trt_llm.build.models.layers import mrope_streams, rotary_tables, sectioned_rotary
from trt_llm.plugins import attention

# Qwen2.5-VL's layout at head_dim 16 (its own is [16, 24, 24] at 128), and Qwen3-VL's interleaved one.
LAYOUTS = {"qwen2_5_vl": ([2, 3, 3], False), "qwen3_vl": ([4, 2, 2], True)}


def transformers_mrope(layout: str, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' rotary embedding of the model, at positions [3, B, S]: cos, sin [B, S, D]."""
    sections, _ = LAYOUTS[layout]
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": sections}
    if layout == "qwen3_vl":
        from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding as Rotary

        config = Qwen3VLTextConfig(hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS, head_dim=HEAD_DIM,
                                   max_position_embeddings=POSITIONS, rope_parameters={**rope, "mrope_interleaved": True})
    else:
        from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLTextConfig
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLRotaryEmbedding as Rotary

        config = Qwen2_5_VLTextConfig(hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS,
                                      max_position_embeddings=POSITIONS, rope_parameters=rope)
    return Rotary(config)(torch.zeros(1, dtype=torch.float32), positions)


def text_tables() -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM))
    return rotary_tables(inv_freq, 1.0, POSITIONS, torch.float32)


def random_positions(batch: int, seq: int, seed: int) -> torch.Tensor:
    """Three different streams, as an image's tokens have (time, row, column)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, POSITIONS, (3, batch, seq), generator=generator)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_sectioned_rows_are_transformers_mrope(layout):
    positions = random_positions(3, 5, seed=1)
    cos, sin, index = sectioned_rotary(*text_tables(), positions, mrope_streams(*LAYOUTS[layout]))
    want_cos, want_sin = transformers_mrope(layout, positions)
    half = HEAD_DIM // 2
    torch.testing.assert_close(cos[index.long()], want_cos[..., :half], rtol=0, atol=1e-6)
    torch.testing.assert_close(sin[index.long()], want_sin[..., :half], rtol=0, atol=1e-6)
    # ... and transformers' second half repeats the first (the rotate-half layout the op applies).
    torch.testing.assert_close(want_cos[..., half:], want_cos[..., :half])


def test_equal_streams_are_the_text_rotation():
    """Text tokens in an mRoPE prompt have t = h = w: their rows are the text tables' rows."""
    cos_table, sin_table = text_tables()
    flat = torch.randint(0, POSITIONS, (2, 4))
    cos, _, index = sectioned_rotary(cos_table, sin_table, flat.expand(3, -1, -1), mrope_streams(*LAYOUTS["qwen3_vl"]))
    assert torch.equal(cos[index.long()], cos_table[flat])


class MropeAttention(torch.nn.Module):
    """One attention op fed mRoPE rows, as a VLM's decoder graph feeds it."""

    def __init__(self, layout: str):
        super().__init__()
        cos, sin = text_tables()
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)
        self.register_buffer("streams", mrope_streams(*LAYOUTS[layout]))

    def forward(self, qkv, past_key, past_value, past_lengths, query_lengths, positions):
        cos, sin, index = sectioned_rotary(self.cos, self.sin, positions, self.streams)
        return torch.ops.trt_llm.attention(qkv, past_key, past_value, past_lengths, query_lengths, index, cos, sin,
                                           None, HEADS, KV_HEADS, HEAD_DIM ** -0.5)


NAMES = ["qkv", "past_key", "past_value", "past_lengths", "query_lengths", "positions"]
CASES = {"ragged prefill": ([0, 0], [5, 3], 5), "decode": ([7, 2, 12], [1, 1, 1], 1),
         "new tokens on a cache": ([6, 3], [4, 2], 4)}


def make_inputs(past, new, seq, seed):
    generator = torch.Generator().manual_seed(seed)
    batch = len(past)
    return (torch.randn(batch, seq, (HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=generator),
            torch.randn(batch, KV_HEADS, CAPACITY, HEAD_DIM, generator=generator),
            torch.randn(batch, KV_HEADS, CAPACITY, HEAD_DIM, generator=generator),
            torch.tensor(past, dtype=torch.int32), torch.tensor(new, dtype=torch.int32),
            random_positions(batch, seq, seed))


def reference(layout, qkv, past_key, past_value, past_lengths, query_lengths, positions):
    """Written out from transformers' mRoPE, row by row: rotate q and k (apply_rotary_pos_emb), write
    the new keys and values after the cached ones, causal attention over the row's slots."""
    from transformers.models.qwen2_vl.modeling_qwen2_vl import apply_rotary_pos_emb

    cos, sin = transformers_mrope(layout, positions)
    out = torch.zeros(qkv.shape[0], qkv.shape[1], HEADS * HEAD_DIM)
    keys, values = past_key.clone(), past_value.clone()
    for b, (p, n) in enumerate(zip(past_lengths.tolist(), query_lengths.tolist())):
        heads = qkv[b, :n].view(n, HEADS + 2 * KV_HEADS, HEAD_DIM).transpose(0, 1)  # [heads, n, D]
        q, k, v = heads[:HEADS], heads[HEADS:HEADS + KV_HEADS], heads[HEADS + KV_HEADS:]
        q, k = apply_rotary_pos_emb(q[None], k[None], cos[b:b + 1, :n], sin[b:b + 1, :n])
        keys[b, :, p:p + n], values[b, :, p:p + n] = k[0], v
        group = HEADS // KV_HEADS
        scores = q[0] @ keys[b, :, :p + n].repeat_interleave(group, 0).transpose(1, 2) * HEAD_DIM ** -0.5
        causal = torch.arange(p + n)[None, :] <= (p + torch.arange(n))[:, None]
        probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        out[b, :n] = (probs @ values[b, :, :p + n].repeat_interleave(group, 0)).transpose(0, 1).reshape(n, -1)
    return out, keys, values


def export(module, example):
    batch, seq, capacity = Dim("batch"), Dim("seq"), Dim("capacity")
    shapes = ({0: batch, 1: seq}, {0: batch, 2: capacity}, {0: batch, 2: capacity}, {0: batch}, {0: batch},
              {1: batch, 2: seq})
    program = torch.onnx.export(
        module.eval(), example, dynamo=True, opset_version=ONNX_OPSET, input_names=NAMES,
        output_names=["output", "present_key", "present_value"], dynamic_shapes=shapes,
        custom_translation_table={torch.ops.trt_llm.attention.default: attention.onnx_translation})
    model = program.model_proto
    finish_custom_nodes(model)
    return model


@pytest.fixture(scope="module", params=list(LAYOUTS))
def exported(request):
    module = MropeAttention(request.param)
    return request.param, module, export(module, make_inputs([1, 0], [3, 2], 4, seed=0))


def _valid(result, past, new):
    """The outputs that carry meaning: valid query rows and the written cache slots."""
    out, keys, values = (torch.as_tensor(np.asarray(t)) for t in result)
    return [(out[b, :n], keys[b, :, :p + n], values[b, :, :p + n]) for b, (p, n) in enumerate(zip(past, new))]


@pytest.mark.parametrize("facet", ["torch op", "function body", "onnxruntime lowering", "tensorrt kernel"])
@pytest.mark.parametrize("case", list(CASES))
def test_every_facet_applies_mrope_rows_as_transformers_does(exported, facet, case):
    layout, module, model = exported
    past, new, seq = CASES[case]
    inputs = make_inputs(past, new, seq, seed=len(case))
    if facet == "torch op":
        got = module(*inputs)
    elif facet == "tensorrt kernel":
        cos, sin, index = sectioned_rotary(module.cos, module.sin, inputs[5], module.streams)
        got = attention.attention_kernel(*inputs[:5], index, cos, sin, None, HEADS, KV_HEADS, HEAD_DIM ** -0.5)
    else:
        model = copy.deepcopy(model)
        if facet == "onnxruntime lowering":
            attention.lower_for_onnxruntime(model)
            assert any(n.op_type == "GroupQueryAttention" for n in model.graph.node)
        got = session(model).run(None, {n: t.numpy() for n, t in zip(NAMES, inputs)})
    want = reference(layout, *inputs)
    for got_row, want_row in zip(_valid(got, past, new), _valid(want, past, new)):
        for g, w in zip(got_row, want_row):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def test_text_tables_reach_onnxruntime_as_they_are():
    """The text path costs nothing more: its tables are initializers, passed to GQA unpadded."""
    from test_attention_plugin import NAMES as TEXT_NAMES, OneAttention, export as export_text, make_inputs as text_inputs

    model = export_text(OneAttention(), text_inputs([1, 0, 2], [3, 2, 0], 4), TEXT_NAMES)
    attention.lower_for_onnxruntime(model)
    tables = {t.name for t in model.graph.initializer}
    gqa = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    assert gqa and all(set(n.input[7:9]) <= tables for n in gqa)
    assert not any(n.op_type == "Pad" for n in model.graph.node)
