"""One engine call: the graph contract's per-call inputs and outputs (schemas/graph_spec.py).

Both engines take `engine.run(step, cache, lora)`: the step's small inputs are bound by their
contract names, the caller preallocates its outputs (reused across steps when shapes repeat), the
cache is updated in place, and the LoRA inputs stay bound while the batch does not change.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trt_llm.schemas.graph_spec import LOGITS, STEP_INPUTS


@dataclass
class Step:
    inputs_embeds: np.ndarray  # [B, S, H] the new tokens' embeddings, rows right-padded
    position_ids: np.ndarray  # [B, S] int32 rotary positions
    past_lengths: np.ndarray  # [B] int32 tokens already cached = where the new ones are written
    query_lengths: np.ndarray  # [B] int32 valid new tokens per row
    logits_indices: np.ndarray  # [B, K] int32 where logits are computed
    logits: np.ndarray  # float32 [B, K, V] output
    inputs: dict[str, np.ndarray] = field(default_factory=dict)  # more inputs: tree_mask, a draft's hidden
    outputs: dict[str, np.ndarray] = field(default_factory=dict)  # more outputs: hidden_states, hidden_out

    @classmethod
    def decode(cls, inputs_embeds: np.ndarray, past: np.ndarray, logits: np.ndarray) -> "Step":
        """One new token per row, at position `past` (its row's cached length)."""
        batch = len(past)
        return cls(inputs_embeds, past[:, None], past, np.ones(batch, np.int32), np.zeros((batch, 1), np.int32),
                   logits)

    def named_inputs(self):
        """(name, array) of every input, the contract's five first."""
        yield from zip(STEP_INPUTS, (self.inputs_embeds, self.position_ids, self.past_lengths, self.query_lengths,
                                     self.logits_indices))
        yield from self.inputs.items()

    def named_outputs(self) -> dict[str, np.ndarray]:
        return {LOGITS: self.logits, **self.outputs}
