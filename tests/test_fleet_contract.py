"""The fleet contract (issue 46 item 2): what a router reads of one server.

- KV events: the blocks a request stores are announced with the keys the context cache computes,
  recomputed here from the prompt's token ids (transformers' tokenizer) with the cache's own chain_key;
  a second request restores exactly the announced blocks of its prompt (its cached_tokens); an adapter's
  blocks carry its served name and its own chain root; the HTTP stream (GET /v1/kv_events) gives the
  same events as a Python callback, and a late subscriber's replay is what the cache holds.
- Eviction under a small budget: BlockRemoved names the evicted keys, least recently used first (a
  chain from its tail), and stored minus
  removed is exactly what the cache still holds.
- /metrics under vLLM's names while one adapter's request runs and others wait on a one-row server.
"""

import json
import threading
import time

import httpx
import pytest

from helpers import LiveServer, make_adapter
from trt_llm.runtime.cache.context_cache import chain_key
from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.requests.runner import Runner

uvicorn = pytest.importorskip("uvicorn")
transformers = pytest.importorskip("transformers")

from trt_llm.server.app import ServerConfig, create_app  # noqa: E402

KEY = "fleet-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
SYSTEM = ("You are a careful assistant for a shipping company. Answer in one short sentence, name the port "
          "of departure and the port of arrival, and never invent a tracking number. ")


@pytest.fixture(scope="module")
def model_and_adapters(tiny_model, build_engine_for, tmp_path_factory):
    base = tiny_model("qwen3")
    engine = build_engine_for(base, lora={"max_rank": 8})  # test_server.py's engine: built once a session
    folder = tmp_path_factory.mktemp("adapters")
    return base, engine, {"ada": str(make_adapter(base, folder / "ada", seed=1)),
                          "bob": str(make_adapter(base, folder / "bob", seed=2))}


class Stream:
    """GET /v1/kv_events read in a thread: its batches as they come."""

    def __init__(self, url):
        self.batches, self.stop = [], threading.Event()
        self.thread = threading.Thread(target=self._read, args=(url,), daemon=True)
        self.thread.start()
        deadline = time.time() + 10
        while not self.batches:  # the replay comes first
            assert time.time() < deadline, "no replay on the KV event stream"
            time.sleep(0.02)

    def _read(self, url):
        with httpx.stream("GET", f"{url}/v1/kv_events", headers=AUTH, timeout=60) as answer:
            assert answer.status_code == 200
            for line in answer.iter_lines():
                if line.strip():
                    self.batches.append(json.loads(line))
                if self.stop.is_set():
                    return

    def events(self, count, timeout=10.0):
        """The live events (after the replay), once there are `count` of them."""
        deadline = time.time() + timeout
        while True:
            live = [e for b in self.batches[1:] for e in b["events"]]
            if len(live) >= count or time.time() > deadline:
                return live
            time.sleep(0.02)


def start(engine, adapters, **config):
    runner = Runner(EngineDir.open(engine), threads=1, scheduling="continuous")
    heard = []
    runner.prefix_cache.subscribe(heard.append)
    app = create_app(runner, ServerConfig(model_name="tiny", lora=adapters, api_keys=(KEY,), **config))
    live = LiveServer(app)
    live.engine = app.state.engine
    return live, runner.prefix_cache, heard


def complete(url, prompt, model="tiny", max_tokens=4, **extra):
    answer = httpx.post(f"{url}/v1/completions", headers=AUTH, timeout=120,
                        json={"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra})
    assert answer.status_code == 200, answer.text
    return answer.json()


def chain(cache, tokens, adapter_identity=None):
    """The keys of the full blocks of `tokens`, by the cache's own function, from the chain's root."""
    size, keys = cache.block_tokens, [cache.root(adapter_identity)]
    for start in range(0, len(tokens) - size + 1, size):
        keys.append(chain_key(keys[-1], tokens[start:start + size]))
    return keys[0], keys[1:]


def test_stored_events_name_the_blocks_a_later_request_restores(model_and_adapters):
    base, engine, adapters = model_and_adapters
    tokenizer = transformers.AutoTokenizer.from_pretrained(base)
    live, cache, heard = start(engine, adapters, max_rows=2)
    try:
        stream = Stream(live.url)
        assert stream.batches[0]["replay"] and stream.batches[0]["events"] == []  # nothing held yet
        first = SYSTEM + "Where does the ship from Rotterdam go?"
        complete(live.url, first)
        tokens = tokenizer(first)["input_ids"]
        root, keys = chain(cache, tokens)
        stored = [e for e in heard if e["type"] == "BlockStored"]
        # Its prompt's blocks (then its generated tokens'), each with its parent, tokens and root.
        assert [e["block_hashes"][0] for e in stored[:len(keys)]] == keys
        assert [e["parent_block_hash"] for e in stored[:len(keys)]] == [None, *keys[:-1]]
        for index, event in enumerate(stored[:len(keys)]):
            assert event["token_ids"] == tokens[index * 16:(index + 1) * 16]
            assert (event["block_size"], event["medium"], event["lora_name"], event["chain_root"]) == \
                (16, "CPU", None, root)

        announced = {e["block_hashes"][0] for e in heard if e["type"] == "BlockStored"}  # before the second
        second = first + " And the one from Genoa, which leaves on Tuesday?"
        answer = complete(live.url, second)
        tokens2 = tokenizer(second)["input_ids"]
        _, keys2 = chain(cache, tokens2)
        shared = next(i for i, key in enumerate(keys2 + [None]) if key not in announced)
        assert shared >= len(keys) - 1 > 0  # the first prompt's blocks (the tokenizer may merge at its end)
        restorable = min(shared, (len(tokens2) - 1) // 16)  # at least one prompt token is computed
        assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 16 * restorable

        # An adapter's blocks: its served name, and a chain of its own (no key shared with the base's).
        before = len(heard)
        complete(live.url, first, model="ada")
        ada = [e for e in heard[before:] if e["type"] == "BlockStored"]
        assert ada and {e["lora_name"] for e in ada} == {"ada"}
        assert ada[0]["chain_root"] != root and not {e["block_hashes"][0] for e in ada} & set(keys)

        # The stream carries the callback's events, in order, numbered from the replay on.
        live_events = stream.events(len(heard))
        assert live_events == heard
        assert [b["seq"] for b in stream.batches[1:]] == list(range(1, len(heard) + 1))
        late = Stream(live.url)  # a router that starts now: the replay is what the cache holds
        replayed = [e["block_hashes"][0] for e in late.batches[0]["events"]]
        assert late.batches[0]["seq"] == len(heard) and replayed == [e["block_hashes"][0] for e in heard]
        assert all(cache.has_block(key) for key in replayed)
        stream.stop.set()
        late.stop.set()
    finally:
        live.close()


def test_eviction_is_announced(model_and_adapters):
    base, engine, adapters = model_and_adapters
    live, cache, heard = start(engine, adapters, max_rows=1)
    try:
        complete(live.url, SYSTEM * 2, max_tokens=1)
        block_bytes = cache.size_bytes // cache.blocks
        held = [e["block_hashes"][0] for e in heard]
        assert len(held) >= 4 and not any(e["type"] == "BlockRemoved" for e in heard)
        cache.budget_bytes = 3 * block_bytes  # room for 3 blocks: the next request's evict the first's
        before = len(heard)
        complete(live.url, "A different question about container cranes and their operators. " * 4, max_tokens=1)
        removed = [k for e in heard[before:] if e["type"] == "BlockRemoved" for k in e["block_hashes"]]
        # The least recently used first: the first request's, its chain from the tail (the cache's policy:
        # a prefix others may share stays longest).
        assert removed[:len(held)] == held[::-1]
        alive = {}
        for event in heard:
            for key in event["block_hashes"]:
                alive[key] = event["type"] == "BlockStored"
        still = {key for key, stored in alive.items() if stored}
        assert len(still) == cache.blocks <= 3 and all(cache.has_block(key) for key in still)
        assert cache.evictions == len(removed)
        replay = Stream(live.url)
        assert {e["block_hashes"][0] for e in replay.batches[0]["events"]} == still
        replay.stop.set()
    finally:
        live.close()


def _scrape(url) -> dict:
    """/metrics as {name: value} and {name + "_labels": labels} (one sample each), by Prometheus' own parser."""
    from prometheus_client.parser import text_string_to_metric_families

    values = {}
    text = httpx.get(f"{url}/metrics", headers=AUTH, timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("vllm:") or sample.name == "trt_llm_kv_cache_usage_ratio":
                name = sample.name + "".join(f"/{v}" for k, v in sample.labels.items() if k == "unit")
                values[name], values[name + "_labels"] = sample.value, sample.labels
    return values


def test_vllm_metrics_while_requests_run_and_wait(model_and_adapters):
    base, engine, adapters = model_and_adapters
    live, cache, _ = start(engine, adapters, max_rows=1)
    eos = EngineDir.open(engine).eos_token_ids
    no_end = {str(t): -100 for t in eos}  # the running request goes on to its max_tokens
    try:
        idle = _scrape(live.url)
        assert idle["vllm:num_requests_waiting"] == idle["vllm:num_requests_running"] == 0
        assert idle["vllm:kv_cache_usage_perc"] == idle["vllm:gpu_cache_usage_perc"] == 0
        assert idle["vllm:lora_requests_info_labels"] == {"running_lora_adapters": "", "waiting_lora_adapters": "",
                                                          "max_lora": "1"}
        assert idle["vllm:cache_config_info_labels"] == {"block_size": "16", "num_gpu_blocks": "1"}

        while live.engine.core is None:  # (made as the engine thread starts)
            time.sleep(0.01)
        core = live.engine.core
        step = core.step
        core.step = lambda: (time.sleep(0.02), step())[1]  # 20 ms a step: scrapes see the rows as they are

        def ask(model, tokens):
            complete(live.url, f"Tell me about {model}.", model=model, max_tokens=tokens, logit_bias=no_end)
        runs = [threading.Thread(target=ask, args=("ada", 150))]
        runs[0].start()
        deadline = time.time() + 60
        while _scrape(live.url)["vllm:num_requests_running"] < 1:
            assert time.time() < deadline
            time.sleep(0.01)
        runs += [threading.Thread(target=ask, args=(model, 2)) for model in ("bob", "tiny")]
        for run in runs[1:]:
            run.start()
        seen = None
        while time.time() < deadline:
            values = _scrape(live.url)
            # (counted as waiting once submitted; their adapters listed once the scheduler holds them, at its
            # next step: the scrape after both)
            if values["vllm:num_requests_waiting"] == 2 and len(core.scheduler.waiting) == 2:
                values = _scrape(live.url)
                seen = values if values["vllm:num_requests_waiting"] == 2 else None
                break
            time.sleep(0.01)
        assert seen is not None, "the two later requests were never seen waiting"
        assert seen["vllm:num_requests_running"] == 1 and seen["vllm:kv_cache_usage_perc"] == 1.0
        assert seen["vllm:lora_requests_info_labels"] == {"running_lora_adapters": "ada", "waiting_lora_adapters": "bob",
                                                          "max_lora": "1"}
        assert abs(seen["vllm:lora_requests_info"] - time.time()) < 60  # its value: when it was read
        assert 0 < seen["trt_llm_kv_cache_usage_ratio/tokens"] < 1  # a row of 512 slots partly held
        for run in runs:
            run.join(timeout=120)
        done = _scrape(live.url)
        assert done["vllm:num_requests_waiting"] == done["vllm:num_requests_running"] == 0
        assert done["vllm:kv_cache_usage_perc"] == 0
    finally:
        live.close()
