"""What a speculating strategy does for recurrent layers (Qwen3.5, LFM2), which replace their states at
every token: a verification pass leaves the states after its last token, rejected ones included.

So a row that will verify a chain has its states copied first (`snapshots`), and a row that refused part
of it gets them back and passes the tokens it took again, alone (`replay`); a row that took its whole
chain needs none. Only chains: a recurrent layer reads a pass's tokens in order, so a tree's branches
would run through one another (runtime/decoding/eagle.py verifies chains on these models).

With context reuse committing generated tokens, a chain stops at a block's end (`block_room`), where
the states are snapshotted for the context cache (reuse.snapshot_decoded).
"""

from __future__ import annotations

import numpy as np

from trt_llm.runtime.engine.step import Step


def snapshots(core, rows: list[int]) -> dict[int, list]:
    """The recurrent states of running rows `rows` (the ones about to verify a chain); none without
    recurrent layers."""
    if not core.cache.recurrent:
        return {}
    return {i: core.cache.snapshot(i) for i in rows}


def block_room(core, sequence) -> int | None:
    """The most tokens a chain after `sequence`'s last token may hold and stay within its block (None: no
    bound), on a recurrent model whose row commits its generated tokens."""
    plan = sequence.context
    if not (core.cache.recurrent and plan is not None and plan.commit == "generated"):
        return None
    block = core.context.block_tokens
    return block - sequence.length % block


def replay(core, index: int, tokens: np.ndarray, past: int, states: list) -> None:
    """Running row `index` back to its states before the pass, then `tokens` (its last token and the
    ones it accepted, at positions past ..) passed again, alone, to bring them to after the last of them
    (the attention layers rewrite the same keys and values at the same slots)."""
    model, width = core.model, len(tokens)
    window = core.cache.window(index, index + 1)
    window.load_states(0, states)
    embeds, extras = model.embed(np.asarray(tokens, dtype=np.int64)[None])
    step = Step(embeds, np.arange(past, past + width, dtype=np.int32)[None], np.array([past], np.int32),
                np.array([width], np.int32), np.array([[width - 1]], np.int32),
                np.empty((1, 1, model.vocab_size), dtype=np.float32))
    step.inputs, step.outputs = model.eagle_io(1, width)
    step.inputs.update(extras)
    if model.positions_vary:
        step.position_ids = model.positions([core.decoding[index].sequence], step.past_lengths, width)
    step.inputs.update(model.decode_extras(1, width))
    with core.stage("recurrent_replay"):
        model.engine.run(step, window, core.lora_rows(index, index + 1))
