"""The EAGLE3 draft side of an engine directory, and the speculation settings it can serve."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trt_llm.runtime.decoding.spec_config import SpecConfig


@dataclass
class Draft:
    """What speculation needs from the draft: its engine and the tensors around it."""

    engine: object  # an engine over the draft graph (one layer)
    fc: np.ndarray  # [H, 3H]: target features -> draft hidden
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

    @property
    def mean_accepted(self) -> float:
        return self.emitted / self.rounds if self.rounds else 0.0


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
