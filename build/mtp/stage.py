"""The MTP part of a build (`mtp: true`): the refusals, the head's tensors, its graph and manifest entry."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from trt_llm.build.checkpoint import Checkpoint
from trt_llm.build.compile import BuildError
from trt_llm.build.mtp import TREE_SIZE
from trt_llm.build.mtp.graph import LAYER, hf_mtp_layer, one_layer_config
from trt_llm.build.models.skeleton import text_decoder

log = logging.getLogger(__name__)

PREFIX = "mtp."
# The head's tensors besides its layer's (vLLM's Qwen3_5MultiTokenPredictor)
HEAD = ("mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight")


@dataclass
class MtpHead:
    """The checkpoint's head, read and checked: its tensors (fp32) and its layer as transformers'."""
    tensors: dict
    hf_layer: object  # transformers' decoder layer (full attention) holding mtp.layers.0.*
    config: object  # the text config as one full-attention layer (graph.one_layer_config)


def read_mtp_head(config, checkpoint: Checkpoint) -> MtpHead:
    """The head of `config.model`, or a BuildError naming `mtp` and why there is none to build."""
    family = checkpoint.family
    if family.multimodal:
        raise BuildError(f"mtp: the MTP head of a multimodal model ({family.architecture}) is not supported yet: "
                         "its verification would need the image or audio rows (and a VLM's mRoPE positions) in "
                         "every tree; build without mtp:")
    if not family.mtp:
        raise BuildError(f"mtp: {family.architecture} has no multi-token-prediction head this build can make "
                         "(Qwen3.5's mtp.* layers only); build without mtp:")
    text = text_decoder(checkpoint.model)
    layers = getattr(text.config, "mtp_num_hidden_layers", None)
    files = {name: path for name, path in _tensor_files(config.model, checkpoint).items() if name.startswith(PREFIX)}
    if not layers or not files:
        raise BuildError(f"mtp: {config.model!r} has no multi-token-prediction head (config.json's "
                         f"mtp_num_hidden_layers is {layers}, {len(files)} mtp.* tensors); build without mtp:")
    if layers != 1:
        raise BuildError(f"mtp: {layers} MTP layers (config.json's mtp_num_hidden_layers); a head of 1 is "
                         "supported; build without mtp:")
    missing = [name for name in HEAD if name not in files]
    if missing:
        raise BuildError(f"mtp: the checkpoint's MTP head has no {missing[0]!r}; build without mtp:")
    tensors = _read(files)
    hidden = text.config.hidden_size
    for name, shape in zip(HEAD, ([hidden, 2 * hidden], [hidden], [hidden], [hidden])):
        if list(tensors[name].shape) != shape:
            raise BuildError(f"mtp: {name} is {list(tensors[name].shape)}, the head's is {shape}; build without mtp:")
    others = [n for n in tensors if n not in HEAD and not n.startswith(LAYER)]
    if others:
        raise BuildError(f"mtp: {others[0]!r} is not a tensor of a one-layer MTP head; build without mtp:")
    single = one_layer_config(text.config)
    try:
        layer = hf_mtp_layer(type(text.model.layers[0]), single, tensors)
    except KeyError as error:
        raise BuildError(f"mtp: the checkpoint's MTP head has no {error.args[0]!r}; build without mtp:") from None
    except ValueError as error:
        raise BuildError(f"mtp: {error}; build without mtp:") from None
    return MtpHead(tensors, layer, single)


def export_mtp_head(head: MtpHead, checkpoint: Checkpoint, config, directory: Path, dtype: torch.dtype) -> dict:
    """Write directory/model.onnx (the head's step) and directory/tensors.safetensors (d2t: zeros, the
    head's ids are the base's); returns the manifest's components["draft"]."""
    from safetensors.torch import save_file

    from trt_llm.build.export import export_draft
    from trt_llm.build.mtp.graph import MtpGraph

    directory.mkdir(parents=True, exist_ok=True)
    text = text_decoder(checkpoint.model)
    lm_head = _lm_head_weight(checkpoint, text.lm_head)
    vocab = int(lm_head.shape[0])
    # No fc tensor: the head's fc is in its graph (the runtime projects nothing on the host).
    save_file({"d2t": torch.zeros(vocab, dtype=torch.int64)}, str(directory / "tensors.safetensors"))
    graph = MtpGraph(checkpoint.family.load(), head.hf_layer, head.config, checkpoint.family, head.tensors, lm_head,
                     text.model.rotary_emb, config.max_kv_cache_capacity, dtype)
    d = graph.dims
    export_draft(graph, d.hidden_size, d.kv_heads, d.head_dim, directory / "model.onnx", dtype)
    return {"kind": "mtp", "graph": "draft/model.onnx", "tensors": "draft/tensors.safetensors",
            "max_draft_tree_size": TREE_SIZE, "max_verify_tree_size": TREE_SIZE, "draft_vocab_size": vocab,
            "source_format": "mtp", "layers": [graph.layer_spec.model_dump()]}


def _lm_head_weight(checkpoint: Checkpoint, head) -> torch.Tensor:
    """The base's LM head weight [V, H] in fp32: a streamed checkpoint's read from its files again (the
    decoder graph emptied its copy), a tied one's from the embedding."""
    weights = checkpoint.weights
    if weights is None:
        return head.weight.detach().float()
    name = f"{weights.names[id(head)]}.weight"
    return weights.read(weights.aliases.get(name, name))


def _tensor_files(model: str, checkpoint: Checkpoint) -> dict[str, Path]:
    """Every tensor name of the checkpoint's safetensors files -> its file (none for a GGUF file)."""
    from trt_llm.build.streamed_weights import _tensor_files as folder_files

    if checkpoint.weights is not None:
        return checkpoint.weights.files
    path = Path(model).expanduser()
    if not path.exists():  # a hub id: the files from_pretrained fetched
        from huggingface_hub import snapshot_download

        try:
            path = Path(snapshot_download(model, allow_patterns=["*.safetensors", "*.json"], local_files_only=True))
        except Exception as error:  # (not cached as a whole snapshot)
            log.info("%s: its files are not in the hub cache (%s)", model, error)
            return {}
    return (folder_files(path) or {}) if path.is_dir() else {}


def _read(files: dict[str, Path]) -> dict[str, torch.Tensor]:
    """The named tensors in fp32, each file opened once."""
    from safetensors import safe_open

    by_file: dict[Path, list[str]] = {}
    for name, file in files.items():
        by_file.setdefault(file, []).append(name)
    tensors = {}
    for file, names in by_file.items():
        with safe_open(str(file), framework="pt") as handle:
            for name in names:
                tensors[name] = handle.get_tensor(name).float()
    return tensors
