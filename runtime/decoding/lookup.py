"""Prompt lookup speculation: a row's next tokens guessed from its own prompt and output, verified by the
base in one pass. No draft model: what summaries, extractive answers, code edits and corrected transcripts
copy from their prompts comes at the cost of one pass for several tokens.

Each step, per decoding row:
 1. propose: the row's latest tokens matched at an earlier place (its last NGRAM tokens at least, the
    earlier place whose match reaches back furthest, up to MATCH_CAP tokens, the latest of equals), and the
    tokens that followed there: up to `max_tokens`, a chain, of which the pass takes what pays
    (pass_cost.plan);
 2. verify: one base pass over [the last token] + the chain, logits at every position (a prefill chunk
    of the row, causal: the chain's tokens sit at their own positions and slots, so sliding windows
    count them right);
 3. accept: walking the chain, the base samples each next token with the request's own sampler (greedy =
    argmax; else its seeded generator, one draw a token, as vanilla draws it) from the logits after the
    tokens accepted so far; while the sampled token is the proposed one the walk goes on, and the first
    that is not ends the step as the bonus token. Every emitted token is vanilla's, sampled or greedy: the
    proposals only decide how many one pass yields. The rejected tokens' keys and values lie past the
    row's length, where the next pass overwrites them. Recurrent layers (Qwen3.5, LFM2): a row that
    refused some of its chain gets its states back and the tokens it took passed again (recurrent.py).

Adaptive: each pass's width is the one that yields the most tokens per unit of time, from the acceptance
of chains like each row's and what a wider pass was measured to cost on this engine (pass_cost.py), so a
batch that copies nothing, or an engine whose wide passes cost too much, runs vanilla's single-token
steps. How far back a match reaches is what predicts a chain best: on SmolLM2's copying and chat
outputs, a chain after a match of 2 tokens had its first token taken 33-65 % of the time, after one of
8 or more 92-99 %. So acceptance is learnt per match length (`MatchAcceptance`, shared by the rows).
A row that must not speculate (EngineRequest.speculate False) never proposes.

A chain never crosses a LongRoPE model's original context (the core recomputes a row that steps past
it by one token, engine_core._long_rope_switch), nor, on a recurrent model whose row commits its
generated tokens to the context cache, a block's end (its states are snapshotted there,
reuse.snapshot_decoded).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from trt_llm.runtime.decoding import recurrent
from trt_llm.runtime.decoding.pass_cost import MatchAcceptance, PassCost, behind, plan
from trt_llm.runtime.decoding.vanilla import Vanilla
from trt_llm.runtime.engine.sequence import Sequence, append_token, count_speculation, record_step
from trt_llm.runtime.engine.step import Step
from trt_llm.runtime.sampling.grammar import mask_logits

NGRAM = 2  # the shortest match that proposes (single tokens propose too often in free text)
MATCH_CAP = 16  # how far back a match is compared (past 8 tokens, chains are taken alike)
CANDIDATES = 16  # the latest earlier places of the row's last NGRAM tokens that are compared
MAX_TOKENS = 8  # the longest chain (on 2 CPU cores a pass of 9 tokens costs 1.6 to 5 single-token steps)


class NgramIndex:
    """Where each NGRAM-token sequence of a token list occurred with a token after it: updated token by
    token, so a lookup is a dictionary probe and a few comparisons back from each recent place, not a scan."""

    def __init__(self):
        self.tokens: list[int] = []
        self.after: dict[tuple[int, ...], list[int]] = {}  # n-gram -> the indices of the tokens that followed it

    def extend(self, tokens: list[int]) -> None:
        for token in tokens:
            end = len(self.tokens)  # the n-gram ending before this token now has a continuation
            if end >= NGRAM:
                self.after.setdefault(tuple(self.tokens[end - NGRAM:end]), []).append(end)
            self.tokens.append(token)

    def propose(self, limit: int) -> tuple[list[int], int]:
        """Up to `limit` tokens that followed the best earlier match of the list's end, and how many
        tokens that match spans (0: none)."""
        tokens = self.tokens
        if limit <= 0 or len(tokens) < NGRAM:
            return [], 0
        best, matched = -1, 0
        for start in reversed(self.after.get(tuple(tokens[-NGRAM:]), ())[-CANDIDATES:]):
            n = NGRAM  # tokens[start - n:start] == tokens[-n:] so far
            while n < MATCH_CAP and n < start and tokens[start - n - 1] == tokens[-n - 1]:
                n += 1
            if n > matched:
                best, matched = start, n
        return (tokens[best:best + limit], matched) if matched else ([], 0)


@dataclass
class _Row:
    sequence: Sequence
    index: NgramIndex = field(default_factory=NgramIndex)

    def sync(self) -> None:
        """The index up to the row's last token (the prompt, then each emitted token)."""
        s = self.sequence
        known = len(self.index.tokens)
        total = len(s.prompt_ids) + len(s.generated)
        if known < len(s.prompt_ids):
            self.index.extend(s.prompt_ids[known:])
            known = len(s.prompt_ids)
        self.index.extend(s.generated[known - len(s.prompt_ids): total - len(s.prompt_ids)])


@dataclass
class LookupStats:
    rounds: int = 0  # verification passes with a proposal, counted per row
    proposed: int = 0  # tokens proposed
    accepted: int = 0  # of them, accepted
    emitted: int = 0  # tokens those passes emitted (accepted + each pass's bonus)


class PromptLookup:
    replays_context = False

    def __init__(self, max_tokens: int = MAX_TOKENS, stats: LookupStats | None = None, cost: PassCost | None = None):
        if max_tokens < 1:
            raise ValueError(f"prompt lookup: max_tokens must be >= 1, got {max_tokens}")
        self.max_tokens = max_tokens
        self.extra_slots = max_tokens  # a verification writes the chain after the last token
        self.stats = stats if stats is not None else LookupStats()
        self.rows: list[_Row] = []  # one per decoding request, in the same order
        self.cost = cost if cost is not None else PassCost()  # (the engine's, where it keeps one)
        self.acceptance = MatchAcceptance()
        self.vanilla = Vanilla()  # a pass without a chain: vanilla's step, its rows sampled in one call

    def reserve(self, core, need: int) -> None:
        pass

    def prefill(self, core, rows, start: int) -> list[int]:
        done = core.prefill(rows, start)
        complete = rows[: done.complete]
        finished = core.sample(complete, done.logits[: done.complete, 0], first=start)
        # the rows that complete their prompts join the decoding rows, in order (the core's leave() then
        # drops the ones that finished on their first token)
        self.rows += [_Row(r.sequence) for r in complete]
        return finished

    def cached(self, core, index: int) -> int:
        return core.scheduler.running[index].sequence.length - 1  # all but the last token, not yet fed

    def leave(self, keep: list[int]) -> None:
        self.rows = [self.rows[i] for i in keep]

    def resumed(self, index: int, sequence: Sequence) -> None:
        """A paused row is decoding row `index` again (runtime/engine/preemption.py): its n-gram index is
        rebuilt from its prompt and generated tokens (_Row.sync)."""
        self.rows.insert(index, _Row(sequence))

    def _proposal(self, request, r: _Row, model, core) -> tuple[list[int], int]:
        """The row's chain and the length of the match it came from (NgramIndex.propose)."""
        if not request.speculate:
            return [], 0
        s = r.sequence
        limit = min(self.max_tokens, s.max_new_tokens - len(s.generated) - 1)  # the bonus token is always one
        if model.long_rope is not None and s.length <= model.long_rope[0]:
            limit = min(limit, model.long_rope[0] - s.length)  # land at most one past the original context
        room = recurrent.block_room(core, s)  # (a recurrent row: its states are snapshotted at a block's end)
        if room is not None:
            limit = min(limit, room)
        r.sync()
        return r.index.propose(limit)

    def step(self, core) -> list[int]:
        running, model = core.decoding, core.model
        with core.stage("propose"):
            chains = [self._proposal(request, r, model, core) for request, r in zip(running, self.rows)]
            proposals = [chain for chain, _ in chains]
            acceptance = [self.acceptance[matched] for _, matched in chains]  # (chains after such a match)
            replay = len(running) ** -0.5 if core.cache.recurrent else 0.0  # a row's pass, in the batch's
            worth = None
            if core.scheduler.policy == "static":  # (the batch's time is its last row's)
                worth = behind([r.sequence.max_new_tokens - len(r.sequence.generated) for r in self.rows])
            lengths = plan([(len(p), a.p) for p, a in zip(proposals, acceptance)], self.cost.slope(len(running)),
                           replay, worth)
            for p, a, n in zip(proposals, acceptance, lengths):
                if p and not n:
                    a.idle()
            proposals = [p[:n] for p, n in zip(proposals, lengths)]
        if not any(proposals):  # (vanilla's step: the same tokens, without a row-by-row walk)
            finished = self.vanilla.step(core)
            self.cost.record(len(running), 1, self.vanilla.engine_seconds)
            return finished
        with core.stage("propose"):
            states = recurrent.snapshots(core, [i for i, p in enumerate(proposals) if p])
        counts = np.array([1 + len(p) for p in proposals], dtype=np.int32)
        width, batch = int(counts.max()), len(running)
        tokens = np.zeros((batch, width), dtype=np.int64)
        for i, (request, p) in enumerate(zip(running, proposals)):
            tokens[i, : counts[i]] = [request.sequence.generated[-1], *p]
        past = np.array([r.sequence.length - 1 for r in running], dtype=np.int32)
        embeds, extras = model.embed(tokens)
        step = Step(embeds, past[:, None] + np.arange(width, dtype=np.int32)[None, :], past, counts,
                    np.broadcast_to(np.arange(width, dtype=np.int32), (batch, width)),
                    np.empty((batch, width, model.vocab_size), dtype=np.float32))
        step.inputs, step.outputs = model.eagle_io(batch, width)
        step.inputs.update(extras)
        if model.positions_vary:
            step.position_ids = model.positions([r.sequence for r in running], past, width)
        step.inputs.update(model.decode_extras(batch, width))
        with core.stage("decode_step"):
            started = time.perf_counter()
            model.engine.run(step, core.cache, core.lora_inputs)
            self.cost.record(batch, width, time.perf_counter() - started)
        finished, emitted_total, rounds, speculated, proposed, accepted = [], 0, 0, 0, 0, 0
        with core.stage("accept"):
            for index, (request, proposal) in enumerate(zip(running, proposals)):
                emitted, done = _accept(model, request, proposal, step.logits[index], core.sampler)
                emitted_total += len(emitted)
                if done:
                    finished.append(index)
                if proposal:
                    taken = _matched(proposal, emitted)
                    rounds, speculated = rounds + 1, speculated + len(emitted)
                    count_speculation(request.sequence, len(proposal), taken, len(emitted))
                    proposed, accepted = proposed + len(proposal), accepted + taken
                    acceptance[index].verified(len(proposal), taken)
                    if index in states and not done and taken < len(proposal):
                        recurrent.replay(core, index, tokens[index, : 1 + taken], int(past[index]), states[index])
        self.stats.rounds += rounds
        self.stats.proposed += proposed
        self.stats.accepted += accepted
        self.stats.emitted += speculated
        if core.profiler:
            core.profiler.count("decode_tokens", emitted_total)
            for name, value in (("spec_rounds", rounds), ("spec_emitted", speculated), ("spec_proposed", proposed),
                                ("spec_accepted", accepted)):
                core.profiler.count(name, value)
        return finished


def _matched(proposal: list[int], emitted: list[int]) -> int:
    """How many of the proposed tokens the emitted ones took, from the first."""
    n = 0
    while n < len(proposal) and n < len(emitted) and proposal[n] == emitted[n]:
        n += 1
    return n


def _accept(model, request, proposal: list[int], logits: np.ndarray, sampler) -> tuple[list[int], bool]:
    """Walk the verified chain; returns (emitted tokens, finished)."""
    s, row, num_logprobs = request.sequence, request.row, request.num_logprobs
    emitted = []
    for position in range(len(proposal) + 1):
        step_logits = logits[position]
        # Structured output masks each verified token in turn and the penalties see the counts of the tokens
        # before it (append_token keeps them), as vanilla's steps do.
        counts = [s.counts if sampler.params[row].penalised else None]
        token = int(sampler.sample(mask_logits(step_logits[None], [s.constraint]), [row], counts)[0])
        if num_logprobs:
            record_step(s, step_logits, token, num_logprobs)
        emitted.append(token)
        if append_token(model.eos, s, token, time.perf_counter()):
            return emitted, True
        if position == len(proposal) or token != proposal[position]:
            return emitted, False
    return emitted, False
