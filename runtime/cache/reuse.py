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
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trt_llm.runtime.cache.context_cache import ContextCache, Entry, chain_key


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
    if kept is not None and len(kept.token_ids) >= length:
        cache.restore(row, len(kept.token_ids), [(len(kept.token_ids), kept.keys, kept.values)])
        context.stats["hits"] += 1
        return len(kept.token_ids)
    if not length:
        context.stats["misses"] += plan.lookup
        return 0
    plan.committed = length
    if plan.replay and length > plan.replay and all(b.draft_keys is not None for b in blocks):
        plan.draft_blocks = blocks
        length -= plan.replay
        blocks = blocks[: length // size]
    first = min(cache.needed(length)) // size
    cache.restore(row, length, [((i + 1) * size, b.keys, b.values) for i, b in enumerate(blocks) if i >= first])
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
        if all(_covers(blocks, layer, first, size) for layer, first in enumerate(cache.needed(len(blocks) * size))):
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
    if plan.save_kept and computed >= len(plan.kept):
        keys, values = cache.read_prefix(row, len(plan.kept))
        context.put(plan.adapter, Entry(tuple(plan.kept), keys, values))
        context.stats["saved"] += 1
        plan.save_kept = False
    if plan.commit == "none":
        return
    size = context.block_tokens
    for index in range(plan.committed // size, computed // size):
        key = plan.key(context, index, tokens)
        if not context.has_block(key):
            keys, values = cache.read(row, index * size, (index + 1) * size)
            context.add_block(key, Entry(tuple(tokens[index * size: (index + 1) * size]), keys, values))
    plan.committed = max(plan.committed, computed - computed % size)
    context.touch(plan.keys[: plan.committed // size][::-1])
    context.trim()
