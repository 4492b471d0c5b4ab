"""The `cpu` backend: our ops lowered to ONNX Runtime's fused contrib ops."""

from __future__ import annotations

import tempfile
from pathlib import Path

import onnx

from trt_llm.plugins import attention

ENGINE_NAME = "model.cpu.onnx"


def compile_cpu(graph_path: Path, quantization: str = "none") -> Path:
    """Write the lowered graph beside the portable one.

    Unquantized, both read the same external weight file: the graph is loaded without its weights,
    so only the node list is rewritten and the weights are neither copied nor duplicated on disk.
    quantization int8 / int4 (an EAGLE draft, whose precision never reaches the output) writes the
    quantized weights to the engine's own file instead.
    """
    model = onnx.load(graph_path, load_external_data=False)
    attention.lower_for_onnxruntime(model)
    engine_path = graph_path.parent / ENGINE_NAME
    if quantization == "none":
        onnx.save_model(model, engine_path)
    else:
        _read_weights(model, graph_path.parent)
        model = quantize_matmul_weights(model, quantization)
        onnx.save_model(model, engine_path, save_as_external_data=True, location=ENGINE_NAME + ".data")
    # Fail at build time, not at run time, if ONNX Runtime cannot load what we wrote.
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ort.InferenceSession(str(engine_path), options, providers=["CPUExecutionProvider"])
    return engine_path


def _read_weights(model: onnx.ModelProto, folder: Path) -> None:
    """Bring the external weights into the model. (onnx.load_external_data_for_model refuses a file
    with several hard links, and a compile's staging folder hard-links the bundle's files.)"""
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    for tensor in model.graph.initializer:
        if not uses_external_data(tensor):
            continue
        info = ExternalDataInfo(tensor)
        with open(folder / info.location, "rb") as data:
            data.seek(info.offset or 0)
            tensor.raw_data = data.read(info.length) if info.length else data.read()
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]


def quantize_matmul_weights(model: onnx.ModelProto, quantization: str) -> onnx.ModelProto:
    """Every MatMul with a constant fp32 weight, quantized by ONNX Runtime's own tools: int8 per
    tensor with activations quantized at run time (MatMulInteger), or int4 in blocks of 32 with int8
    compute (MatMulNBits, accuracy level 4: the VNNI kernels)."""
    import logging

    quiet = logging.getLogger().level
    logging.getLogger().setLevel(logging.ERROR)  # the quantizers log every node they touch
    try:
        if quantization == "int8":
            from onnxruntime.quantization import QuantType, quantize_dynamic

            with tempfile.TemporaryDirectory() as work:  # quantize_dynamic works on files
                source, target = Path(work) / "in.onnx", Path(work) / "out.onnx"
                onnx.save_model(model, source, save_as_external_data=True, location="in.onnx.data")
                quantize_dynamic(source, target, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"],
                                 extra_options={"MatMulConstBOnly": True})
                return onnx.load(target)
        if quantization == "int4":
            from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

            quantizer = MatMulNBitsQuantizer(model, algo_config=DefaultWeightOnlyQuantConfig(
                block_size=32, is_symmetric=True, accuracy_level=4))
            quantizer.process()
            return quantizer.model.model
        raise ValueError(f"quantization must be none, int8 or int4, got {quantization!r}")
    finally:
        logging.getLogger().setLevel(quiet)
