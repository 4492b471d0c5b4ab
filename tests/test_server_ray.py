"""trt-llm-serve on Ray Serve: a local Ray instance with 2 replicas of a tiny model behind Ray's HTTP
proxy; concurrent requests spread over both and each gets the answer one server gives it; the test
stops Ray itself."""

import asyncio
import socket

import httpx
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.serve")
pytest.importorskip("fastapi")

from helpers import PROMPTS  # noqa: E402
from trt_llm.server.app import ServerConfig  # noqa: E402

KEY = "ray-key"


@pytest.fixture(scope="module")
def ray_server(tiny_model, build_engine_for):
    from ray import serve

    from trt_llm.server.ray_app import deployment

    engine = build_engine_for(tiny_model("qwen3"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
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
