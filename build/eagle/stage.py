"""The EAGLE3 part of a build: read the draft, export its graph, write what the runtime needs."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from trt_llm.build.checkpoint import Checkpoint


class DraftError(ValueError):
    pass


def check_draft_source(config) -> None:
    """A `draft:` folder that does not exist, named in one line (before the base is loaded)."""
    if config.draft is not None and not Path(config.draft.model).expanduser().exists():
        raise DraftError(f"draft.model: {config.draft.model!r} does not exist")


def load_eagle_draft(config, checkpoint: Checkpoint):
    """The draft of `config.draft`, checked against the base (a missing embedding or LM head is
    taken from the base)."""
    from trt_llm.build.eagle.formats import load_draft

    check_draft_source(config)
    if checkpoint.family.multimodal:
        raise DraftError(f"draft: an EAGLE draft on a multimodal model ({checkpoint.family.architecture}) is "
                         "not supported yet: its verification would need the image or audio rows (and a VLM's "
                         "mRoPE positions) in every tree; build without draft:")
    base = checkpoint.model
    try:
        return load_draft(config.draft.model, base.config, base.get_input_embeddings(),
                          base_lm_head=base.lm_head.weight)
    except (OSError, ValueError, KeyError) as error:
        reason = f"missing {error.args[0]!r}" if isinstance(error, KeyError) and error.args else error  # not a bare word
        raise DraftError(f"draft.model: cannot use {config.draft.model!r}: {reason}") from error


def export_eagle_draft(draft, checkpoint: Checkpoint, config, directory: Path, dtype: torch.dtype) -> Path:
    """Write directory/model.onnx (the draft graph) and directory/tensors.safetensors (fc, d2t, and
    the draft's own embedding when it has one); returns the graph's path."""
    from trt_llm.build.eagle.graph import DraftGraph
    from trt_llm.build.export import export_draft

    directory.mkdir(parents=True, exist_ok=True)
    tensors = {"fc": draft.fc_weight.detach().to(dtype).contiguous(), "d2t": draft.d2t.detach().to(torch.int64)}
    if draft.fc_bias is not None:
        raise DraftError("draft.model: drafts whose fc has a bias are not supported")
    base_embedding = checkpoint.model.get_input_embeddings().weight
    if not torch.equal(draft.embed_tokens.weight, base_embedding):
        tensors["embedding"] = draft.embed_tokens.weight.detach().to(dtype).contiguous()
    save_file(tensors, str(directory / "tensors.safetensors"))
    d = draft.dims
    graph = DraftGraph(draft, config.max_kv_cache_capacity, dtype)
    return export_draft(graph, d.hidden_size, d.kv_heads, d.head_dim, directory / "model.onnx", dtype)


def manifest_entries(draft, config) -> tuple[dict, dict]:
    """(components["draft"], model["eagle"]) of the manifest (the compile stage adds the engine)."""
    component = {"kind": "eagle3", "graph": "draft/model.onnx", "tensors": "draft/tensors.safetensors",
                 "max_draft_tree_size": config.draft.max_draft_tree_size,
                 "max_verify_tree_size": config.draft.max_verify_tree_size,
                 "draft_vocab_size": int(draft.d2t.numel()), "source_format": draft.source_format}
    from trt_llm.build.eagle.graph import draft_layer_spec

    component["layers"] = [draft_layer_spec(draft).model_dump()]
    eagle = {"feature_layers": list(draft.aux_layer_ids),
             "feature_width": int(draft.fc_weight.shape[1])}
    return component, eagle
