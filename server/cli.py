"""`trt-llm-serve --engine-dir DIR`: the OpenAI-compatible server (needs the `server` extra).

Binds 127.0.0.1 unless told otherwise. Exit status 2 when the engine directory or a flag is unusable.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from trt_llm.common.cli_args import (OneLineParser, byte_size, capped_threads, non_negative_int, port_number,
                                     physical_memory, positive_float, positive_int, steps_above_one)
from trt_llm.runtime.engine import DEFAULT_PREFILL_CHUNK

PROG = "trt-llm-serve"
EXIT_UNUSABLE = 2


def parse_args(argv: list[str] | None):
    p = OneLineParser(prog=PROG, description="Serve an engine over an OpenAI-compatible HTTP API.")
    p.add_argument("--engine-dir", required=True, help="engine directory from trt-llm-build")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=port_number, default=8000, help="port to listen on (default 8000; 0: any free port)")
    p.add_argument("--model-name", help="the model's name in the API (default: the engine directory's name)")
    p.add_argument("--lora", action="append", default=[], metavar="NAME=PATH",
                   help="serve a LoRA adapter as model NAME (repeatable)")
    p.add_argument("--api-key", action="append", default=[], help="a key clients must send (repeatable)")
    p.add_argument("--api-key-file", type=Path, help="a file of keys, one per line")
    p.add_argument("--max-batch-size", type=positive_int, help="requests decoding together (default: the engine's)")
    p.add_argument("--max-queue", type=positive_int, default=256, help="requests waiting for a row before 429")
    p.add_argument("--max-body-bytes", type=positive_int, default=4 << 20)
    p.add_argument("--max-upload-mb", type=positive_float, default=25, metavar="MB",
                   help="largest audio file /v1/audio/transcriptions and /translations take, in MB of 2^20 bytes "
                        "(default 25, OpenAI's); streamed to disk, never held in memory")
    p.add_argument("--max-audio-seconds", type=positive_float, default=1800, metavar="SECONDS",
                   help="longest clip the speech routes transcribe, read from its header before decoding (default "
                        "1800: 30 minutes; trt-llm-run's input files allow 7200)")
    p.add_argument("--audio-decode-budget", type=byte_size, default=256 << 20, metavar="SIZE",
                   help="memory the speech routes' decodes take together, e.g. 256M (default); a decode that does "
                        "not fit waits its turn")
    p.add_argument("--request-timeout", type=positive_float, default=None,
                   help="seconds before a request is aborted (504)")
    p.add_argument("--allowed-local-media-path", type=Path, help="folder local image/audio paths may come from")
    p.add_argument("--cors-origin", action="append", default=[], help="allow browser calls from this origin")
    p.add_argument("--no-prefix-cache", action="store_true",
                   help="compute every prompt whole: no reuse of earlier turns' or system prompts' keys and values")
    p.add_argument("--kv-cache-budget", type=byte_size, default=1 << 30, metavar="SIZE",
                   help="memory for reused keys and values, e.g. 512M or 2G (default 1G)")
    p.add_argument("--prefill-chunk", type=positive_int, default=DEFAULT_PREFILL_CHUNK, metavar="TOKENS",
                   help=f"prompt tokens prefilled a pass; while others decode, for all new prompts together "
                        f"(default {DEFAULT_PREFILL_CHUNK}: a long prompt costs the running streams a chunk a step)")
    p.add_argument("--prefill-latency-target", type=steps_above_one, metavar="STEPS",
                   help="while prompts go in, keep the running streams' time between tokens within this many "
                        "decode steps (chunks sized by measurement, decode steps in the same passes; 2 keeps them "
                        "within 2x, at the cost of the new prompts' time to first token)")
    p.add_argument("--max-num-batched-tokens", type=positive_int, metavar="TOKENS",
                   help="the most tokens a pass takes, its new prompts' and its decode rows' together (vLLM's; "
                        "at least --max-batch-size; default: no limit beyond --prefill-chunk). An EAGLE or "
                        "prompt lookup verification pass is as wide as its trees")
    p.add_argument("--reserve-rows", action="append", default=[], metavar="PRIORITY:ROWS",
                   help="keep ROWS of the batch's rows free for requests of PRIORITY or above (repeatable): a "
                        "lower request waits rather than take them, so an urgent one starts at once")
    p.add_argument("--tool-call-parser", choices=("auto", "hermes", "llama3_json", "gemma4", "none"), default="auto",
                   help="how an answer's tool calls are parsed (default auto: hermes when the chat template "
                        "mentions <tool_call>, llama3_json when it renders calls with their \"parameters\" "
                        "(Llama 3.1 / 3.2), gemma4 when it mentions <|tool_call> (Gemma 4's call:name{...}); "
                        "none: tools are refused)")
    p.add_argument("--no-spec-decode", action="store_true", help="vanilla decoding even with an EAGLE draft")
    p.add_argument("--speculation", choices=("prompt-lookup", "prompt_lookup", "eagle", "mtp", "none"),
                   help="the decoding strategy: prompt-lookup (guesses from each request's own text, verified by the "
                        "base), eagle, none (default: the engine's EAGLE draft if it has one, else none); a body's "
                        "disable_spec_decode still turns it off for that request")
    p.add_argument("--threads", type=positive_int, default=None, help="CPU threads (default: all physical cores)")
    p.add_argument("--ray-replicas", type=positive_int, default=None,
                   help="serve N replicas on Ray Serve (the `ray` extra) instead of one process")
    p.add_argument("--ray-routing", choices=("prefix", "pow2"), default="prefix",
                   help="how Ray Serve picks a replica: prefix (default: the one holding the longest prefix of the "
                        "request's text, else the less loaded of two) or pow2 (Ray's power of two choices alone)")
    p.add_argument("--ray-max-imbalance", type=non_negative_int, default=4, metavar="REQUESTS",
                   help="routing by prefix: the replica holding the prefix gets the request while it has at most "
                        "this many more requests in flight than the least loaded one (default 4; 0: only when "
                        "it is as idle as any)")
    p.add_argument("-v", "--verbose", action="store_true")
    return p.parse_args(argv)


def server_config(args, engine_dir):
    from trt_llm.server.app import ServerConfig

    keys = list(args.api_key)
    if args.api_key_file is not None:
        try:
            keys += [line.strip() for line in args.api_key_file.read_text().splitlines() if line.strip()]
        except OSError as error:
            raise ValueError(f"--api-key-file {args.api_key_file}: {error.strerror}") from None
    lora = {}
    for item in args.lora:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--lora {item!r}: expected NAME=PATH")
        lora[name] = path
    limit = engine_dir.limits["max_batch_size"]
    rows = args.max_batch_size or limit
    if rows > limit:
        raise ValueError(f"--max-batch-size {rows} exceeds the engine's max_batch_size {limit}")
    if args.max_num_batched_tokens is not None and args.max_num_batched_tokens < rows:
        raise ValueError(f"--max-num-batched-tokens {args.max_num_batched_tokens}: a decode step of {rows} rows "
                         f"takes {rows}; give at least --max-batch-size")
    reserved = reserved_rows(args.reserve_rows, rows)
    memory = physical_memory()
    if memory and args.kv_cache_budget > memory:
        raise ValueError(f"--kv-cache-budget: {args.kv_cache_budget / 2**30:.1f} GiB is more than this machine's "
                         f"memory ({memory / 2**30:.1f} GiB)")
    media = args.allowed_local_media_path
    if media is not None and not media.is_dir():
        raise ValueError(f"--allowed-local-media-path {media}: not a folder")
    return ServerConfig(model_name=args.model_name or engine_dir.path.name, lora=lora, api_keys=tuple(keys),
                        max_body_bytes=args.max_body_bytes, max_upload_bytes=int(args.max_upload_mb * (1 << 20)),
                        max_audio_seconds=args.max_audio_seconds, audio_decode_budget=args.audio_decode_budget,
                        max_rows=rows, max_waiting=args.max_queue,
                        request_timeout_s=args.request_timeout, media_root=media,
                        cors_origins=tuple(args.cors_origin), save_prefixes=not args.no_prefix_cache,
                        kv_cache_budget=args.kv_cache_budget, prefill_chunk=args.prefill_chunk,
                        latency_target=args.prefill_latency_target, tool_call_parser=args.tool_call_parser,
                        max_num_batched_tokens=args.max_num_batched_tokens, reserved_rows=reserved)


def reserved_rows(items: list[str], rows: int) -> tuple[tuple[int, int], ...]:
    """--reserve-rows PRIORITY:ROWS, each class once, leaving the lowest priorities at least one row."""
    reserved: dict[int, int] = {}
    for item in items:
        priority, sep, count = item.partition(":")
        try:
            priority, count = int(priority), int(count)
        except ValueError:
            raise ValueError(f"--reserve-rows {item!r}: expected PRIORITY:ROWS (integers)") from None
        if not sep or count < 1 or priority in reserved:
            raise ValueError(f"--reserve-rows {item!r}: expected PRIORITY:ROWS, ROWS at least 1, each priority once")
        reserved[priority] = count
    if sum(reserved.values()) >= rows:
        raise ValueError(f"--reserve-rows: {sum(reserved.values())} rows reserved of {rows} (--max-batch-size): "
                         "leave at least one for the lowest priorities")
    return tuple(sorted(reserved.items()))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format=f"{PROG}: %(levelname)s: %(message)s")
    log = logging.getLogger(PROG)
    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError:
        log.error("the server needs its extra: pip install 'trt-llm[server]'")
        return EXIT_UNUSABLE
    from trt_llm.runtime.engine_dir import EngineDir, EngineDirError

    try:
        engine_dir = EngineDir.open(args.engine_dir)
        config = server_config(args, engine_dir)
        if args.ray_replicas:
            try:
                import ray.serve  # noqa: F401
            except ImportError:
                log.error("--ray-replicas needs the ray extra: pip install 'trt-llm[server,ray]'")
                return EXIT_UNUSABLE
            from trt_llm.server.ray_app import serve_on_ray

            return serve_on_ray(args, config)
        app = build_app(engine_dir, config, capped_threads(args.threads) or 0, not args.no_spec_decode,
                        args.speculation)
    except (EngineDirError, ValueError) as error:
        log.error("%s", error)
        return EXIT_UNUSABLE
    if args.host not in ("127.0.0.1", "localhost", "::1") and not config.api_keys:
        log.warning("listening on %s without an API key: anyone who reaches this address can use the model",
                    args.host)
    server = _announcing(uvicorn.Server)(uvicorn.Config(app, host=args.host, port=args.port,
                                                        log_level="info" if args.verbose else "warning"))
    try:
        server.run()
    except SystemExit as stopped:  # uvicorn's startup failure (the address in use: it said so in one line)
        return EXIT_UNUSABLE if stopped.code == 3 else stopped.code
    except KeyboardInterrupt:
        pass
    return 0 if server.started else EXIT_UNUSABLE


def _announcing(server_class):
    """uvicorn's Server, printing where it listens once its sockets are bound, whatever the log level
    (`--port 0` takes any free port: this line says which)."""

    class Announcing(server_class):
        async def startup(self, sockets=None):
            await super().startup(sockets)
            if self.started:
                for listening in self.servers:
                    for sock in listening.sockets:
                        host, port = sock.getsockname()[:2]
                        print(f"{PROG}: listening on http://{f'[{host}]' if ':' in host else host}:{port}",
                              file=sys.stderr, flush=True)

    return Announcing


def build_app(engine_dir, config, threads: int, spec_decode: bool = True, speculation: str | None = None):
    """The app on a fresh LoadedEngine (the model loaded once, its draft when it has one)."""
    from trt_llm.runtime.cache.context_cache import ContextCache
    from trt_llm.runtime.requests.loaded_engine import LoadedEngine
    from trt_llm.server.app import create_app

    for name, path in config.lora.items():
        if not os.path.isdir(path):
            raise ValueError(f"--lora {name}={path}: no such folder")
    context = ContextCache(engine_dir.identity, config.kv_cache_budget)
    runner = LoadedEngine(engine_dir, threads=threads, prefix_cache=context, spec_decode=spec_decode,
                          prefill_chunk=config.prefill_chunk, latency_target=config.latency_target,
                          speculation=speculation)
    return create_app(runner, config)


if __name__ == "__main__":
    sys.exit(main())
