"""The server past one machine: N replicas of the same app on Ray Serve (the `ray` extra).

Each replica is a Ray actor that loads the engine once and runs the very app of app.py (its routes,
in-flight batching, limits and keys); Ray's HTTP proxy spreads requests over the replicas. The
engine directory must be at the same path on every node that runs a replica.

    trt-llm-serve --engine-dir DIR --ray-replicas 2            # a local Ray instance
    RAY_ADDRESS=auto trt-llm-serve --engine-dir DIR --ray-replicas 8 --host 0.0.0.0 --api-key-file KEYS
                                                               # a running cluster (README: multi-node)

Answers carry `X-Replica` (the replica's id), so a client or a test can see where a request ran.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def replica_app(engine_dir: str, config, threads: int, spec_decode: bool):
    """The app one replica serves (called on the replica, where it loads the engine)."""
    from ray import serve

    from trt_llm.runtime.engine_dir import EngineDir
    from trt_llm.server.cli import build_app

    app = build_app(EngineDir.open(engine_dir), config, threads, spec_decode)
    replica = serve.get_replica_context().replica_id.unique_id

    @app.middleware("http")
    async def tag(request, call_next):
        response = await call_next(request)
        response.headers["X-Replica"] = replica
        return response

    return app


def deployment(engine_dir: str, config, replicas: int, threads: int, spec_decode: bool = True):
    """The Ray Serve application: `replicas` copies of the app, each with `threads` CPUs. The builder
    (and the ServerConfig in it) travels to each replica pickled, and runs there."""
    from ray import serve

    def build():
        return replica_app(engine_dir, config, threads, spec_decode)

    replica = serve.deployment(name="trt-llm", num_replicas=replicas,
                               ray_actor_options={"num_cpus": max(threads, 1)})(serve.ingress(build)(_Replica))
    return replica.bind()


class _Replica:
    """The deployment's class: the app built by `build` does all the work."""


def serve_on_ray(args, config) -> int:
    """`trt-llm-serve --ray-replicas N`: runs until interrupted."""
    import ray
    from ray import serve

    ray.init(ignore_reinit_error=True)  # RAY_ADDRESS (e.g. auto) joins a running cluster
    serve.start(http_options={"host": args.host, "port": args.port})
    app = deployment(str(args.engine_dir), config, args.ray_replicas, args.threads or 1, not args.no_spec_decode)
    log.warning("serving %d replicas on http://%s:%d (Ray Serve)", args.ray_replicas, args.host, args.port)
    serve.run(app, name="trt-llm", route_prefix="/", blocking=True)
    return 0
