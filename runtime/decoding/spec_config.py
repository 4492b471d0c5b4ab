"""The EAGLE token tree a run drafts and verifies, and the default that pays on each backend.

On a CPU a verification pass is compute-bound beyond a few tokens (SmolLM2 on 2 cores: 4 tokens cost
1.2 single-token steps, 8 about 1.5, 60 about 3.4), so the measured best there is a small tree; on a
GPU a pass of 60 tokens costs about what one token does, and the spec's tree accepts the most. The
build records the default in the manifest (components.draft.tree_defaults); run flags override it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class SpecConfig:
    draft_top_k: int = 10
    draft_steps: int = 6
    verify_tree_size: int = 60


# cpu: benchmarks/spec_decode.py, SmolLM2 with its fitted draft, batch 1: 3,2,4 ran 1.28x-1.40x
# vanilla where 4,4,8 ran 1.04x-1.20x and 10,6,60 0.51x (benchmarks/results/2026-11-30).
TREE_DEFAULTS = {"cpu": SpecConfig(3, 2, 4), "tensorrt": SpecConfig(10, 6, 60), "tensorrt-rtx": SpecConfig(10, 6, 60)}


def default_tree(backend: str, max_draft_tree_size: int, max_verify_tree_size: int) -> SpecConfig:
    """The backend's default tree, shrunk to fit what the engine was built for."""
    tree = TREE_DEFAULTS.get(backend, SpecConfig())
    steps = max(1, min(tree.draft_steps, max_draft_tree_size))
    top_k = max(1, min(tree.draft_top_k, max_draft_tree_size // steps))
    return SpecConfig(top_k, steps, max(2, min(tree.verify_tree_size, max_verify_tree_size)))


def tree_defaults_entry(backend: str, max_draft_tree_size: int, max_verify_tree_size: int) -> dict:
    return asdict(default_tree(backend, max_draft_tree_size, max_verify_tree_size))


def resolve_spec(draft_component: dict, backend: str, draft_top_k: int | None = None,
                 draft_steps: int | None = None, verify_tree_size: int | None = None) -> SpecConfig:
    """The tree a run uses: each flag given, else the engine's recorded default (engines built before
    the defaults were recorded get their backend's)."""
    recorded = draft_component.get("tree_defaults")
    base = SpecConfig(**recorded) if isinstance(recorded, dict) else default_tree(
        backend, draft_component["max_draft_tree_size"], draft_component["max_verify_tree_size"])
    return SpecConfig(draft_top_k if draft_top_k is not None else base.draft_top_k,
                      draft_steps if draft_steps is not None else base.draft_steps,
                      verify_tree_size if verify_tree_size is not None else base.verify_tree_size)
