"""EAGLE3 speculative decoding of one batch: draft a token tree, verify it in one base pass, accept.

Each round, per row:
 1. the draft catches up on the tokens the base accepted last round (with the base's features),
 2. the draft expands a tree level by level from the last token (the root): every frontier node's
    top-k children are scored by cumulative log-probability and the best k form the next frontier,
 3. the best `verify_tree_size` nodes (closed under ancestors) go through the base in one pass
    under a tree mask,
 4. walking from the root, the base samples the next token at each node with the request's own
    sampler (greedy = argmax, otherwise temperature/top-k/top-p with its seeded generator); while
    the sampled token is a child in the tree the walk goes on, and the first one that is not ends
    the round as the bonus token.
Every emitted token is drawn from the base model's own (biased, filtered) distribution with one draw
of the row's generator, exactly as vanilla decoding draws it: the output is the vanilla output,
greedy or sampled, and the draft only decides how many tokens one base pass yields.
 5. the accepted nodes' keys and values move to contiguous slots after the root's.

The draft's tree nodes are recomputed at each level (the draft is one layer) because the attention
op sees every cached slot; its cache only keeps the caught-up context between rounds.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch

from trt_llm.runtime.generate import Model, Sequence, append_token, prefill, record_step
from trt_llm.runtime.sampler import Sampler
from trt_llm.runtime.spec_config import SpecConfig  # noqa: F401 - where callers import it from
from trt_llm.schemas.graph_spec import DRAFT_HIDDEN, DRAFT_HIDDEN_OUT, FEATURES, TREE_MASK
from trt_llm.runtime.threads import leaves_cores_to_the_engine


@dataclass
class Draft:
    """What the loop needs from the draft side of an engine directory."""

    engine: object  # an engine over the draft graph (one layer)
    fc: np.ndarray  # [H, 3H]: target features -> draft hidden
    d2t: np.ndarray  # [Vd] int64: target id = draft id + d2t[draft id]
    embedding: np.ndarray  # [V, H]: the token embedding the draft reads (the base's unless its own)
    hidden_size: int
    target_ids: np.ndarray = field(init=False)  # [Vd]: the target id of each draft id

    def __post_init__(self):
        self.target_ids = np.arange(len(self.d2t)) + self.d2t


@dataclass
class _Row:
    """One sequence's speculative state."""

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
class SpecStats:
    rounds: int = 0  # verification passes, counted per row
    emitted: int = 0  # tokens they emitted

    @property
    def mean_accepted(self) -> float:
        return self.emitted / self.rounds if self.rounds else 0.0


def load_draft_engine(engine_dir, threads: int, base_embedding: np.ndarray) -> Draft:
    """The draft side of an engine directory (components.draft in its manifest)."""
    from safetensors.numpy import load_file

    from trt_llm.runtime.engines import open_engine

    paths = engine_dir.manifest["components"]["draft"]
    tensors = load_file(str(engine_dir.path / paths["tensors"]))
    embedding = base_embedding
    if "embedding" in tensors:
        embedding = tensors["embedding"]
    engine = open_engine(engine_dir, threads, "draft", spinning=False)  # see Runner: base and draft alternate
    return Draft(engine, tensors["fc"], tensors["d2t"].astype(np.int64), embedding, int(tensors["fc"].shape[0]))


def check_spec(spec: SpecConfig, engine_dir) -> SpecConfig:
    """Refuse speculation settings beyond what the engine was built for."""
    limits = engine_dir.manifest["components"]["draft"]
    drafted = spec.draft_top_k * spec.draft_steps
    if min(spec.draft_top_k, spec.draft_steps) < 1 or spec.verify_tree_size < 2:
        raise ValueError(f"draft top-k {spec.draft_top_k} and draft steps {spec.draft_steps} must be >= 1, "
                         f"verify tree size {spec.verify_tree_size} >= 2")
    if drafted > limits["max_draft_tree_size"]:
        raise ValueError(f"draft top-k {spec.draft_top_k} x draft steps {spec.draft_steps} = {drafted} nodes "
                         f"exceeds the engine's max_draft_tree_size {limits['max_draft_tree_size']}")
    if spec.verify_tree_size > limits["max_verify_tree_size"]:
        raise ValueError(f"verify tree size {spec.verify_tree_size} exceeds the engine's max_verify_tree_size "
                         f"{limits['max_verify_tree_size']}")
    return spec


def _causal(lengths: np.ndarray, width: int) -> np.ndarray:
    mask = np.tril(np.ones((width, width), dtype=bool))
    return np.broadcast_to(mask, (len(lengths), width, width)).copy()


@leaves_cores_to_the_engine
def generate_eagle(model: Model, draft: Draft, sequences: list[Sequence], sampler: Sampler, spec: SpecConfig,
                   num_logprobs: int = 0, profiler=None, lora_inputs: dict | None = None,
                   stats: SpecStats | None = None) -> None:
    """Run `sequences` (one batch) to completion with EAGLE3 speculation (see the module doc)."""
    stage = profiler.stage if profiler else (lambda name: nullcontext())
    stats = stats if stats is not None else SpecStats()
    batch = len(sequences)
    tree_nodes = spec.draft_top_k * spec.draft_steps
    longest = max(len(s.prompt_ids) + s.max_new_tokens for s in sequences)
    cache = model.new_cache(batch, longest + spec.verify_tree_size + 1)
    draft_cache = draft.engine.new_cache(batch, longest + tree_nodes + 1)
    max_position = (model.max_positions or 1 << 30) - 1
    extra = lora_inputs or {}

    # Prefill: logits at each prompt's last token, features at every prefilled token. A reused
    # system prompt has no features: the draft's context then starts after it (it only proposes).
    logits, past, lengths, features = prefill(model, sequences, cache, extra, stage, profiler)
    first = sampler.sample(torch.from_numpy(logits[:, 0]), list(range(batch)))
    now = time.perf_counter()
    active, rows = [], {}
    for row, s in enumerate(sequences):
        token = int(first[row])
        if num_logprobs:
            record_step(s, torch.from_numpy(logits[row, 0]), token, num_logprobs)
        if not append_token(model, s, token, now):
            active.append(row)
            start, n = int(past[row]), int(lengths[row])
            rows[row] = _Row(s, committed=start + n, draft_committed=0, draft_offset=start, root=token,
                             pending_tokens=s.prompt_ids[start + 1:] + [token],
                             pending_features=features[row, :n].copy())

    cached = list(range(batch))  # the sequence in each cache row: all of them after the prefill
    while active:
        if active != cached:  # rows finished (also at their first token): compact both caches and the inputs
            keep = [cached.index(r) for r in active]
            cache.keep_rows(keep, [rows[r].committed for r in active])
            draft_cache.keep_rows(keep, [rows[r].draft_committed for r in active])
            rows, cached = {r: rows[r] for r in active}, list(active)
            extra = {name: np.ascontiguousarray(array[active]) for name, array in (lora_inputs or {}).items()}
        state = [rows[r] for r in active]
        with stage("draft"):
            hidden_root = _draft_catch_up(draft, state, draft_cache)
            for r in state:
                r.tree = []
            _draft_tree(draft, state, draft_cache, hidden_root, spec, model, sampler, active, max_position)
        with stage("verify"):
            verify_logits, verify_features, chosen = _verify(model, state, cache, spec, extra, max_position)
        stats.rounds += len(state)  # row-rounds: the mean accepted length is per sequence
        emitted_before = stats.emitted
        still = []
        with stage("accept"):
            for index, (row, r) in enumerate(zip(active, state)):
                s = sequences[row]
                emitted, path, done = _accept(model, s, r, chosen[index], verify_logits[index], sampler, row,
                                              num_logprobs)
                stats.emitted += len(emitted)
                if done:
                    continue
                _commit(cache, index, r, path, chosen[index], emitted, verify_features[index])
                still.append(row)
        if profiler:
            profiler.count("decode_tokens", stats.emitted - emitted_before)
        active = still
    if profiler:
        profiler.count("spec_rounds", stats.rounds)
        profiler.count("spec_emitted", stats.emitted)


def _draft_catch_up(draft: Draft, state: list[_Row], draft_cache) -> np.ndarray:
    """Feed the draft the tokens accepted last round with the base's features; returns the draft's
    hidden output at each row's last one (the root's parent state) [B, H]."""
    counts = np.array([len(r.pending_tokens) for r in state], dtype=np.int32)
    width = int(counts.max())
    batch, hidden_size = len(state), draft.hidden_size
    tokens = np.zeros((batch, width), dtype=np.int64)
    feats = np.zeros((batch, width, draft.fc.shape[1]), dtype=draft.embedding.dtype)
    for i, r in enumerate(state):
        tokens[i, : counts[i]] = r.pending_tokens
        feats[i, : counts[i]] = r.pending_features
    # The draft's fc, applied here so its graph takes one hidden input; as one 2-D matmul (numpy's
    # stacked 3-D matmul does not use BLAS).
    hidden = (feats.reshape(-1, feats.shape[-1]) @ draft.fc.T).reshape(batch, width, -1)
    past = np.array([r.draft_committed for r in state], dtype=np.int32)
    offsets = np.array([r.draft_offset for r in state], dtype=np.int32)
    positions = (offsets + past)[:, None] + np.arange(width, dtype=np.int32)[None, :]
    logits = np.empty((batch, 1, len(draft.d2t)), dtype=np.float32)
    hidden_out = np.empty((batch, width, hidden_size), dtype=draft.embedding.dtype)
    draft.engine.run(draft.embedding[tokens], positions, past, counts, (counts - 1)[:, None], draft_cache,
                     logits, None, {DRAFT_HIDDEN: hidden.astype(draft.embedding.dtype), TREE_MASK: _causal(counts, width)},
                     {DRAFT_HIDDEN_OUT: hidden_out})
    for i, r in enumerate(state):
        r.draft_committed += int(counts[i])
        r.root_draft_logits = logits[i, 0].copy()
    return hidden_out[np.arange(batch), counts - 1]


@dataclass
class _Node:
    token: int  # target vocabulary id
    parent: int  # index in the row's tree (-1 = the root)
    depth: int
    score: float  # cumulative draft log-probability
    hidden_in: np.ndarray  # the draft hidden its parent produced


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
                model: Model, sampler: Sampler, active: list[int], max_position: int) -> None:
    k = spec.draft_top_k
    for i, r in enumerate(state):
        tokens, log_probs = _best_children(draft, r.root_draft_logits[None], k, sampler.params[active[i]].logit_bias)
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
        logits = np.empty((batch, frontier_width, len(draft.d2t)), dtype=np.float32)
        hidden_out = np.empty((batch, width, draft.hidden_size), dtype=draft.embedding.dtype)
        draft.engine.run(draft.embedding[tokens], positions, past, counts, indices, draft_cache, logits,
                         None, {DRAFT_HIDDEN: hidden_in, TREE_MASK: mask}, {DRAFT_HIDDEN_OUT: hidden_out})
        for i, r in enumerate(state):
            children, log_probs = _best_children(draft, logits[i, :len(r.frontier)], k,
                                                 sampler.params[active[i]].logit_bias)
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


def _verify(model: Model, state: list[_Row], cache, spec: SpecConfig, extra: dict, max_position: int):
    """One base pass over [root] + the chosen nodes of every row; logits and features at each."""
    chosen = [_select(r, spec.verify_tree_size - 1) for r in state]
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
    logits = np.empty((batch, width, model.dims["vocab_size"]), dtype=np.float32)
    features = np.empty((batch, width, model.feature_width), dtype=model.embedding.dtype)
    model.engine.run(model.embedding[tokens], positions, past, counts,
                     np.broadcast_to(np.arange(width, dtype=np.int32), (batch, width)), cache, logits, extra,
                     {TREE_MASK: mask}, {FEATURES: features})
    return logits, features, chosen


def _accept(model: Model, s: Sequence, r: _Row, nodes: list[int], logits: np.ndarray, sampler: Sampler,
            row: int, num_logprobs: int) -> tuple[list[int], list[int], bool]:
    """Walk the verified tree from the root; returns (emitted tokens, accepted nodes, finished)."""
    children: dict[int, dict[int, int]] = {}
    for j, n in enumerate(nodes):
        children.setdefault(r.tree[n].parent, {})[r.tree[n].token] = n
    position = {n: j + 1 for j, n in enumerate(nodes)}
    emitted, path, node = [], [], -1
    while True:
        step_logits = torch.from_numpy(logits[0 if node < 0 else position[node]])
        token = int(sampler.sample(step_logits[None], [row])[0])
        if num_logprobs:
            record_step(s, step_logits, token, num_logprobs)
        emitted.append(token)
        if append_token(model, s, token, time.perf_counter()):
            return emitted, path, True
        child = children.get(node, {}).get(token)
        if child is None:
            return emitted, path, False
        path.append(child)
        node = child


def _commit(cache, index: int, r: _Row, path: list[int], nodes: list[int], emitted: list[int],
            features: np.ndarray) -> None:
    """Keep the root and the accepted nodes in the base cache, contiguously; queue the draft."""
    position = {n: j + 1 for j, n in enumerate(nodes)}
    sources = [r.committed + position[n] for n in path]
    cache.move_slots(index, sources, r.committed + 1)
    r.pending_tokens = emitted
    r.pending_features = features[[0] + [position[n] for n in path]].copy()
    r.committed += 1 + len(path)
    r.root = emitted[-1]
