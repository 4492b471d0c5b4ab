"""The system-prompt KV cache: outputs unchanged, fallback, budget, persistence across processes."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.cache.context_cache import ContextCache, Entry
from trt_llm.runtime.requests.runner import Runner
from trt_llm.schemas.input_file import parse_input_dict

SYSTEM = ("You are a careful assistant for a small shipping company. You answer questions about parcels, "
          "prices and delivery times. Be brief, be polite, and never invent tracking numbers.")
QUESTIONS = ["Where is my parcel?", "How much does a 2 kg box to Lyon cost?", "Hi", "Can I change the address?",
             "What are your opening hours?"]


def conversation(question, save=False, system=SYSTEM):
    return {"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "save_system_prompt_kv_cache": save}


def run(engine, requests, cache=None, batch_size=2, max_new=24):
    data = {"batch_size": batch_size, "temperature": 0.0, "max_generate_length": max_new, "requests": requests}
    loaded = parse_input_dict(json.loads(json.dumps(data)))
    runner = Runner(EngineDir.open(engine), threads=1, prefix_cache=cache)
    return runner.run(loaded, loaded.settings).responses, runner


def assert_cache_changes_nothing(engine):
    requests = [conversation(q, save=(i == 0)) for i, q in enumerate(QUESTIONS)]
    with_cache, runner = run(engine, requests)
    without, _ = run(engine, [conversation(q) for q in QUESTIONS])
    assert [r.output_token_ids for r in with_cache] == [r.output_token_ids for r in without]
    assert [r.output_text for r in with_cache] == [r.output_text for r in without]
    # Batch 0 saves (batch-wide: both its requests prefill fully); batches 1 and 2 reuse.
    reused = [r.reused_tokens for r in with_cache]
    assert reused[:2] == [0, 0] and all(n > 20 for n in reused[2:]) and len(set(reused[2:])) == 1
    assert runner.prefix_stats["hits"] == 3 and len(runner.prefix_cache) == 1
    assert all(r.reused_tokens == 0 for r in without)


def test_tiny_qwen3_outputs_identical_with_cache(tiny_model, build_engine_for):
    assert_cache_changes_nothing(build_engine_for(tiny_model("qwen3")))


def test_a_long_reused_prefix_beside_a_long_fresh_prompt(tiny_model, build_engine_for):
    """One prefill pass would write the fresh prompt's padded width after the reused prefix's
    slots, past the batch's cache (sized for the longest prompt and 4 new tokens): the batch still
    runs, with the tokens each request gives without the cache."""
    engine = build_engine_for(tiny_model("qwen3"))
    long_question = {"messages": [{"role": "user", "content": " ".join(["Tell me about parcels."] * 12)}]}
    requests = [conversation(QUESTIONS[0], save=True), conversation(QUESTIONS[1]), conversation(QUESTIONS[2]),
                long_question]  # batch 0 saves the system prompt; in batch 1, request 2 reuses it
    with_cache, runner = run(engine, requests, max_new=4)
    without, _ = run(engine, [conversation(q) for q in QUESTIONS[:3]] + [long_question], max_new=4)
    assert all(r.finish_reason != "error" for r in with_cache), [r.error for r in with_cache]
    assert with_cache[2].reused_tokens > 30
    assert with_cache[2].reused_tokens + with_cache[3].prompt_tokens > with_cache[3].prompt_tokens + 4
    assert [r.output_token_ids for r in with_cache] == [r.output_token_ids for r in without]


@pytest.mark.slow
def test_smollm2_outputs_identical_with_cache(smollm2_engine):
    assert_cache_changes_nothing(smollm2_engine)


def test_different_system_prompt_is_not_reused(tiny_model, build_engine_for):
    engine = build_engine_for(tiny_model("qwen3"))
    responses, _ = run(engine, [conversation("Hi", save=True), conversation("Hi", system="Other rules."),
                                conversation("Hello", system=SYSTEM + " ")], batch_size=1)
    assert [r.reused_tokens for r in responses] == [0, 0, 0]


def test_template_merging_across_boundary_falls_back(tiny_model, build_engine_for, tmp_path, caplog):
    """A template that glues the system and user text together lets BPE merge across the boundary:
    the prompt's tokens no longer start with the system prompt's tokens, so it is fully prefilled."""
    engine = tmp_path / "engine"
    shutil.copytree(build_engine_for(tiny_model("qwen3")), engine)
    (engine / "tokenizer" / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    requests = [conversation("n and the sea", save=True, system="the drago"),
                conversation("n and the sky", system="the drago")]
    responses, runner = run(engine, requests, batch_size=1)
    assert [r.formatted_system_prompt for r in responses] == ["the drago"] * 2
    assert [r.reused_tokens for r in responses] == [0, 0]
    assert runner.prefix_stats["fallbacks"] == 2 and len(runner.prefix_cache) == 0
    assert "falls back to full prefills" in caplog.text


def entry(n, value, layers=2):
    shape = (2, n, 4)
    return Entry(tuple(range(value, value + n)), [np.full(shape, value, np.float32)] * layers,
                 [np.full(shape, -value, np.float32)] * layers)


def test_budget_evicts_least_recently_used():
    one = entry(8, 1)
    cache = ContextCache("engine", budget_bytes=2 * one.nbytes)
    cache.put(None, one)
    cache.put(None, entry(8, 2))
    assert cache.get(None, one.token_ids) is not None  # 1 is now the most recently used
    cache.put(None, entry(8, 3))
    assert cache.get(None, entry(8, 2).token_ids) is None and cache.evictions == 1
    assert cache.get(None, one.token_ids) is not None and len(cache) == 2
    assert cache.size_bytes == 2 * one.nbytes
    # An adapter is part of the key.
    assert cache.get("french", one.token_ids) is None


def test_disk_entries_reload_and_reject_corrupt_or_foreign(tmp_path, caplog):
    saved = entry(5, 7)
    ContextCache("engine-a", directory=tmp_path).put(None, saved)
    loaded = ContextCache("engine-a", directory=tmp_path).get(None, saved.token_ids)
    assert loaded is not None and np.array_equal(loaded.keys[1], saved.keys[1])
    assert ContextCache("engine-b", directory=tmp_path).get(None, saved.token_ids) is None
    assert "another engine" in caplog.text
    for path in tmp_path.glob("*.safetensors"):
        path.write_bytes(path.read_bytes()[:100])
    assert ContextCache("engine-a", directory=tmp_path).get(None, saved.token_ids) is None
    assert "unreadable" in caplog.text


def test_persisted_cache_warms_a_second_process(tiny_model, build_engine_for, tmp_path):
    engine = build_engine_for(tiny_model("qwen3"))
    data = {"temperature": 0.0, "max_generate_length": 8,
            "requests": [conversation(QUESTIONS[0], save=True), conversation(QUESTIONS[1])]}
    (tmp_path / "in.json").write_text(json.dumps(data))
    outputs = []
    for run_index in range(2):
        out = tmp_path / f"out{run_index}.json"
        subprocess.run([sys.executable, "-m", "trt_llm.runtime.app.run_cli", str(tmp_path / "in.json"), "--engine-dir",
                        str(engine), "-o", str(out), "--threads", "1", "--kv-cache-dir", str(tmp_path / "kv")],
                       check=True, capture_output=True)
        outputs.append(json.loads(out.read_text())["responses"])
    first, second = outputs
    assert [r["reused_tokens"] for r in first][0] == 0 and first[1]["reused_tokens"] > 0
    assert all(r["reused_tokens"] > 0 for r in second)  # warm from the first process's disk entry
    assert [r["output_token_ids"] for r in first] == [r["output_token_ids"] for r in second]
