"""Our custom ops, one file each, and the registry that every stage loops over.

Each op module in this package exposes its four facets under fixed names (plugins/attention.py is
the model):

    TORCH_OPS                 the torch custom ops the model calls (facet 1, the eager reference)
    onnx_translation          the exporter's translation of those ops to our ONNX node (facet 2)
    DOMAIN, function_protos() the node's ONNX domain and its function bodies in standard ops (facet 2)
    lower_for_onnxruntime()   rewrites its nodes of a model for ONNX Runtime's CPU kernels (facet 3)
    register_tensorrt_plugin() registers its nodes as TensorRT plugins (facet 4)

and, where needed, `finish_export(model)` (a fix-up of its nodes after torch.onnx.export:
plugins/weight_only_matmul.py types its 4-bit weights there) and `lower_for_tensorrt(model)` (a
rewrite before TensorRT parses the graph; returns whether it changed anything).

The export, the cpu backend and the TensorRT build and runtime call the functions below, never an op
by name, so adding an op is one new file here: it is found by its file name.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from types import ModuleType

FACETS = ("TORCH_OPS", "onnx_translation", "DOMAIN", "function_protos", "lower_for_onnxruntime",
          "register_tensorrt_plugin")


@functools.cache
def ops() -> tuple[ModuleType, ...]:
    """Every op module of this package (importing one registers its torch ops)."""
    modules = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        missing = [facet for facet in FACETS if not hasattr(module, facet)]
        if missing:
            raise ImportError(f"plugins/{info.name}.py is not an op: it lacks {', '.join(missing)}")
        modules.append(module)
    return tuple(modules)


def translation_table() -> dict:
    """torch op overload -> its ONNX translation, for torch.onnx.export's custom_translation_table."""
    return {torch_op: module.onnx_translation for module in ops() for torch_op in module.TORCH_OPS}


def domains() -> set[str]:
    return {module.DOMAIN for module in ops()}


def finish_export(model) -> None:
    """Every op's fix-up of a freshly exported model, in place."""
    for module in ops():
        if hasattr(module, "finish_export"):
            module.finish_export(model)


def function_protos() -> list:
    """The function bodies of every op's nodes, to attach to an exported model."""
    return [proto for module in ops() for proto in module.function_protos()]


def lower_for_onnxruntime(model):
    """Every op's nodes of `model` rewritten for ONNX Runtime, in place."""
    for module in ops():
        module.lower_for_onnxruntime(model)
    return model


def lower_for_tensorrt(model) -> bool:
    """Every op's rewrite of `model` before TensorRT parses it, in place; True when one changed it."""
    changed = [module.lower_for_tensorrt(model) for module in ops() if hasattr(module, "lower_for_tensorrt")]
    return any(changed)


def register_tensorrt_plugins() -> tuple[str, ...]:
    """Every op registered with TensorRT (once per process); returns the plugin ids."""
    return tuple(plugin_id for module in ops() for plugin_id in module.register_tensorrt_plugin())
