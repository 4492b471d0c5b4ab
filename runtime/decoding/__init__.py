"""Decoding strategies: how EngineCore (runtime/engine/engine_core.py) turns a running batch into tokens.

A strategy is one object with:
    extra_slots                      KV slots a row needs beyond its prompt and max_new_tokens
    replays_context                  a row that restores a cached prefix computes its last block again
                                     (EAGLE: the draft's next input is that block's last feature)
    reserve(core, need)              size its own pools (rows aligned with the core's KV pool)
    prefill(core, rows, start)       a prefill pass of the rows still prefilling (running rows start ..,
                                     core.prefill: the next chunk of each prompt); the rows that complete
                                     their prompts sample their first token; returns the running indexes
                                     that finished
    step(core)                       one decode step of every row past its prefill (core.decoding, the
                                     first rows of the pool); the same return
    cached(core, index)              tokens of running row `index` in the base cache (what it may commit)
    leave(keep)                      running rows `keep` stay (ascending): drop the others' state

`vanilla.py` emits one token per row per step; `eagle.py` drafts a tree with the EAGLE3 draft and
verifies it in one base pass; `lookup.py` proposes a chain from the row's own prompt and output and
verifies it the same way. All draw every token from the base model's own distribution with the
request's sampler, so they emit the same tokens. A new strategy is one file here, named in `choice.py`
and made where the loaded engine makes its EngineCore (`LoadedEngine.engine_core`).
"""
