"""Our gated-MLP activation (runtime/backends/cpu_kernels/swiglu.c): SwiGLU in place of the Split, silu and Mul
our lowering writes for a SwiGLU MLP.

Oracle: ONNX Runtime running those very nodes on the same inputs, in both forms the swap meets (an optimised
graph's QuickGelu, a lowered graph's Sigmoid and Mul, which ONNX Runtime fuses as it loads it): the kernel's
outputs have the same bits, so an engine emits the tokens it emitted before the swap. Both of the kernel's
paths run: AVX-512 and plain C (TRT_LLM_CPU_KERNELS=c).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from kernel_sessions import kernel_session
from trt_llm.runtime.backends import cpu_kernels
from trt_llm.runtime.backends.cpu_kernels import rewrite

PATHS = ["c"] + (["1"] if cpu_kernels.cpu_supported() else [])


def mlp_activation(width: int, fused: bool, dtype=TensorProto.FLOAT, alpha: float = 1.0, sizes=None) -> onnx.ModelProto:
    """x [B, S, 2 width] -> Split (last axis) -> silu(gate) -> * up, as an optimised graph (fused: QuickGelu) or
    as our lowering writes it (Sigmoid, Mul); sizes: the Split's sizes as an input, else num_outputs 2."""
    n = helper.make_node
    split_inputs = ["x"] + (["sizes"] if sizes else [])
    nodes = [n("Split", split_inputs, ["gate", "up"], axis=2, **({} if sizes else {"num_outputs": 2}))]
    if fused:
        nodes.append(n("QuickGelu", ["gate"], ["silu"], domain="com.microsoft", alpha=alpha))
    else:
        nodes += [n("Sigmoid", ["gate"], ["sig"]), n("Mul", ["gate", "sig"], ["silu"])]
    nodes.append(n("Mul", ["silu", "up"], ["y"]))
    x = helper.make_tensor_value_info("x", dtype, ["B", "S", 2 * width])
    y = helper.make_tensor_value_info("y", dtype, ["B", "S", width])
    inits = [helper.make_tensor("sizes", TensorProto.INT64, [2], sizes)] if sizes else []
    graph = helper.make_graph(nodes, "mlp", [x], [y], inits,
                              value_info=[helper.make_tensor_value_info("x", dtype, ["B", "S", 2 * width])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])


def inputs(rng, shape) -> np.ndarray:
    """Gates from small to past the approximation's clamp (|x| > 18), and special values at the front."""
    x = (rng.standard_normal(shape) * rng.choice([0.3, 3.0, 30.0], size=shape)).astype(np.float32)
    special = np.array([0.0, -0.0, 17.99, 18.0, 18.01, -18.01, -40.0, 1e-30, -1e-30, np.inf, -np.inf, np.nan],
                       np.float32)
    x.reshape(-1)[:special.size] = special
    return x


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit, NaN where NaN (its payload aside)."""
    nan = np.isnan(a)
    return bool((nan == np.isnan(b)).all() and (a.view(np.int32)[~nan] == b.view(np.int32)[~nan]).all())


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fused", [True, False], ids=["optimised QuickGelu", "lowered Sigmoid and Mul"])
@pytest.mark.parametrize("shape", [(2, 3, 40), (1, 64, 1536)], ids=["a ragged width", "threads"])
def test_the_kernel_has_the_bits_of_onnx_runtimes_nodes(built, path, fused, shape, monkeypatch, tmp_path):
    monkeypatch.setenv(cpu_kernels.ENV, path)
    model = mlp_activation(shape[-1], fused)
    x = inputs(np.random.default_rng(0), (*shape[:-1], 2 * shape[-1]))
    theirs = kernel_session(model, tmp_path).run(None, {"x": x})[0]
    ours = kernel_session(model, tmp_path, rewrite.SWIGLU_OP).run(None, {"x": x})[0]
    assert same_bits(theirs, ours)
    assert np.isnan(ours).any() and np.isinf(ours).any()  # (the special values went through)


def test_the_swap_takes_only_what_the_kernel_computes():
    model = mlp_activation(16, fused=True)
    assert rewrite.swap_swiglu(model) == 1
    (node,) = model.graph.node
    assert (node.domain, node.op_type, list(node.input), list(node.output)) == (rewrite.DOMAIN, "SwiGLU", ["x"], ["y"])
    assert rewrite.swap_swiglu(mlp_activation(16, fused=False)) == 1
    assert rewrite.swap_swiglu(mlp_activation(16, fused=False, sizes=[16, 16])) == 1
    assert rewrite.swap_swiglu(mlp_activation(16, fused=True, sizes=[20, 12])) == 0  # uneven halves
    assert rewrite.swap_swiglu(mlp_activation(16, fused=True, alpha=1.702)) == 0  # GELU's approximation, not silu
    assert rewrite.swap_swiglu(mlp_activation(16, fused=True, dtype=TensorProto.FLOAT16)) == 0
    read_twice = mlp_activation(16, fused=True)
    read_twice.graph.output.append(helper.make_tensor_value_info("silu", TensorProto.FLOAT, None))
    assert rewrite.swap_swiglu(read_twice) == 0  # the silu is a graph output: it must stay
