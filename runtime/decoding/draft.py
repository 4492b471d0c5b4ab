"""The draft side of an engine directory, and the speculation settings it can serve.

Two kinds draft the same way (runtime/decoding/eagle.py): an EAGLE3 draft, which reads the base's
hidden states entering three of its layers (`hidden_states`, [3H], projected by `fc` here), and a
checkpoint's multi-token-prediction head (build/mtp/, kind "mtp"), which reads the base's final-normed
hidden states (`final_hidden_states`, [H]) and has its fc in its graph. Each pairs the feature at token j
with token j + 1 and predicts token j + 2; a deeper step reads its own hidden_out."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trt_llm.runtime.decoding.spec_config import SpecConfig


@dataclass
class Draft:
    """What speculation needs from the draft: its engine and the tensors around it."""

    engine: object  # an engine over the draft graph (one layer)
    fc: np.ndarray | None  # [H, 3H]: target features -> draft hidden (None: the features are its input)
    d2t: np.ndarray  # [Vd] int64: target id = draft id + d2t[draft id]
    embedding: np.ndarray  # [V, H]: the token embedding the draft reads (the base's unless its own)
    hidden_size: int
    target_ids: np.ndarray = field(init=False)  # [Vd]: the target id of each draft id

    def __post_init__(self):
        self.target_ids = np.arange(len(self.d2t)) + self.d2t


@dataclass
class SpecStats:
    rounds: int = 0  # verification passes, counted per row
    emitted: int = 0  # tokens they emitted
    proposed: int = 0  # drafted tokens verified
    accepted: int = 0  # of them, taken

    @property
    def mean_accepted(self) -> float:
        return self.emitted / self.rounds if self.rounds else 0.0


def draft_kind(engine_dir) -> str | None:
    """The strategy the engine's draft serves: "eagle" (an EAGLE3 draft), "mtp" (a multi-token-prediction
    head) or None (no draft)."""
    draft = engine_dir.manifest["components"].get("draft")
    if draft is None:
        return None
    return "mtp" if draft.get("kind") == "mtp" else "eagle"


def load_draft_engine(engine_dir, threads: int, base_embedding: np.ndarray) -> Draft:
    """The draft side of an engine directory (components.draft in its manifest)."""
    from safetensors.numpy import load_file

    from trt_llm.runtime.backends.engines import open_engine

    paths = engine_dir.manifest["components"]["draft"]
    tensors = load_file(str(engine_dir.path / paths["tensors"]))
    embedding = base_embedding
    if "embedding" in tensors:
        embedding = tensors["embedding"]
    engine = open_engine(engine_dir, threads, "draft", spinning=False)  # see Runner: base and draft alternate
    fc = tensors.get("fc")
    hidden_size = int(fc.shape[0]) if fc is not None else int(engine_dir.dims["hidden_size"])
    return Draft(engine, fc, tensors["d2t"].astype(np.int64), embedding, hidden_size)


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
