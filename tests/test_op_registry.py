"""The op registry (plugins/__init__.py): every op file's facets under fixed names, found by file."""

import textwrap

import onnx
import pytest
import torch

from trt_llm import plugins
from trt_llm.plugins import attention, cross_attention, gated_delta_rule, moe, vision_attention, weight_only_matmul


def test_our_ops_are_registered_with_every_facet():
    assert plugins.ops() == (attention, cross_attention, gated_delta_rule, moe, vision_attention, weight_only_matmul)
    assert plugins.translation_table() == {
        torch.ops.trt_llm.attention.default: attention.onnx_translation,
        torch.ops.trt_llm.cross_attention.default: cross_attention.onnx_translation,
        torch.ops.trt_llm.gated_delta_rule.default: gated_delta_rule.onnx_translation,
        torch.ops.trt_llm.moe.default: moe.onnx_translation,
        torch.ops.trt_llm.vision_attention.default: vision_attention.onnx_translation,
        torch.ops.trt_llm.weight_only_matmul.default: weight_only_matmul.onnx_translation}
    assert plugins.domains() == {"trt"}
    names = sorted(f.name for f in plugins.function_protos())
    assert names == sorted([*attention.OP_NAMES, *cross_attention.OP_NAMES, *gated_delta_rule.OP_NAMES, *moe.OP_NAMES,
                            *vision_attention.OP_NAMES, *weight_only_matmul.OP_NAMES])


def test_an_op_is_one_new_file(tmp_path, monkeypatch):
    # A second op, written as a file in a folder on the package's path: every registry loop sees it.
    (tmp_path / "scale.py").write_text(textwrap.dedent('''
        import onnx
        import torch

        @torch.library.custom_op("trt_llm_test::scale", mutates_args=())
        def scale(x: torch.Tensor) -> torch.Tensor:
            return x * 2

        TORCH_OPS = (torch.ops.trt_llm_test.scale.default,)
        DOMAIN = "trt_test"
        onnx_translation = object()
        lowered = []

        def function_protos():
            return [onnx.helper.make_function(DOMAIN, "Scale", ["x"], ["y"], [], [])]

        def lower_for_onnxruntime(model):
            lowered.append(model)

        def register_tensorrt_plugin():
            return ("trt_llm_test::Scale",)
    '''))
    monkeypatch.setattr(plugins, "__path__", [*plugins.__path__, str(tmp_path)])
    plugins.ops.cache_clear()
    try:
        names = [module.__name__.rsplit(".", 1)[-1] for module in plugins.ops()]
        assert names == ["attention", "cross_attention", "gated_delta_rule", "moe", "scale", "vision_attention",
                         "weight_only_matmul"]
        assert torch.ops.trt_llm_test.scale.default in plugins.translation_table()
        assert plugins.domains() == {"trt", "trt_test"}
        assert "Scale" in [f.name for f in plugins.function_protos()]
        model = onnx.ModelProto()
        plugins.lower_for_onnxruntime(model)
        assert plugins.ops()[4].lowered == [model]
        plugins.finish_export(model)  # an op without the optional fix-up is skipped
    finally:
        plugins.ops.cache_clear()


def test_a_file_without_the_facets_is_refused(tmp_path, monkeypatch):
    (tmp_path / "helper.py").write_text("X = 1\n")
    monkeypatch.setattr(plugins, "__path__", [*plugins.__path__, str(tmp_path)])
    plugins.ops.cache_clear()
    try:
        with pytest.raises(ImportError, match="plugins/helper.py is not an op: it lacks TORCH_OPS"):
            plugins.ops()
    finally:
        plugins.ops.cache_clear()
