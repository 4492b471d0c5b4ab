"""The cpu backend's SigLIP lowering (trt_llm/families/siglip_lowering.py): our SiglipEncoder's graph
as build/cpu_backend.py compiles it takes ONNX Runtime's fused kernels (one MultiHeadAttention and one
FastGelu a layer) and still equals transformers' SiglipEncoder, the oracle, within float32 rounding; a
graph whose nodes are not siglip.py's is left as it was."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
import torch

from trt_llm.families import siglip_lowering

LAYERS = 3


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    """transformers' SigLIP encoder with random weights, its biases and norms away from their 0 / 1
    initial values (a fusion that dropped one would show), and our graph of it, compiled for cpu."""
    from torch.export import Dim
    from transformers import SiglipVisionConfig
    from transformers.models.siglip.modeling_siglip import SiglipEncoder as HFEncoder

    from trt_llm.build.cpu_backend import compile_cpu
    from trt_llm.build.export import export_graph
    from trt_llm.families.siglip import SiglipEncoder

    # head_dim 12: not a power of two (Gemma 3's tower has 72)
    config = SiglipVisionConfig(hidden_size=96, intermediate_size=192, num_hidden_layers=LAYERS,
                                num_attention_heads=8, hidden_act="gelu_pytorch_tanh")
    torch.manual_seed(0)
    hf = HFEncoder(config).eval()
    with torch.no_grad():
        for parameter in hf.parameters():
            if parameter.dim() == 1:
                parameter.add_(torch.randn_like(parameter) * 0.2)
    folder = tmp_path_factory.mktemp("siglip")
    graph = export_graph(SiglipEncoder(hf.layers), (torch.zeros(2, 20, 96),), ["x"], ["y"],
                         ({0: Dim("frames"), 1: Dim("patches")},), folder / "encoder.onnx")
    return hf, graph, compile_cpu(graph)


def test_the_layers_take_onnxruntimes_fused_kernels(encoder):
    _, _, engine = encoder
    ops = collections.Counter(node.op_type for node in onnx.load(engine, load_external_data=False).graph.node)
    assert ops["MultiHeadAttention"] == ops["FastGelu"] == LAYERS
    assert ops["LayerNormalization"] == 2 * LAYERS  # the norms stay (see the lowering's docstring)
    assert not {"Softmax", "Tanh", "Pow", "Transpose"} & set(ops)


def test_the_lowered_graph_equals_transformers_encoder(encoder):
    import onnxruntime as ort

    hf, _, engine = encoder
    x = np.random.default_rng(0).standard_normal((3, 37, 96)).astype(np.float32)
    with torch.no_grad():
        expected = hf(torch.from_numpy(x)).last_hidden_state.numpy()
    session = ort.InferenceSession(str(engine), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"x": x})[0], expected, atol=1e-5, rtol=1e-5)


def test_nodes_outside_siglip_are_left_as_they_are(encoder):
    _, graph, _ = encoder
    model = onnx.load(graph, load_external_data=False)
    for node in model.graph.node:  # the same ops, no longer recorded as siglip.py's
        del node.metadata_props[:]
    before = model.SerializeToString()
    assert set(siglip_lowering.lower_for_onnxruntime(model).values()) == {0}
    assert model.SerializeToString() == before
