"""The server past one machine: N replicas of the same app on Ray Serve (the `ray` extra), routed by prefix.

Two deployments. The engine replicas ("trt-llm-engine", N of them): Ray actors that each load the
engine once and run the very app of app.py (its routes, in-flight batching, limits and keys), called
in process with a request's method, path, headers and body; the answer streams back as ASGI messages.
The proxy ("trt-llm", Ray's HTTP ingress) reads each request's body and forwards it through a handle
to the engine deployment, whose request router picks the replica: with routing "prefix" (the default)
server/ray_router.py's PrefixRequestRouter (the replica holding the longest prefix of the body's text,
else the less loaded of two), with "pow2" Ray's power of two choices alone. A router sees the body only
so: Ray's HTTP proxy hands an ingress replica the request before its body.

    trt-llm-serve --engine-dir DIR --ray-replicas 2            # a local Ray instance
    RAY_ADDRESS=auto trt-llm-serve --engine-dir DIR --ray-replicas 8 --host 0.0.0.0 --api-key-file KEYS
                                                               # a running cluster (README: multi-node)

The engine directory must be at the same path on every node that runs a replica. Answers carry
`X-Replica` (the engine replica's id), so a client or a test can see where a request ran.
"""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger(__name__)

ROUTINGS = ("prefix", "pow2")
ENGINE = "trt-llm-engine"


class _EngineReplica:
    """One engine replica: the app of app.py, called in process."""

    def __init__(self, engine_dir: str, config, threads: int, spec_decode: bool):
        from ray import serve

        from trt_llm.runtime.engine_dir import EngineDir
        from trt_llm.server.cli import build_app

        self.app = build_app(EngineDir.open(engine_dir), config, threads, spec_decode)
        self.replica = serve.get_replica_context().replica_id.unique_id

    async def forward(self, request: dict):
        """Run `request` ({"method", "path", "query", "headers", "body"}) through the app: yields its ASGI
        messages (http.response.start first, with X-Replica added; then the body's chunks)."""
        messages: asyncio.Queue = asyncio.Queue()
        sent = False

        async def receive():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": request["body"], "more_body": False}
            await asyncio.Event().wait()  # the client stays connected: the proxy cancels this call if not

        async def send(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"x-replica", self.replica.encode())]}
            await messages.put(message)

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": request["method"],
                 "scheme": "http", "path": request["path"], "raw_path": request["path"].encode(),
                 "query_string": request["query"], "root_path": "", "headers": request["headers"],
                 "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 80)}
        run = asyncio.ensure_future(self.app(scope, receive, send))
        try:
            while True:
                getter = asyncio.ensure_future(messages.get())
                await asyncio.wait({getter, run}, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    if messages.empty():
                        run.result()  # (raises what the app raised)
                        return
                    continue
                message = getter.result()
                yield message
                if message["type"] == "http.response.body" and not message.get("more_body", False):
                    return
        finally:
            if not run.done():
                run.cancel()  # the client left: the app aborts its request


class _Proxy:
    """The ingress: every request forwarded whole to an engine replica its request router chooses."""

    def __init__(self, engines):
        self.stream = engines.options(stream=True)

    async def __call__(self, request):
        from starlette.responses import StreamingResponse

        body = await request.body()
        path = request.url.path
        prefix = request.scope.get("root_path", "")
        if prefix and path.startswith(prefix):  # (an application under a route prefix)
            path = path[len(prefix):] or "/"
        answer = self.stream.forward.remote({"method": request.method, "path": path,
                                             "query": request.url.query.encode(), "headers": request.headers.raw,
                                             "body": body})
        start = await answer.__anext__()

        async def rest():
            async for message in answer:
                if message.get("body"):
                    yield message["body"]

        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in start.get("headers", [])
                   if k.lower() not in (b"content-length", b"transfer-encoding")}
        return StreamingResponse(rest(), status_code=start["status"], headers=headers)


def deployment(engine_dir: str, config, replicas: int, threads: int, spec_decode: bool = True,
               routing: str = "prefix", max_imbalance: int = 4):
    """The Ray Serve application: `replicas` engine replicas (each with `threads` CPUs) behind one proxy.
    The ServerConfig travels to each replica pickled. max_imbalance: routing by prefix, how many more
    requests in flight than the least loaded replica the one holding the prefix may have and still get
    the request (server/prefix_router.py)."""
    from ray import serve

    if routing not in ROUTINGS:
        raise ValueError(f"--ray-routing {routing!r}: expected one of {', '.join(ROUTINGS)}")
    options = {}
    if routing == "prefix":
        from ray.serve.config import RequestRouterConfig

        from trt_llm.server.ray_router import PrefixRequestRouter

        options["request_router_config"] = RequestRouterConfig(
            request_router_class=PrefixRequestRouter, request_router_kwargs={"max_imbalance": max_imbalance})
    engines = serve.deployment(name=ENGINE, num_replicas=replicas, ray_actor_options={"num_cpus": max(threads, 1)},
                               **options)(_EngineReplica).bind(engine_dir, config, threads, spec_decode)
    return serve.deployment(name="trt-llm", ray_actor_options={"num_cpus": 0})(_Proxy).bind(engines)


def serve_on_ray(args, config) -> int:
    """`trt-llm-serve --ray-replicas N`: runs until interrupted."""
    import ray
    from ray import serve

    ray.init(ignore_reinit_error=True)  # RAY_ADDRESS (e.g. auto) joins a running cluster
    serve.start(http_options={"host": args.host, "port": args.port})
    app = deployment(str(args.engine_dir), config, args.ray_replicas, args.threads or 1, not args.no_spec_decode,
                     args.ray_routing, args.ray_max_imbalance)
    log.warning("serving %d replicas on http://%s:%d (Ray Serve, routing by %s)", args.ray_replicas, args.host,
                args.port, args.ray_routing)
    serve.run(app, name="trt-llm", route_prefix="/", blocking=True)
    return 0
