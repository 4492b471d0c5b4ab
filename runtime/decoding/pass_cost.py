"""How long each speculation is, given what a wider pass costs: the plan of one prompt-lookup pass.

A verification pass of width w (every row of a pass is as wide as its widest: the graph is dense) costs
about t(B, w) = a_B (1 + slope_B (w - 1)) for a batch of B rows; `PassCost` fits slope_B by least squares
over the passes it has timed. How much a wider pass costs differs by an order of magnitude between
engines: SmolLM2 on 2 cores (benchmarks/results/2026-12-07/prompt_lookup_attention.json), fp32 0.04 at
batch 1 and 0.3 at batch 4, int4 on our kernels 0.24 at batch 1 and 0.4 at batch 4 (its matmuls are
bound by memory at one row, by arithmetic at several: each row's int8 dots are work of their own).

A row's chain of k tokens takes p + p^2 + ... + p^k of them on average, p its acceptance (`Acceptance`:
the share of verified tokens taken, recent passes weighing more; prompt lookup keeps one per length of the
match its chains came from, `MatchAcceptance`). `plan` picks the width whose
tokens per unit of cost are the most, vanilla's single token a row (width 1, cost 1) included and
preferred unless a wider pass promises MARGIN times its rate, so a batch that copies nothing, or an
engine whose wider passes cost too much, decodes as vanilla does. In a static batch only the rows
furthest from their end count (`behind`): the batch lasts as long as its last row. On a
recurrent model a row that refuses part of its chain passes its taken tokens again (recurrent.replay):
a chain there costs that pass too, with the chance it is needed.
"""

from __future__ import annotations

from collections import deque

PRIOR_SLOPE = 0.3  # until two widths were timed at a batch size
# A wider pass is taken only where it promises this many times vanilla's tokens per unit of cost: the
# acceptance is estimated from a few passes and a pass's time moves by 10 % on a shared machine, so a
# promised gain of a few percent was as often a loss (SmolLM2 fp32, free chat at batch 4: 0.90x vanilla
# without a margin, 0.97x with 1.15; benchmarks/results/2026-12-07/prompt_lookup_{attention,margin}.json).
MARGIN = 1.15
SAMPLES = 48  # the passes a fit reads, per batch size


class PassCost:
    def __init__(self):
        self._samples: dict[int, deque] = {}

    def record(self, batch: int, width: int, seconds: float) -> None:
        self._samples.setdefault(batch, deque(maxlen=SAMPLES)).append((width - 1, seconds))

    def slope(self, batch: int) -> float:
        """What each token past the first adds to a pass of `batch` rows, in passes of width 1."""
        samples = self._samples.get(batch, ())
        n = len(samples)
        if n < 2 or len({x for x, _ in samples}) < 2:
            return PRIOR_SLOPE
        mean_x = sum(x for x, _ in samples) / n
        mean_t = sum(t for _, t in samples) / n
        spread = sum((x - mean_x) ** 2 for x, _ in samples)
        rise = sum((x - mean_x) * (t - mean_t) for x, t in samples) / spread
        base = mean_t - rise * mean_x
        if base <= 0:
            return PRIOR_SLOPE
        return min(max(rise / base, 0.01), 4.0)


class Acceptance:
    """A row's share of verified tokens taken: counts that decay by `DECAY` a pass, from a prior that
    tries; a row whose chains go unverified drifts back toward the prior (`idle`), so it is tried again."""

    DECAY, DRIFT = 0.8, 0.97
    PRIOR = (2.0, 1.0)  # (taken, refused): 0.67

    def __init__(self):
        self.taken, self.refused = self.PRIOR

    @property
    def p(self) -> float:
        return self.taken / (self.taken + self.refused)

    def verified(self, proposed: int, taken: int) -> None:
        self.taken = self.taken * self.DECAY + taken
        self.refused = self.refused * self.DECAY + (taken < proposed)

    def idle(self) -> None:
        prior_taken, prior_refused = self.PRIOR
        self.taken = prior_taken + (self.taken - prior_taken) * self.DRIFT
        self.refused = prior_refused + (self.refused - prior_refused) * self.DRIFT


class MatchAcceptance:
    """An `Acceptance` per length of the match a chain was proposed from (runtime/decoding/lookup.py):
    2, 3, ... up to LONGEST, which also counts the longer ones."""

    LONGEST = 8

    def __init__(self):
        self._by_length: dict[int, Acceptance] = {}

    def __getitem__(self, matched: int) -> Acceptance:
        return self._by_length.setdefault(min(matched, self.LONGEST), Acceptance())


def expected_taken(p: float, k: int) -> float:
    """Tokens a chain of k takes on average when each is taken with p after the ones before it."""
    return k if p >= 1.0 else p * (1 - p ** k) / (1 - p)


def plan(rows: list[tuple[int, float]], slope: float, replay: float = 0.0,
         worth: list[float] | None = None) -> list[int]:
    """Each row's chain length this pass (0: none). rows: (tokens it may propose, its acceptance p);
    slope: PassCost.slope; replay: what passing a row's taken tokens again costs, in passes of the batch
    (0 without recurrent layers); worth: what a token of each row is worth (default 1 each; see
    `behind`)."""
    worth = worth or [1.0] * len(rows)
    best_rate, best = sum(worth) * MARGIN, [0] * len(rows)  # width 1: a token a row for one pass
    for width in range(2, max((n for n, _ in rows), default=0) + 2):
        lengths, tokens = [], sum(worth)
        for (n, p), w in zip(rows, worth):
            k = min(n, width - 1)
            value = expected_taken(p, k) - replay * (1 - p ** k) if k else 0.0
            if value <= 0:
                k, value = 0, 0.0
            lengths.append(k)
            tokens += w * value
        if max(lengths) < width - 1:
            continue  # (no chain fills this width: a narrower one did better)
        rate = tokens / (1 + slope * (width - 1))
        if rate > best_rate:
            best_rate, best = rate, lengths
    return best


def behind(left: list[int]) -> list[float]:
    """What a token of each row is worth to a batch that ends when its last row does (a static batch:
    no request waits for a freed row): only the rows furthest from their end (`left`: the tokens each
    may still generate) bring the end nearer; a token of a row ahead brings nothing. Measured, SmolLM2
    int4 chatting at batch 4 on 2 cores (a pass of 9 tokens a row costs 5 single-token steps): counting
    every row's tokens, three rows that repeated themselves took wide passes and finished early, while the
    fourth, which copied nothing, ran its 128 steps all the same: 0.91x vanilla."""
    most = max(left, default=0)
    return [1.0 if n == most else 0.0 for n in left]
