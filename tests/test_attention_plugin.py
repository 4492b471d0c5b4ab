"""The attention op's ONNX function body (facet 2) and its ONNX Runtime lowering (facet 3) equal the
torch reference (facet 1), case by case: ragged prefill, decode, several new tokens on a non-empty
cache, idle rows; with a sliding window and soft-capping, the plugin's kernel (facet 4) too, and the
reference against attention written out from the definition."""

import contextlib
import copy
import functools
import importlib.util
import inspect
import types

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
    def __init__(self, window=0, softcap=0.0):
        super().__init__()
        self.window, self.softcap = window, softcap
        inv_freq = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
        freqs = torch.outer(torch.arange(POSITIONS).float(), inv_freq)
        self.register_buffer("cos", freqs.cos())
        self.register_buffer("sin", freqs.sin())

    def forward(self, qkv, past_key, past_value, past_lengths, query_lengths, position_ids, tree_mask=None):
        return torch.ops.trt_llm.attention(qkv, past_key, past_value, past_lengths, query_lengths,
                                           position_ids, self.cos, self.sin, tree_mask, HEADS, KV_HEADS,
                                           HEAD_DIM ** -0.5, self.window, self.softcap)


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


# --- sliding window and soft-capping --------------------------------------------------------------


class TwoLayers(torch.nn.Module):
    """Two attention layers on the same inputs, their outputs summed: a model may mix layers (Gemma 2
    alternates sliding-window and global ones)."""

    def __init__(self, first, second):
        super().__init__()
        self.first, self.second = first, second

    def forward(self, qkv, past_key, past_value, past_lengths, query_lengths, position_ids, tree_mask=None):
        inputs = (qkv, past_key, past_value, past_lengths, query_lengths, position_ids, tree_mask)
        out, present_key, present_value = self.first(*inputs)
        return out + self.second(*inputs)[0], present_key, present_value


def dense_attention(module, inputs, tree_mask=None):
    """The output of `module`'s attention written out from the definition, row by row, query by query:
    new token i of a row sits in slot past + i and sees a cached slot j < past, or new token t the tree
    mask allows (without one: t <= i); with a window W, only slots j with (past + i) - j < W; scores are
    scale * q.k, with a soft-cap c turned into c * tanh(score / c)."""
    qkv, past_key, past_value, past_lengths, query_lengths, positions = inputs
    batch, seq, _ = qkv.shape
    heads = qkv.view(batch, seq, HEADS + 2 * KV_HEADS, HEAD_DIM)
    q, k, v = heads[:, :, :HEADS], heads[:, :, HEADS:HEADS + KV_HEADS], heads[:, :, HEADS + KV_HEADS:]
    cos, sin = module.cos[positions.long()], module.sin[positions.long()]
    q, k = attention.rotate_half_rope(q, cos, sin), attention.rotate_half_rope(k, cos, sin)
    out = torch.zeros(batch, seq, HEADS * HEAD_DIM)
    for row in range(batch):
        past, new = int(past_lengths[row]), int(query_lengths[row])
        keys = torch.cat([past_key[row, :, :past], k[row, :new].transpose(0, 1)], dim=1)  # [Hkv, slots, D]
        values = torch.cat([past_value[row, :, :past], v[row, :new].transpose(0, 1)], dim=1)
        for i in range(new):
            seen = [j for j in range(past + new)
                    if (j < past or (bool(tree_mask[row, i, j - past]) if tree_mask is not None else j - past <= i))
                    and (module.window == 0 or past + i - j < module.window)]
            for head in range(HEADS):
                kv = head // (HEADS // KV_HEADS)
                scores = (keys[kv, seen] @ q[row, i, head]) * HEAD_DIM ** -0.5
                if module.softcap:
                    scores = module.softcap * torch.tanh(scores / module.softcap)
                out[row, i, head * HEAD_DIM:(head + 1) * HEAD_DIM] = scores.softmax(0) @ values[kv, seen]
    return out


# (past lengths, new tokens per row, widest row, window, soft-cap); HEADS > KV_HEADS throughout.
WINDOW_CASES = {
    "window smaller than the context, prefill on a cache": ([6, 3, 0], [4, 2, 5], 5, 3, 0.0),
    "window equal to the context": ([4, 0], [3, 7], 7, 7, 0.0),
    "window larger than the context": ([2, 5], [3, 1], 3, 20, 0.0),
    "window of one slot": ([5, 0], [2, 3], 3, 1, 0.0),
    "decode steps with a window": ([7, 2, 12, 0], [1, 1, 1, 1], 1, 4, 0.0),
    "idle row with a window": ([4, 0, 9], [0, 3, 0], 3, 2, 0.0),
    "soft-cap only": ([6, 3], [4, 2], 4, 0, 2.0),
    "window and soft-cap, ragged": ([10, 3, 0], [1, 4, 2], 4, 5, 1.5),
}
# The runtime may keep only a row's last slots: rotary positions then run ahead of the slots, and the
# window must follow the slots.
KEPT_SLOTS_SHIFT = 7


def window_case(case, seed):
    """(past, new, the module, its inputs) for a case, rotary positions KEPT_SLOTS_SHIFT ahead of the slots."""
    past, new, seq, window, softcap = WINDOW_CASES[case]
    inputs = make_inputs(past, new, seq, seed=seed)
    return past, new, OneAttention(window, softcap), (*inputs[:5], inputs[5] + KEPT_SLOTS_SHIFT)


def windowed_tree_case():
    """tree_case with a window of 3 slots (fewer than the deepest path, so a node loses its root) and a soft-cap."""
    past, new, inputs, _ = tree_case()
    return past, new, OneTreeAttention(3, 2.0), inputs


@functools.cache
def exported_with(window, softcap, tree=False):
    if tree:
        example = (*make_inputs([1, 0, 2], [3, 2, 0], 4), torch.ones(3, 4, 4, dtype=torch.bool).tril())
        return export(OneTreeAttention(window, softcap), example, NAMES + ["tree_mask"])
    return export(OneAttention(window, softcap), make_inputs([1, 0, 2], [3, 2, 0], 4), NAMES)


def run_facet(facet, module, inputs):
    """`module`'s attention on `inputs` through a facet: its exported graph on ONNX Runtime (the function
    body, or the GroupQueryAttention lowering), or the plugin's kernel."""
    tree = len(inputs) == 7
    if facet == "kernel":
        return [t.numpy() for t in attention.attention_kernel(
            *inputs[:6], module.cos, module.sin, inputs[6] if tree else None, HEADS, KV_HEADS, HEAD_DIM ** -0.5,
            module.window, module.softcap)]
    model = copy.deepcopy(exported_with(module.window, module.softcap, tree))
    if facet == "onnxruntime lowering":
        attention.lower_for_onnxruntime(model)
        assert not any(n.domain == attention.DOMAIN for n in model.graph.node)
    return session(model).run(None, {n: t.numpy() for n, t in zip(NAMES + ["tree_mask"], inputs)})


def assert_facet_equals(got, expected, past, new, inputs):
    for row, (p, q) in enumerate(zip(past, new)):
        np.testing.assert_allclose(got[0][row, :q], expected[0][row, :q], atol=2e-5, rtol=1e-4)
        for out in (1, 2):
            np.testing.assert_allclose(got[out][row, :, : p + q], expected[out][row, :, : p + q], atol=1e-6)
        np.testing.assert_array_equal(got[1][row, :, :p], inputs[1][row, :, :p].numpy())


@pytest.mark.parametrize("case", [*WINDOW_CASES, "tree mask"])
def test_windowed_reference_matches_attention_written_out(case):
    past, new, module, inputs = windowed_tree_case() if case == "tree mask" else window_case(case, seed=len(case))
    out = module(*inputs)[0]
    expected = dense_attention(module, inputs[:6], inputs[6] if case == "tree mask" else None)
    for row, q in enumerate(new):
        torch.testing.assert_close(out[row, :q], expected[row, :q], atol=1e-5, rtol=1e-4)
        assert not out[row, q:].any()  # padded queries are zero


def test_a_window_of_at_least_the_context_changes_nothing():
    _, _, _, inputs = window_case("window larger than the context", seed=5)  # rows of 2 + 3 and 5 + 1 slots
    for window in (20, 6):
        torch.testing.assert_close(OneAttention(window)(*inputs)[0], OneAttention()(*inputs)[0])
    assert not torch.allclose(OneAttention(5)(*inputs)[0], OneAttention()(*inputs)[0])


@pytest.mark.parametrize("facet", ["function body", "onnxruntime lowering", "kernel"])
@pytest.mark.parametrize("case", [*WINDOW_CASES, "tree mask"])
def test_windowed_facet_equals_torch_reference(facet, case):
    past, new, module, inputs = windowed_tree_case() if case == "tree mask" else window_case(case, seed=len(case))
    expected = [t.numpy() for t in module(*inputs)]
    got = run_facet(facet, module, inputs)
    assert_facet_equals(got, expected, past, new, inputs)


def test_gqa_local_window_size_is_our_window():
    """ONNX Runtime's GroupQueryAttention (1.32, CPU) counts the query's own slot in local_window_size:
    the lowering passes our window as it is, and one less would be one slot short."""
    model = attention.lower_for_onnxruntime(copy.deepcopy(exported_with(3, 0.0)))
    (node,) = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    assert attention._attr(node, "local_window_size") == 3
    past, new, module, inputs = window_case("window smaller than the context, prefill on a cache", seed=2)
    feeds = {n: t.numpy() for n, t in zip(NAMES, inputs)}
    for local_window_size, window in ((3, 3), (2, 2)):
        for attribute in node.attribute:
            if attribute.name == "local_window_size":
                attribute.i = local_window_size
        got = session(model).run(None, feeds)[0]
        expected = OneAttention(window)(*inputs)[0].numpy()
        for row, q in enumerate(new):
            np.testing.assert_allclose(got[row, :q], expected[row, :q], atol=2e-5, rtol=1e-4)


def test_graphs_without_window_and_softcap_run_as_before(exported):
    """A node made before the attributes existed is valid, its body reads them as 0, and it lowers to
    GQA's defaults (no window, no soft-cap)."""
    model = copy.deepcopy(exported)
    (node,) = [n for n in model.graph.node if n.domain == attention.DOMAIN]
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attributes["window"] == 0 and attributes["softcap"] == 0.0
    kept = [a for a in node.attribute if a.name not in ("window", "softcap")]
    del node.attribute[:]
    node.attribute.extend(kept)
    onnx.checker.check_model(model)  # the schema's attributes are optional
    past, new, seq = CASES["several new tokens on a non-empty cache"]
    inputs = make_inputs(past, new, seq, seed=4)
    got = session(model).run(None, {n: t.numpy() for n, t in zip(NAMES, inputs)})
    assert_facet_equals(got, [t.numpy() for t in OneAttention()(*inputs)], past, new, inputs)
    attention.lower_for_onnxruntime(model)
    (gqa,) = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    assert attention._attr(gqa, "local_window_size") == -1 and attention._attr(gqa, "softcap") == 0.0


def body_ops(model) -> list[str]:
    """The op types in the model's attention function bodies, and in their If branches."""
    def ops(nodes):
        for node in nodes:
            yield node.op_type
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    yield from ops(attribute.g.node)

    return [op for f in model.functions if f.name in attention.OP_NAMES for op in ops(f.node)]


@pytest.mark.parametrize("softcaps", [(0.0, 0.0), (2.0, 2.0), (0.0, 2.0)])
def test_softcap_branch_is_fixed_at_export_and_a_mixed_model_keeps_the_if(softcaps):
    """finish_export gives the bodies the soft-cap branch every node takes (TensorRT-RTX builds no If on
    the float soft-cap); the window's If stays, per node. A model mixing soft-caps keeps the If, and
    ONNX Runtime runs every layer as the reference does."""
    module = TwoLayers(OneAttention(0, softcaps[0]), OneAttention(3, softcaps[1]))
    model = export(module, make_inputs([1, 0, 2], [3, 2, 0], 4), NAMES)
    onnx.checker.check_model(model)
    ops = body_ops(model)
    assert ops.count("If") == (1 if softcaps[0] == softcaps[1] else 2)
    assert ("Tanh" in ops) == any(softcaps)
    past, new, _, inputs = window_case("window and soft-cap, ragged", seed=9)
    expected = [t.numpy() for t in module(*inputs)]
    assert_facet_equals(session(model).run(None, {n: t.numpy() for n, t in zip(NAMES, inputs)}), expected, past, new,
                        inputs)


def test_window_zero_body_runs_no_window_or_softcap_node_on_onnxruntime(tmp_path):
    """ONNX Runtime folds the window's If: the optimized graph of a body without window or soft-cap
    has no If and no Tanh, and fewer nodes than one with a window."""
    counts = {}
    for window, softcap in ((0, 0.0), (3, 0.0)):
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.optimized_model_filepath = str(tmp_path / f"{window}.onnx")
        ort.InferenceSession(exported_with(window, softcap).SerializeToString(), options,
                             providers=["CPUExecutionProvider"])
        optimized = onnx.load(options.optimized_model_filepath)
        counts[window] = [n.op_type for n in optimized.graph.node]
    assert "If" not in counts[0] + counts[3] and "Tanh" not in counts[0]
    assert len(counts[3]) > len(counts[0])  # the window's mask term, only where it is set


def test_tensorrt_plugin_takes_what_tensorrt_plugin_passes(monkeypatch):
    """Facet 4's registration, with a stand-in for tensorrt.plugin that calls describe and run as it
    does: descriptors by position and attributes by name; tensors, attributes and outputs by position
    and the stream by name. The annotations sit in the signatures, where it reads them."""
    registered = {}

    class Desc:
        def __init__(self, shape):
            self.shape_expr = list(shape)

        def like(self):
            return Desc(self.shape_expr)

    trtp = types.SimpleNamespace(
        TensorDesc=Desc, Tensor=torch.Tensor,
        register=lambda plugin_id: lambda f: registered.setdefault(plugin_id, {}).update(describe=f),
        impl=lambda plugin_id: lambda f: registered[plugin_id].update(run=f))
    monkeypatch.setattr(attention, "_tensorrt_as_torch", lambda tensor: tensor)
    monkeypatch.setattr(torch.cuda, "ExternalStream", lambda stream: stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    names = ["qkv", "past_key", "past_value", "past_lengths", "query_lengths", "position_ids", "cos_cache", "sin_cache"]
    past, new, module, inputs = windowed_tree_case()
    attributes = dict(num_heads=HEADS, kv_num_heads=KV_HEADS, scale=HEAD_DIM ** -0.5, window=module.window,
                      softcap=module.softcap)
    for plugin_id, tree in zip(attention.TENSORRT_PLUGIN_IDS, (False, True)):
        attention._register_one(trtp, plugin_id, names + ["tree_mask"] * tree)
        describe, run = registered[plugin_id]["describe"], registered[plugin_id]["run"]
        signature = inspect.signature(describe)
        assert list(signature.parameters) == names + ["tree_mask"] * tree + list(attention.PLUGIN_ATTRIBUTES)
        assert signature.parameters["softcap"].annotation is float and signature.parameters["window"].annotation is int
        assert list(inspect.signature(run).parameters)[-2:] == ["outputs", "stream"]
        tensors = [*inputs[:6], module.cos, module.sin] + [inputs[6]] * tree
        output, _, _ = describe(*[Desc(t.shape) for t in tensors], **attributes)
        assert output.shape_expr[2] == HEADS * HEAD_DIM
        targets = [torch.empty(len(past), inputs[0].shape[1], HEADS * HEAD_DIM), torch.empty_like(inputs[1]),
                   torch.empty_like(inputs[2])]
        run(*tensors, *attributes.values(), targets, stream=0)
        expected = [t.numpy() for t in (module if tree else OneAttention(module.window, module.softcap))(
            *inputs[:6], *[inputs[6]] * tree)]
        assert_facet_equals([t.numpy() for t in targets], expected, past, new, inputs)


@pytest.mark.skipif(importlib.util.find_spec("tensorrt_rtx") is None,
                    reason="TensorRT-RTX is not installed (pip install 'trt-llm[tensorrt-rtx]')")
@pytest.mark.parametrize("tree", [False, True])
@pytest.mark.parametrize("softcap", [0.0, 2.0])
def test_tensorrt_rtx_builds_windowed_layers_without_a_gpu(tmp_path, tree, softcap):
    """A global and a sliding-window layer in one graph: TensorRT-RTX inlines the bodies per node and
    builds a plan ahead of time (the window's If folds per node; the soft-cap's was fixed at export)."""
    from trt_llm.build.tensorrt_backend import compile_tensorrt

    layer = OneTreeAttention if tree else OneAttention
    example = make_inputs([1, 0, 2], [3, 2, 0], 4) + (torch.ones(3, 4, 4, dtype=torch.bool).tril(),) * tree
    model = export(TwoLayers(layer(0, softcap), layer(3, softcap)), example, NAMES + ["tree_mask"] * tree)
    onnx.save(model, tmp_path / "model.onnx")
    shapes = {"batch": (1, 2, 4), "seq": (1, 4, 16), "capacity": (1, CAPACITY, 64)}
    plan = compile_tensorrt(tmp_path / "model.onnx", tmp_path, types.SimpleNamespace(dtype="fp32"), rtx=True,
                            profiles=[shapes])
    assert plan.stat().st_size > 100_000


def test_a_rotation_gqa_cannot_take_is_refused_at_lowering():
    """ONNX Runtime's GQA wants R/2 a multiple of 8: 8 rotated dims of 16 (R/2 = 4) are refused in one
    line at the cpu lowering, not at the first request."""
    module = OneAttention()
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8))
    freqs = torch.outer(torch.arange(POSITIONS).float(), inv_freq)
    module.cos, module.sin = freqs.cos(), freqs.sin()
    model = export(module, make_inputs([1, 0, 2], [3, 2, 0], 4), NAMES)
    with pytest.raises(ValueError, match="rotates a multiple of 16 dims per head; this model rotates 8"):
        attention.lower_for_onnxruntime(model)
