"""Prometheus metrics of one server (GET /metrics), in a registry of its own.

Memory: the process's (prometheus_client's process_* metrics, read from /proc: Linux only), its peak
resident set, and the bytes the running batch's KV pools hold (server/memory.py). Registries are per
app: several apps in one process (the tests; a Ray Serve replica is a process of its own) each report
the same process.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from trt_llm.server import memory

# Seconds: from a few ms (a decode step on a GPU) to a minute (a long prompt on a busy CPU).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("trt_llm_requests", "Requests answered, by route and HTTP status",
                                ["route", "status"], registry=r)
        self.prompt_tokens = Counter("trt_llm_prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.generation_tokens = Counter("trt_llm_generation_tokens", "Tokens generated", registry=r)
        self.aborted = Counter("trt_llm_aborted_requests",
                               "Requests stopped before they finished (client gone, timeout)", registry=r)
        self.time_to_first_token = Histogram("trt_llm_time_to_first_token_seconds",
                                             "From submission to the first generated token",
                                             buckets=LATENCY_BUCKETS, registry=r)
        self.inter_token_latency = Histogram("trt_llm_inter_token_latency_seconds",
                                             "Between consecutive generated tokens of one request",
                                             buckets=LATENCY_BUCKETS, registry=r)
        self.queue_depth = Gauge("trt_llm_queue_depth", "Requests waiting for a row", registry=r)
        self.rows_in_flight = Gauge("trt_llm_rows_in_flight", "Requests in the running batch", registry=r)
        self.cached_tokens = Counter("trt_llm_prompt_cached_tokens",
                                     "Prompt tokens restored from the context cache instead of computed", registry=r)
        self.rejections = Counter("trt_llm_request_rejections",
                                  "Requests refused (queue_full: answered 429) or ended at their body's timeout "
                                  "(timeout: finish_reason timeout)", ["reason"], registry=r)
        for reason in ("queue_full", "timeout"):
            self.rejections.labels(reason=reason)  # both reported from the start, at 0

    def watch_context_cache(self, cache) -> None:
        """Report the context cache (runtime/cache/context_cache.py) at every scrape."""
        self.registry.register(_ContextCacheCollector(cache))

    def watch_speculation(self, runner) -> None:
        """Report the speculation of `runner` (a LoadedEngine: its EAGLE and prompt lookup counts) at every scrape."""
        self.registry.register(_SpeculationCollector(runner))

    def watch_memory(self, engine) -> None:
        """Report the process's memory and the KV pools of `engine` (a server.engine.ServingEngine)."""
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes, ...: read from /proc
        self.registry.register(_MemoryCollector(engine))

    def watch_fleet(self, engine, max_rows: int, row_tokens: int, block_tokens: int) -> None:
        """Report what a fleet's router reads, under vLLM's names (server/fleet_metrics.py)."""
        from trt_llm.server.fleet_metrics import FleetCollector

        self.registry.register(FleetCollector(engine, max_rows, row_tokens, block_tokens))

    def watch_scheduling(self, engine) -> None:
        """Report `engine`'s waiting requests by priority and its paused rows at every scrape."""
        self.registry.register(_SchedulingCollector(engine))


class _SchedulingCollector:
    def __init__(self, engine):
        self.engine = engine

    def collect(self):
        waiting = GaugeMetricFamily("trt_llm_num_requests_waiting",
                                    "Requests waiting for a row (paused ones included), by priority class",
                                    labels=["priority"])
        counts = self.engine.waiting()
        for priority in sorted(counts or {0: 0}):
            waiting.add_metric([str(priority)], counts.get(priority, 0))
        yield waiting
        yield GaugeMetricFamily("trt_llm_num_requests_paused",
                                "Running requests paused for a higher priority, waiting to resume",
                                value=len(self.engine.paused))


class _ContextCacheCollector:
    def __init__(self, cache):
        self.cache = cache

    def collect(self):
        stats, cache = self.cache.stats, self.cache
        for name, help_text, value in (
                ("hits", "Requests that restored a cached prefix", stats["hits"]),
                ("misses", "Requests that looked one up and found none", stats["misses"]),
                ("evictions", "Cached records evicted by the budget", cache.evictions)):
            yield CounterMetricFamily(f"trt_llm_context_cache_{name}", help_text, value=value)
        yield GaugeMetricFamily("trt_llm_context_cache_bytes", "Bytes of keys and values held", value=cache.size_bytes)
        yield GaugeMetricFamily("trt_llm_context_cache_entries", "Blocks and kept system prompts held", value=len(cache))


class _SpeculationCollector:
    """vLLM's spec_decode counters, by strategy: verification passes (per row), the tokens they emitted, and
    for prompt lookup the tokens proposed and accepted (its acceptance rate: accepted / draft tokens)."""

    def __init__(self, runner):
        self.runner = runner

    def collect(self):
        from trt_llm.runtime.decoding.draft import SpecStats
        from trt_llm.runtime.decoding.lookup import LookupStats

        drafted = getattr(self.runner, "spec_stats", None) or SpecStats()
        lookup = getattr(self.runner, "lookup_stats", None) or LookupStats()
        kind = getattr(self.runner, "draft_kind", None) or "eagle"  # the engine's draft: eagle or mtp
        for name, help_text, values in (
                ("num_drafts", "Verification passes with a proposal, counted per row",
                 {kind: drafted.rounds, "prompt-lookup": lookup.rounds}),
                ("num_emitted_tokens", "Tokens those passes emitted", {kind: drafted.emitted,
                                                                      "prompt-lookup": lookup.emitted}),
                ("num_draft_tokens", "Tokens proposed", {kind: drafted.proposed, "prompt-lookup": lookup.proposed}),
                ("num_accepted_tokens", "Proposed tokens the base took",
                 {kind: drafted.accepted, "prompt-lookup": lookup.accepted})):
            family = CounterMetricFamily(f"trt_llm_spec_decode_{name}", help_text, labels=["strategy"])
            for strategy, value in values.items():
                family.add_metric([strategy], value)
            yield family


class _MemoryCollector:
    def __init__(self, engine):
        self.engine = engine

    def collect(self):
        peak = memory.peak_resident_bytes()
        if peak is not None:
            yield GaugeMetricFamily("trt_llm_peak_resident_memory_bytes",
                                    "The process's peak resident memory since it started (VmHWM)", value=peak)
        pools = GaugeMetricFamily(
            "trt_llm_kv_pool_bytes",
            "Bytes allocated for the running batch's caches (keys, values, states), by pool (base, draft) and "
            "memory (host, device); allocated once and grown, never shrunk. Zero-filled host pages never "
            "written are not resident, so this can exceed what the pool adds to the resident memory",
            labels=["pool", "memory"])
        for pool, cache in memory.engine_pools(self.engine.core):
            for where, nbytes in memory.pool_bytes(cache).items():
                pools.add_metric([pool, where], nbytes)
        yield pools
