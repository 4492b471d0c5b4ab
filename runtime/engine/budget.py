"""How many prompt tokens a prefill pass may take while other rows decode.

At most `limit` (the prefill chunk). With a latency target T, also as many as keep the running
streams' time between tokens within T decode steps: the decode step's time and each pass's time are
measured, and after each pass the budget is scaled by what the pass was allowed over what it took,
so it settles where a pass costs what the target allows, on whatever hardware (a token of prefill
costs a CPU about as much as a decode step costs it for several rows; a GPU reads its weights once
for dozens). A pass mixed with the decode step (vanilla decoding) may cost T steps; a pass between
two decode steps (EAGLE) T - 1, the step itself being the rest.
"""

from __future__ import annotations

START = 16  # the budget before anything is measured


class PrefillBudget:
    def __init__(self, limit: int | None, target: float | None = None):
        """limit: the most prompt tokens a pass takes (None: no limit); target: the streams' time
        between tokens while prompts go in, in decode steps (None: only the limit)."""
        self.limit, self.target = limit, target
        self.tokens = limit if target is None else min(limit or START, START)
        self.decode_seconds: float | None = None  # a decode step's time, smoothed

    def decoded(self, seconds: float) -> None:
        """A decode step alone took `seconds`."""
        self.decode_seconds = seconds if self.decode_seconds is None else 0.7 * self.decode_seconds + 0.3 * seconds

    def prefilled(self, seconds: float, tokens: int, mixed: bool) -> None:
        """A pass that took `tokens` prompt tokens while rows decoded took `seconds` (with their decode
        step when `mixed`)."""
        if self.target is None or self.decode_seconds is None or tokens < 1:
            return
        step = self.decode_seconds
        allowed = (self.target - 1.0) * step  # the pass's share beyond a decode step
        spent = max(seconds - step, 1e-6) if mixed else max(seconds, 1e-6)
        scaled = int(tokens * allowed / spent + 1e-6)  # floor: a pass at most what the target allows
        self.tokens = max(1, scaled if self.limit is None else min(self.limit, scaled))
