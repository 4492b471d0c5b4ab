"""One batch of sequences to completion: the simplest way to decode with an engine (benchmarks and
tests use it; `trt-llm-run` drives EngineCore itself, runtime/requests/runner.py and continuous.py).

    generate(model, [Sequence(prompt_ids, max_new_tokens)], Sampler([SamplingParams(temperature=0.0)]))
"""

from __future__ import annotations

from trt_llm.runtime.engine.engine_core import EngineCore, EngineRequest
from trt_llm.runtime.engine.model import Model
from trt_llm.runtime.sampling.sampler import Sampler
from trt_llm.runtime.engine.sequence import Sequence
from trt_llm.runtime.engine.threads import leaves_cores_to_the_engine


@leaves_cores_to_the_engine
def generate(model: Model, sequences: list[Sequence], sampler: Sampler, num_logprobs: int = 0, profiler=None,
             strategy=None) -> None:
    """Run `sequences` as one static batch, filling in `generated` and `finish_reason`; sequence i
    samples with row i of `sampler`. strategy: runtime.decoding's Vanilla (the default) or Eagle."""
    core = EngineCore(model, len(sequences), "static", profiler=profiler, strategy=strategy, sampler=sampler)
    for row, sequence in enumerate(sequences):
        core.add_request(EngineRequest(row, sequence, sampler.params[row], num_logprobs=num_logprobs, row=row))
    core.run_to_completion()
