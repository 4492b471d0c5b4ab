"""Token sampling for the decode loop.

numpy on the host: the engine hands over float32 logits [B, V] (a numpy array), one row per active
sequence. The order is Hugging Face ``generate``'s (``_get_logits_processor``): the logits processors
first, logit bias (its SequenceBiasLogitsProcessor), then the repetition penalty
(RepetitionPenaltyLogitsProcessor: over the prompt and generated tokens), then OpenAI's presence and
frequency penalties (over the generated tokens, where generate puts a caller's own processor); then,
for sampled rows only, the warpers: temperature, top-k, top-p, min-p, and a multinomial draw. Greedy
is argmax of the processed logits (ties to the lowest index, as torch.argmax). The penalties read
each row's token counts (engine/sequence.py's TokenCounts), which the caller passes.

Each request (an "original row") owns its own ``numpy.random.Generator`` (PCG64, seeded from the
request's seed) and takes exactly one uniform draw from it per sampled token, so what it samples
does not depend on which other requests share its batch or where its row sits in the logits;
finished rows leave the batch and ``rows`` maps the current logits rows back to the original ones.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # (engine/sequence.py imports this module)
    from trt_llm.runtime.engine.sequence import TokenCounts

__all__ = ["SamplingParams", "Sampler", "log_softmax_topn", "token_logprob"]


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings.

    temperature 0 means greedy (argmax after bias and penalties); top_k 0 turns top-k off;
    top_p 1.0 turns top-p off; min_p 0 turns min-p off. ``logit_bias`` maps token id -> value
    added to that token's logit (applies to greedy and sampled rows alike, as the penalties do).
    presence_penalty / frequency_penalty (OpenAI's, in [-2, 2], 0 = off): each token generated
    so far loses presence + frequency * its count from its logit. repetition_penalty
    (transformers', > 0, 1 = off): each token of the prompt or generated so far has its logit
    divided by it (multiplied, where the logit is negative).
    """

    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 0.8
    logit_bias: dict[int, float] | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:  # also rejects NaN
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.logit_bias and min(self.logit_bias) < 0:
            raise ValueError("logit_bias token ids must be >= 0")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not 0.0 < self.repetition_penalty < float("inf"):
            raise ValueError(f"repetition_penalty must be > 0 (1 = off), got {self.repetition_penalty}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalised(self) -> bool:
        """Whether sampling this request needs its token counts (a penalty is on)."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0


class Sampler:
    """Samples one token per row; built once per batch of requests.

    ``params[r]`` and ``seeds[r]`` belong to original row r. A None seed is
    replaced by a random one at construction (kept in ``self.seeds`` so a run can
    be reproduced). The same seed gives the same draws everywhere (numpy's PCG64,
    one uniform per sampled token), so the same tokens wherever the logits agree,
    whatever backend computed them.
    """

    def __init__(self, params: Sequence[SamplingParams], seeds: Sequence[int | None] | None = None):
        if seeds is None:
            seeds = [None] * len(params)
        if len(seeds) != len(params):
            raise ValueError(f"{len(params)} params but {len(seeds)} seeds")
        self.params: list[SamplingParams] = []
        self.seeds: list[int] = []
        self._greedy: list[bool] = []
        self._filter_key: list[tuple[float, int, float, float]] = []
        self._gens: list[np.random.Generator | None] = []  # made on a row's first sampled token
        # Bias preprocessed once into (ids, values, max id); None = row has no bias.
        self._bias: list[tuple[np.ndarray, np.ndarray, int] | None] = []
        self._sampled_rows = 0  # rows that are not greedy
        self._free: list[int] = []  # released rows, reused by add()
        for p, seed in zip(params, seeds):
            self.add(p, seed)

    def add(self, params: SamplingParams, seed: int | None = None) -> int:
        """One more original row (a request joining a running engine); returns its row index, a
        released one when there is one (a server's sampler stays as large as its batch)."""
        if params.logit_bias:
            ids = np.array(list(params.logit_bias.keys()), dtype=np.int64)
            vals = np.array(list(params.logit_bias.values()), dtype=np.float32)
            bias = (ids, vals, int(ids.max()))
        else:
            bias = None
        row = {"params": params, "seeds": secrets.randbits(63) if seed is None else int(seed),
               "_greedy": params.greedy,
               "_filter_key": (params.temperature, params.top_k, params.top_p, params.min_p),
               "_gens": None, "_bias": bias}
        self._sampled_rows += not params.greedy
        if self._free:
            index = self._free.pop()
            for name, value in row.items():
                getattr(self, name)[index] = value
            return index
        for name, value in row.items():
            getattr(self, name).append(value)
        return len(self.params) - 1

    def release(self, row: int) -> None:
        """Row `row` is done (its request left): its generator and bias go, and add() reuses it."""
        if not self._greedy[row]:
            self._sampled_rows -= 1
        self._greedy[row], self._gens[row], self._bias[row] = True, None, None
        self._free.append(row)

    @property
    def _all_greedy(self) -> bool:
        return self._sampled_rows == 0

    # -- public API ---------------------------------------------------------

    def sample(self, logits: np.ndarray, rows: Sequence[int] | None = None,
               counts: Sequence[TokenCounts | None] | None = None) -> np.ndarray:
        """Next token per row of ``logits`` [B, V] -> int64 [B].

        ``rows[i]`` is the original row index of logits row i (default: identity,
        which requires B == len(params)). ``counts[i]``: the token counts of logits row i's
        sequence (engine/sequence.py's ``Sequence.counts``), needed where its request has a
        penalty (None elsewhere).
        """
        logits = np.asarray(logits)
        rows = self._check_rows(logits, rows)
        logits = self._penalised(self._biased(logits, rows), logits, rows, counts)  # processors, greedy too
        out = logits.argmax(-1).astype(np.int64, copy=False)  # greedy rows; sampled rows are overwritten below
        if self._all_greedy or all(self._greedy[r] for r in rows):
            return out
        # Rows with the same settings are filtered together (a few array ops per group rather than
        # per row). Every op works row by row on same-shaped rows, so a row's result does not depend
        # on its group-mates.
        groups: dict[tuple[float, int, float, float], list[int]] = {}
        for i, r in enumerate(rows):
            if not self._greedy[r]:
                groups.setdefault(self._filter_key[r], []).append(i)
        for (temperature, top_k, top_p, min_p), idx in groups.items():
            part = logits if len(idx) == len(logits) else logits[idx]  # (idx is then every row, in order)
            for i, (weights, ids) in zip(idx, _filter(part, temperature, top_k, top_p, min_p)):
                # One uniform draw per row from that request's own generator.
                choice = _draw(weights, self._generator(rows[i]).random())
                out[i] = choice if ids is None else ids[choice]
        return out

    def processed(self, logits: np.ndarray, rows: Sequence[int] | None = None,
                  counts: Sequence[TokenCounts | None] | None = None) -> np.ndarray:
        """The logits processors of ``generate`` on ``logits`` [B, V]: each row's logit bias, then its
        repetition penalty, then its presence and frequency penalties (``counts`` as in sample). The
        input itself is never modified (returned as is when no active row has any of them)."""
        logits = np.asarray(logits)
        rows = self._check_rows(logits, rows)
        return self._penalised(self._biased(logits, rows), logits, rows, counts)

    def _penalised(self, logits: np.ndarray, given: np.ndarray, rows: Sequence[int],
                   counts: Sequence[TokenCounts | None] | None) -> np.ndarray:
        """`logits` (the biased `given`, or `given` itself) with each penalised row's penalties."""
        todo = [i for i, r in enumerate(rows) if self.params[r].penalised]
        if not todo:
            return logits
        if counts is None or len(counts) != len(rows):
            raise ValueError("rows with penalties need their token counts: pass counts= (one per logits row)")
        if logits is given:  # not copied yet: a contiguous copy, the caller's array stays as it is
            logits = np.array(logits, copy=True, order="C")
        dtype = logits.dtype
        for i in todo:
            p, c = self.params[rows[i]], counts[i]
            if c is None:
                raise ValueError(f"row {rows[i]} has penalties but no token counts")
            if p.repetition_penalty != 1.0:
                # transformers' RepetitionPenaltyLogitsProcessor: once per distinct token, whatever its count
                ids = c.seen
                score = logits[i, ids]
                finfo = np.finfo(dtype)  # an extreme penalty: neither 0 nor inf in the logits' dtype (no 0 / 0)
                penalty = dtype.type(min(max(p.repetition_penalty, float(finfo.smallest_subnormal)), float(finfo.max)))
                with np.errstate(over="ignore"):
                    score = np.where(score < 0, score * penalty, score / penalty)
                score[score == np.inf] = finfo.max  # an overflow is its limit, not an inf that makes softmax NaN
                logits[i, ids] = score
            if p.presence_penalty != 0.0 or p.frequency_penalty != 0.0:
                # OpenAI's: logit[t] -= presence * (count[t] > 0) + frequency * count[t], generated tokens only
                ids, n = c.generated
                logits[i, ids] -= dtype.type(p.presence_penalty) + dtype.type(p.frequency_penalty) * n.astype(dtype)
        return logits

    def apply_bias(self, logits: np.ndarray, rows: Sequence[int] | None = None) -> np.ndarray:
        """``logits`` plus each row's logit bias; the input itself is never modified
        (returned as is when no active row has a bias)."""
        logits = np.asarray(logits)
        return self._biased(logits, self._check_rows(logits, rows))

    def _biased(self, logits: np.ndarray, rows: Sequence[int]) -> np.ndarray:
        biased = [(i, self._bias[r]) for i, r in enumerate(rows) if self._bias[r] is not None]
        if not biased:
            return logits
        vocab = logits.shape[-1]
        # a contiguous copy: a broadcast input would otherwise share its memory across rows
        out = np.array(logits, copy=True, order="C")
        for i, (ids, vals, max_id) in biased:
            if max_id >= vocab:
                raise ValueError(f"logit_bias token id {max_id} out of range for vocab {vocab}")
            out[i, ids] += vals.astype(out.dtype, copy=False)
        return out

    def log_softmax_topn(
        self,
        logits: np.ndarray,
        n: int,
        rows: Sequence[int] | None = None,
        include_bias: bool = False,
    ) -> tuple[np.ndarray, np.ndarray]:
        """:func:`log_softmax_topn`, optionally of the biased logits."""
        if include_bias:
            logits = self.apply_bias(logits, rows)
        return log_softmax_topn(logits, n)

    def token_logprob(
        self,
        logits: np.ndarray,
        ids: np.ndarray,
        rows: Sequence[int] | None = None,
        include_bias: bool = False,
    ) -> np.ndarray:
        """:func:`token_logprob`, optionally of the biased logits."""
        if include_bias:
            logits = self.apply_bias(logits, rows)
        return token_logprob(logits, ids)

    # -- internals ----------------------------------------------------------

    def _check_rows(self, logits: np.ndarray, rows: Sequence[int] | None) -> Sequence[int]:
        if logits.ndim != 2:
            raise ValueError(f"logits must be [B, V], got shape {tuple(logits.shape)}")
        batch = logits.shape[0]
        if rows is None:
            if batch != len(self.params):
                raise ValueError(f"{batch} logits rows but {len(self.params)} params; pass rows=")
            return range(batch)
        if len(rows) != batch:
            raise ValueError(f"{batch} logits rows but {len(rows)} entries in rows")
        for r in rows:
            if not 0 <= r < len(self.params):
                raise IndexError(f"row {r} out of range for {len(self.params)} params")
        return rows

    def _generator(self, r: int) -> np.random.Generator:
        gen = self._gens[r]
        if gen is None:
            gen = self._gens[r] = np.random.Generator(np.random.PCG64(self.seeds[r] % (1 << 64)))
        return gen


def _topk(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k largest of each row of x [n, V], sorted descending, ties to the lower id (what a stable
    full sort gives, whatever the batch): (values [n, k], ids [n, k] int64). A partition finds the
    k-th value: no full sort of the vocabulary."""
    vocab = x.shape[-1]
    if k >= vocab:
        ids = np.argsort(-x, axis=-1, kind="stable")
    else:
        ids = np.empty((len(x), k), dtype=np.int64)
        for i, row in enumerate(x):  # row by row: small temporaries, and numpy's partition is per row anyway
            kth = np.partition(row, vocab - k)[vocab - k]
            picked = np.flatnonzero(row >= kth)  # ascending ids
            if len(picked) > k:  # tokens tied at the k-th value: the lowest ids of them
                above = np.flatnonzero(row > kth)
                picked = np.sort(np.concatenate([above, np.flatnonzero(row == kth)[: k - len(above)]]))
            ids[i] = picked
        # The ids ascending, so the stable sort by value breaks ties towards the lower id.
        ids = np.take_along_axis(ids, np.argsort(-np.take_along_axis(x, ids, -1), axis=-1, kind="stable"), -1)
    ids = ids.astype(np.int64, copy=False)
    return np.take_along_axis(x, ids, -1), ids


def _softmax(x: np.ndarray) -> np.ndarray:
    """float32 softmax over the last axis, as torch.softmax: shifted by the row's max."""
    peak = x.max(-1, keepdims=True)
    e = np.exp(x - np.where(np.isfinite(peak), peak, 0.0).astype(x.dtype))
    return e / e.sum(-1, keepdims=True)


def _nucleus(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Which of `probs` [m] (sorted descending) top-p keeps, bool [m]. A token is dropped when the
    tokens strictly above it already reach top_p: the kept prefix is the smallest one with mass >=
    top_p, as in transformers' TopPLogitsWarper. The best token always survives (mass above it is
    0 < top_p); (above > 0: a top_p below float32's smallest number rounds to 0 and must not drop it)."""
    above = probs.cumsum(-1, dtype=np.float32) - probs
    return ~((above >= np.float32(top_p)) & (above > 0))


def _filter(x: np.ndarray, temperature: float, top_k: int, top_p: float,
            min_p: float = 0.0) -> list[tuple[np.ndarray, np.ndarray | None]]:
    """Temperature, top-k, top-p, min-p on (processed) logits x [n, V], as generate() does.

    Returns per row (sampling weights [m], zero for a dropped token: _draw does not need them to sum
    to 1; ids [m] mapping column j to its token id, or None when column j is token j).
    """
    x = x.astype(np.float32, copy=False)  # read only: the caller's logits stay as they are
    if temperature != 1.0:
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            scaled = x / np.float32(temperature)  # float32, where a tiny temperature is 0 or overflows
        peak = scaled.max(-1)
        # A temperature so small that a row's logits overflow (in float32 it may even be 0): its limit,
        # the best token (ties shared), instead of the inf - inf that makes every weight NaN.
        bad = np.isnan(scaled).any(-1) | (peak == np.inf) | ((peak == -np.inf) & np.isfinite(x.max(-1)))
        if bad.any():
            best = x[bad] == x[bad].max(-1, keepdims=True)
            scaled[bad] = np.where(best, np.float32(0.0), np.float32(-np.inf))
        x = scaled
    if 0 < top_k < x.shape[-1]:
        # top-k first: sorted descending, which is what top-p needs next.
        x, ids = _topk(x, top_k)
        probs = _softmax(x)
        if top_p < 1.0:  # 1.0 means off (as in generate), not "keep all but fp dust"
            probs[~_nucleus(probs, top_p)] = 0.0
        return [(_min_p(row, min_p), row_ids) for row, row_ids in zip(probs, ids)]
    probs = _softmax(x)
    if top_p >= 1.0:
        return [(_min_p(row, min_p), None) for row in probs]
    rows = []
    for row in probs:
        # The nucleus is usually a few tokens of the vocabulary: the best k, sorted, widened until its
        # last one is dropped (then every later one is too), instead of sorting all V.
        k = 64
        while True:
            values, ids = _topk(row[None], min(k, len(row)))
            keep = _nucleus(values[0], top_p)
            if not keep[-1] or k >= len(row):
                break
            k *= 8
        rows.append((_min_p(np.where(keep, values[0], np.float32(0.0)), min_p), ids[0]))
    return rows


def _min_p(weights: np.ndarray, min_p: float) -> np.ndarray:
    """transformers' MinPLogitsWarper on the probabilities that survived the filters before it
    (weights [m], zero for a dropped token): a token whose probability is below min_p times the
    best one's is dropped (the best token always stays). A ratio of probabilities, so it does not
    matter that top-p's survivors are not renormalised here. In place; 0 = off."""
    if min_p > 0.0:
        weights[weights < np.float32(min_p) * weights.max()] = 0.0
    return weights


def _draw(weights: np.ndarray, u: float) -> int:
    """The column that uniform draw u in [0, 1) picks from non-negative weights [m] (inverse CDF in
    float64); a zero-weight column is never picked."""
    cdf = np.cumsum(weights, dtype=np.float64)
    if not cdf[-1] > 0 or not np.isfinite(cdf[-1]):
        raise ValueError("sampling weights contain NaN or inf, or none is positive")
    choice = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    if choice >= len(cdf) or weights[choice] <= 0:  # u * total rounded up to the total
        choice = int(np.flatnonzero(weights > 0)[-1])
    return choice


def _logsumexp(x: np.ndarray) -> np.ndarray:
    """log(sum(exp(x))) over the last axis, keepdims, in float32: max + log-sum-exp of the shifted row."""
    peak = x.max(-1, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, np.float32(0.0)).astype(np.float32)
    return peak + np.log(np.exp(x - peak).sum(-1, keepdims=True))


def log_softmax_topn(logits: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The n most likely tokens per row under log-softmax (temperature 1) of
    ``logits`` [B, V]: (values [B, n] float32 sorted descending, ids [B, n] int64).
    n is clipped to V."""
    logits = np.asarray(logits, dtype=np.float32)
    values, ids = _topk(logits, min(n, logits.shape[-1]))
    # log_softmax(x)_i = x_i - logsumexp(x); no need to normalise the whole vocab.
    return values - _logsumexp(logits), ids


def token_logprob(logits: np.ndarray, ids) -> np.ndarray:
    """log-softmax (temperature 1) of token ids[i] in row i of ``logits`` [B, V] -> [B] float32."""
    logits = np.asarray(logits, dtype=np.float32)
    ids = np.asarray(ids, dtype=np.int64).reshape(-1, 1)
    return (np.take_along_axis(logits, ids, -1) - _logsumexp(logits))[:, 0]
