"""EAGLE3 speculative decoding: draft a token tree, verify it in one base pass, accept.

Each round, per running row:
 1. the draft catches up on the tokens the base accepted last round (with the base's features),
 2. the draft expands a tree level by level from the last token (the root): every frontier node's
    top-k children are scored by cumulative log-probability and the best k form the next frontier,
 3. the best `verify_tree_size` nodes (closed under ancestors) go through the base in one pass
    under a tree mask,
 4. walking from the root, the base samples the next token at each node with the request's own
    sampler (greedy = argmax, otherwise temperature/top-k/top-p with its seeded generator); while
    the sampled token is a child in the tree the walk goes on, and the first one that is not ends
    the round as the bonus token.
Every emitted token is drawn from the base model's own (biased, penalised, filtered) distribution with one draw
of the row's generator, exactly as vanilla decoding draws it: the output is the vanilla output,
greedy or sampled, and the draft only decides how many tokens one base pass yields.
 5. the accepted nodes' keys and values move to contiguous slots after the root's.

A request that must not speculate (EngineRequest.speculate False) verifies its root alone: one
token a round, vanilla's.

On a model with sliding-window or recurrent layers the tree is a chain (top-k 1, `draft_steps` deep):
a chain's nodes sit in the slots of their positions, so a window counts them right, and a recurrent
layer reads them in order; a row that refused part of its chain gets its recurrent states back and
its accepted tokens passed again (recurrent.py). A tree there would put nodes in slots past their
positions and run one branch's tokens through another's states. The draft's tree nodes are recomputed at each level (the draft is one
layer) because the attention op sees every cached slot; the draft's KV pool, its rows aligned with
the base pool's, only keeps the caught-up context between rounds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from trt_llm.runtime.decoding import recurrent
from trt_llm.runtime.decoding.draft import Draft, SpecStats
from trt_llm.runtime.sampling.grammar import mask_logits
from trt_llm.runtime.engine.model import Model
from trt_llm.runtime.sampling.sampler import Sampler
from trt_llm.runtime.engine.sequence import Sequence, append_token, count_speculation, record_step
from trt_llm.runtime.decoding.spec_config import SpecConfig
from trt_llm.runtime.engine.step import Step
from trt_llm.schemas.graph_spec import DRAFT_HIDDEN, DRAFT_HIDDEN_OUT, TREE_MASK


@dataclass
class _Row:
    """One running request's speculative state."""

    sequence: Sequence
    committed: int  # tokens in the base cache (the root is the next one)
    draft_committed: int  # tokens in the draft cache
    draft_offset: int  # the position of the draft cache's first token (after a reused prefix)
    root: int  # last emitted token, not yet in the base cache
    pending_tokens: list[int]  # draft catch-up: the tokens ...
    pending_features: np.ndarray  # ... and the base features [n, 3H] before each of them
    tree: list = field(default_factory=list)  # this round's draft nodes (_Node)
    frontier: list[int] = field(default_factory=list)  # the nodes the next level expands
    root_draft_logits: np.ndarray | None = None  # the draft's prediction after the root


@dataclass
class _Node:
    token: int  # target vocabulary id
    parent: int  # index in the row's tree (-1 = the root)
    depth: int
    score: float  # cumulative draft log-probability
    hidden_in: np.ndarray  # the draft hidden its parent produced


class Eagle:
    # A restored prefix's last block is computed again: the draft's next input is its last feature
    # (reuse.ContextPlan.replay).
    replays_context = True

    def __init__(self, draft: Draft, spec: SpecConfig, stats: SpecStats | None = None, chain: bool = False):
        """chain: the base has sliding-window or recurrent layers (see above): the tree is the chain of
        `spec.draft_steps` nodes (at most verify_tree_size - 1) whatever the spec's top-k."""
        if chain:
            steps = max(1, min(spec.draft_steps, spec.verify_tree_size - 1))
            spec = SpecConfig(1, steps, steps + 1)
        self.draft, self.spec, self.chain = draft, spec, chain
        self.stats = stats if stats is not None else SpecStats()
        self.extra_slots = spec.verify_tree_size + 1  # a verification writes the tree after the root
        self.cache = None  # the draft's KV pool
        self.rows: list[_Row] = []  # one per running request, in the same order
        self.context = None  # the core's context cache, which the draft's state of each block joins
        self._features: dict[int, list[np.ndarray]] = {}  # a prefilling row's features, chunk by chunk

    def reserve(self, core, need: int) -> None:
        draft_need = need - self.extra_slots + self.spec.draft_top_k * self.spec.draft_steps + 1
        if self.cache is None:
            self.cache = self.draft.engine.new_cache(core.scheduler.max_rows, draft_need)
        else:
            self.cache.reserve(core.scheduler.max_rows, draft_need, [r.draft_committed for r in self.rows])
        self.cache.batch = len(self.rows)

    def prefill(self, core, rows, start: int) -> list[int]:
        """Logits at each prompt's last token, features at every prefilled token. A restored prefix
        has no features: where its blocks hold the draft's state too, the draft restores it (and the
        base recomputed the prefix's last block, whose last feature the draft reads next: reuse.py's
        replay); else the draft's context starts after the prefix (it only proposes)."""
        self.context = core.context
        done = core.prefill(rows, start)
        # A long prompt comes in chunks: its features gather until its prompt is through.
        self._features = {id(r): self._features.get(id(r), []) for r in rows}  # (drops aborted rows')
        for request, n, features in zip(rows, done.computed.tolist(), done.features):
            if n:
                self._features[id(request)].append(features[:n].copy())
        complete = rows[: done.complete]
        finished = core.sample(complete, done.logits[: done.complete, 0], first=start)
        for i, request in enumerate(complete):
            s = request.sequence
            begin, n = s.reused_tokens, len(s.prompt_ids) - s.reused_tokens
            features = np.concatenate(self._features.pop(id(request)))  # at prompt tokens begin ..
            root = s.generated[-1]
            plan = s.context
            if plan is not None and plan.draft_blocks:
                # The draft's pairs (feature j, token j + 1) for j < prefix - 1 are the blocks'; the
                # next is the prefix's last feature (recomputed) with the first token after it.
                prefix, size = begin + plan.replay, self.context.block_tokens
                self.cache.restore(start + i, prefix - 1, [((k + 1) * size, b.draft_keys, b.draft_values)
                                                           for k, b in enumerate(plan.draft_blocks)])
                plan.draft_blocks = None
                self.rows.append(_Row(s, committed=begin + n, draft_committed=prefix - 1, draft_offset=0, root=root,
                                      pending_tokens=s.prompt_ids[prefix:] + [root],
                                      pending_features=features[prefix - 1 - begin:]))
                continue
            self.rows.append(_Row(s, committed=begin + n, draft_committed=0, draft_offset=begin, root=root,
                                  pending_tokens=s.prompt_ids[begin + 1:] + [root], pending_features=features))
        return finished

    def step(self, core) -> list[int]:
        running, state, model = core.decoding, self.rows, core.model
        self.cache.batch = len(state)
        max_position = (model.max_positions or 1 << 30) - 1
        biases = [core.sampler.params[r.row].logit_bias for r in running]
        with core.stage("draft"):
            hidden_root = _draft_catch_up(self.draft, state, self.cache)
            _draft_tree(self.draft, state, self.cache, hidden_root, self.spec, biases, max_position)
        with core.stage("verify"):
            sizes = [self._size(core, request) for request in running]
            states = recurrent.snapshots(core, [i for i, size in enumerate(sizes) if size]) if self.chain else {}
            logits, features, chosen = _verify(model, state, core.cache, sizes, core.lora_inputs, max_position)
        finished, emitted_total, proposed, accepted = [], 0, 0, 0
        with core.stage("accept"):
            for index, (request, r) in enumerate(zip(running, state)):
                emitted, path, done = _accept(model, request, r, chosen[index], logits[index], core.sampler)
                emitted_total += len(emitted)
                proposed += len(chosen[index])
                accepted += len(path)
                if chosen[index]:
                    count_speculation(request.sequence, len(chosen[index]), len(path), len(emitted))
                if done:
                    finished.append(index)
                    continue
                if index in states and len(path) < len(chosen[index]):
                    recurrent.replay(core, index, [r.root, *emitted[:len(path)]], r.committed, states[index])
                _commit(core.cache, index, r, path, chosen[index], emitted, features[index])
        self.stats.rounds += len(state)  # row-rounds: the mean accepted length is per sequence
        self.stats.emitted += emitted_total
        self.stats.proposed += proposed
        self.stats.accepted += accepted
        if core.profiler:
            core.profiler.count("decode_tokens", emitted_total)
            core.profiler.count("spec_rounds", len(state))
            core.profiler.count("spec_emitted", emitted_total)
            core.profiler.count("spec_proposed", proposed)
            core.profiler.count("spec_accepted", accepted)
        return finished

    def _size(self, core, request) -> int:
        """How many drafted nodes row `request` verifies: the spec's tree, none where it must not
        speculate, and a recurrent row's chain within its block (recurrent.block_room)."""
        if not request.speculate:
            return 0
        size = self.spec.verify_tree_size - 1
        room = recurrent.block_room(core, request.sequence) if self.chain else None
        return size if room is None else min(size, room)

    def cached(self, core, index: int) -> int:
        return self.rows[index].committed  # the root and the rejected nodes are not the row's tokens

    def leave(self, keep: list[int]) -> None:
        if self.context is not None:
            staying = set(keep)
            for index, r in enumerate(self.rows):
                if index not in staying:
                    self._commit_draft(index, r)
        self.cache.keep_rows(keep, [self.rows[i].draft_committed for i in keep])
        self.rows = [self.rows[i] for i in keep]

    def _commit_draft(self, index: int, r: _Row) -> None:
        """A leaving row's draft state of each of its blocks the context cache holds: block k's
        pairs are those at its positions (feature j, token j + 1; the last one's token is the next
        block's first, which a restore that takes it has too)."""
        plan, size = r.sequence.context, self.context.block_tokens
        if plan is None or plan.commit == "none":
            return
        tokens = r.sequence.prompt_ids + r.sequence.generated
        first = -(-r.draft_offset // size)  # the blocks whose pairs the draft cache holds whole
        last = min((r.draft_offset + r.draft_committed) // size, plan.committed // size)
        for k in range(first, last):
            keys, values = self.cache.read(index, k * size - r.draft_offset, (k + 1) * size - r.draft_offset)
            self.context.attach_draft(plan.key(self.context, k, tokens), keys, values)


def _causal(width: int, batch: int) -> np.ndarray:
    return np.broadcast_to(np.tril(np.ones((width, width), dtype=bool)), (batch, width, width)).copy()


def _draft_catch_up(draft: Draft, state: list[_Row], draft_cache) -> np.ndarray:
    """Feed the draft the tokens accepted last round with the base's features; returns the draft's
    hidden output at each row's last one (the root's parent state) [B, H]."""
    counts = np.array([len(r.pending_tokens) for r in state], dtype=np.int32)
    width = int(counts.max())
    if len(state) > 1 and max(r.draft_committed for r in state) + width > draft_cache.capacity:
        # A request just admitted catches up on its whole prompt beside rows deep in their context:
        # ONNX Runtime's attention writes each row's padded chunk whole, so these rows go one by one.
        return np.concatenate([_draft_catch_up(draft, [r], draft_cache.window(i, i + 1))
                               for i, r in enumerate(state)])
    batch, hidden_size = len(state), draft.hidden_size
    tokens = np.zeros((batch, width), dtype=np.int64)
    feats = np.zeros((batch, width, state[0].pending_features.shape[-1]), dtype=draft.embedding.dtype)
    for i, r in enumerate(state):
        tokens[i, : counts[i]] = r.pending_tokens
        feats[i, : counts[i]] = r.pending_features
    # An EAGLE3 draft's fc, applied here so its graph takes one hidden input; as one 2-D matmul (numpy's
    # stacked 3-D matmul does not use BLAS). An MTP head has its own in its graph.
    hidden = feats if draft.fc is None else (feats.reshape(-1, feats.shape[-1]) @ draft.fc.T).reshape(batch, width, -1)
    past = np.array([r.draft_committed for r in state], dtype=np.int32)
    offsets = np.array([r.draft_offset for r in state], dtype=np.int32)
    positions = (offsets + past)[:, None] + np.arange(width, dtype=np.int32)[None, :]
    step = Step(draft.embedding[tokens], positions, past, counts, (counts - 1)[:, None],
                np.empty((batch, 1, len(draft.d2t)), dtype=np.float32),
                {DRAFT_HIDDEN: hidden.astype(draft.embedding.dtype), TREE_MASK: _causal(width, batch)},
                {DRAFT_HIDDEN_OUT: np.empty((batch, width, hidden_size), dtype=draft.embedding.dtype)})
    draft.engine.run(step, draft_cache)
    for i, r in enumerate(state):
        r.draft_committed += int(counts[i])
        r.root_draft_logits = step.logits[i, 0].copy()
    return step.outputs[DRAFT_HIDDEN_OUT][np.arange(batch), counts - 1]


def _best_children(draft: Draft, logits: np.ndarray, k: int, bias_row: dict | None) -> tuple[np.ndarray, np.ndarray]:
    """Each row's k most likely next tokens under the draft, best first: (target ids [F, k], their
    log-probabilities [F, k]). logits: [F, draft vocab]; the request's logit bias applies, as the base's
    own sampler applies it. One top-k call covers the whole frontier."""
    logits = logits.astype(np.float32)  # a copy: the bias must not touch the caller's buffer
    if bias_row:
        for token, value in bias_row.items():
            logits[..., draft.target_ids == token] += value
    peak = logits.max(-1, keepdims=True)
    log_normalizer = peak + np.log(np.exp(logits - peak).sum(-1, keepdims=True))
    if k >= logits.shape[-1]:
        best = np.argsort(-logits, axis=-1, kind="stable")
    else:  # argpartition: no full sort of the vocabulary
        best = np.argpartition(-logits, k - 1, axis=-1)[:, :k]
        order = np.argsort(-np.take_along_axis(logits, best, -1), axis=-1, kind="stable")
        best = np.take_along_axis(best, order, -1)
    return draft.target_ids[best], np.take_along_axis(logits, best, -1) - log_normalizer


def _draft_tree(draft: Draft, state: list[_Row], draft_cache, hidden_root: np.ndarray, spec: SpecConfig,
                biases: list[dict | None], max_position: int) -> None:
    """Each row's tree (_Row.tree), `spec.draft_steps` levels of the best `spec.draft_top_k`."""
    k = spec.draft_top_k
    for i, r in enumerate(state):
        tokens, log_probs = _best_children(draft, r.root_draft_logits[None], k, biases[i])
        r.tree = [_Node(int(t), -1, 1, float(lp), hidden_root[i]) for t, lp in zip(tokens[0], log_probs[0])]
        r.frontier = list(range(len(r.tree)))
    for _ in range(spec.draft_steps - 1):
        counts = np.array([len(r.tree) for r in state], dtype=np.int32)
        width = int(counts.max())
        batch = len(state)
        tokens = np.zeros((batch, width), dtype=np.int64)
        hidden_in = np.zeros((batch, width, draft.hidden_size), dtype=draft.embedding.dtype)
        positions = np.zeros((batch, width), dtype=np.int32)
        mask = np.zeros((batch, width, width), dtype=bool)
        for i, r in enumerate(state):
            for n, node in enumerate(r.tree):
                tokens[i, n] = node.token
                hidden_in[i, n] = node.hidden_in
                positions[i, n] = min(r.committed + node.depth - 1, max_position)
                ancestor = n
                while ancestor >= 0:
                    mask[i, n, ancestor] = True
                    ancestor = r.tree[ancestor].parent
            for n in range(len(r.tree), width):
                mask[i, n, n] = True
        # Logits only at the frontier: the rest of the tree was expanded already (the LM head is
        # about half of a one-layer draft's cost). Rows with a shorter frontier repeat their last node.
        frontier_width = max(len(r.frontier) for r in state)
        indices = np.array([r.frontier + r.frontier[-1:] * (frontier_width - len(r.frontier)) for r in state],
                           dtype=np.int32)
        past = np.array([r.draft_committed for r in state], dtype=np.int32)
        step = Step(draft.embedding[tokens], positions, past, counts, indices,
                    np.empty((batch, frontier_width, len(draft.d2t)), dtype=np.float32),
                    {DRAFT_HIDDEN: hidden_in, TREE_MASK: mask},
                    {DRAFT_HIDDEN_OUT: np.empty((batch, width, draft.hidden_size), dtype=draft.embedding.dtype)})
        draft.engine.run(step, draft_cache)
        logits, hidden_out = step.logits, step.outputs[DRAFT_HIDDEN_OUT]
        for i, r in enumerate(state):
            children, log_probs = _best_children(draft, logits[i, :len(r.frontier)], k, biases[i])
            scores = np.array([r.tree[n].score for n in r.frontier])[:, None] + log_probs  # cumulative
            start = len(r.tree)
            for flat in np.argsort(-scores.ravel(), kind="stable")[:k]:  # the best k of the frontier's children
                slot, j = divmod(int(flat), children.shape[1])
                parent = r.frontier[slot]
                r.tree.append(_Node(int(children[slot, j]), parent, r.tree[parent].depth + 1, float(scores[slot, j]),
                                    hidden_out[i, parent].copy()))
            r.frontier = list(range(start, len(r.tree)))


def _select(r: _Row, size: int) -> list[int]:
    """The best `size` tree nodes by score, closed under ancestors, ordered parents first."""
    order = sorted(range(len(r.tree)), key=lambda n: (-r.tree[n].score, r.tree[n].depth))
    chosen: set[int] = set()
    for n in order:
        if len(chosen) >= size:
            break
        if r.tree[n].parent < 0 or r.tree[n].parent in chosen:
            chosen.add(n)
    return sorted(chosen, key=lambda n: (r.tree[n].depth, n))


def _verify(model: Model, state: list[_Row], cache, sizes: list[int], lora: dict, max_position: int):
    """One base pass over [root] + the best `sizes[i]` nodes of row i; logits and features at each."""
    chosen = [_select(r, size) for r, size in zip(state, sizes)]
    counts = np.array([1 + len(c) for c in chosen], dtype=np.int32)
    width = int(counts.max())
    batch = len(state)
    tokens = np.zeros((batch, width), dtype=np.int64)
    positions = np.zeros((batch, width), dtype=np.int32)
    mask = np.zeros((batch, width, width), dtype=bool)
    for i, (r, nodes) in enumerate(zip(state, chosen)):
        slot = {n: j + 1 for j, n in enumerate(nodes)}  # tree node -> position in this pass
        tokens[i, 0] = r.root
        positions[i, 0] = r.committed
        mask[i, :, 0] = True
        for n, j in slot.items():
            tokens[i, j] = r.tree[n].token
            positions[i, j] = min(r.committed + r.tree[n].depth, max_position)
            ancestor = n
            while ancestor >= 0:
                mask[i, j, slot[ancestor]] = True
                ancestor = r.tree[ancestor].parent
        for j in range(counts[i], width):
            mask[i, j, j] = True
    past = np.array([r.committed for r in state], dtype=np.int32)
    embeds, extras = model.embed(tokens)
    if model.tree_input:  # (an MTP head's base is causal: its drafts are chains, decoding/recurrent.py)
        extras[TREE_MASK] = mask
    step = Step(embeds, positions, past, counts, np.broadcast_to(np.arange(width, dtype=np.int32), (batch, width)),
                np.empty((batch, width, model.vocab_size), dtype=np.float32), extras,
                {model.feature_output: np.empty((batch, width, model.feature_width), dtype=model.embedding.dtype)})
    model.engine.run(step, cache, lora)
    return step.logits, step.outputs[model.feature_output], chosen


def _accept(model: Model, request, r: _Row, nodes: list[int], logits: np.ndarray,
            sampler: Sampler) -> tuple[list[int], list[int], bool]:
    """Walk the verified tree from the root; returns (emitted tokens, accepted nodes, finished)."""
    s, row, num_logprobs = request.sequence, request.row, request.num_logprobs
    children: dict[int, dict[int, int]] = {}
    for n in nodes:
        children.setdefault(r.tree[n].parent, {})[r.tree[n].token] = n
    position = {n: j + 1 for j, n in enumerate(nodes)}
    emitted, path, node = [], [], -1
    while True:
        step_logits = logits[0 if node < 0 else position[node]]
        # Structured output masks each verified token in turn, as vanilla decoding masks it; the
        # penalties see the counts of the path before it (append_token keeps them), as vanilla's do.
        counts = [s.counts if sampler.params[row].penalised else None]
        token = int(sampler.sample(mask_logits(step_logits[None], [s.constraint]), [row], counts)[0])
        if num_logprobs:
            record_step(s, step_logits, token, num_logprobs)
        emitted.append(token)
        child = children.get(node, {}).get(token)
        if child is not None:
            path.append(child)
        if append_token(model.eos, s, token, time.perf_counter()):
            return emitted, path, True  # (its last token may be a node's: a finished row commits nothing)
        if child is None:
            return emitted, path, False
        node = child


def _commit(cache, index: int, r: _Row, path: list[int], nodes: list[int], emitted: list[int],
            features: np.ndarray) -> None:
    """Keep the root and the accepted nodes in the base cache, contiguously; queue the draft."""
    position = {n: j + 1 for j, n in enumerate(nodes)}
    sources = [r.committed + position[n] for n in path]
    if sources != list(range(r.committed + 1, r.committed + 1 + len(path))):  # (a chain's are in place)
        cache.move_slots(index, sources, r.committed + 1)
    r.pending_tokens = emitted
    r.pending_features = features[[0] + [position[n] for n in path]].copy()
    r.committed += 1 + len(path)
    r.root = emitted[-1]
