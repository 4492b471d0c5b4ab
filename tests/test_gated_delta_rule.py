"""The gated delta rule op (plugins/gated_delta_rule.py) at tiny widths (2 q/k heads of 16, 4 v heads of 8).

Oracles: transformers' torch_recurrent_gated_delta_rule and torch_chunk_gated_delta_rule
(use_qk_l2norm_in_kernel=True) on each row's own tokens alone, from its past state; float64's
triangular solve for the UT transform's inverse; the torch op for every ONNX form on ONNX Runtime
(the function body, the lowering, the token-by-token Loop), for a tiny module exported with
torch.onnx.export, and for the TensorRT kernel.
"""

from __future__ import annotations

import importlib.util

import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper
from torch.export import Dim
from transformers.models.qwen3_5.modeling_qwen3_5 import (torch_chunk_gated_delta_rule,
                                                          torch_recurrent_gated_delta_rule)

from trt_llm import plugins
from trt_llm.build.export import export_graph
from trt_llm.plugins import gated_delta_rule as op

K_HEADS, V_HEADS, K_DIM, V_DIM = 2, 4, 16, 8


def example(batch: int, seq: int, lengths: list[int] | None = None, seed: int = 0, dtype=torch.float32) -> list:
    """Inputs as Qwen3.5 makes them (g = -exp(A) * softplus(a), beta = sigmoid(b)), a nonzero past
    state, ragged rows (default: row b has seq - 3b tokens, at least 0)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seq, K_HEADS, K_DIM, generator=gen).to(dtype)
    k = torch.randn(batch, seq, K_HEADS, K_DIM, generator=gen).to(dtype)
    v = torch.randn(batch, seq, V_HEADS, V_DIM, generator=gen).to(dtype)
    g = -torch.nn.functional.softplus(torch.randn(batch, seq, V_HEADS, generator=gen)) * 0.5
    beta = torch.sigmoid(torch.randn(batch, seq, V_HEADS, generator=gen))
    state = torch.randn(batch, V_HEADS, K_DIM, V_DIM, generator=gen) * 0.5
    lengths = lengths or [max(seq - 3 * b, 0) for b in range(batch)]
    return [q, k, v, g, beta, state, torch.tensor(lengths, dtype=torch.int64)]


def transformers_rows(x: list, rule) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """transformers' rule on each row's own tokens, from its past state: (output [n, Hv, Dv], state)."""
    q, k, v, g, beta, state, lengths = x
    rows = []
    for b, n in enumerate(lengths.tolist()):
        if n == 0:
            rows.append((v.new_zeros(0, V_HEADS, V_DIM), state[b]))
            continue
        out, final = rule(q[b:b + 1, :n], k[b:b + 1, :n], v[b:b + 1, :n], g=g[b:b + 1, :n], beta=beta[b:b + 1, :n],
                          initial_state=state[b:b + 1], output_final_state=True, use_qk_l2norm_in_kernel=True)
        rows.append((out[0], final[0]))
    return rows


def assert_rows(got: tuple, rows: list, lengths: torch.Tensor, rtol=1e-5, atol=1e-5) -> None:
    output, state = got
    for b, (want_out, want_state) in enumerate(rows):
        n = int(lengths[b])
        torch.testing.assert_close(output[b, :n].float(), want_out.float(), rtol=rtol, atol=atol)
        assert not output[b, n:].any(), "padding positions are zeros"
        torch.testing.assert_close(state[b], want_state, rtol=rtol, atol=atol)


@pytest.mark.parametrize("seq", [1, 7, 64, 130, 300])
def test_the_op_and_the_chunked_form_are_transformers_rule(seq):
    x = example(3, seq)
    reference, chunked = torch.ops.trt_llm.gated_delta_rule(*x), op.chunked(*x)
    for rule in (torch_recurrent_gated_delta_rule, torch_chunk_gated_delta_rule):
        rows = transformers_rows(x, rule)
        assert_rows(reference, rows, x[-1])
        assert_rows(chunked, rows, x[-1])


def test_padding_never_reaches_the_state():
    # Garbage (huge, and a positive g) in the padding of a row changes nothing.
    x = example(2, 9, lengths=[9, 4])
    dirty = [t.clone() for t in x]
    for t in dirty[:5]:
        t[1, 4:] = 1e4
    for fn in (torch.ops.trt_llm.gated_delta_rule, op.chunked, op.gated_delta_rule_kernel):
        for a, b in zip(fn(*x), fn(*dirty)):
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("spread", [1.0, 0.01])
def test_the_inverse_by_doubling_is_the_triangular_solve(spread):
    # Alike keys (each the first plus a little noise, beta 1, no decay) are the hard case.
    gen = torch.Generator().manual_seed(1)
    for size in (1, 5, 33, 64):
        keys = torch.randn(1, 32, generator=gen) + spread * torch.randn(size, 32, generator=gen)
        keys = keys / keys.norm(dim=-1, keepdim=True)
        strict = (keys @ keys.T).tril(-1).double()
        exact = torch.linalg.solve_triangular(torch.eye(size, dtype=torch.float64) + strict,
                                              torch.eye(size, dtype=torch.float64), upper=False, unitriangular=True)
        got = op.unit_lower_inverse(strict.float()).double()
        assert float((got - exact).abs().max()) <= 1e-5 * float(exact.abs().max())


def single_node_model(function: onnx.FunctionProto, dtype: int = TensorProto.FLOAT,
                      lengths: int = TensorProto.INT64) -> onnx.ModelProto:
    types = [dtype] * 3 + [TensorProto.FLOAT] * 3 + [lengths]
    inputs = [helper.make_tensor_value_info(n, t, None) for n, t in zip(op.INPUTS, types)]
    outputs = [helper.make_tensor_value_info("output", dtype, None),
               helper.make_tensor_value_info("present_state", TensorProto.FLOAT, None)]
    node = helper.make_node(op.OP_NAME, op.INPUTS, op.OUTPUTS, domain=op.DOMAIN, name="gdr",
                            plugin_namespace=op.PLUGIN_NAMESPACE)
    return helper.make_model(helper.make_graph([node], "gdr", inputs, outputs), functions=[function],
                             opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(op.DOMAIN, 1)])


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def run(s: ort.InferenceSession, x: list) -> list[torch.Tensor]:
    return [torch.from_numpy(a) for a in s.run(None, dict(zip(op.INPUTS, (t.numpy() for t in x))))]


def test_every_onnx_form_is_the_op():
    sessions = {name: session(single_node_model(f)) for name, f in op.forms().items()}
    lowered = op.lower_for_onnxruntime(single_node_model(op.function_protos()[0]))
    assert not [n for n in lowered.graph.node if n.domain == op.DOMAIN] and not lowered.functions
    sessions["lower_for_onnxruntime"] = session(lowered)
    for seq in (1, 5, 64, 70, 129):
        x = example(3, seq, seed=seq)
        expected = torch.ops.trt_llm.gated_delta_rule(*x)
        for name, s in sessions.items():
            for got, want in zip(run(s, x), expected):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5, msg=lambda m: f"{name} S={seq}: {m}")


def test_the_body_keeps_the_model_dtype():
    x = example(2, 70, dtype=torch.float16)
    x[-1] = x[-1].to(torch.int32)  # the decoder graph's query_lengths are int32: the op takes both
    model = single_node_model(op.function_protos()[0], TensorProto.FLOAT16, TensorProto.INT32)
    for m in (model, op.lower_for_onnxruntime(single_node_model(op.function_protos()[0], TensorProto.FLOAT16,
                                                                TensorProto.INT32))):
        for inputs in (x, [t[:, :1] if t.dim() > 2 else t for t in x[:5]] + x[5:]):  # prefill, and S == 1
            output, state = run(session(m), inputs)
            want_output, want_state = torch.ops.trt_llm.gated_delta_rule(*inputs)
            assert output.dtype == torch.float16 and state.dtype == torch.float32
            torch.testing.assert_close(output, want_output, rtol=2e-3, atol=2e-3)
            torch.testing.assert_close(state, want_state, rtol=1e-4, atol=1e-4)


class Tiny(torch.nn.Module):
    """A module calling the op as a model family does: projections in, the op, a projection out."""

    def __init__(self):
        super().__init__()
        gen = torch.Generator().manual_seed(3)
        self.w = torch.nn.Parameter(torch.randn(K_HEADS * K_DIM, K_HEADS * K_DIM, generator=gen) * 0.2)

    def forward(self, q, k, v, g, beta, past_state, query_lengths):
        shape = q.shape
        q = (q.flatten(2) @ self.w).view(shape)
        output, state = torch.ops.trt_llm.gated_delta_rule(q, k, v, g, beta, past_state, query_lengths)
        return output * 2, state


def test_a_module_exports_and_runs_lowered_on_onnx_runtime(tmp_path):
    module = Tiny().eval()
    batch, seq = Dim("batch"), Dim("seq")
    shapes = ({0: batch, 1: seq},) * 5 + ({0: batch}, {0: batch})
    path = export_graph(module, tuple(example(3, 5)), op.INPUTS, op.OUTPUTS, shapes, tmp_path / "gdr.onnx")
    model = onnx.load(path)
    assert [n.op_type for n in model.graph.node if n.domain == op.DOMAIN] == [op.OP_NAME]
    assert [f.name for f in model.functions] == [op.OP_NAME]
    onnx.checker.check_model(model)
    body = session(model)
    lowered = session(plugins.lower_for_onnxruntime(model))
    x = example(2, 70, lengths=[70, 41], seed=5)
    with torch.no_grad():
        expected = module(*x)
    for s in (body, lowered):
        for got, want in zip(run(s, x), expected):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("seq", [1, 70])
def test_the_tensorrt_kernel_is_the_reference(seq):
    x = example(3, seq, lengths=[seq, seq // 2, 0])
    expected = torch.ops.trt_llm.gated_delta_rule(*x)
    out = (torch.full(x[2].shape, float("nan")), torch.full(x[5].shape, float("nan")))
    assert op.gated_delta_rule_kernel(*x, out=out) is out
    for got, want in zip(out, expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5)


@pytest.mark.skipif(importlib.util.find_spec("tensorrt_rtx") is None,
                    reason="TensorRT-RTX is not installed (pip install 'trt-llm[tensorrt-rtx]')")
def test_tensorrt_rtx_builds_the_body_ahead_of_time():
    """TensorRT-RTX has no plugins: its parser inlines the body (the chunk Loop included), and the plan
    builds for SM80 without a GPU (batch and tokens dynamic)."""
    import tensorrt_rtx as trt
    from trt_llm.build.tensorrt_backend import DEFAULT_COMPUTE_CAPABILITY, compute_capability
    from trt_llm.common.trt_import import make_logger

    model = single_node_model(op.function_protos()[0], TensorProto.FLOAT16)
    shapes = [["b", "s", K_HEADS, K_DIM]] * 2 + [["b", "s", V_HEADS, V_DIM]] + [["b", "s", V_HEADS]] * 2 + [
        ["b", V_HEADS, K_DIM, V_DIM], ["b"]]
    for value, dims in zip(model.graph.input, shapes):
        value.CopyFrom(helper.make_tensor_value_info(value.name, value.type.tensor_type.elem_type, dims))
    logger = make_logger(trt)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    assert parser.parse(model.SerializeToString()), [str(parser.get_error(i)) for i in range(parser.num_errors)]
    assert network.get_output(0).dtype == trt.DataType.HALF and network.get_output(1).dtype == trt.DataType.FLOAT
    config = builder.create_builder_config()
    config.num_compute_capabilities = 1
    config.set_compute_capability(compute_capability(trt, DEFAULT_COMPUTE_CAPABILITY), 0)
    profile = builder.create_optimization_profile()
    for value, dims in zip(model.graph.input, shapes):
        lo, opt, hi = (tuple(sizes.get(d, d) for d in dims) for sizes in ({"b": 1, "s": 1}, {"b": 2, "s": 64},
                                                                           {"b": 4, "s": 256}))
        profile.set_shape(value.name, lo, opt, hi)
    config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    assert plan is not None and plan.nbytes > 0


def test_the_chunk_work_runs_inside_the_loop():
    """Every chunk's arithmetic (the MatMuls, the l2norm) is in the Loop's body, one chunk at a time,
    and nothing expands the q/k heads (MatMul broadcasts them over their v heads): outside the Loop
    only the chunk count, the masks and the outputs' reassembly, so the prefill's intermediates are
    one chunk's, never the sequence's."""
    lowered = op.lower_for_onnxruntime(single_node_model(op.function_protos()[0]))
    for graph in (lowered.graph, next(a.g for a in lowered.graph.node[-1].attribute if a.name == "else_branch")):
        outside = {n.op_type for n in graph.node}
        assert not outside & {"MatMul", "Expand", "ReduceSum", "CumSum", "Pad"}, outside
    body = op.function_protos()[0]
    assert not {n.op_type for n in body.node} & {"MatMul", "Expand", "ReduceSum", "CumSum", "If"}
    loop = next(n for n in body.node if n.op_type == "Loop")
    inside = [n.op_type for n in loop.attribute[0].g.node]
    assert inside.count("MatMul") >= 15 and "Expand" not in inside


def test_padding_garbage_never_reaches_the_onnx_forms():
    # NaN and huge values at a ragged row's padding (across a chunk boundary: 70 tokens, 20 valid).
    x = example(2, 70, lengths=[70, 20])
    dirty = [t.clone() for t in x]
    for t in dirty[:5]:
        t[1, 20:] = float("nan")
    dirty[3][1, 20:] = 1e4
    lowered = session(op.lower_for_onnxruntime(single_node_model(op.function_protos()[0])))
    for s in (session(single_node_model(op.function_protos()[0])), lowered):
        for a, b in zip(run(s, x), run(s, dirty)):
            torch.testing.assert_close(a, b)
