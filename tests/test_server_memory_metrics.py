"""The server's memory on GET /metrics (server/metrics.py, server/memory.py): the process's resident
set against /proc/self/status read here, its peak bracketed by VmHWM read before and after the
scrape, and the KV pool's bytes against the pool's shape worked out from the manifest and the one
request's usage (full attention: layers x {key, value} x rows x kv_heads x slots x head_dim x
itemsize, plus the row offsets); on a (simulated) device, against every byte the device allocated."""

import json
import os

import numpy as np
import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402
from prometheus_client import generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from test_cuda_graphs import FakeCudart  # noqa: E402

from trt_llm.runtime.cache.cache_set import cache_set  # noqa: E402
from trt_llm.runtime.cache.device import device_cache_set  # noqa: E402
from trt_llm.runtime.engine_dir import EngineDir  # noqa: E402
from trt_llm.runtime.requests.runner import Runner  # noqa: E402
from trt_llm.schemas.layer_spec import FullAttention, Recurrent, SlidingAttention, StateTensor  # noqa: E402
from trt_llm.server import memory  # noqa: E402
from trt_llm.server.app import ServerConfig, create_app  # noqa: E402
from trt_llm.server.metrics import Metrics  # noqa: E402

ROWS, MAX_TOKENS = 3, 5


def samples(text: str) -> dict[tuple, float]:
    """(name, sorted labels) -> value of every sample of a /metrics page."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def status_bytes(field: str) -> int:
    with open("/proc/self/status") as lines:
        return next(int(line.split()[1]) * 1024 for line in lines if line.startswith(f"{field}:"))


@pytest.fixture(scope="module")
def engine(tiny_model, build_engine_for):
    return build_engine_for(tiny_model("qwen3"))  # the engine most server tests share


def expected_pool_bytes(engine, slots: int) -> int:
    """The host pool of a model of full-attention layers, from its manifest: one group, a key and a
    value buffer [rows, kv_heads, slots, head_dim] per layer, and the group's int64 row offsets."""
    model = json.loads((engine / "manifest.json").read_text())["model"]
    layers = model["layers"]
    assert {layer["kind"] for layer in layers} == {"full"}
    itemsize = np.dtype({"fp32": np.float32, "fp16": np.float16}[model["dtype"]]).itemsize
    kv = sum(2 * ROWS * layer["kv_heads"] * slots * layer["head_dim"] * itemsize for layer in layers)
    return kv + ROWS * 8


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc (Linux)")
def test_metrics_report_the_process_and_the_kv_pool(engine):
    app = create_app(Runner(EngineDir.open(engine), threads=1, scheduling="continuous"),
                     ServerConfig(model_name="tiny", max_rows=ROWS))
    with TestClient(app) as client:
        idle = samples(client.get("/metrics").text)
        assert not [key for key in idle if key[0] == "trt_llm_kv_pool_bytes"]  # no pool before a request

        answer = client.post("/v1/chat/completions", json={
            "model": "tiny", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": MAX_TOKENS,
            "temperature": 0}).json()
        before = status_bytes("VmHWM")
        got = samples(client.get("/metrics").text)
        rss_here, after = status_bytes("VmRSS"), status_bytes("VmHWM")

    rss, peak = got[("process_resident_memory_bytes", ())], got[("trt_llm_peak_resident_memory_bytes", ())]
    assert 0 < rss <= peak
    assert before <= peak <= after
    assert abs(rss - rss_here) <= 0.2 * rss_here, (rss, rss_here)
    assert got[("process_virtual_memory_bytes", ())] >= rss
    # The pool is sized to the run: its rows hold the prompt and the tokens it may generate.
    slots = answer["usage"]["prompt_tokens"] + MAX_TOKENS
    assert got[("trt_llm_kv_pool_bytes", (("memory", "host"), ("pool", "base")))] == expected_pool_bytes(engine, slots)
    assert got[("trt_llm_kv_pool_bytes", (("memory", "device"), ("pool", "base")))] == 0
    assert not [key for key in got if key[0] == "trt_llm_kv_pool_bytes" and ("pool", "draft") in key[1]]


def test_apps_in_one_process_each_report_it():
    """Registries are per app: a second one (Ray Serve's replicas in a process, the tests) registers
    its own process collector without a clash."""

    class NoEngine:
        core = None

    pages = []
    for _ in range(2):
        metrics = Metrics()
        metrics.watch_memory(NoEngine())
        pages.append(samples(generate_latest(metrics.registry).decode()))
    for page in pages:
        assert page[("trt_llm_peak_resident_memory_bytes", ())] > 0
        if os.path.exists("/proc/self/stat"):
            assert page[("process_resident_memory_bytes", ())] > 0


LAYERS = [FullAttention(kv_heads=2, head_dim=8, scale=1.0), SlidingAttention(kv_heads=2, head_dim=8, scale=1.0, window=4),
          Recurrent(states=[StateTensor(name="conv", shape=[3, 5]), StateTensor(name="ssm", shape=[2, 4, 4],
                                                                               dtype="float32")])]


def test_pool_bytes_of_every_group_kind_host_and_device():
    """Host: the buffers' shapes worked out by hand; device: every byte the simulated device holds,
    as the pool grows and after it is freed."""
    rows, capacity, widest = 2, 16, 4
    host = cache_set(LAYERS, rows, capacity, np.float16, widest)
    full = 2 * rows * 2 * capacity * 8 * 2  # key + value [rows, 2, 16, 8] fp16
    sliding = 2 * rows * 2 * (4 - 1 + widest) * 8 * 2  # its window - 1 + the widest step's slots
    states = 2 * rows * (3 * 5 * 2 + 2 * 4 * 4 * 4)  # current + spare: conv fp16 (the model's), ssm fp32
    assert memory.pool_bytes(host) == {"host": full + sliding + rows * 8 * 2 + states, "device": 0}

    cudart = FakeCudart()
    device = device_cache_set(cudart, 7, LAYERS, rows, capacity, np.float16, widest)
    allocated = lambda: sum(len(block) for block in cudart.memory.values())  # noqa: E731
    assert memory.pool_bytes(device)["device"] == allocated() == 2 * (full + sliding) + states  # KV double-buffered
    device.reserve(5, 40, [3, 2])
    assert memory.pool_bytes(device)["device"] == allocated() > 2 * (full + sliding)
    device.free()
    assert memory.pool_bytes(device)["device"] == allocated() == 0


def test_an_eagle_draft_is_a_pool_of_its_own():
    """The engine core's pools: none before the first admission, the base's, and an EAGLE strategy's
    draft pool (runtime/decoding/eagle.py keeps it as `cache`) beside it."""
    from types import SimpleNamespace

    from trt_llm.runtime.decoding.vanilla import Vanilla

    base, draft = cache_set(LAYERS[:1], 2, 8, np.float32), cache_set(LAYERS[:1], 2, 12, np.float32)
    assert memory.engine_pools(None) == []
    assert memory.engine_pools(SimpleNamespace(cache=None, strategy=Vanilla())) == []
    pools = memory.engine_pools(SimpleNamespace(cache=base, strategy=SimpleNamespace(cache=draft)))
    assert [(name, memory.pool_bytes(cache)["host"]) for name, cache in pools] == [
        ("base", 2 * 2 * 2 * 8 * 8 * 4 + 2 * 8), ("draft", 2 * 2 * 2 * 12 * 8 * 4 + 2 * 8)]
