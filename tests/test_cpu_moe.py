"""Our float MoE kernel (runtime/backends/cpu_kernels/moe.c): MixtureOfExperts in place of the ONNX Runtime
MoE that plugins/moe.lower_for_onnxruntime writes for SwiGLU experts.

Oracles: ONNX Runtime's MoE on the same graph (the op it stands in for), and the method written out in numpy
(softmax over all experts, the top k, renormalised where asked, each chosen expert's down(silu(gate) * up)
summed by its weight). Both of the kernel's paths run: AVX-512 and plain C (TRT_LLM_CPU_KERNELS=c). The
families' tests (test_families.py, Qwen3-MoE) compare whole engines with transformers on it.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kernel_sessions import kernel_session
from trt_llm.runtime.backends import cpu_kernels
from trt_llm.runtime.backends.cpu_kernels import rewrite

PATHS = ["c"] + (["1"] if cpu_kernels.cpu_supported() else [])


def moe_model(gate_up: np.ndarray, down: np.ndarray, k: int, normalize: int, **attributes) -> onnx.ModelProto:
    """One MoE node as our lowering writes it (interleaved gate/up rows, SwiGLU, no biases)."""
    experts, _, hidden = gate_up.shape
    settings = dict(k=k, normalize_routing_weights=normalize, activation_type="swiglu", swiglu_fusion=1,
                    activation_alpha=1.0, activation_beta=0.0) | attributes
    node = helper.make_node("MoE", ["x", "logits", "gate_up", "", "down"], ["y"], domain="com.microsoft", **settings)
    v = helper.make_tensor_value_info
    graph = helper.make_graph([node], "moe", [v("x", TensorProto.FLOAT, None), v("logits", TensorProto.FLOAT, ["T", experts])],
                              [v("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(gate_up, "gate_up"), numpy_helper.from_array(down, "down")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])


def by_hand(x, logits, gate_up, down, k, normalize):
    rows = x.reshape(-1, x.shape[-1]).astype(np.float64)
    out = np.zeros_like(rows)
    for t, row in enumerate(rows):
        p = np.exp(logits[t] - logits[t].max())
        p /= p.sum()
        chosen = np.argsort(-p, kind="stable")[:k]
        weights = p[chosen] / (p[chosen].sum() if normalize else 1.0)
        for e, w in zip(chosen, weights):
            h = gate_up[e].astype(np.float64) @ row
            gate, up = h[0::2], h[1::2]
            out[t] += w * (down[e].astype(np.float64) @ (gate / (1 + np.exp(-gate)) * up))
    return out.reshape(x.shape)


def run(model: onnx.ModelProto, feeds: dict, ours: bool, tmp_path) -> np.ndarray:
    return kernel_session(model, tmp_path, rewrite.MOE_OP if ours else None).run(None, feeds)[0]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("normalize", [0, 1])
def test_the_kernel_computes_what_onnx_runtimes_moe_does(built, path, normalize, monkeypatch, tmp_path):
    """Decode (one token), a few tokens, a batch of rows (rank 3) and a prefill of 70: within float rounding
    of ONNX Runtime's MoE and of the method by hand, on 16 experts of which each token takes 4 (a prefill's
    experts see several tokens at once, more than the kernel's 4 a row load)."""
    monkeypatch.setenv(cpu_kernels.ENV, path)
    rng = np.random.default_rng(normalize)
    experts, hidden, width, k = 16, 80, 48, 4  # (H, I multiples of 16, not of the kernel's 32-value steps)
    gate_up = (rng.standard_normal((experts, 2 * width, hidden)) * 0.1).astype(np.float32)
    down = (rng.standard_normal((experts, hidden, width)) * 0.1).astype(np.float32)
    model = moe_model(gate_up, down, k, normalize)
    for shape in [(1, hidden), (3, hidden), (2, 5, hidden), (70, hidden)]:
        x = rng.standard_normal(shape).astype(np.float32)
        logits = rng.standard_normal((int(np.prod(shape[:-1])), experts)).astype(np.float32)
        feeds = {"x": x, "logits": logits}
        got, theirs = run(model, feeds, True, tmp_path), run(model, feeds, False, tmp_path)
        scale = np.abs(theirs).max()
        assert got.shape == x.shape
        np.testing.assert_allclose(got, theirs, rtol=0, atol=2e-6 * scale, err_msg=str(shape))
        np.testing.assert_allclose(got, by_hand(x, logits, gate_up, down, k, normalize), rtol=0, atol=2e-6 * scale)


def test_the_swap_takes_only_what_the_kernel_computes():
    rng = np.random.default_rng(0)
    gate_up = rng.standard_normal((4, 32, 16)).astype(np.float32)
    down = rng.standard_normal((4, 16, 16)).astype(np.float32)

    def swapped(model):
        return rewrite.swap_moe(model) == 1 and model.graph.node[0].op_type == rewrite.MOE_OP

    assert swapped(moe_model(gate_up, down, 2, 1))
    assert not swapped(moe_model(gate_up, down, 2, 1, activation_type="relu"))  # not SwiGLU
    assert not swapped(moe_model(gate_up, down, 2, 1, activation_alpha=1.702))  # GPT-OSS's gate
    assert not swapped(moe_model(gate_up, down, 2, 1, swiglu_limit=7.0))  # a clamp it does not apply
    assert not swapped(moe_model(gate_up, down[:, :, :8], 2, 1))  # down's width is not gate_up's
    assert not swapped(moe_model(gate_up[:, :, :8], down[:, :8], 2, 1))  # H not a multiple of 16
    model = moe_model(gate_up, down, 2, 1)
    model.graph.node[0].input.append("fc3")  # a third matrix
    assert not swapped(model)
    model = moe_model(gate_up, down, 2, 1)
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(gate_up.astype(np.float16), "gate_up"))
    assert not swapped(model)  # float16 experts
    model = moe_model(gate_up, down, 2, 0)
    assert swapped(model) and [(a.name, a.i) for a in model.graph.node[0].attribute] == [("k", 2), ("normalize", 0)]
    assert list(model.graph.node[0].input) == ["x", "logits", "gate_up", "down"]
