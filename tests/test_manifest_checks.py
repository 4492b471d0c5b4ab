"""Every hand-edited manifest is one line before any session starts (issue 47 item 5): a manifest whose
keys are well typed but no longer describe the engine (layers cut, a window or a layer kind the
graph lacks, another geometry, limits raised past the build) is refused by trt-llm-run in one line
naming the key, exit status 2, no output written; never ONNX Runtime's error from a batch. The
graph's inputs are read from its file without the onnx package (runtime/onnx_inputs.py), checked
here against onnx's own reading."""

import json
import shutil
import subprocess
import sys

import pytest

from trt_llm.runtime.engine_dir import EngineDir, EngineDirError
from trt_llm.runtime.onnx_inputs import graph_inputs

REQUESTS = {"max_generate_length": 4, "requests": [{"messages": [{"role": "user", "content": "Hello there"}]},
                                                   {"messages": [{"role": "user", "content": "And again"}]}]}


@pytest.fixture(scope="module")
def engine(tiny_model, build_engine_for):
    return build_engine_for(tiny_model("qwen3"))  # the session's shared tiny engine


def sliding(m):
    m["model"]["layers"][0].update(kind="sliding", window=4)


def recurrent(m):
    m["model"]["layers"][1] = {"kind": "recurrent", "states": [{"name": "conv", "shape": [64, 3]}]}


def cut(m):
    m["model"]["layers"] = m["model"]["layers"][:1]
    m["model"]["dims"]["num_layers"] = 1


def cut_layers_only(m):
    m["model"]["layers"] = m["model"]["layers"][:1]


def per_layer(layers: int) -> dict:
    """Gemma 4's model.per_layer_inputs, on an engine without one."""
    return {"layers": layers, "width": 8, "vocab_size": 100, "scale": 2.0}


CASES = {
    "cut_layers": (cut, "model.layers: 1 layers, the graph has 2"),
    "cut_layers_only": (cut_layers_only, "model.dims.num_layers: 2, but model.layers has 1 layers"),
    "window_the_graph_lacks": (sliding, "model.layers[0].window: 4, a window the graph does not have"),
    "another_kind": (recurrent, "model.layers[1]: kind 'recurrent', the graph's layer 1 is attention"),
    "kv_heads": (lambda m: m["model"]["layers"][0].update(kv_heads=4), "model.layers[0].kv_heads: 4, the graph's "
                                                                         "past_key_0 has 2"),
    "head_dim": (lambda m: m["model"]["layers"][1].update(head_dim=8), "model.layers[1].head_dim: 8"),
    "hidden_size": (lambda m: m["model"]["dims"].update(hidden_size=128), "model.dims.hidden_size: 128"),
    "a_reader_the_graph_has_a_cache_for": (lambda m: m["model"]["layers"][1].update(kv_source=0),
                                           "model.layers: 1 layers with a cache, the graph has 2"),
    "kv_source_not_earlier": (lambda m: m["model"]["layers"][1].update(kv_source=1),
                              "model.layers[1].kv_source: 1, not an earlier layer"),
    "per_layer_table_missing": (lambda m: m["model"].update(per_layer_inputs=per_layer(2)),
                                "components.llm.per_layer_embedding: missing, which model.per_layer_inputs calls for"),
    "per_layer_layers": (lambda m: (m["model"].update(per_layer_inputs=per_layer(3)),
                                    m["components"]["llm"].update(per_layer_embedding="llm/embedding.safetensors")),
                         "model.per_layer_inputs.layers: 3, but model.layers has 2 layers"),
    "per_layer_input_the_graph_lacks": (lambda m: (m["model"].update(per_layer_inputs=per_layer(2)),
                                                   m["components"]["llm"].update(
                                                       per_layer_embedding="llm/embedding.safetensors")),
                                        "the graph has no input 'per_layer_inputs'"),
    "raised_capacity": (lambda m: m["limits"].update(max_kv_cache_capacity=4096),
                        "limits.max_kv_cache_capacity: 4096, but the engine was built for 512"),
    "raised_input_len": (lambda m: m["limits"].update(max_input_len=4096),
                         "limits.max_input_len: 4096, but the engine was built for 256"),
    "input_past_capacity": (lambda m: m["limits"].update(max_kv_cache_capacity=200),
                            "limits.max_input_len: 256 is more than limits.max_kv_cache_capacity (200)"),
}


def edited(engine, tmp_path, edit):
    copy = tmp_path / "engine"
    shutil.copytree(engine, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    edit(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


@pytest.mark.parametrize("case", CASES)
def test_a_hand_edited_manifest_is_one_line(case, engine, tmp_path):
    edit, expected = CASES[case]
    copy = edited(engine, tmp_path, edit)
    with pytest.raises(EngineDirError) as refused:
        EngineDir.open(copy)
    message = str(refused.value)
    assert expected in message and "\n" not in message and "manifest.json" in message


@pytest.mark.parametrize("case", ["window_the_graph_lacks", "raised_capacity"])
def test_trt_llm_run_refuses_it_before_any_session(case, engine, tmp_path):
    copy = edited(engine, tmp_path, CASES[case][0])
    (tmp_path / "in.json").write_text(json.dumps(REQUESTS))
    out = tmp_path / "out.json"
    result = subprocess.run([sys.executable, "-m", "trt_llm.runtime.app.run_cli", str(tmp_path / "in.json"),
                             "--engine-dir", str(copy), "-o", str(out), "--threads", "1"],
                            capture_output=True, text=True, timeout=300)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert CASES[case][1] in lines[0] and "onnxruntime" not in result.stderr.lower()
    assert not out.exists()


def test_the_untouched_engine_opens(engine):
    EngineDir.open(engine)


def test_graph_inputs_are_what_onnx_reads(engine):
    import onnx

    for name in ("model.onnx", "model.cpu.onnx"):
        model = onnx.load(str(engine / "llm" / name), load_external_data=False)
        expected = {i.name: [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                             for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
        assert graph_inputs(engine / "llm" / name) == expected
        assert list(graph_inputs(engine / "llm" / name)) == [i.name for i in model.graph.input]


def test_reordered_hybrid_layers_are_one_line(family_model, build_engine_for, tmp_path):
    """LFM2's conv and attention layers swapped in model.layers (test_hybrid's shared engine)."""
    engine = build_engine_for(family_model("lfm2"))

    def swap(m):
        layers = m["model"]["layers"]
        layers[0], layers[1] = layers[1], layers[0]

    with pytest.raises(EngineDirError, match=r"model.layers\[0\]: kind 'full', the graph's layer 0 is recurrent"):
        EngineDir.open(edited(engine, tmp_path, swap))
