"""`trt-llm-run INPUT.json --engine-dir DIR [-o OUTPUT.json]`.

Exit status: 0 all requests succeeded; 1 some request failed (its response says why); 2 the input
file or the engine directory is unusable.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from pathlib import Path

EXIT_OK, EXIT_REQUEST_FAILED, EXIT_UNUSABLE = 0, 1, 2


def write_atomically(path: Path, text: str) -> None:
    """Write to a temporary file beside `path`, then rename: readers never see half a file."""
    path = Path(path)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _positive(value: str) -> int:
    number = int(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return number


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trt-llm-run", description="Run the requests of an input file on an engine.")
    parser.add_argument("input", help="input JSON file")
    parser.add_argument("--engine-dir", required=True, help="engine directory from trt-llm-build")
    parser.add_argument("-o", "--output", help="output JSON file (default: standard output)")
    parser.add_argument("--batch-size", type=_positive, help="overrides the file's batch_size")
    parser.add_argument("--max-generate-length", type=_positive, help="overrides the file's max_generate_length")
    parser.add_argument("--seed", type=int, help="overrides the file's seed")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0 = all physical cores)")
    parser.add_argument("--prompt-cache-budget-mb", type=_positive, default=1024,
                        help="memory for saved system-prompt KV (least recently used out first)")
    parser.add_argument("--kv-cache-dir", help="also keep saved system-prompt KV here, across runs")
    parser.add_argument("--no-spec-decode", action="store_true",
                        help="vanilla decoding even when the engine has an EAGLE draft")
    parser.add_argument("--draft-top-k", type=_positive, default=10, help="children kept per drafted node")
    parser.add_argument("--draft-steps", type=_positive, default=6, help="tree depth drafted per round")
    parser.add_argument("--verify-tree-size", type=_positive, default=60,
                        help="tokens per verification pass (root included); smaller pays off sooner on a CPU")
    parser.add_argument("--profile-output", help="write the run's profile (JSON) here")
    parser.add_argument("--dump-profile", action="store_true", help="print a profile summary to stderr")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="trt-llm-run: %(levelname)s: %(message)s")
    log = logging.getLogger("trt-llm-run")

    from trt_llm.runtime.eagle import SpecConfig
    from trt_llm.runtime.engine_dir import EngineDir, EngineDirError
    from trt_llm.runtime.prefix_cache import PrefixCache
    from trt_llm.runtime.profiler import Profiler, format_summary
    from trt_llm.runtime.runner import Runner, RunError
    from trt_llm.schemas.input_file import InputFileError, InputSettings, load_input_file

    try:
        loaded = load_input_file(args.input)
        overrides = {key: value for key, value in (("batch_size", args.batch_size),
                     ("max_generate_length", args.max_generate_length), ("seed", args.seed)) if value is not None}
        settings = InputSettings.model_validate({**loaded.settings.model_dump(), **overrides})
        for warning in loaded.warnings:
            log.warning("%s", warning)
        engine_dir = EngineDir.open(args.engine_dir)
        prefix_cache = PrefixCache(engine_dir.identity, args.prompt_cache_budget_mb << 20, args.kv_cache_dir)
        profiler = Profiler() if (args.profile_output or args.dump_profile) else None
        spec = SpecConfig(args.draft_top_k, args.draft_steps, args.verify_tree_size)
        runner = Runner(engine_dir, threads=args.threads, prefix_cache=prefix_cache, profiler=profiler,
                        spec=spec, spec_decode=not args.no_spec_decode)
        output = runner.run(loaded, settings)
    except (InputFileError, EngineDirError, RunError) as error:
        log.error("%s", error)
        return EXIT_UNUSABLE
    except ValueError as error:  # an override out of range (pydantic)
        log.error("%s", error)
        return EXIT_UNUSABLE
    text = output.to_json()
    if args.output:
        write_atomically(Path(args.output), text)
    else:
        sys.stdout.write(text)
    if profiler:
        profile = profiler.summary()
        if args.profile_output:
            write_atomically(Path(args.profile_output), profile.model_dump_json(indent=2) + "\n")
        if args.dump_profile:
            print(format_summary(profile), file=sys.stderr)
    stats = runner.prefix_stats
    if stats["saved"] or stats["hits"]:
        print(f"trt-llm-run: system-prompt KV cache: {len(prefix_cache)} entries, "
              f"{prefix_cache.size_bytes / 2**20:.1f} MB of {args.prompt_cache_budget_mb} MB, "
              f"{stats['hits']} reused, {stats['saved']} saved, {prefix_cache.evictions} evicted, "
              f"{stats['fallbacks']} full-prefill fallbacks", file=sys.stderr)
    failed = sum(r.finish_reason == "error" for r in output.responses)
    if failed:
        log.error("%d of %d requests failed", failed, len(output.responses))
        return EXIT_REQUEST_FAILED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
