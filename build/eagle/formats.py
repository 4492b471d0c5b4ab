"""Reading and writing published EAGLE3 drafts: the EAGLE authors' format, SpecForge's, ModelOpt's and
vLLM speculators'. The aux-layer conventions of each are in model.py's docstring."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch
from torch import Tensor, nn

from trt_llm.build.eagle.model import AUX_KEY, DraftDims, Eagle3Draft, config_get, default_aux_layer_ids, t2d_from_d2t

log = logging.getLogger(__name__)
_PREFIXES = ("eagle_module.", "draft_model.", "draft.", "module.", "model.")
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def _canonical_name(name: str) -> str:
    changed = True
    while changed:
        changed = False
        for prefix in _PREFIXES:
            if name.startswith(prefix):
                name, changed = name[len(prefix):], True
    if name.startswith("layers.0."):
        name = "midlayer." + name[len("layers.0."):]
    return name


def _read_tensors(folder: Path) -> dict[str, tuple[Tensor, str]]:
    """name -> (tensor, file name) over every weight file of a draft folder."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        files = sorted(folder.glob("pytorch_model*.bin")) or sorted(folder.glob("*.bin")) or sorted(folder.glob("*.pt"))
    if not files:
        raise FileNotFoundError(f"{folder}: no weights (model.safetensors or pytorch_model.bin)")
    tensors: dict[str, tuple[Tensor, str]] = {}
    for file in files:
        if file.suffix == ".safetensors":
            from safetensors.torch import load_file
            data = load_file(str(file))
        else:
            data = torch.load(str(file), map_location="cpu", weights_only=True)
            if isinstance(data, dict) and "state_dict" in data and isinstance(data["state_dict"], dict):
                data = data["state_dict"]
        for name, tensor in data.items():
            tensors[name] = (tensor, file.name)
    return tensors


def _flatten_config(raw: dict) -> tuple[dict, str]:
    """(a LlamaForCausalLM-style draft config, the format's name) from any of the published configs."""
    architectures = raw.get("architectures") or []
    if "transformer_layer_config" in raw or "speculators_config" in raw:
        config = dict(raw.get("transformer_layer_config") or {})
        for key in ("draft_vocab_size", "target_hidden_size", "norm_before_residual",
                    "eagle_aux_hidden_state_layer_ids", AUX_KEY):
            if key in raw:
                config[key] = raw[key]
        return config, "speculators"
    config = dict(raw)
    if "eagle_config" in raw:
        return config, "modelopt"
    if "LlamaForCausalLMEagle3" in architectures:
        return config, "specforge"
    return config, "eagle"


def _aux_from_config(config: dict, fmt: str) -> list[int] | None:
    if config.get(AUX_KEY) is not None:
        return [int(i) for i in config[AUX_KEY]]
    nested = config.get("eagle_config") if isinstance(config.get("eagle_config"), dict) else {}
    ids = config.get("eagle_aux_hidden_state_layer_ids") or nested.get("eagle_aux_hidden_state_layer_ids")
    if not ids:
        return None
    if fmt == "speculators":
        return [int(i) for i in ids]  # vLLM: already input-of-layer ids
    return [int(i) + 1 for i in ids]  # SGLang / SpecForge / ModelOpt: output-of-layer ids


def load_draft(path, base_config, base_embedding, *, base_lm_head: Tensor | None = None,
               aux_layer_ids: list[int] | None = None, dtype: torch.dtype = torch.float32) -> Eagle3Draft:
    """Read a published EAGLE3 draft folder: the EAGLE authors', SpecForge, ModelOpt or vLLM speculators.

    base_config: the base's HF config (object or dict). base_embedding: its input embedding
    ([vocab, H] tensor or nn.Embedding). base_lm_head: its LM head [vocab, H], used only when the
    draft has none and its vocabulary is the full one (a tied base needs none: the embedding serves).
    The returned draft carries `.aux_layer_ids` (input-of-layer ids into the base; see the module
    docstring), `.source_format` and `.source_path`. Shape mismatches raise a ValueError naming the
    file and the tensor.
    """
    path = Path(path).expanduser()
    folder = path if path.is_dir() else path.parent
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{folder}: no config.json")
    raw = json.loads(config_path.read_text())
    config, fmt = _flatten_config(raw)

    base_vocab = int(config_get(base_config, "vocab_size"))
    base_hidden = int(config_get(base_config, "hidden_size"))
    base_layers = int(config_get(base_config, "num_hidden_layers"))
    if isinstance(base_embedding, nn.Embedding):
        base_embedding = base_embedding.weight
    base_embedding = base_embedding.detach()

    # The aux ids, then the config the module is built from.
    aux = [int(i) for i in aux_layer_ids] if aux_layer_ids is not None else _aux_from_config(config, fmt)
    aux = aux if aux is not None else default_aux_layer_ids(base_layers)
    if any(not 0 <= i < base_layers for i in aux):
        raise ValueError(f"{config_path}: aux layer ids {aux} (input-of-layer) are outside the base's 0..{base_layers - 1}")
    config.setdefault("vocab_size", base_vocab)
    if int(config["vocab_size"]) != base_vocab:
        raise ValueError(f"{config_path}: vocab_size {config['vocab_size']} differs from the base's {base_vocab}")
    if int(config.get("num_hidden_layers", 1)) != 1:
        raise ValueError(f"{config_path}: num_hidden_layers {config['num_hidden_layers']}: only one-layer EAGLE3 "
                         "drafts are supported")
    target_hidden = int(config.get("target_hidden_size") or config["hidden_size"])
    if target_hidden != base_hidden:
        raise ValueError(f"{config_path}: the draft expects target features of width {target_hidden} "
                         f"(target_hidden_size/hidden_size), the base's hidden size is {base_hidden}")
    config[AUX_KEY] = aux
    d = DraftDims.from_config(config)

    # The tensors, under their canonical names.
    tensors: dict[str, tuple[Tensor, str]] = {}
    for name, (tensor, file) in _read_tensors(folder).items():
        if name.endswith(_IGNORED_SUFFIXES):
            continue
        canonical = _canonical_name(name)
        if canonical in tensors:
            raise ValueError(f"{folder / file}: tensor {name!r} duplicates {canonical!r}")
        tensors[canonical] = (tensor, file)

    draft = Eagle3Draft(config)
    expected = {name: tuple(t.shape) for name, t in draft.state_dict().items()}
    why = {
        "fc.weight": f"[H, {d.num_aux} x target hidden {target_hidden}]",
        "embed_tokens.weight": f"[base vocab {base_vocab}, draft hidden {d.hidden_size}]",
        "lm_head.weight": f"[draft_vocab_size {d.draft_vocab_size}, hidden {d.hidden_size}]",
        "d2t": f"[draft_vocab_size {d.draft_vocab_size}]",
        "t2d": f"[base vocab {base_vocab}]",
    }
    for name in ("q_proj", "k_proj", "v_proj"):
        heads = d.num_heads if name == "q_proj" else d.kv_heads
        why[f"midlayer.self_attn.{name}.weight"] = f"[{heads} heads x head_dim {d.head_dim}, 2 x hidden {d.hidden_size}]"
    if "fc.bias" in tensors:
        draft.fc.bias = nn.Parameter(torch.zeros(d.hidden_size))
        expected["fc.bias"] = (d.hidden_size,)
    unexpected = sorted(set(tensors) - set(expected))
    if unexpected:
        name = unexpected[0]
        raise ValueError(f"{folder / tensors[name][1]}: unexpected tensor {name!r} in an EAGLE3 draft "
                         f"({len(unexpected)} such)")
    for name, (tensor, file) in tensors.items():
        if tuple(tensor.shape) != expected[name]:
            detail = why.get(name, f"from {config_path.name}")
            raise ValueError(f"{folder / file}: tensor {name!r} has shape {list(tensor.shape)}, expected "
                             f"{list(expected[name])} {detail}")

    state = {name: tensor for name, (tensor, _) in tensors.items()}
    if "embed_tokens.weight" not in state:
        if tuple(base_embedding.shape) != (base_vocab, d.hidden_size):
            raise ValueError(f"{folder}: the draft has no embed_tokens.weight and the base embedding is "
                             f"{list(base_embedding.shape)}, expected [{base_vocab}, {d.hidden_size}]")
        state["embed_tokens.weight"] = base_embedding
    elif not torch.equal(state["embed_tokens.weight"].to(base_embedding.dtype), base_embedding):
        log.warning("%s: the draft's embed_tokens differ from the base's embedding; the draft graph is fed the "
                    "embedding its inputs_embeds are made with", folder)
    if "lm_head.weight" not in state:
        if d.draft_vocab_size != base_vocab:
            raise ValueError(f"{folder}: no lm_head.weight and the draft vocabulary ({d.draft_vocab_size}) is not the "
                             f"base's ({base_vocab}), so the base's LM head cannot stand in")
        head = base_lm_head if base_lm_head is not None else (
            base_embedding if config_get(base_config, "tie_word_embeddings", False) else None)
        if head is None:
            raise ValueError(f"{folder}: no lm_head.weight; pass base_lm_head (the base's LM head)")
        state["lm_head.weight"] = head.detach()
    if "d2t" not in state:
        if d.draft_vocab_size != base_vocab:
            raise ValueError(f"{folder}: no d2t and the draft vocabulary ({d.draft_vocab_size}) is smaller than the "
                             f"base's ({base_vocab})")
        state["d2t"] = torch.zeros(d.draft_vocab_size, dtype=torch.long)
    state["d2t"] = state["d2t"].long()
    try:
        derived = t2d_from_d2t(state["d2t"], base_vocab)
    except ValueError as exc:
        raise ValueError(f"{folder / tensors.get('d2t', (None, 'd2t'))[1]}: tensor 'd2t': {exc}") from None
    if "t2d" in state and not torch.equal(state["t2d"].bool(), derived):
        log.warning("%s: t2d disagrees with d2t; using the one derived from d2t", folder)
    state["t2d"] = derived

    state = {name: t.to(dtype) if t.is_floating_point() else t for name, t in state.items()}
    draft.load_state_dict(state, strict=True)
    draft.to(dtype)
    draft.embed_tokens.weight.requires_grad_(False)
    draft.aux_layer_ids = aux
    draft.source_format = fmt
    draft.source_path = str(folder)
    return draft


def save_draft_eagle_format(draft: Eagle3Draft, out_dir, config: dict | None = None, *,
                            include_embedding: bool = False, dtype: torch.dtype | None = None) -> Path:
    """Write the EAGLE authors' layout: config.json (LlamaForCausalLM-style, with draft_vocab_size) +
    model.safetensors (fc, midlayer.*, norm, lm_head, d2t, t2d; embed_tokens only if asked).

    `config` entries override the draft's own config (e.g. a `_name_or_path` or training notes).
    """
    from safetensors.torch import save_file

    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    cfg = dict(draft.config)
    cfg.pop(AUX_KEY, None)
    cfg.update({"architectures": cfg.get("architectures") or ["LlamaForCausalLM"],
                "draft_vocab_size": draft.dims.draft_vocab_size, "num_hidden_layers": 1})
    if draft.aux_layer_ids is not None:
        cfg[AUX_KEY] = [int(i) for i in draft.aux_layer_ids]
    cfg.update(config or {})
    state = {}
    for name, tensor in draft.state_dict().items():
        if name == "embed_tokens.weight" and not include_embedding:
            continue
        tensor = tensor.detach().contiguous()
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        state[name] = tensor.clone()
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    umask = os.umask(0)
    os.umask(umask)
    (out / "model.safetensors").chmod(0o666 & ~umask)  # save_file leaves it private
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out
