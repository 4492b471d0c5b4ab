"""A sampler that answers from a script: the engine runs as ever (prefill, decode steps, the
detokenizer, stop and end-of-sequence checks), but each row's tokens are the script's, in order.
A tiny random model then "writes" a <think> block or a tool call on cue, for the paths that parse
an answer (runtime/text/reasoning.py, server/tool_calls.py)."""

from contextlib import contextmanager

import numpy as np

from trt_llm.runtime.sampling.sampler import Sampler


@contextmanager
def scripted_answers(monkeypatch, token_ids: list[int]):
    """Every request admitted while this holds samples `token_ids` (then their last one, over and over)."""
    add, script = Sampler.add, list(token_ids)

    def scripted_add(self, params, seed=None):
        row = add(self, params, seed)
        self.__dict__.setdefault("_script_at", {})[row] = 0
        return row

    def scripted_sample(self, logits, rows=None, counts=None):
        rows = self._check_rows(np.asarray(logits), rows)
        out = []
        for r in rows:
            at = self._script_at[r]
            self._script_at[r] = at + 1
            out.append(script[min(at, len(script) - 1)])
        return np.array(out, dtype=np.int64)

    with monkeypatch.context() as patch:
        patch.setattr(Sampler, "add", scripted_add)
        patch.setattr(Sampler, "sample", scripted_sample)
        yield
