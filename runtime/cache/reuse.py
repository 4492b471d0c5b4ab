"""Context reuse at the engine: a request's plan, what its row restores when it is admitted, and
what it commits once computed (runtime/cache/context_cache.py holds the records).

    restore(context, cache, row, sequence)   at admission: the longest usable cached prefix of the
                                             prompt into the empty row; returns its length
    commit(context, cache, row, sequence, n) after a pass: the row's full blocks of its first n
                                             tokens (and a kept system prompt) into the cache

A prefix is usable when every layer gets what it needs of it (cache_set.CacheSet.needed): all of
it for full attention, the last window - 1 tokens for a sliding-window layer (a block holds what the
layer still held when it was committed: always the block's last window - 1 tokens, since a pass
computes no more than the window cache holds beyond them). At least one prompt token is always
computed: it gives the first logits.

A hybrid model's recurrent layers keep no tokens, only a state after the last: a prefix is usable
there only where its last record holds the row's states at its end. A row's states are snapshotted
at the ends of the passes that reach a snapshot point (`snapshot_points`: the last block boundary of
its system prompt and of its prompt, and a kept system prompt's end; the engine ends a prefill pass
there) and, decoding a request that commits its generated tokens, at each block boundary it passes
(`snapshot_decoded`, the latest kept until it leaves).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trt_llm.runtime.cache.context_cache import ContextCache, Entry, chain_key


@dataclass(frozen=True)
class ContextRequest:
    """A request's context policies as its preparation resolved them; the engine core, which owns the
    cache, turns them into the sequence's ContextPlan when the request is added (EngineCore.plan)."""
    commit: str = "including_generated_tokens"  # its context_cache_commit_policy
    adapter: str | None = None  # its LoRA adapter's digest (None: the base model)
    kept: tuple[int, ...] | None = None  # its templated system prompt's tokens, where they prefix the prompt
    save_kept: bool = False  # keep them after its prefill (its batch's save_system_prompt_kv_cache)


@dataclass
class ContextPlan:
    """What a request may take from the context cache and give to it."""
    root: str  # ContextCache.root of its engine and adapter
    media: tuple[tuple[int, int, str], ...] = ()  # (first token, tokens, content hash) of each image / clip
    lookup: bool = False  # restore its longest cached prefix (context reuse)
    commit: str = "none"  # "none", "prefill" (its prompt's blocks) or "generated" (also its generated tokens')
    adapter: str | None = None  # a kept entry's key, with its tokens: the adapter's digest (None: the base)
    kept: tuple[int, ...] | None = None  # its system prompt's tokens: reuse a kept entry of exactly them ...
    save_kept: bool = False  # ... or keep one after its prefill (save_system_prompt_kv_cache)
    keys: list[str] = field(default_factory=list)  # the chain keys of its blocks, as far as computed
    committed: int = 0  # tokens whose blocks are in the cache (it restored or committed them)
    # An EAGLE base: the draft catches up from the base's features, which a restored prefix has none
    # of. Where every restored block has the draft's keys and values, the row restores those too and
    # the base recomputes the prefix's last `replay` tokens (the draft's next input is the feature of
    # the prefix's last token): Edge-LLM's replay of the final matched page.
    replay: int = 0
    draft_blocks: list | None = None  # set by restore: the blocks whose draft state the draft restores
    decoded_states: tuple[int, list] | None = None  # a recurrent row's latest block-boundary snapshot while decoding

    def key(self, context: ContextCache, index: int, token_ids) -> str:
        """The chain key of block `index` (token_ids: at least its tokens)."""
        size = context.block_tokens
        while len(self.keys) <= index:
            i = len(self.keys)
            start, stop = i * size, (i + 1) * size
            media = tuple((first - start, count, digest) for first, count, digest in self.media
                          if first < stop and first + count > start)
            self.keys.append(chain_key(self.keys[-1] if self.keys else self.root, token_ids[start:stop], media))
        return self.keys[index]


def restore(context: ContextCache, cache, row: int, s) -> int:
    """Fill the empty `row` of `cache` with the longest usable cached prefix of s.prompt_ids (a
    kept entry or a chain of blocks); returns how many tokens it covers."""
    plan = s.context
    if plan is None:
        return 0
    limit = len(s.prompt_ids) - 1
    kept = None
    if plan.kept is not None and len(plan.kept) <= limit:
        kept = context.get(plan.adapter, plan.kept)
        if kept is not None:
            plan.save_kept = False  # there is one already
    blocks = _usable_blocks(context, cache, s, limit) if plan.lookup else []
    size = context.block_tokens
    length = len(blocks) * size
    if kept is not None and cache.recurrent and kept.states is None:
        kept = None  # (saved without its states: not a prefix a recurrent layer can resume from)
    if kept is not None and len(kept.token_ids) >= length:
        cache.restore(row, len(kept.token_ids), [(len(kept.token_ids), kept.keys, kept.values)], kept.states)
        context.stats["hits"] += 1
        return len(kept.token_ids)
    if not length:
        context.stats["misses"] += plan.lookup
        return 0
    plan.committed = length
    trimmed = (length - plan.replay) // size  # the blocks restored under a replay; on a recurrent model the
    # last of them must hold its states (they are snapshotted at some block ends only: snapshot_points)
    if (plan.replay and length > plan.replay and all(b.draft_keys is not None for b in blocks)
            and (not cache.recurrent or blocks[trimmed - 1].states is not None)):
        plan.draft_blocks = blocks
        length -= plan.replay
        blocks = blocks[: length // size]
    first = min(cache.needed(length)) // size
    cache.restore(row, length, [((i + 1) * size, b.keys, b.values) for i, b in enumerate(blocks) if i >= first],
                  blocks[-1].states)
    context.stats["hits"] += 1
    return length


def _usable_blocks(context: ContextCache, cache, s, limit: int) -> list:
    """The longest run of cached blocks of the prompt's first `limit` tokens, from its first, whose
    every layer has what it needs."""
    blocks = []
    for index in range(limit // context.block_tokens):
        block = context.block(s.context.key(context, index, s.prompt_ids))
        if block is None:
            break
        blocks.append(block)
    context.touch(s.context.keys[: len(blocks)][::-1])
    size = context.block_tokens
    while blocks:
        if (all(_covers(blocks, layer, first, size) for layer, first in enumerate(cache.needed(len(blocks) * size)))
                and (blocks[-1].states is not None or not cache.recurrent)):
            return blocks
        blocks.pop()
    return []


def _covers(blocks: list, layer: int, first: int, size: int) -> bool:
    """Whether the blocks hold every token from `first` to their end for `layer`: each block holds
    its last n tokens (all of them, or what a sliding layer still held when it was committed)."""
    for index in range(len(blocks) - 1, -1, -1):
        start = index * size
        if start + size <= first:
            return True
        held = blocks[index].keys[layer]
        if held is None:
            return False
        if start + size - held.shape[1] > max(first, start):
            return False  # a gap before the tokens this block holds
    return True


def commit(context: ContextCache, cache, row: int, s, computed: int, token_ids=None) -> None:
    """After a pass: the blocks of the first `computed` tokens of `row` not yet in the context cache
    (token_ids: the row's tokens, default its prompt), and a kept system prompt once computed."""
    plan = s.context
    if plan is None:
        return
    tokens = s.prompt_ids if token_ids is None else token_ids
    size, recurrent = context.block_tokens, cache.recurrent
    # A recurrent row's states now are those after its `computed` tokens (the pass just ended there):
    # copied only where a record ends there (a block, a kept system prompt).
    at_kept = plan.save_kept and computed == len(plan.kept)
    at_block = plan.commit != "none" and computed % size == 0
    states = cache.snapshot(row) if recurrent and (at_kept or at_block) else None
    if plan.save_kept and computed >= len(plan.kept) and (not recurrent or at_kept):
        keys, values = cache.read_prefix(row, len(plan.kept))
        context.put(plan.adapter, Entry(tuple(plan.kept), keys, values, states=states))
        context.stats["saved"] += 1
        plan.save_kept = False
    if plan.commit == "none":
        return
    at = {computed: states} if states is not None else {}
    if plan.decoded_states is not None:
        at.setdefault(*plan.decoded_states)
        plan.decoded_states = None
    for index in range(plan.committed // size, computed // size):
        key, end = plan.key(context, index, tokens), (index + 1) * size
        if not context.has_block(key):
            keys, values = cache.read(row, index * size, end)
            context.add_block(key, Entry(tuple(tokens[index * size: end]), keys, values, states=at.get(end)))
        elif at.get(end) is not None:
            context.attach_states(key, at[end])
    plan.committed = max(plan.committed, computed - computed % size)
    context.touch(plan.keys[: plan.committed // size][::-1])
    context.trim()


def snapshot_points(context: ContextCache, s) -> list[int]:
    """Where a recurrent row's prefill passes end so that its states are snapshotted (ascending):
    the last block boundary of its system prompt and of its prompt (of the tokens a later request
    may restore: all but the last), and the end of a system prompt it keeps."""
    plan = s.context
    if plan is None:
        return []
    size, points = context.block_tokens, set()
    if plan.commit != "none":
        points.add((len(s.prompt_ids) - 1) // size * size)
        if plan.kept is not None:
            points.add(len(plan.kept) // size * size)
    if plan.save_kept:
        points.add(len(plan.kept))
    return sorted(p for p in points if p > (s.prefilled or 0))


def snapshot_decoded(context: ContextCache, cache, row: int, s, cached: int) -> None:
    """After a decode step of a recurrent row that commits its generated tokens: its states, when the
    `cached` tokens its row now holds end a block (committed with that block when it leaves)."""
    plan = s.context
    if (plan is not None and plan.commit == "generated" and cached % context.block_tokens == 0
            and (plan.decoded_states is None or plan.decoded_states[0] != cached)):
        plan.decoded_states = (cached, cache.snapshot(row))
