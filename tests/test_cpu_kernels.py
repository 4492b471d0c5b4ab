"""Our ONNX Runtime kernels (runtime/backends/cpu_kernels): MatMulBlocks8 in place of MatMulNBits.

Oracles: ONNX Runtime's own MatMulNBits at accuracy level 4 on the same graph (the op it stands in
for), and the method written out in numpy (A quantized per block of 32 to int8 by hand, the integer
dots exact in float64). Both of the kernel's paths run: AVX-512 VNNI (where the CPU has it) and plain C
(TRT_LLM_CPU_KERNELS=c). An engine with the kernels swapped in scores a text like the same engine on
MatMulNBits (the arithmetic is the same up to float summation order).
"""

from __future__ import annotations

import io
import tarfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from trt_llm.common.cli_args import FlagError
from trt_llm.runtime.backends import cpu_kernels
from trt_llm.runtime.backends.cpu_kernels import headers, library, rewrite


PATHS = ["c"] + (["1"] if cpu_kernels.cpu_supported() else [])


def matmul_nbits(K, N, bits, weights, scales, accuracy_level=4, zero_points=None, name="m", block_size=32):
    inputs = ["A", "B", "S"] + (["Z"] if zero_points is not None else [])
    node = helper.make_node("MatMulNBits", inputs, ["Y"], domain="com.microsoft", K=K, N=N, bits=bits,
                            block_size=block_size, accuracy_level=accuracy_level)
    weights = weights.reshape(N, -(-K // block_size), -1)  # MatMulNBits' [N, blocks, bytes]: the same bytes
    initializers = [numpy_helper.from_array(weights, "B"), numpy_helper.from_array(scales, "S")]
    if zero_points is not None:
        initializers.append(numpy_helper.from_array(zero_points, "Z"))
    graph = helper.make_graph([node], name, [helper.make_tensor_value_info("A", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])


def run(model: onnx.ModelProto | bytes, a: np.ndarray, options=None) -> np.ndarray:
    options = options or ort.SessionOptions()
    options.intra_op_num_threads = 2
    graph = model if isinstance(model, bytes) else model.SerializeToString()
    return ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"]).run(None, {"A": a})[0]


def with_kernel(model: onnx.ModelProto, a: np.ndarray, tmp_path) -> np.ndarray:
    options = ort.SessionOptions()
    graph = cpu_kernels.adopt(model.SerializeToString(), options, tmp_path)
    assert isinstance(graph, bytes) and b"MatMulBlocks8" in graph
    return run(graph, a, options)


def by_hand(a: np.ndarray, weights: np.ndarray, scales: np.ndarray, bits: int) -> np.ndarray:
    """The method in numpy: A per block of 32 to int8 (max|a| / 127, nearest, ties to even), the
    weights' unsigned values less their zero point (8 or 128), the integer dots exact."""
    rows = a.reshape(-1, a.shape[-1]).astype(np.float32)
    m, k = rows.shape
    blocks = rows.reshape(m, k // 32, 32)
    d_a = np.abs(blocks).max(axis=2) / np.float32(127)
    inverse = np.where(d_a > 0, np.float32(1) / np.where(d_a > 0, d_a, 1), 0).astype(np.float32)
    q_a = np.rint(blocks * inverse[..., None]).astype(np.int64)
    n = weights.shape[0]
    if bits == 4:
        q_w = np.stack([weights & 0x0F, weights >> 4], axis=-1).reshape(n, k // 32, 32).astype(np.int64) - 8
    else:
        q_w = weights.astype(np.int64) - 128
    dots = np.einsum("mbj,nbj->mnb", q_a, q_w).astype(np.float64)
    out = np.einsum("mnb,mb,nb->mn", dots, d_a.astype(np.float64), scales.reshape(n, -1).astype(np.float64))
    return out.reshape(*a.shape[:-1], n)


def dequantized(weights: np.ndarray, scales: np.ndarray, bits: int) -> np.ndarray:
    n = weights.shape[0]
    if bits == 4:
        q = np.stack([weights & 0x0F, weights >> 4], axis=-1).reshape(n, -1).astype(np.float64) - 8
    else:
        q = weights.reshape(n, -1).astype(np.float64) - 128
    return q * np.repeat(scales.reshape(n, -1), 32, axis=1)


SHAPES = {32: [(64, 24), (96, 8), (576, 960), (1536, 576), (64, 40)],  # N % 16 = 8: a last unit of one group
          128: [(128, 24), (256, 40), (1536, 576), (576, 24)]}  # 576: the last block of 128 padded


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("scales_kind,group", [("fp16", 32), ("fp32", 32), ("fp32", 128)])
def test_the_kernel_computes_what_matmul_nbits_does(built, path, bits, scales_kind, group, monkeypatch, tmp_path):
    """Blocks of 32 (a GGUF's): the activations round as MatMulNBits' at level 4 do, so the two agree to the
    summation order. Blocks of 128 (int4's default): ours round per 32, MatMulNBits' per 128: the method by
    hand is the oracle, and both stay as close to the float matmul."""
    monkeypatch.setenv(cpu_kernels.ENV, path)
    rng = np.random.default_rng(bits)
    for K, N in SHAPES[group]:
        groups = -(-K // group)  # MatMulNBits pads a row to whole blocks
        padded = rng.integers(0, 256, (N, groups * group // 32, 16 if bits == 4 else 32), dtype=np.uint8)
        scales = rng.uniform(0.001, 0.05, N * groups).astype(np.float32)
        if scales_kind == "fp16":  # a GGUF's: every scale exactly an fp16, packed as one
            scales = scales.astype(np.float16).astype(np.float32)
        model = matmul_nbits(K, N, bits, padded, scales, block_size=group)
        weights = padded[:, :K // 32]
        per_32 = np.repeat(scales.reshape(N, -1), group // 32, axis=1)[:, :K // 32]
        for shape in [(1, K), (3, K), (2, 5, K), (70, K)]:
            a = rng.standard_normal(shape).astype(np.float32)
            a[..., 5] *= 20  # an outlier channel, as real activations have
            got = with_kernel(model, a, tmp_path)
            scale = np.abs(got).max()
            assert got.shape == (*shape[:-1], N)
            np.testing.assert_allclose(got, by_hand(a, weights, per_32, bits), rtol=0, atol=2e-6 * scale)
            if group == 32:
                np.testing.assert_allclose(got, run(model, a), rtol=0, atol=2e-6 * scale, err_msg=f"{K}x{N} {shape}")
            else:
                exact = a @ dequantized(weights, per_32, bits).T
                assert np.abs(got - exact).mean() <= 1.1 * np.abs(run(model, a) - exact).mean()


@pytest.mark.parametrize("bits,scales_kind", [(4, "fp16"), (4, "fp32"), (8, "fp16"), (8, "fp32")])
def test_a_rows_bits_are_its_own_at_every_pass_width(built, bits, scales_kind, monkeypatch, tmp_path):
    """A pass of M rows runs in register tiles of 4, 3 and 2 rows (a single row on the decode path): every
    row's output has the bits it has alone, whichever tile took it, at every width from 1 to 13, on a
    matrix whose last unit has one group of 8 columns. Prompt lookup's exactness on int4 rests on it."""
    monkeypatch.setenv(cpu_kernels.ENV, PATHS[-1])
    rng = np.random.default_rng(13)
    K, N = 576, 968
    weights = rng.integers(0, 256, (N, K // 32, 16 if bits == 4 else 32), dtype=np.uint8)
    scales = rng.uniform(0.001, 0.05, N * K // 32).astype(np.float32)
    if scales_kind == "fp16":
        scales = scales.astype(np.float16).astype(np.float32)
    model = matmul_nbits(K, N, bits, weights, scales)
    a = rng.standard_normal((13, K)).astype(np.float32)
    alone = np.concatenate([with_kernel(model, a[i:i + 1], tmp_path) for i in range(13)])
    np.testing.assert_allclose(alone, run(model, a), rtol=0, atol=2e-6 * np.abs(alone).max())
    for width in range(2, 14):
        assert np.array_equal(with_kernel(model, a[:width], tmp_path), alone[:width]), f"{width} rows"


def test_fp16_scales_are_stored_as_fp16_and_read_on_either_kernel(built, monkeypatch, tmp_path):
    """The build stores a 4-bit matmul's scales as fp16 where every one is an fp16 (a GGUF's), widened by a
    Cast, and an 8-bit matmul's (the tied head's) as they were; as the engine opens, our kernel reads the
    fp16 tensor and the Cast goes, and where MatMulNBits runs (TRT_LLM_CPU_KERNELS=0) the Cast is folded:
    both give what the float32 scales gave."""
    from trt_llm.build import cpu_backend

    rng = np.random.default_rng(16)
    K, N = 576, 96
    weights4 = rng.integers(0, 256, (N, K // 32, 16), dtype=np.uint8)
    weights8 = rng.integers(0, 256, (N, K // 32, 32), dtype=np.uint8)
    scales = rng.uniform(0.001, 0.05, N * K // 32).astype(np.float16).astype(np.float32)
    four, eight = matmul_nbits(K, N, 4, weights4, scales, name="four"), matmul_nbits(K, N, 8, weights8, scales, name="eight")
    graph = four.graph  # Y = four(A) + eight(A)
    graph.node[0].output[0] = "Y4"
    graph.node.extend([helper.make_node("MatMulNBits", ["A", "eight.B", "eight.S"], ["Y8"], domain="com.microsoft",
                                        K=K, N=N, bits=8, block_size=32, accuracy_level=4),
                       helper.make_node("Add", ["Y4", "Y8"], ["Y"])])
    for tensor in eight.graph.initializer:
        tensor.name = "eight." + tensor.name
        graph.initializer.append(tensor)
    path = tmp_path / "model.cpu.opt.onnx"
    onnx.save_model(four, str(path), save_as_external_data=True, location="weights.bin", size_threshold=0)
    a = rng.standard_normal((3, K)).astype(np.float32)
    expected = run(onnx.load(str(path)), a)

    cpu_backend.own_weights(path)
    stored = onnx.load(str(path), load_external_data=False)
    kinds = {t.name: t.data_type for t in stored.graph.initializer}
    assert kinds["S" + cpu_backend.HALF_SCALES_SUFFIX] == TensorProto.FLOAT16 and kinds["eight.S"] == TensorProto.FLOAT
    assert [n.op_type for n in stored.graph.node] == ["Cast", "MatMulNBits", "MatMulNBits", "Add"]
    for mode in PATHS + ["0"]:
        monkeypatch.setenv(cpu_kernels.ENV, mode)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # as ort_engine loads an engine
        adopted = cpu_kernels.adopt(path, options, tmp_path)
        if mode != "0":
            assert b"Cast" not in adopted and b"MatMulBlocks8" in adopted
        else:
            assert adopted == path and options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.intra_op_num_threads = 2
        session = ort.InferenceSession(str(adopted) if mode == "0" else adopted, options, providers=["CPUExecutionProvider"])
        got = session.run(None, {"A": a})[0]
        np.testing.assert_allclose(got, expected, rtol=0, atol=2e-6 * np.abs(expected).max(), err_msg=mode)


def with_offsets(model: onnx.ModelProto, offsets: np.ndarray) -> onnx.ModelProto:
    """`model` (one MatMulNBits) plus a Q4_1 file's offsets as plugins/weight_only_matmul.py lowers them:
    Y = MatMulNBits(A) + ReduceSum(Reshape(A, [..., K/O, O]), -1) @ offsets."""
    group = model.graph.node[0].attribute
    K = next(a.i for a in group if a.name == "K")
    o = K // offsets.shape[0]
    model.graph.node[0].output[0] = "blocks_product"
    n = helper.make_node
    model.graph.node.extend([
        n("Shape", ["A"], ["leading"], start=0, end=-1),
        n("Concat", ["leading", "last", "group"], ["block_shape"], axis=0),
        n("Reshape", ["A", "block_shape"], ["x_blocks"]),
        n("ReduceSum", ["x_blocks", "last"], ["block_sums"], keepdims=0),
        n("MatMul", ["block_sums", "offsets"], ["offsets_product"]),
        n("Add", ["blocks_product", "offsets_product"], ["Y"]),
    ])
    model.graph.initializer.extend([numpy_helper.from_array(np.array([-1], np.int64), "last"),
                                    numpy_helper.from_array(np.array([o], np.int64), "group"),
                                    numpy_helper.from_array(offsets, "offsets")])
    return model


@pytest.mark.parametrize("path", PATHS)
def test_a_q4_1_files_offsets_are_folded_into_the_kernel(built, path, monkeypatch, tmp_path):
    """The four float nodes that add a Q4_1 file's block offsets become the kernel's fourth input: the same
    result as ONNX Runtime running them beside MatMulNBits, and a row's bits are its own in a pass of
    several rows (the MatMul's were not)."""
    monkeypatch.setenv(cpu_kernels.ENV, path)
    rng = np.random.default_rng(5)
    K, N = 576, 960
    weights = rng.integers(0, 256, (N, K // 32, 16), dtype=np.uint8)
    scales = rng.uniform(0.001, 0.05, N * K // 32).astype(np.float16).astype(np.float32)
    offsets = rng.uniform(-0.1, 0.1, (K // 32, N)).astype(np.float16).astype(np.float32)
    model = with_offsets(matmul_nbits(K, N, 4, weights, scales), offsets)
    folded = onnx.ModelProto()
    folded.CopyFrom(model)
    assert rewrite.swap_matmuls(folded) == 1
    assert [(n.op_type, len(n.input)) for n in folded.graph.node] == [(rewrite.OP, 4)]
    a = rng.standard_normal((9, K)).astype(np.float32)
    got = with_kernel(model, a, tmp_path)
    np.testing.assert_allclose(got, run(model, a), rtol=0, atol=2e-6 * np.abs(got).max())
    alone = np.concatenate([with_kernel(model, a[i:i + 1], tmp_path) for i in range(9)])
    assert np.array_equal(alone, got)


def test_the_swap_takes_only_what_the_kernel_computes():
    rng = np.random.default_rng(0)
    weights = rng.integers(0, 256, (24, 2, 16), dtype=np.uint8)
    scales = rng.uniform(0.01, 0.1, 48).astype(np.float32)

    def swapped(model):
        return rewrite.swap_matmuls(model) == 1 and model.graph.node[0].op_type == rewrite.OP

    assert swapped(matmul_nbits(64, 24, 4, weights, scales))
    assert not swapped(matmul_nbits(64, 24, 4, weights, scales, accuracy_level=1))  # the tests' fp32 level
    assert not swapped(matmul_nbits(64, 24, 4, weights, scales, zero_points=np.full(24, 0x88, np.uint8)))
    assert not swapped(matmul_nbits(64, 20, 4, weights[:20], scales[:40]))  # N not a multiple of 8
    assert not swapped(matmul_nbits(64, 24, 4, weights, np.repeat(scales, 2), block_size=16))  # blocks below 32
    assert swapped(matmul_nbits(64, 24, 4, weights, scales[:24], block_size=64))  # int4's default blocks are 128
    model = matmul_nbits(64, 24, 4, weights, scales)
    rewrite.swap_matmuls(model)
    node = model.graph.node[0]
    assert node.domain == rewrite.DOMAIN and list(node.input) == ["A", "B", "S"]
    assert sorted(a.name for a in node.attribute) == ["K", "N", "bits", "block_size"]
    assert any(o.domain == rewrite.DOMAIN for o in model.opset_import)


def test_no_library_leaves_the_graph_to_onnx_runtime_unless_asked(monkeypatch, tmp_path):
    monkeypatch.setenv(library.CACHE_ENV, str(tmp_path / "empty"))  # no header here, and no download
    model = matmul_nbits(64, 24, 4, np.zeros((24, 2, 16), np.uint8), np.ones(48, np.float32)).SerializeToString()
    monkeypatch.setenv(cpu_kernels.ENV, "auto")
    assert cpu_kernels.adopt(model, ort.SessionOptions(), tmp_path) is model
    monkeypatch.setenv(cpu_kernels.ENV, "0")
    assert cpu_kernels.library_path() is None
    monkeypatch.setenv(cpu_kernels.ENV, "1")
    with pytest.raises(FlagError, match="TRT_LLM_CPU_KERNELS=1: .*onnxruntime_c_api.h is not there"):
        cpu_kernels.adopt(model, ort.SessionOptions(), tmp_path)
    monkeypatch.setenv(cpu_kernels.ENV, "yes")
    with pytest.raises(FlagError, match="TRT_LLM_CPU_KERNELS must be auto, 0, 1 or c"):
        cpu_kernels.mode()


def deb(files: dict[str, bytes]) -> bytes:
    """A .deb as Debian writes one: an ar archive of debian-binary, control and data tars."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:xz") as archive:
        for name, body in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            archive.addfile(info, io.BytesIO(body))
    out = b"!<arch>\n"
    for name, body in (("debian-binary", b"2.0\n"), ("control.tar.xz", b"x" * 7), ("data.tar.xz", data.getvalue())):
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(body):<10}`\n".encode() + body + b"\n" * (len(body) % 2)
    return out


def test_the_header_is_taken_from_the_package_only_with_its_digest(monkeypatch, tmp_path):
    header = b"/* ONNX Runtime C API */\n"
    package = deb({"./usr/include/onnxruntime/onnxruntime_c_api.h": header, "./usr/include/onnxruntime/other.h": b"-"})
    assert headers._member(package, headers.HEADER) == header

    class Response(io.BytesIO):
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    import hashlib

    monkeypatch.setattr(headers.urllib.request, "urlopen", lambda url, timeout: Response(package))
    monkeypatch.setattr(headers, "PACKAGES", (("http://deb.example/bad.deb", "0" * 64),))
    with pytest.raises(headers.HeaderUnavailable, match="sha256 is not the recorded one"):
        headers.header(tmp_path)
    assert not (tmp_path / headers.HEADER).exists()
    monkeypatch.setattr(headers, "PACKAGES", (("http://deb.example/good.deb", hashlib.sha256(package).hexdigest()),))
    assert headers.header(tmp_path).read_bytes() == header
    assert [p.name for p in tmp_path.iterdir()] == [headers.HEADER]  # written whole, nothing left beside it


def test_an_int4_engine_scores_a_text_alike_on_either_kernel(built, tiny_model, build_engine_for, monkeypatch):
    """The tiny Llama built int4 (blocks of 32, as a Q4_0 file's): its log-probabilities on a text with
    our kernels and on MatMulNBits agree to the summation order's noise, and every top-1 token agrees."""
    from trt_llm.runtime.app.evaluate import chunk_log_softmax, open_model
    from trt_llm.runtime.backends import ort_engine
    from trt_llm.runtime.engine_dir import EngineDir

    engine = EngineDir.open(build_engine_for(tiny_model("llama"), quantization={"weights": "int4", "group_size": 32}))
    graph = onnx.load(engine.component_path("llm", "engine"), load_external_data=False)
    assert rewrite.swap_matmuls(graph) == 2 * 4 + 1  # per layer qkv, o, gate_up, down; the LM head
    chunk = list(np.random.default_rng(0).integers(0, 200, 48))
    opened = []  # each session's graph: ours swapped in (bytes) or the engine's file as it is (a path)
    session = ort_engine._session
    monkeypatch.setattr(ort_engine, "_session", lambda graph, options: (opened.append(graph), session(graph, options))[1])
    scores = {}
    for setting in ("0", "1"):
        monkeypatch.setenv(cpu_kernels.ENV, setting)
        model = open_model(engine, threads=2)
        assert isinstance(model.engine, ort_engine.OrtEngine)
        swapped = isinstance(opened[-1], bytes) and onnx.load_from_string(opened[-1]).graph.node
        assert [n.op_type for n in swapped or []].count(rewrite.OP) == (9 if setting == "1" else 0)
        scores[setting] = chunk_log_softmax(model, chunk)
    assert np.abs(scores["1"] - scores["0"]).max() < 1e-3
    assert (scores["1"].argmax(-1) == scores["0"].argmax(-1)).all()




@pytest.mark.parametrize("setting, message", [
    ("yes", "TRT_LLM_CPU_KERNELS must be auto, 0, 1 or c, got 'yes'"),
    ("1", "TRT_LLM_CPU_KERNELS=1: "),  # the empty cache below: no header, no library
])
def test_a_kernel_setting_the_run_cannot_use_is_one_line_not_a_damaged_engine(
        tiny_model, build_engine_for, monkeypatch, tmp_path, caplog, setting, message):
    from test_nothing_lost import error_lines, good_input

    from trt_llm.runtime.app.run_cli import main as run_main

    engine = build_engine_for(tiny_model("llama"), quantization={"weights": "int4", "group_size": 32})
    monkeypatch.setenv(library.CACHE_ENV, str(tmp_path / "empty"))
    monkeypatch.setenv(cpu_kernels.ENV, setting)
    out = tmp_path / "out.json"
    assert run_main([str(good_input(tmp_path)), "--engine-dir", str(engine), "-o", str(out), "--threads", "1"]) != 0
    errors = error_lines(caplog)
    assert len(errors) == 1 and message in errors[0] and "damaged" not in errors[0], errors
