"""The attention op's ONNX function body (facet 2) and its ONNX Runtime lowering (facet 3) equal the
torch reference (facet 1), case by case: ragged prefill, decode, several new tokens on a non-empty
cache, idle rows."""

import copy

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch.export import Dim

from trt_llm.build.export import ONNX_OPSET, finish_custom_nodes
from trt_llm.plugins import attention

HEADS, KV_HEADS, HEAD_DIM, CAPACITY, POSITIONS = 4, 2, 16, 24, 64


class OneAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        inv_freq = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
        freqs = torch.outer(torch.arange(POSITIONS).float(), inv_freq)
        self.register_buffer("cos", freqs.cos())
        self.register_buffer("sin", freqs.sin())

    def forward(self, qkv, past_key, past_value, past_lengths, query_lengths, position_ids, tree_mask=None):
        return torch.ops.trt_llm.attention(qkv, past_key, past_value, past_lengths, query_lengths,
                                           position_ids, self.cos, self.sin, tree_mask, HEADS, KV_HEADS,
                                           HEAD_DIM ** -0.5)


class OneTreeAttention(OneAttention):
    def forward(self, qkv, past_key, past_value, past_lengths, query_lengths, position_ids, tree_mask):
        return super().forward(qkv, past_key, past_value, past_lengths, query_lengths, position_ids, tree_mask)


def make_inputs(past, new, seq, seed=0):
    generator = torch.Generator().manual_seed(seed)
    batch = len(past)
    past_t = torch.tensor(past, dtype=torch.int32)
    return (
        torch.randn(batch, seq, (HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=generator),
        torch.randn(batch, KV_HEADS, CAPACITY, HEAD_DIM, generator=generator),
        torch.randn(batch, KV_HEADS, CAPACITY, HEAD_DIM, generator=generator),
        past_t,
        torch.tensor(new, dtype=torch.int32),
        (past_t[:, None] + torch.arange(seq)[None]).int(),
    )


NAMES = ["qkv", "past_key", "past_value", "past_lengths", "query_lengths", "position_ids"]


def export(module, example, names):
    batch, seq, capacity = Dim("batch"), Dim("seq"), Dim("capacity")
    shapes = [{0: batch, 1: seq}, {0: batch, 2: capacity}, {0: batch, 2: capacity},
              {0: batch}, {0: batch}, {0: batch, 1: seq}, {0: batch, 1: seq, 2: seq}][: len(names)]
    program = torch.onnx.export(
        module.eval(), example, dynamo=True, opset_version=ONNX_OPSET, input_names=names,
        output_names=["output", "present_key", "present_value"], dynamic_shapes=tuple(shapes),
        custom_translation_table={torch.ops.trt_llm.attention.default: attention.onnx_translation},
    )
    model = program.model_proto
    finish_custom_nodes(model)
    return model


@pytest.fixture(scope="module")
def exported():
    return export(OneAttention(), make_inputs([1, 0, 2], [3, 2, 0], 4), NAMES)


@pytest.fixture(scope="module")
def exported_tree():
    example = (*make_inputs([1, 0, 2], [3, 2, 0], 4), torch.ones(3, 4, 4, dtype=torch.bool).tril())
    return export(OneTreeAttention(), example, NAMES + ["tree_mask"])


def session(model):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def test_export_emits_one_plugin_node_with_namespace_and_function(exported):
    nodes = [n for n in exported.graph.node if n.domain == attention.DOMAIN]
    assert [n.op_type for n in nodes] == [attention.OP_NAME]
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in nodes[0].attribute}
    assert attributes["plugin_namespace"] == attention.PLUGIN_NAMESPACE.encode()
    assert attributes["num_heads"] == HEADS and attributes["kv_num_heads"] == KV_HEADS
    assert not any(name.startswith("_") for name in attributes)
    assert [f.name for f in exported.functions] == [attention.OP_NAME]  # the bodies of the node types it has
    onnx.checker.check_model(exported)


CASES = {
    "ragged prefill on empty cache": ([0, 0, 0], [5, 3, 1], 5),
    "decode, ragged past": ([7, 2, 12, 0], [1, 1, 1, 1], 1),
    "several new tokens on a non-empty cache": ([6, 3], [4, 2], 4),
    "idle rows": ([4, 0, 9], [0, 3, 0], 3),
    "cache filled to capacity": ([CAPACITY - 3, 1], [3, 2], 3),
}


@pytest.mark.parametrize("facet", ["function body", "onnxruntime lowering"])
@pytest.mark.parametrize("case", list(CASES))
def test_facet_equals_torch_reference(exported, facet, case):
    model = copy.deepcopy(exported)
    if facet == "onnxruntime lowering":
        attention.lower_for_onnxruntime(model)
        assert not any(n.domain == attention.DOMAIN for n in model.graph.node)
    past, new, seq = CASES[case]
    inputs = make_inputs(past, new, seq, seed=len(case))
    expected = [t.numpy() for t in OneAttention()(*inputs)]
    got = session(model).run(None, {n: t.numpy() for n, t in zip(NAMES, inputs)})
    for row, (p, q) in enumerate(zip(past, new)):
        # Only valid query positions and cache slots carry meaning; the rest is free to differ.
        np.testing.assert_allclose(got[0][row, :q], expected[0][row, :q], atol=2e-5, rtol=1e-4)
        for out in (1, 2):
            np.testing.assert_allclose(got[out][row, :, : p + q], expected[out][row, :, : p + q], atol=1e-6)
        # Slots before the write offset are untouched.
        np.testing.assert_array_equal(got[1][row, :, :p], inputs[1][row, :, :p].numpy())


def test_reference_matches_plain_causal_attention():
    """The reference itself against a hand-written single-sequence computation."""
    qkv, past_key, past_value, past_lengths, query_lengths, positions = make_inputs([3], [2], 2, seed=7)
    module = OneAttention()
    out, present_key, present_value = module(qkv, past_key, past_value, past_lengths, query_lengths, positions)
    heads = qkv.view(1, 2, HEADS + 2 * KV_HEADS, HEAD_DIM)
    q, k, v = heads[:, :, :HEADS], heads[:, :, HEADS:HEADS + KV_HEADS], heads[:, :, HEADS + KV_HEADS:]
    cos, sin = module.cos[3:5][None], module.sin[3:5][None]
    q, k = attention.rotate_half_rope(q, cos, sin), attention.rotate_half_rope(k, cos, sin)
    keys = torch.cat([past_key[0, :, :3], k[0].transpose(0, 1)], dim=1)  # [Hkv, 5, D]
    values = torch.cat([past_value[0, :, :3], v[0].transpose(0, 1)], dim=1)
    for head in range(HEADS):
        kv = head // (HEADS // KV_HEADS)
        for i in range(2):
            scores = (keys[kv, : 4 + i] @ q[0, i, head]) * HEAD_DIM ** -0.5
            expected = scores.softmax(0) @ values[kv, : 4 + i]
            torch.testing.assert_close(out[0, i, head * HEAD_DIM:(head + 1) * HEAD_DIM], expected)
    torch.testing.assert_close(present_key[0, :, 3:5], k[0].transpose(0, 1))


def tree_case(seed=3):
    """Two rows verifying token trees on a non-empty cache, plus an idle row.

    Row 0: root 0 with children 1, 2; node 3 under 1; node 4 under 2 (parents come first).
    Row 1: a chain of 3 (plain causal), padded to 5. Row 2: idle.
    """
    parents = {0: [None, 0, 0, 1, 2], 1: [None, 0, 1]}
    past, new, seq = [6, 2, 4], [5, 3, 0], 5
    inputs = make_inputs(past, new, seq, seed=seed)
    mask = torch.zeros(3, seq, seq, dtype=torch.bool)
    positions = inputs[5].clone()
    for row, tree in parents.items():
        mask[row], depths = attention.tree_mask_for(tree, seq)
        positions[row, :len(tree)] = past[row] + torch.tensor(depths, dtype=positions.dtype)
    return past, new, (*inputs[:5], positions, mask), parents


@pytest.mark.parametrize("facet", ["function body", "onnxruntime lowering"])
def test_tree_facets_equal_torch_reference(exported_tree, facet):
    model = copy.deepcopy(exported_tree)
    assert {n.op_type for n in model.graph.node if n.domain == attention.DOMAIN} == {attention.TREE_OP_NAME}
    if facet == "onnxruntime lowering":
        attention.lower_for_onnxruntime(model)
    past, new, inputs, _ = tree_case()
    expected = [t.numpy() for t in OneTreeAttention()(*inputs)]
    got = session(model).run(None, {n: t.numpy() for n, t in zip(NAMES + ["tree_mask"], inputs)})
    for row, (p, q) in enumerate(zip(past, new)):
        np.testing.assert_allclose(got[0][row, :q], expected[0][row, :q], atol=2e-5, rtol=1e-4)
        for out in (1, 2):
            np.testing.assert_allclose(got[out][row, :, : p + q], expected[out][row, :, : p + q], atol=1e-6)
    assert np.isfinite(got[0]).all()


def test_tree_reference_equals_each_path_run_causally():
    """Each tree node's output equals running its root-to-node path as a plain causal sequence."""
    past, new, inputs, parents = tree_case(seed=11)
    module = OneAttention()
    tree_out = module(*inputs[:6], inputs[6])[0]
    qkv, past_key, past_value, _, _, positions, _ = inputs
    for row, tree in parents.items():
        for node in range(len(tree)):
            path, ancestor = [], node
            while ancestor is not None:
                path.insert(0, ancestor)
                ancestor = tree[ancestor]
            causal = module(qkv[row:row + 1, path], past_key[row:row + 1], past_value[row:row + 1],
                            torch.tensor([past[row]], dtype=torch.int32), torch.tensor([len(path)], dtype=torch.int32),
                            positions[row:row + 1, path])[0]
            torch.testing.assert_close(tree_out[row, node], causal[0, -1], atol=1e-5, rtol=1e-4)
