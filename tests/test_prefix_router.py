"""Routing by prefix (server/prefix_router.py), on its own and in front of two servers of a tiny model in
this process (two replicas, each with its own context cache; Ray Serve is not in the loop):
4 conversations x 3 turns with a long system prompt. Routed by prefix, every later turn lands where its
earlier turns ran and at least 0.8 of its prompt is reported as cached_tokens; routed by power of two
choices alone the figure is lower; every answer equals one server's."""

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from helpers import LiveServer
from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.requests.runner import Runner
from trt_llm.server.prefix_router import CHUNK, PrefixRouter, body_text, chunk_keys

uvicorn = pytest.importorskip("uvicorn")

from trt_llm.server.app import ServerConfig, create_app  # noqa: E402

SYSTEM = ("You are the dispatcher of a regional freight railway. Every answer names the train, its origin, "
          "its destination and its expected delay in minutes, in that order, in one sentence. You never "
          "guess a platform number, you never promise a connection, and you say so when a question falls "
          "outside the timetable you were given this morning. ") * 3
QUESTIONS = [["Where is train 12?", "And its delay?", "Which crew drives it?"],
             ["Is the Basel freight late?", "By how much?", "Will it make the connection?"],
             ["List the trains to Milan.", "Which is first?", "And the last one?"],
             ["What leaves after noon?", "Any of them to Lyon?", "How long is that trip?"]]


def test_a_conversation_sticks_to_its_replica_and_load_breaks_ties():
    router = PrefixRouter(["a", "b"], seed=0)
    first = body_text({"model": "m", "messages": [{"role": "system", "content": SYSTEM},
                                                  {"role": "user", "content": "hi"}]})
    assert len(chunk_keys(first)) == len(first) // CHUNK and router.matches(first) == {}
    router.record(first, "b")
    later = first + "assistant\x00hello\x01user\x00and then?\x01"
    assert router.matches(later) == {"b": len(first) // CHUNK * CHUNK}
    assert router.choose(later, {"a": 0, "b": 3}) == "b"  # within the imbalance allowed
    assert router.choose(later, {"a": 0, "b": 5}) == "a"  # overloaded: the least loaded instead
    other = body_text({"model": "m", "messages": [{"role": "user", "content": "x" * 500}]})
    assert router.matches(other) == {}
    picks = {router.choose(other, {"a": 1, "b": 1}) for _ in range(40)}
    assert picks == {"a", "b"}  # no match: two at random, equal loads
    assert {router.choose(other, {"a": 0, "b": 2}) for _ in range(20)} == {"a"}  # the less loaded of the two
    # Another adapter's conversation (the model comes first) matches nothing of the base's.
    assert router.matches(body_text({"model": "ada", "messages": [{"role": "system", "content": SYSTEM}]})) == {}


def serve(engine, **config) -> LiveServer:
    """The tiny engine served on a loopback port."""
    runner = Runner(EngineDir.open(engine), threads=1, scheduling="continuous")
    return LiveServer(create_app(runner, ServerConfig(model_name="tiny", max_rows=4, **config)))


def converse(replicas: dict, routing: str, seed: int = 1, headers=None):
    """The 4 conversations, a turn of each at a time, the 4 sent together (each routed with the requests
    already in flight counted as its replica's load): every answer, each later turn's cached share, and
    where each turn ran (its X-Replica where the server says, else the name routed to), turn by turn."""
    router = PrefixRouter(list(replicas), max_imbalance=1, seed=seed)
    histories = [[{"role": "system", "content": SYSTEM}] for _ in QUESTIONS]
    answers, shares, where = [], [], []
    for turn in range(3):
        loads, sends = dict.fromkeys(replicas, 0), []
        for history, questions in zip(histories, QUESTIONS):
            history.append({"role": "user", "content": questions[turn]})
            body = {"model": "tiny", "messages": list(history), "max_tokens": 8, "temperature": 0}
            text = body_text(body)
            name = router.choose(text, loads) if routing == "prefix" else router.least_loaded(loads)
            router.record(text, name)
            loads[name] += 1
            sends.append((name, body))
        with ThreadPoolExecutor(len(sends)) as pool:
            replies = list(pool.map(lambda s: httpx.post(f"{replicas[s[0]]}/v1/chat/completions", json=s[1],
                                                         headers=headers, timeout=120), sends))
        for history, (name, _), reply in zip(histories, sends, replies):
            assert reply.status_code == 200, reply.text
            data = reply.json()
            content = data["choices"][0]["message"]["content"]
            history.append({"role": "assistant", "content": content})
            answers.append(content)
            where.append(reply.headers.get("X-Replica", name))
            if turn:
                usage = data["usage"]
                shares.append(usage["prompt_tokens_details"]["cached_tokens"] / usage["prompt_tokens"])
    return answers, shares, where


def conversation_engine(tiny_model, build_engine_for):
    """A tiny engine whose inputs hold the conversations' third turns."""
    return build_engine_for(tiny_model("qwen3"), max_input_len=1024, max_kv_cache_capacity=1152)


@pytest.fixture(scope="module")
def engine(tiny_model, build_engine_for):
    return conversation_engine(tiny_model, build_engine_for)


def test_prefix_routing_keeps_each_conversation_cached(engine):
    results = {}
    for routing in ("prefix", "pow2"):
        servers = {name: serve(engine) for name in ("r0", "r1")}
        try:
            results[routing] = converse({name: s.url for name, s in servers.items()}, routing)
        finally:
            for server in servers.values():
                server.close()
    one = serve(engine)
    try:
        alone = converse({"only": one.url}, "prefix")
    finally:
        one.close()
    prefix, pow2 = results["prefix"], results["pow2"]
    assert prefix[0] == pow2[0] == alone[0]  # the same answers wherever each turn ran
    assert min(prefix[1]) >= 0.8, prefix[1]
    assert abs(sum(prefix[1]) - sum(alone[1])) <= 0.1 * sum(alone[1])  # as one replica's figure
    assert sum(pow2[1]) < sum(prefix[1]), (pow2[1], prefix[1])
    assert len(set(prefix[2])) == 2  # both replicas served
    assert prefix[2][4:] == prefix[2][:4] * 2  # every conversation stayed where it began
