"""trt-llm-serve on Ray Serve: a local Ray instance with 2 replicas of a tiny model behind our proxy
deployment; concurrent requests spread over both and each gets the answer one server gives it; routed
by prefix (the default), 4 conversations x 3 turns keep their replicas and at least 0.8 of each later
turn's prompt cached, Ray's power of two choices alone less; the test stops Ray itself."""

import asyncio
import json
import socket

import httpx
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.serve")
pytest.importorskip("fastapi")

from helpers import PROMPTS  # noqa: E402
from test_prefix_router import conversation_engine, converse  # noqa: E402
from test_prefix_router import serve as serve_alone  # noqa: E402
from trt_llm.server.app import ServerConfig  # noqa: E402

KEY = "ray-key"


@pytest.fixture(scope="module")
def ray_server(tiny_model, build_engine_for):
    from ray import serve

    from trt_llm.server.ray_app import deployment

    engine = conversation_engine(tiny_model, build_engine_for)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)  # (logical: two apps of 2 replicas)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        config = ServerConfig(model_name="tiny", api_keys=(KEY,), max_rows=4)
        serve.run(deployment(str(engine), config, replicas=2, threads=1), name="trt-llm", route_prefix="/")
        yield f"http://127.0.0.1:{port}", engine
    finally:
        serve.shutdown()
        ray.shutdown()


def test_two_replicas_share_the_requests(ray_server):
    url, engine = ray_server
    auth = {"Authorization": f"Bearer {KEY}"}

    async def ask(client, i):
        body = {"model": "tiny", "messages": [{"role": "user", "content": f"{PROMPTS[i % 4]} ({i})"}],
                "max_tokens": 8, "temperature": 0}
        answer = await client.post(f"{url}/v1/chat/completions", json=body, headers=auth)
        return i, answer

    async def everyone():
        async with httpx.AsyncClient(timeout=120) as client:
            return await asyncio.gather(*(ask(client, i) for i in range(24)))

    answers = asyncio.run(everyone())
    assert all(a.status_code == 200 for _, a in answers), [a.text for _, a in answers if a.status_code != 200]
    assert len({a.headers["X-Replica"] for _, a in answers}) == 2  # both replicas served
    # The same request gives the same greedy answer whichever replica ran it.
    again = {i: a.json()["choices"][0]["message"]["content"] for i, a in answers}
    repeat = asyncio.run(everyone())
    assert {i: a.json()["choices"][0]["message"]["content"] for i, a in repeat} == again
    assert httpx.post(f"{url}/v1/chat/completions", json={"model": "tiny", "messages": []}).status_code == 401


def test_prefix_routing_on_ray_keeps_conversations_cached(ray_server):
    from ray import serve

    from trt_llm.server.ray_app import deployment

    url, engine = ray_server
    auth = {"Authorization": f"Bearer {KEY}"}
    config = ServerConfig(model_name="tiny", api_keys=(KEY,), max_rows=4)
    serve.run(deployment(str(engine), config, replicas=2, threads=1, routing="pow2"), name="pow2",
              route_prefix="/pow2")
    prefix = converse({"ray": url}, "prefix", headers=auth)
    pow2 = converse({"ray": f"{url}/pow2"}, "prefix", headers=auth)
    one = serve_alone(engine)
    try:
        alone = converse({"one": one.url}, "prefix")
    finally:
        one.close()
    assert prefix[0] == pow2[0] == alone[0]  # the same answers wherever each turn ran
    assert min(prefix[1]) >= 0.8, prefix[1]
    assert abs(sum(prefix[1]) - sum(alone[1])) <= 0.1 * sum(alone[1])  # as one replica's figure
    assert prefix[2][4:] == prefix[2][:4] * 2  # every conversation stayed on its replica
    # Power of two choices: a turn that moved found only the system prompt there; one that stayed all.
    moved = [i for i in range(8) if pow2[2][4 + i] != pow2[2][i]]
    assert all(pow2[1][i] < prefix[1][i] for i in moved), (moved, pow2[1], prefix[1])
    assert sum(pow2[1]) <= sum(prefix[1])


def test_a_stream_comes_through_the_proxy(ray_server):
    url, _ = ray_server
    auth = {"Authorization": f"Bearer {KEY}"}
    body = {"model": "tiny", "messages": [{"role": "user", "content": PROMPTS[2]}], "max_tokens": 12, "temperature": 0}
    whole = httpx.post(f"{url}/v1/chat/completions", json=body, headers=auth, timeout=120).json()
    deltas, lines = [], []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True}, headers=auth,
                      timeout=120) as answer:
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
        for line in answer.iter_lines():
            if line.startswith("data: "):
                lines.append(line[6:])
    assert lines[-1] == "[DONE]"
    for data in lines[:-1]:
        deltas.append(json.loads(data)["choices"][0]["delta"].get("content") or "")
    assert "".join(deltas) == whole["choices"][0]["message"]["content"]


def test_the_load_margin_reaches_the_prefix_router():
    """--ray-max-imbalance (default 4) is the prefix router's max_imbalance on the engine replicas' deployment
    (Ray passes request_router_kwargs to PrefixRequestRouter.initialize_state); pow2 has no router of ours."""
    from trt_llm.server.cli import parse_args
    from trt_llm.server.ray_app import deployment

    def router_config(*flags):
        args = parse_args(["--engine-dir", "x", "--ray-replicas", "2", *flags])
        app = deployment("x", ServerConfig(model_name="x"), args.ray_replicas, 1, routing=args.ray_routing,
                         max_imbalance=args.ray_max_imbalance)
        engines = app._bound_deployment.init_args[0]._bound_deployment  # (the proxy's handle to them)
        return engines._deployment_config.request_router_config

    assert router_config().request_router_kwargs == {"max_imbalance": 4}
    assert router_config("--ray-max-imbalance", "0").request_router_kwargs == {"max_imbalance": 0}
    assert router_config("--ray-routing", "pow2").request_router_kwargs == {}
