"""Prometheus metrics of one server (GET /metrics), in a registry of its own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

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

    def watch_context_cache(self, cache) -> None:
        """Report the context cache (runtime/cache/context_cache.py) at every scrape."""
        self.registry.register(_ContextCacheCollector(cache))


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
