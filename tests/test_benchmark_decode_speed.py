"""benchmarks/decode_speed.py runs end to end in its smoke mode and writes reports of the expected shape.

No timing is asserted: the smoke mode runs a tiny random Llama for a few tokens, one round, and skips the
peers that are not installed. Also: the HF -> F32 GGUF conversion that llama.cpp reads.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "benchmarks"
LENGTHS, BATCHES = [24, 40], [1, 2]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    # The builds (tiny model, our engine, GenAI's, the GGUF) are cached in the tests' cache like the
    # SmolLM2 conversion: about 20 s then, 40 s the first time or after a change to the builder.
    cache = Path(os.environ.get("TRT_LLM_TEST_CACHE", "~/.cache/trt-llm-tests")).expanduser() / "bench-smoke"
    out = tmp_path_factory.mktemp("bench-out")
    cmd = [sys.executable, str(BENCH / "decode_speed.py"), "--smoke", "--threads", "1", "--work-dir", str(cache),
           "--out-dir", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return json.loads((out / "decode_speed.json").read_text()), (out / "decode_speed.md").read_text(), out, done


def test_json_report(smoke):
    report, _, out, _ = smoke
    for key in ("model", "threads", "new_tokens", "rounds", "prompt_lengths", "batch_sizes", "cpu", "versions",
                "bandwidth", "engines", "results", "ratios", "engine_ratios", "targets", "token_check", "notes",
                "warnings", "total_s", "files"):
        assert key in report, key
    assert report["smoke"] and report["prompt_lengths"] == LENGTHS and report["batch_sizes"] == BATCHES
    bw = report["bandwidth"]
    assert bw["read_bytes_s"] > 0 and bw["weight_bytes_per_step"]["fp32"] > 0 and bw["limit_steps_s"]["fp32"] > 0
    floor = report["matmul_floor"]  # 4 packed matmuls a layer (qkv, o, gate_up, down) and the LM head
    assert floor["ms_per_step"] > 0 and floor["tok_s"] == pytest.approx(1000 / floor["ms_per_step"])
    assert floor["matmuls"] >= 5 and floor["matmuls"] % 4 == 1
    assert 0.5 * bw["weight_bytes_per_step"]["fp32"] < floor["weight_bytes"] < bw["weight_bytes_per_step"]["fp32"]

    engines = report["engines"]
    assert list(engines)[:3] == ["trt-llm", "transformers", "ort-genai"] or "skipped" in engines.get("ort-genai", {})
    ours = engines["trt-llm"]
    assert ours["precision"] == "fp32" and ours["build"]["seconds"] > 0 and ours["build"]["peak_rss_mb"] > 0
    ran = [name for name, e in engines.items() if "skipped" not in e]
    assert {"trt-llm", "transformers"} <= set(ran)
    for name, e in engines.items():
        if name in ran:
            assert e["peak_rss_mb"] >= e["loaded_rss_mb"] > 0, name
        else:
            assert isinstance(e["skipped"], str) and e["skipped"], name

    rows = {(r["engine"], r["prompt_len"], r["batch"]): r for r in report["results"]}
    for name in ran:
        for length in LENGTHS:
            for b in BATCHES:
                row = rows[(name, length, b)]
                if row["status"] == "n/a":  # llama.cpp's binding: one sequence at a time
                    assert b > 1 and not engines[name]["batched"] and row["reason"]
                    continue
                assert row["status"] == "ok"
                assert row["decode_tok_s_best"] >= row["decode_tok_s_median"] > 0
                assert 0 < row["ttft_ms_best"] <= row["ttft_ms_median"]
                assert row["bandwidth_limit_tok_s"] > 0 and row["gap_to_limit"] > 0 and len(row["runs"]) == 1

    ratios = {(x["peer"], x["prompt_len"], x["batch"]): x for x in report["ratios"]}
    assert set(ratios) == {(n, length, b) for n in ran if n != "trt-llm" for length in LENGTHS for b in BATCHES}
    for x in ratios.values():
        assert x["status"] == "n/a" or (x["decode_speedup"] > 0 and x["ttft_speedup"] > 0)
    assert {x["peer"] for x in report["engine_ratios"]} == set(engines) - {"trt-llm"}

    checks = {(c["engine"], c["prompt_len"], c["batch"]): c for c in report["token_check"]}
    assert set(checks) == {key for key, row in rows.items() if key[0] != "trt-llm" and row["status"] == "ok"}
    for c in checks.values():
        assert c["rows"] == c["batch"] and len(c["first_mismatch"]) == c["rows"]
    # transformers is the project's oracle: same checkpoint, same precision, same greedy tokens.
    for length in LENGTHS:
        for b in BATCHES:
            assert checks[("transformers", length, b)]["rows_matching"] == b

    for path in report["files"].values():
        assert Path(path).is_file(), path
    if importlib.util.find_spec("matplotlib") is not None:
        assert {"decode_speed", "ttft", "memory_build"} <= set(report["files"])
        assert (out / "decode_speed.png").read_bytes()[:4] == b"\x89PNG"


def test_markdown_report(smoke):
    report, text, _, done = smoke
    assert text in done.stdout  # the same Markdown is printed
    for heading in ("### Decode speed and time to first token", "### trt-llm against each peer",
                    "### Memory and build", "### Greedy tokens against trt-llm"):
        assert heading in text
    assert "**Bandwidth limit.**" in text and "gap to limit" in text and "**Matmul floor.**" in text
    table = text.split("### Decode speed and time to first token")[1].split("\n\n")[1].splitlines()
    assert len(table) == 2 + len(report["results"])  # header, rule, one line per result row (n/a included)
    for name, e in report["engines"].items():
        assert f"| {name} |" in text
        if "skipped" in e:
            assert "skipped" in text


def test_loaded_mode(tmp_path):
    """--load N: N busy processes beside every timed run, recorded in the report, gone afterwards."""
    cache = Path(os.environ.get("TRT_LLM_TEST_CACHE", "~/.cache/trt-llm-tests")).expanduser() / "bench-smoke"
    cmd = [sys.executable, str(BENCH / "decode_speed.py"), "--smoke", "--threads", "1", "--load", "1",
           "--engines", "ours", "--no-plots", "--work-dir", str(cache), "--out-dir", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    report = json.loads((tmp_path / "decode_speed.json").read_text())
    load = report["load"]
    assert load["processes"] == 1 and len(load["pids"]) == 1 and "spinner" in load["kind"]
    assert load["timed_s"] > 0 and load["cores"] > 0
    runs = [x for row in report["results"] for x in row["runs"]]
    assert len(runs) == len(LENGTHS) * len(BATCHES) and all(x["busy_load_cores"] is not None for x in runs)
    for pid in load["pids"]:  # the spinners were stopped with the benchmark
        assert not Path(f"/proc/{pid}").exists() or "while True" not in Path(f"/proc/{pid}/cmdline").read_text()
    text = (tmp_path / "decode_speed.md").read_text()
    assert "LOADED: 1 busy process beside every engine" in text and "**Loaded mode.** 1 busy process (" in text


def test_gguf_conversion(tmp_path, tiny_model):
    """The F32 GGUF holds the checkpoint's weights exactly, renamed, q/k in llama.cpp's rotary layout."""
    pytest.importorskip("gguf")
    from gguf import GGUFReader
    from safetensors.numpy import load_file

    sys.path.insert(0, str(BENCH))
    from sidebyside.gguf_convert import convert

    model = tiny_model("llama")
    config = json.loads((model / "config.json").read_text())
    path = convert(model, tmp_path / "tiny.gguf")
    reader = GGUFReader(str(path))
    tensors = {t.name: np.array(t.data) for t in reader.tensors}
    layers, heads, kv_heads = config["num_hidden_layers"], config["num_attention_heads"], config["num_key_value_heads"]
    # 9 per layer, embedding, final norm, untied LM head, Llama 3 rope factors.
    assert len(tensors) == 9 * layers + 4 and "rope_freqs.weight" in tensors
    assert all(t.tensor_type.name == "F32" for t in reader.tensors)
    hf = load_file(str(model / "model.safetensors"))
    np.testing.assert_array_equal(tensors["token_embd.weight"], hf["model.embed_tokens.weight"])
    np.testing.assert_array_equal(tensors["output.weight"], hf["lm_head.weight"])
    np.testing.assert_array_equal(tensors["blk.1.ffn_down.weight"], hf["model.layers.1.mlp.down_proj.weight"])

    def unpermute(w, n):  # llama.cpp's pair layout back to HF's halves
        return w.reshape(n, w.shape[0] // n // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    np.testing.assert_array_equal(unpermute(tensors["blk.0.attn_q.weight"], heads),
                                  hf["model.layers.0.self_attn.q_proj.weight"])
    np.testing.assert_array_equal(unpermute(tensors["blk.0.attn_k.weight"], kv_heads),
                                  hf["model.layers.0.self_attn.k_proj.weight"])
    fields = {f.name: f for f in reader.fields.values()}
    assert fields["general.architecture"].contents() == "llama"
    assert fields["llama.attention.head_count_kv"].contents() == kv_heads
    assert len(fields["tokenizer.ggml.tokens"].contents()) == config["vocab_size"]


def test_batch1_targets_name_the_speed_they_need_against_the_matmul_floor(smoke):
    sys.path.insert(0, str(BENCH))
    from sidebyside import report

    def row(engine, batch, tok_s):
        return dict(engine=engine, prompt_len=64, batch=batch, status="ok", decode_tok_s_best=tok_s,
                    decode_tok_s_median=tok_s, disturbed=False)

    rows = [row("trt-llm", 1, 35.0), row("transformers", 1, 21.0), row("ort-genai", 1, 35.0), row("trt-llm", 8, 175.0)]
    got = report.targets(rows, floor_tok_s=40.0)
    hf = got["trt-llm / transformers, batch 1, prompt 64"]
    assert hf["best"] == pytest.approx(35 / 21) and not hf["met"]
    assert hf["needs_tok_s"] == pytest.approx(42.0) and hf["floor_tok_s"] == 40.0
    assert got["trt-llm / ort-genai, batch 1, prompt 64"]["met"]
    assert got["trt-llm batch-8 / batch-1 throughput, prompt 64"]["needs_tok_s"] is None
    text = report.markdown({**smoke[0], "targets": got})
    assert ("- trt-llm / transformers, batch 1, prompt 64: 1.67 (medians 1.67); target >= 2.0: BELOW TARGET: it needs "
            "42.0 tok/s; the matmul floor is 40.0") in text
