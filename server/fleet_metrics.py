"""The metrics a fleet's router reads, under vLLM's names (llm-d's endpoint picker, the Gateway API
inference extension's EPP, scrape these names by default: --total-queued-requests-metric,
--total-running-requests-metric, --kv-cache-usage-percentage-metric, --lora-info-metric,
--cache-info-metric):

    vllm:num_requests_waiting    requests waiting for a row: submitted and not admitted, and paused rows
                                 (trt_llm_num_requests_waiting summed over priorities)
    vllm:num_requests_running    requests holding a row of the running batch (trt_llm_rows_in_flight)
    vllm:kv_cache_usage_perc     the batch pool's rows in use over the rows it has (--max-batch-size),
                                 a fraction from 0 to 1 as vLLM's; vllm:gpu_cache_usage_perc, its older
                                 name, too. Our pool gives each running request a whole row of
                                 max_kv_cache_capacity token slots (no paging), so rows, not tokens, are
                                 what runs out: at 1 a new request waits. The tokens the rows hold over
                                 their slots are trt_llm_kv_cache_usage_ratio{unit="tokens"}.
    vllm:lora_requests_info      value: when it was read (unix seconds); labels running_lora_adapters and
                                 waiting_lora_adapters (the adapters, by the names they are served as,
                                 of the running and of the waiting requests, comma-separated, each once)
                                 and max_lora (the adapters a batch holds at once: one a row)
    vllm:cache_config_info       value 1; labels block_size (the context cache's block, in tokens, the
                                 unit of its KV events) and num_gpu_blocks (the pool's rows)

Read at every scrape from the engine thread's core: lists copied, never locked (a scrape may see a
step half way; the next one is right).
"""

from __future__ import annotations

import time

from prometheus_client.core import GaugeMetricFamily


class FleetCollector:
    def __init__(self, engine, max_rows: int, row_tokens: int, block_tokens: int):
        """max_rows: the server's rows (--max-batch-size); row_tokens: a row's token slots (the engine's
        max_kv_cache_capacity); block_tokens: the context cache's block."""
        self.engine, self.max_rows, self.row_tokens, self.block_tokens = engine, max_rows, row_tokens, block_tokens

    def _requests(self) -> tuple[list, list]:
        core = self.engine.core
        if core is None:
            return [], []
        return list(core.scheduler.running), list(core.scheduler.waiting)

    def collect(self):
        running, waiting = self._requests()
        queued = sum(self.engine.waiting().values())
        yield GaugeMetricFamily("vllm:num_requests_waiting", "Requests waiting for a row (paused ones included)",
                                value=queued)
        yield GaugeMetricFamily("vllm:num_requests_running", "Requests in the running batch", value=len(running))
        rows = min(len(running), self.max_rows) / self.max_rows
        for name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
            yield GaugeMetricFamily(name, "The batch pool's rows in use over its rows (0 to 1)", value=rows)
        usage = GaugeMetricFamily("trt_llm_kv_cache_usage_ratio",
                                  "The batch pool's use: rows in use over its rows; token slots the running rows "
                                  "hold over all rows' slots", labels=["unit"])
        usage.add_metric(["rows"], rows)
        usage.add_metric(["tokens"], self._token_usage(running))
        yield usage
        info = GaugeMetricFamily("vllm:lora_requests_info", "The LoRA adapters of the running and waiting requests",
                                 labels=["running_lora_adapters", "waiting_lora_adapters", "max_lora"])
        info.add_metric([_adapters(running), _adapters(waiting), str(self.max_rows)], time.time())
        yield info
        config = GaugeMetricFamily("vllm:cache_config_info", "The context cache's block size and the pool's rows",
                                   labels=["block_size", "num_gpu_blocks"])
        config.add_metric([str(self.block_tokens), str(self.max_rows)], 1)
        yield config

    def _token_usage(self, running) -> float:
        # A row holds its prefilled prompt and every generated token but the last (fed at the next step).
        held = sum((r.sequence.prefilled or 0) + max(len(r.sequence.generated) - 1, 0) for r in running)
        return held / (self.row_tokens * self.max_rows)


def _adapters(requests) -> str:
    names = dict.fromkeys(r.adapter.name for r in requests if getattr(r, "adapter", None) is not None)
    return ",".join(names)
