"""schemathesis against the server's own OpenAPI schema: generated bodies, valid (positive) and
not (negative), never get a 5xx, and every refusal is an OpenAI error object.

It found, and these now guard: a top_p below float32's smallest number (or a temperature that
overflows it) made the sampler's distribution NaN and failed the batch; a body FastAPI cannot parse
was answered in its own shape, not OpenAI's; an app whose lifespan ran twice had a stopped engine
and hung every later request."""

import collections
import json
import zlib

import pytest

schemathesis = pytest.importorskip("schemathesis")
pytest.importorskip("fastapi")

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402

from trt_llm.runtime.engine_dir import EngineDir  # noqa: E402
from trt_llm.runtime.requests.runner import Runner  # noqa: E402
from trt_llm.server.app import ServerConfig, create_app  # noqa: E402


@pytest.fixture(scope="module")
def app(tiny_model, build_engine_for):
    engine = build_engine_for(tiny_model("qwen3"), max_kv_cache_capacity=96, max_input_len=64)
    runner = Runner(EngineDir.open(engine), threads=1, scheduling="continuous")
    return create_app(runner, ServerConfig(model_name="tiny", max_rows=4, request_timeout_s=20))


@pytest.mark.parametrize("mode", list(GenerationMode))
def test_generated_requests_never_get_a_5xx(app, mode):
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    failures, statuses = [], collections.Counter()
    for operation in schema.get_all_operations():
        operation = operation.ok()
        if mode == GenerationMode.NEGATIVE and operation.method.upper() != "POST":
            continue  # a GET without parameters has no invalid form

        @settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck),
                  phases=[Phase.explicit, Phase.reuse, Phase.generate])  # no shrinking: a failure is
        # reported as found (shrinking a failure that depends on the server's state takes minutes)
        @given(case=operation.as_strategy(generation_mode=mode))
        def check(case):
            # Most bodies name the served model, so that generation past the 404 is reached too.
            if isinstance(case.body, dict) and "model" in case.body and zlib.crc32(repr(case.body).encode()) % 4:
                case.body["model"] = "tiny"
            response = case.call()
            statuses[(case.path, response.status_code)] += 1
            if response.status_code >= 500:
                failures.append((case.method, case.path, case.body, response.status_code, response.text[:300]))
            elif response.status_code >= 400:
                assert "error" in response.json(), (response.status_code, case.method, case.path, case.headers,
                                                    case.body, response.text)

        check()
    assert not failures, json.dumps([f[2] for f in failures[:3]])
    served = sum(n for (path, status), n in statuses.items() if path.startswith("/v1/") and status == 200)
    if mode == GenerationMode.POSITIVE:
        assert served > 10, statuses  # generation itself was exercised, not only the refusals
