"""Our attention kernel (runtime/backends/cpu_kernels/attention.c): CachedAttention in place of the
GroupQueryAttention that plugins/attention.lower_for_onnxruntime writes.

Oracles: ONNX Runtime's GroupQueryAttention on the same graph (the op it stands in for: outputs and caches
to float rounding, zeros at padded tokens), and the kernel itself one token at a time (a token's output
has the same bits alone in a decode step, in a pass of several tokens and beside other rows, which
GroupQueryAttention does not give). Both of the kernel's paths run: AVX-512 and plain C
(TRT_LLM_CPU_KERNELS=c). End to end: prompt lookup on SmolLM2's Q4_1 file built int4 emits vanilla's
tokens exactly (the int8 activations turned GroupQueryAttention's last-bit differences into other tokens).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from kernel_sessions import kernel_session
from trt_llm.runtime.backends import cpu_kernels
from trt_llm.runtime.backends.cpu_kernels import rewrite

PATHS = ["c"] + (["1"] if cpu_kernels.cpu_supported() else [])


def gqa_model(hq, hkv, d, capacity, rotary, window=-1, softcap=0.0, bias=False, dtype=TensorProto.FLOAT,
              **extra) -> onnx.ModelProto:
    """One GroupQueryAttention node with the inputs our lowering gives it (packed qkv, the cache, seqlens_k,
    the capacity as total length, rotary tables and positions, a tree's bias, the query lengths)."""
    v = helper.make_tensor_value_info
    inputs = [v("qkv", dtype, ["B", "S", (hq + 2 * hkv) * d]), v("past_key", dtype, ["B", hkv, capacity, d]),
              v("past_value", dtype, ["B", hkv, capacity, d]), v("seqlens_k", TensorProto.INT32, ["B"]),
              v("total", TensorProto.INT32, []), v("cos", dtype, ["P", rotary // 2]), v("sin", dtype, ["P", rotary // 2]),
              v("positions", TensorProto.INT64, ["B", "S"]), v("query_lengths", TensorProto.INT32, ["B"])]
    if bias:
        inputs.append(v("bias", dtype, ["B", 1, "S", capacity]))
    node = helper.make_node(
        "GroupQueryAttention",
        ["qkv", "", "", "past_key", "past_value", "seqlens_k", "total", "cos", "sin", "positions",
         "bias" if bias else "", "", "", "", "", "", "query_lengths"],
        ["out", "present_key", "present_value"], domain="com.microsoft", num_heads=hq, kv_num_heads=hkv,
        scale=d ** -0.5, local_window_size=window, softcap=softcap, do_rotary=1, rotary_interleaved=0, **extra)
    outputs = [v("out", dtype, None), v("present_key", dtype, None), v("present_value", dtype, None)]
    graph = helper.make_graph([node], "attention", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])


def session(model: onnx.ModelProto, ours: bool, tmp_path, threads: int = 2) -> ort.InferenceSession:
    return kernel_session(model, tmp_path, rewrite.ATTENTION_OP if ours else None, threads)


def feeds(rng, hq, hkv, d, capacity, rotary, past, new, width, bias=None) -> dict:
    angles = np.arange(2 * capacity)[:, None] * 10000.0 ** (-np.arange(rotary // 2) / (rotary // 2))
    batch = len(past)
    f = {"qkv": rng.standard_normal((batch, width, (hq + 2 * hkv) * d), dtype=np.float32),
         "past_key": rng.standard_normal((batch, hkv, capacity, d), dtype=np.float32),
         "past_value": rng.standard_normal((batch, hkv, capacity, d), dtype=np.float32),
         "seqlens_k": (np.array(past) + np.array(new) - 1).astype(np.int32), "total": np.array(capacity, np.int32),
         "cos": np.cos(angles).astype(np.float32), "sin": np.sin(angles).astype(np.float32),
         "positions": (np.array(past)[:, None] + np.arange(width)[None] + 5).astype(np.int64),
         "query_lengths": np.array(new, np.int32)}
    if bias is not None:
        f["bias"] = bias
    return f


CASES = {  # (heads, kv heads, head size, rotated dims, window, softcap, past per row, new per row, pass width)
    "prefill": (9, 3, 64, 64, -1, 0.0, [0], [7], 7),
    "decode": (9, 3, 64, 64, -1, 0.0, [37], [1], 1),
    "ragged, a padded and an idle row": (9, 3, 64, 64, -1, 0.0, [37, 0, 100], [5, 3, 0], 5),
    "ragged, few heads (tokens grouped)": (4, 2, 64, 64, -1, 0.0, [20, 3], [7, 2], 7),
    "head size 128, partial rotary": (4, 2, 128, 64, -1, 0.0, [20, 9], [4, 4], 4),
    "sliding window": (8, 1, 256, 256, 16, 0.0, [40], [6], 6),
    "soft-cap": (4, 4, 32, 32, -1, 50.0, [10], [3], 3),
    "head size 48 (the C loop), window": (4, 2, 48, 32, 8, 0.0, [30], [4], 4),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", list(CASES))
def test_the_kernel_computes_what_group_query_attention_does(built, path, case, monkeypatch, tmp_path):
    monkeypatch.setenv(cpu_kernels.ENV, path)
    hq, hkv, d, rotary, window, softcap, past, new, width = CASES[case]
    model = gqa_model(hq, hkv, d, 128, rotary, window, softcap)
    f = feeds(np.random.default_rng(1), hq, hkv, d, 128, rotary, past, new, width)
    theirs = session(model, False, tmp_path).run(None, f)
    ours = session(model, True, tmp_path).run(None, f)
    valid = np.arange(width)[None] < np.array(new)[:, None]
    assert np.abs(np.where(valid[..., None], theirs[0], 0) - ours[0]).max() < 2e-6
    assert (ours[0][~valid] == 0).all()  # padded tokens: zeros, as our op's contract says
    for b, (p, n) in enumerate(zip(past, new)):  # the caches up to each row's end (the new keys rotated)
        assert np.abs(theirs[1][b, :, :p + n] - ours[1][b, :, :p + n]).max() < 1e-6
        assert np.array_equal(theirs[2][b, :, :p + n], ours[2][b, :, :p + n])


@pytest.mark.parametrize("path", PATHS)
def test_a_tree_bias_hides_what_group_query_attention_hides(built, path, monkeypatch, tmp_path):
    """An EAGLE tree's attention_bias (0 or -inf per key slot): token 2 does not see token 1."""
    monkeypatch.setenv(cpu_kernels.ENV, path)
    bias = np.zeros((1, 1, 4, 64), np.float32)
    bias[0, 0, 2, 11] = -np.inf
    bias[0, 0, :, 14:] = -np.inf
    model = gqa_model(9, 3, 64, 64, 64, bias=True)
    f = feeds(np.random.default_rng(2), 9, 3, 64, 64, 64, [10], [4], 4, bias)
    theirs, ours = session(model, False, tmp_path).run(None, f), session(model, True, tmp_path).run(None, f)
    assert np.abs(theirs[0] - ours[0]).max() < 2e-6


def in_place(s: ort.InferenceSession, f: dict, keys: ort.OrtValue, values: ort.OrtValue) -> np.ndarray:
    """A run with the cache bound as past and present at once, as the runtime binds it."""
    binding = s.io_binding()
    binding.bind_output("out")  # (first: copy_outputs_to_cpu lists the outputs in the order they were bound)
    for name, value in f.items():
        if name not in ("past_key", "past_value"):
            binding.bind_cpu_input(name, value)
    binding.bind_ortvalue_input("past_key", keys)
    binding.bind_ortvalue_input("past_value", values)
    binding.bind_ortvalue_output("present_key", keys)
    binding.bind_ortvalue_output("present_value", values)
    s.run_with_iobinding(binding)
    return binding.copy_outputs_to_cpu()[0]


@pytest.mark.parametrize("path", PATHS)
def test_a_token_has_the_same_bits_alone_in_a_pass_or_beside_other_rows(built, path, monkeypatch, tmp_path):
    """Nine tokens after 600 cached ones: one at a time (decode steps) and in one pass (a verification),
    alone and as row 1 of a batch of 2, in place; the outputs and the caches are bit for bit the same.
    GroupQueryAttention's differ (the oracle that this test can fail: it is run the same way)."""
    monkeypatch.setenv(cpu_kernels.ENV, path)
    hq, hkv, d, capacity, past, k = 9, 3, 64, 1024, 600, 9
    model = gqa_model(hq, hkv, d, capacity, d)
    f = feeds(np.random.default_rng(3), hq, hkv, d, capacity, d, [past], [k], k)

    def outputs(s):
        # (an OrtValue made from numpy does not keep the array alive: these do)
        held = [f[name].copy() for name in ("past_key", "past_value", "past_key", "past_value")]
        keys, values, keys_s, values_s = (ort.OrtValue.ortvalue_from_numpy(a) for a in held)
        wide = in_place(s, f, keys, values)[0]
        steps = np.stack([in_place(s, dict(f, qkv=f["qkv"][:, i:i + 1], seqlens_k=np.array([past + i], np.int32),
                                           positions=f["positions"][:, i:i + 1], query_lengths=np.array([1], np.int32)),
                                   keys_s, values_s)[0, 0] for i in range(k)])
        return wide, steps, held[0], held[2]

    wide, steps, keys, keys_s = outputs(session(model, True, tmp_path))
    assert np.array_equal(wide, steps) and np.array_equal(keys, keys_s)
    other = feeds(np.random.default_rng(4), hq, hkv, d, capacity, d, [200], [3], k)
    pair = {n: np.concatenate([other[n], f[n]]) if n not in ("total", "cos", "sin") else f[n] for n in f}
    beside = session(model, True, tmp_path).run(None, pair)[0][1]
    assert np.array_equal(beside, wide)
    wide_gqa, steps_gqa, _, _ = outputs(session(model, False, tmp_path))
    assert not np.array_equal(wide_gqa, steps_gqa)


@pytest.mark.parametrize("path", PATHS)
def test_a_token_has_the_same_bits_however_the_call_is_cut_for_the_threads(built, path, monkeypatch, tmp_path):
    """A decode row, a 9-token pass and a 3-token one (the kernel takes the rows by new tokens, most first), in
    sessions of 1, 2, 16 and 64 threads: the kernel cuts the call into units for them (a kv head's three query
    heads in one unit or a unit each, a row's tokens in 1 to 9 groups), and every output has the same bits.
    GroupQueryAttention's within 2e-6."""
    monkeypatch.setenv(cpu_kernels.ENV, path)
    hq, hkv, d, capacity, new = 9, 3, 64, 1024, [1, 9, 3]
    model = gqa_model(hq, hkv, d, capacity, d)
    f = feeds(np.random.default_rng(6), hq, hkv, d, capacity, d, [300, 600, 50], new, 9)
    outputs = [session(model, True, tmp_path, threads).run(None, f)[0] for threads in (1, 2, 16, 64)]
    assert all(np.array_equal(outputs[0], other) for other in outputs[1:])
    theirs = session(model, False, tmp_path).run(None, f)[0]
    valid = np.arange(9)[None, :, None] < np.array(new)[:, None, None]
    assert np.abs(np.where(valid, theirs, 0) - outputs[0]).max() < 2e-6


@pytest.mark.parametrize("path", PATHS)
def test_a_long_prefill_has_the_bits_of_its_chunks(built, path, monkeypatch, tmp_path):
    """600 tokens on an empty cache in one pass, where the kernel cuts the tokens into more groups to keep
    each unit's scores near L2 (attention.c's UNIT_SCORES), and in two chunks of 300 (chunked prefill), cut
    into fewer: every token's output has the same bits, and is GroupQueryAttention's within 2e-6."""
    monkeypatch.setenv(cpu_kernels.ENV, path)
    hq, hkv, d, capacity, n = 9, 3, 64, 640, 600
    model = gqa_model(hq, hkv, d, capacity, d)
    f = feeds(np.random.default_rng(5), hq, hkv, d, capacity, d, [0], [n], n)
    ours = session(model, True, tmp_path)
    held = [f[name].copy() for name in ("past_key", "past_value", "past_key", "past_value")]
    keys, values, keys_c, values_c = (ort.OrtValue.ortvalue_from_numpy(a) for a in held)
    whole = in_place(ours, f, keys, values)[0]
    half = n // 2
    chunk = {i: dict(f, qkv=f["qkv"][:, i:i + half], seqlens_k=np.array([i + half - 1], np.int32),
                     positions=f["positions"][:, i:i + half], query_lengths=np.array([half], np.int32))
             for i in (0, half)}
    chunks = np.concatenate([in_place(ours, chunk[i], keys_c, values_c)[0] for i in (0, half)])
    assert np.array_equal(whole, chunks) and np.array_equal(held[0], held[2])
    theirs = session(model, False, tmp_path).run(None, f)[0][0]
    assert np.abs(theirs - whole).max() < 2e-6


def test_the_swap_takes_only_what_the_kernel_computes():
    def swapped(model):
        return rewrite.swap_attention(model)

    model = gqa_model(9, 3, 64, 128, 64, bias=True)
    assert swapped(model) == 1
    node = model.graph.node[0]
    assert (node.domain, node.op_type) == (rewrite.DOMAIN, rewrite.ATTENTION_OP)
    assert list(node.input) == ["qkv", "past_key", "past_value", "seqlens_k", "cos", "sin", "positions",
                                "query_lengths", "bias"]
    assert sorted(a.name for a in node.attribute) == ["kv_num_heads", "local_window_size", "num_heads", "scale",
                                                      "softcap"]
    threaded = gqa_model(9, 3, 64, 128, 64)
    assert rewrite.swap_attention(threaded, threads=4) == 1  # (a session's threads, which the kernel cuts its work for)
    assert next(a.i for a in threaded.graph.node[0].attribute if a.name == "threads") == 4
    assert swapped(gqa_model(9, 3, 64, 128, 64)) == 1  # no tree: no bias input
    assert swapped(gqa_model(9, 3, 64, 128, 64, dtype=TensorProto.FLOAT16)) == 0  # an fp16 graph
    interleaved = gqa_model(9, 3, 64, 128, 64)
    next(a for a in interleaved.graph.node[0].attribute if a.name == "rotary_interleaved").i = 1
    assert swapped(interleaved) == 0
    assert swapped(gqa_model(9, 3, 64, 128, 64, smooth_softmax=1)) == 0  # an attribute it does not compute


def test_int4_prompt_lookup_emits_vanillas_tokens_exactly(built, smollm2_dir, build_engine_for, monkeypatch):
    """SmolLM2 built int4 (blocks of 32, no zero points: every matmul MatMulBlocks8's), our kernels on:
    prompt lookup over copying requests and a free one, continuous, emits vanilla's tokens, and took
    proposals. (On GroupQueryAttention 2 of these 3 answers parted from vanilla's.)"""
    from test_prompt_lookup import COPYING, FREE, run

    from trt_llm.runtime.decoding.pass_cost import PassCost

    monkeypatch.setenv(cpu_kernels.ENV, PATHS[-1])
    monkeypatch.setattr(PassCost, "slope", lambda self, batch: 0.1)  # (as test_prompt_lookup pins it)
    engine = build_engine_for(smollm2_dir, max_input_len=1024, max_kv_cache_capacity=2048,
                              quantization={"weights": "int4", "group_size": 32})
    requests = COPYING + [FREE]
    vanilla, _ = run(engine, requests, "none", max_generate_length=64)
    looked, runner = run(engine, requests, "prompt-lookup", scheduling="continuous", max_generate_length=64)
    assert [r.output_token_ids for r in looked] == [r.output_token_ids for r in vanilla]
    assert runner.lookup_stats.accepted > 20
