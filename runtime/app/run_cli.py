"""`trt-llm-run INPUT.json --engine-dir DIR [-o OUTPUT.json]`.

Exit status: 0 all requests succeeded; 1 some request failed (its response says why); 2 the input
file, the engine directory, a flag or an output path is unusable (checked before any request runs,
nothing is written); 130 / 143 interrupted by SIGINT / SIGTERM (the output holds every finished
response, the others fail as "interrupted").
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from trt_llm.common.cli_args import (FlagError, Interrupted, OneLineParser, byte_size, capped_threads, positive_int, steps_above_one,
                                      physical_memory, signals_interrupt)
from trt_llm.runtime.engine import DEFAULT_PREFILL_CHUNK
from trt_llm.common.files import OutputPathError, prepare_output_dir, prepare_output_file, write_atomically

EXIT_OK, EXIT_REQUEST_FAILED, EXIT_UNUSABLE = 0, 1, 2
DEFAULT_KV_CACHE_BUDGET = 1 << 30
PROG = "trt-llm-run"
OVERRIDES = ("batch_size", "max_generate_length", "seed")  # flags that override the file's settings


def parse_args(argv: list[str] | None):
    parser = OneLineParser(prog=PROG, description="Run the requests of an input file on an engine.")
    parser.add_argument("input", help="input JSON file")
    parser.add_argument("--engine-dir", required=True, help="engine directory from trt-llm-build")
    parser.add_argument("-o", "--output", help="output JSON file (default: standard output); its folder is made")
    parser.add_argument("--batch-size", type=positive_int, help="overrides the file's batch_size")
    parser.add_argument("--max-generate-length", type=positive_int, help="overrides the file's max_generate_length")
    parser.add_argument("--seed", type=int, help="overrides the file's seed")
    parser.add_argument("--scheduling", choices=("static", "continuous"), default="static",
                        help="static: batches of batch_size in file order (the reference's); continuous: up to "
                             "batch_size requests in flight, the next admitted as soon as a row frees "
                             "(same results, request by request)")
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="CPU threads (default: all physical cores; at most the cores this process may use)")
    parser.add_argument("--context-reuse", action=argparse.BooleanOptionalAction, default=True,
                        help="reuse computed prefixes across requests and turns (on by default, as llama-server, "
                             "vLLM and TensorRT-LLM do): a request restores its longest cached prefix (images, clips "
                             "and the LoRA adapter included) and leaves its tokens for the next (the file's "
                             "context_cache_lookup_policy / _commit_policy say how); with --no-context-reuse only "
                             "system prompts saved with save_system_prompt_kv_cache are reused")
    parser.add_argument("--kv-cache-budget", type=byte_size, metavar="SIZE",
                        help="memory for reused keys and values, e.g. 512M or 2G (default 1G; least recently used "
                             "out first, saved system prompts last)")
    parser.add_argument("--prompt-cache-budget-mb", type=positive_int, help="the same budget in MiB (older name)")
    parser.add_argument("--kv-cache-dir", help="also keep reused keys and values here, across runs")
    parser.add_argument("--prefill-chunk", type=positive_int, metavar="TOKENS",
                        help="prompt tokens prefilled a pass, and while other requests decode for all new prompts "
                             f"together (default: whole prompts; {DEFAULT_PREFILL_CHUNK} with --scheduling "
                             "continuous, where a long prompt then costs the running requests a chunk a step)")
    parser.add_argument("--prefill-latency-target", type=steps_above_one, metavar="STEPS",
                        help="while prompts go in, keep the running requests' time between tokens within this many "
                             "decode steps (chunks sized by measurement, decode steps in the same passes)")
    parser.add_argument("--max-num-batched-tokens", type=positive_int, metavar="TOKENS",
                        help="the most tokens a pass takes, prompt chunks and decode rows together (default: no "
                             "cap beyond --prefill-chunk); at least the batch size")
    parser.add_argument("--no-spec-decode", action="store_true",
                        help="vanilla decoding even when the engine has an EAGLE draft")
    parser.add_argument("--speculation", choices=("prompt-lookup", "prompt_lookup", "eagle", "mtp", "none"),
                        help="the decoding strategy (wins over the input file's \"speculation\"): prompt-lookup guesses "
                             "the next tokens from the request's own text and the base verifies them in one pass; "
                             "default: the engine's EAGLE draft if it has one, else none. Tokens are vanilla's either way")
    parser.add_argument("--draft-top-k", type=positive_int,
                        help="children kept per drafted node (default: the engine's, 3 on cpu, 10 on TensorRT)")
    parser.add_argument("--draft-steps", type=positive_int,
                        help="tree depth drafted per round (default: the engine's, 2 on cpu, 6 on TensorRT)")
    parser.add_argument("--verify-tree-size", type=positive_int,
                        help="tokens per verification pass, root included (default: the engine's, 4 on cpu, "
                             "60 on TensorRT)")
    parser.add_argument("--profile-output", help="write the run's profile (JSON) here; its folder is made")
    parser.add_argument("--dump-profile", action="store_true", help="print a profile summary to stderr")
    parser.add_argument("-v", "--verbose", action="store_true", help="log the engine, each batch and the totals")
    args = parser.parse_args(argv)
    if args.kv_cache_budget is not None and args.prompt_cache_budget_mb is not None:
        parser.error("--prompt-cache-budget-mb: not with --kv-cache-budget (the same budget by its older name; "
                     "give one)")
    flag = "--kv-cache-budget" if args.prompt_cache_budget_mb is None else "--prompt-cache-budget-mb"
    args.budget = (args.prompt_cache_budget_mb << 20 if args.prompt_cache_budget_mb is not None
                   else args.kv_cache_budget or DEFAULT_KV_CACHE_BUDGET)
    memory = physical_memory()
    if memory and args.budget > memory:
        parser.error(f"{flag}: {args.budget / 2**30:.1f} GiB is more than this machine's memory "
                     f"({memory / 2**30:.1f} GiB)")
    return args


def warn_ignored_reuse(loaded, log) -> None:
    """With --no-context-reuse, a file that asks for reuse in so many words is told it gets none
    (its policies are never silently ignored)."""
    from trt_llm.schemas.input_file import RequestError

    asked = ["top level"] if {"context_cache_lookup_policy", "context_cache_commit_policy"} & \
        loaded.settings.model_fields_set else []
    asked += [f"requests[{index}]" for index, request in enumerate(loaded.requests)
              if not isinstance(request, RequestError)
              and {"context_cache_lookup_policy", "context_cache_commit_policy"} & request.model_fields_set]
    if asked:
        more = f" and {len(asked) - 3} more" if len(asked) > 3 else ""
        log.warning("%s: context_cache_lookup_policy / _commit_policy ignored: --no-context-reuse turns context "
                    "reuse off (only saved system prompts are reused)", ", ".join(asked[:3]) + more)


def check_output_paths(args) -> tuple[Path | None, Path | None]:
    """Every path the run writes, checked (folders made) before any work: a run must not compute
    for an hour and then fail to write."""
    output = prepare_output_file(args.output, "-o") if args.output else None
    if output is not None and output == Path(os.path.abspath(args.input)):
        raise OutputPathError(f"-o {str(output)!r}: is the input file; write the output elsewhere")
    profile = prepare_output_file(args.profile_output, "--profile-output") if args.profile_output else None
    if args.kv_cache_dir:
        prepare_output_dir(args.kv_cache_dir, "--kv-cache-dir")
    return output, profile


def resolve_settings(loaded, args):
    """The file's settings with the flags' overrides; a bad override is one line naming the flag."""
    from pydantic import ValidationError

    from trt_llm.schemas._errors import describe
    from trt_llm.schemas.input_file import RANGES, InputSettings

    overrides = {key: getattr(args, key) for key in OVERRIDES if getattr(args, key) is not None}
    try:
        return InputSettings.model_validate({**loaded.settings.model_dump(), **overrides})
    except ValidationError as error:
        # The file's own settings were valid when loaded: what fails here is an override.
        first = error.errors(include_url=False)[0]
        flag = "--" + str(first["loc"][0]).replace("_", "-")
        raise FlagError(f"{flag}: {describe(first, RANGES)}") from None


@dataclass
class _Progress:
    """What a run has got so far, for the output of an interrupted one."""
    loaded: object = None
    settings: object = None
    output_path: Path | None = None
    finished: list = field(default_factory=list)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format=f"{PROG}: %(levelname)s: %(message)s")
    log = logging.getLogger(PROG)
    progress = _Progress()
    with signals_interrupt() as ignore_signals:
        try:
            return _run(args, log, progress)
        except Interrupted as interrupt:
            ignore_signals()  # a second signal while the finished responses are written must not lose them
            return _write_interrupted(log, progress, interrupt)


def _run(args, log, progress: _Progress) -> int:
    from trt_llm.runtime.decoding.spec_config import resolve_spec
    from trt_llm.runtime.engine_dir import EngineDir, EngineDirError
    from trt_llm.runtime.cache.context_cache import ContextCache
    from trt_llm.runtime.engine.profiler import Profiler, format_summary
    from trt_llm.runtime.requests.runner import Runner, RunError
    from trt_llm.schemas.input_file import InputFileError, load_input_file

    # Made first, so that the profile's startup and load stages cover the whole run (its imports too).
    profiler = Profiler() if (args.profile_output or args.dump_profile) else None
    try:
        output_path, profile_path = check_output_paths(args)
        loaded = load_input_file(args.input)
        settings = resolve_settings(loaded, args)
        for warning in loaded.warnings:
            log.warning("%s", warning)
        threads = capped_threads(args.threads)
        with profiler.stage("load_engine_dir") if profiler else nullcontext():
            engine_dir = EngineDir.open(args.engine_dir)
        budget = args.budget
        if not args.context_reuse:
            warn_ignored_reuse(loaded, log)
        prefix_cache = ContextCache(engine_dir.identity, budget, args.kv_cache_dir)
        draft = engine_dir.manifest["components"].get("draft")
        spec = resolve_spec(draft, engine_dir.manifest["backend"], args.draft_top_k, args.draft_steps,
                            args.verify_tree_size) if draft else None
        if args.max_num_batched_tokens is not None and args.max_num_batched_tokens < settings.batch_size:
            raise FlagError(f"--max-num-batched-tokens {args.max_num_batched_tokens}: a decode step of "
                            f"{settings.batch_size} rows (the batch size) takes {settings.batch_size}; give at least that")
        progress.loaded, progress.settings, progress.output_path = loaded, settings, output_path
        runner = Runner(engine_dir, threads=threads or 0, prefix_cache=prefix_cache, profiler=profiler,
                        spec=spec, spec_decode=not args.no_spec_decode, scheduling=args.scheduling,
                        context_reuse=args.context_reuse,
                        prefill_chunk=args.prefill_chunk or (DEFAULT_PREFILL_CHUNK if args.scheduling == "continuous"
                                                             else None),
                        latency_target=args.prefill_latency_target, speculation=args.speculation,
                        max_batched_tokens=args.max_num_batched_tokens)
        log.info("engine %s: %s backend, %s threads, %d requests in batches of %d (%s scheduling)",
                 engine_dir.path, engine_dir.manifest["backend"], threads or "default", len(loaded.requests),
                 settings.batch_size, args.scheduling)
        output = runner.run(loaded, settings, progress.finished)
    except (InputFileError, EngineDirError, RunError, OutputPathError, FlagError, ValueError) as error:
        # ValueError: speculation settings the engine cannot take (check_spec); the others name
        # the input file, the engine directory, the run's settings, an output path or a flag.
        log.error("%s", error)
        return EXIT_UNUSABLE
    _write_output(output_path, output)
    if profiler:
        profile = profiler.summary()
        if profile_path:
            write_atomically(profile_path, profile.model_dump_json(indent=2) + "\n")
        if args.dump_profile:
            print(format_summary(profile), file=sys.stderr)
    stats = runner.prefix_stats
    if stats["saved"] or stats["hits"] or args.verbose:
        print(f"{PROG}: context cache: {len(prefix_cache)} entries ({prefix_cache.blocks} blocks), "
              f"{prefix_cache.size_bytes / 2**20:.1f} MB of {budget / 2**20:.0f} MB, "
              f"{stats['hits']} requests reused, {stats['misses']} missed, {stats['saved']} system prompts saved, "
              f"{prefix_cache.evictions} evicted, {stats['fallbacks']} full-prefill fallbacks", file=sys.stderr)
    failed = sum(r.finish_reason == "error" for r in output.responses)
    log.info("%d requests, %d failed, %d tokens generated", len(output.responses), failed,
             sum(r.generated_tokens for r in output.responses))
    if failed:
        log.error("%d of %d requests failed", failed, len(output.responses))
        return EXIT_REQUEST_FAILED
    return EXIT_OK


def _write_output(path: Path | None, output) -> None:
    text = output.to_json()
    if path is not None:
        write_atomically(path, text)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()


def _write_interrupted(log, progress: _Progress, interrupt: Interrupted) -> int:
    from trt_llm.runtime.requests.runner import interrupted_output

    if progress.loaded is None:  # before the first request could run: there is nothing to keep
        log.error("interrupted (%s) before any request ran; nothing written", interrupt.name)
        return interrupt.exit_status
    output = interrupted_output(progress.loaded, progress.settings, progress.finished,
                                f"interrupted ({interrupt.name}) before this request finished")
    _write_output(progress.output_path, output)
    where = f" to {progress.output_path}" if progress.output_path else ""
    log.error("interrupted (%s): wrote %d finished responses%s, %d marked interrupted", interrupt.name,
              len(progress.finished), where, len(output.responses) - len(progress.finished))
    return interrupt.exit_status


if __name__ == "__main__":
    sys.exit(main())
