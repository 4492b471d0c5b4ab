"""Where a run's time goes: stage timings and token counts, summarised as the profile file."""

from __future__ import annotations

import os
import resource
import statistics
import time
from collections import defaultdict
from contextlib import contextmanager

from trt_llm.schemas.profile import Profile, StageStats, StartupStats


def process_started() -> float | None:
    """When this process started, on time.perf_counter's clock (Linux: its start time in
    /proc/self/stat, in clock ticks since boot; None elsewhere)."""
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        ticks = int(fields[19])  # field 22 of the whole line: starttime
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
        now = time.perf_counter()
        return now - (since_boot - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def _percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    index = max(0, min(len(sorted_values) - 1, round(q / 100 * len(sorted_values) + 0.5) - 1))
    return sorted_values[index]


def stage_stats(values_ms: list[float]) -> StageStats:
    ordered = sorted(values_ms)
    return StageStats(count=len(ordered), total_ms=sum(ordered), min_ms=ordered[0], max_ms=ordered[-1],
                      mean_ms=statistics.fmean(ordered), median_ms=statistics.median(ordered),
                      p95_ms=_percentile(ordered, 95), p99_ms=_percentile(ordered, 99))


class Profiler:
    def __init__(self):
        self.started = time.perf_counter()
        process = process_started()
        # A start "after" now is a clock we misread: then the run's start stands in for it.
        self.process_started = process if process is not None and process <= self.started else self.started
        self.first_token_at: float | None = None  # the run's first token, on perf_counter's clock
        self.stages: dict[str, list[float]] = defaultdict(list)
        self.counts: dict[str, int] = defaultdict(int)
        self.seconds: dict[str, float] = defaultdict(float)  # audio seconds of the requests, and encoded
        self.ttft_ms: dict[int, float] = {}
        self.strategy = "none"  # the run's decoding strategy (LoadedEngine.engine_core)
        self.speculation: dict[int, object] = {}  # request index -> its sequence.SpeculationCounts
        self.cache: dict[str, int] | None = None  # what a row of the pool holds (cache_set.cache_bytes)

    @contextmanager
    def stage(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.stages[name].append((time.perf_counter() - start) * 1000)

    def first_token(self, at: float | None) -> None:
        """A request's first token was chosen at `at` (perf_counter): the earliest is the run's."""
        if at is not None and (self.first_token_at is None or at < self.first_token_at):
            self.first_token_at = at

    def count(self, name: str, n: int = 1) -> None:
        self.counts[name] += n

    def add_seconds(self, name: str, seconds: float) -> None:
        self.seconds[name] += seconds

    def summary(self) -> Profile:
        wall = time.perf_counter() - self.started
        prefill_ms = sum(self.stages.get("prefill", []))
        decode_ms = sum(self.stages.get("decode_step", []))
        computed, generated = self.counts["prefill_computed_tokens"], self.counts["decode_tokens"]
        ttfts = sorted(self.ttft_ms.values())
        return Profile(
            prefill={"runs": len(self.stages.get("prefill", [])), "reused_tokens": self.counts["prefill_reused_tokens"],
                     "computed_tokens": computed,
                     "tokens_per_second": computed / prefill_ms * 1000 if prefill_ms else 0.0,
                     "ms_per_token": prefill_ms / computed if computed else 0.0},
            generation={"runs": len(self.stages.get("decode_step", [])), "generated_tokens": generated,
                        "tokens_per_second": generated / decode_ms * 1000 if decode_ms else 0.0,
                        "ms_per_token": decode_ms / generated if generated else 0.0},
            speculative={"iterations": self.counts["spec_rounds"], "generated_tokens": self.counts["spec_emitted"],
                         "mean_accepted_length": (self.counts["spec_emitted"] / self.counts["spec_rounds"]
                                                  if self.counts["spec_rounds"] else 0.0),
                         "proposed_tokens": self.counts["spec_proposed"], "accepted_tokens": self.counts["spec_accepted"],
                         "strategy": self.strategy,
                         "per_request": {str(k): {"passes": c.passes, "proposed_tokens": c.proposed,
                                                  "accepted_tokens": c.accepted,
                                                  "mean_accepted_length": c.emitted / c.passes}
                                         for k, c in sorted(self.speculation.items())}},
            # images and image tokens of the requests; the encoder's time per token it encoded (an image
            # sent again comes from its cache)
            multimodal={"images": self.counts["images"], "image_tokens": self.counts["image_tokens"],
                        "ms_per_token": (sum(self.stages.get("vision_encode", [])) / self.counts["vision_encoded_tokens"]
                                         if self.counts["vision_encoded_tokens"] else 0.0),
                        # clips and their seconds; the encoder's time per second of audio it encoded; the
                        # run's wall time per second of the requests' audio (< 1: faster than real time)
                        "clips": self.counts["clips"], "audio_seconds": self.seconds["audio_seconds"],
                        "audio_encoder_ms_per_second": (
                            sum(self.stages.get("audio_encode", [])) / self.seconds["audio_encoded_seconds"]
                            if self.seconds["audio_encoded_seconds"] else 0.0),
                        "real_time_factor": wall / self.seconds["audio_seconds"] if self.seconds["audio_seconds"] else 0.0},
            time_to_first_token={
                "requests": len(ttfts), "mean_ms": statistics.fmean(ttfts) if ttfts else 0.0,
                "median_ms": statistics.median(ttfts) if ttfts else 0.0,
                "p95_ms": _percentile(ttfts, 95) if ttfts else 0.0, "max_ms": ttfts[-1] if ttfts else 0.0,
                "per_request_ms": {str(k): v for k, v in sorted(self.ttft_ms.items())}},
            stages={name: stage_stats(values) for name, values in sorted(self.stages.items()) if values},
            startup=StartupStats(
                before_run_ms=(self.started - self.process_started) * 1000,
                to_first_token_ms=((self.first_token_at - self.process_started) * 1000
                                   if self.first_token_at is not None else 0.0)),
            cache=self.cache,
            # ru_maxrss is in KiB on Linux.
            peak_memory_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            wall_time_s=wall,
        )


def format_summary(profile: Profile) -> str:
    p = profile
    lines = [
        f"prefill:    {p.prefill.runs} runs, {p.prefill.computed_tokens} tokens computed, "
        f"{p.prefill.reused_tokens} reused, {p.prefill.tokens_per_second:.1f} tok/s, {p.prefill.ms_per_token:.2f} ms/token",
        f"generation: {p.generation.runs} steps, {p.generation.generated_tokens} tokens, "
        f"{p.generation.tokens_per_second:.1f} tok/s, {p.generation.ms_per_token:.2f} ms/token",
        f"time to first token: mean {p.time_to_first_token.mean_ms:.1f} ms, median "
        f"{p.time_to_first_token.median_ms:.1f} ms, p95 {p.time_to_first_token.p95_ms:.1f} ms over "
        f"{p.time_to_first_token.requests} requests",
        *([f"images: {p.multimodal.images}, {p.multimodal.image_tokens} image tokens, vision encoder "
           f"{p.multimodal.ms_per_token:.3f} ms per image token"] if p.multimodal.images else []),
        *([f"audio: {p.multimodal.clips} clips, {p.multimodal.audio_seconds:.1f} s, audio encoder "
           f"{p.multimodal.audio_encoder_ms_per_second:.1f} ms per second of audio, real-time factor "
           f"{p.multimodal.real_time_factor:.3f}"] if p.multimodal.clips else []),
        f"peak memory: {p.peak_memory_mb:.0f} MB, wall time {p.wall_time_s:.2f} s",
        *([f"cache per row: {p.cache.attention_bytes_per_token / 1024:.1f} KiB a token, "
           f"{p.cache.state_bytes_per_row / 2**20:.2f} MiB of recurrent states ({p.cache.recurrent_layers} layers)"]
          if p.cache else []),
        *([f"startup: {p.startup.before_run_ms:.0f} ms before the run (interpreter, imports), first token "
           f"{p.startup.to_first_token_ms:.0f} ms after the process started"] if p.startup else []),
        "stage               count    mean ms  median ms     p95 ms     p99 ms     max ms",
    ]
    for name, s in p.stages.items():
        lines.append(f"{name:<18}{s.count:>7}{s.mean_ms:>11.2f}{s.median_ms:>11.2f}{s.p95_ms:>11.2f}"
                     f"{s.p99_ms:>11.2f}{s.max_ms:>11.2f}")
    return "\n".join(lines)
