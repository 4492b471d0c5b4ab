"""LoRA adapters as data: read PEFT adapters, check them against the engine, lay them out per row.

An adapter is read once per run: `adapter_config.json` + `adapter_model.safetensors`, from a
directory or given as the .safetensors file with its config beside it. Its scale (alpha / r, or
alpha / sqrt(r) for rsLoRA) is folded into B. A batch's LoRA inputs stack each row's adapter (or
zeros for rows without one), so rows of one batch may use different adapters.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from trt_llm.schemas.graph_spec import lora_groups_at, lora_input

_TENSOR = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.\w+)?\.weight$")


class LoraError(ValueError):
    pass


@dataclass
class LoraAdapter:
    name: str
    # (layer, module) -> (A [r, in], B [out, r] with the scale folded in)
    weights: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]]

    @cached_property
    def digest(self) -> str:
        """Names its weights' content (the context cache keys a prefix's state on it)."""
        h = hashlib.sha256(self.name.encode())
        for (layer, module), (a, b) in sorted(self.weights.items()):
            h.update(f"{layer}/{module}".encode())
            h.update(np.ascontiguousarray(a).tobytes())
            h.update(np.ascontiguousarray(b).tobytes())
        return h.hexdigest()[:32]

    @property
    def max_rank(self) -> int:
        return max(a.shape[0] for a, _ in self.weights.values())


def _files(name: str, path: str) -> tuple[Path, Path]:
    location = Path(path).expanduser()
    if location.is_dir():
        weights, config = location / "adapter_model.safetensors", location / "adapter_config.json"
    else:
        weights, config = location, location.parent / "adapter_config.json"
    for f in (weights, config):
        if not f.is_file():
            raise LoraError(f"LoRA adapter {name!r}: {str(f)!r} not found")  # quoted: a NUL or newline shows escaped
    return weights, config


def load_adapter(name: str, path: str, layout: dict, dtype=np.float32) -> LoraAdapter:
    """Read and check one adapter against the engine's LoRA layout (see build/lora.py)."""
    from safetensors.numpy import load_file

    weights_path, config_path = _files(name, path)
    try:
        config = json.loads(config_path.read_text())
        tensors = load_file(str(weights_path))
    except Exception as error:
        raise LoraError(f"LoRA adapter {name!r}: cannot read {weights_path.name}: {error}") from error
    if config.get("fan_in_fan_out"):
        raise LoraError(f"LoRA adapter {name!r}: fan_in_fan_out adapters (Conv1D models) are not supported")
    if config.get("bias", "none") != "none":
        raise LoraError(f"LoRA adapter {name!r}: bias={config['bias']!r} adapters are not supported")

    # (layer, module) -> (in, out): the layers may differ (build/lora.py's layer_groups)
    shapes = {(layer, m): (g["in_features"], g["module_out_features"][m]) for layer in range(layout["num_layers"])
              for g in lora_groups_at(layout, layer) for m in g["modules"]}
    targeted = {m for _, m in shapes}
    pairs: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    for tensor_name, tensor in tensors.items():
        match = _TENSOR.search(tensor_name)
        if not match:
            raise LoraError(f"LoRA adapter {name!r}: tensor {tensor_name!r} is not a LoRA weight of a "
                            "decoder layer projection (embedding or lm_head adapters are not supported)")
        layer, module, which = int(match[1]), match[2], match[3]
        if module not in targeted:
            raise LoraError(f"LoRA adapter {name!r}: tensor {tensor_name!r} targets {module}, but the engine "
                            f"was built with LoRA on {', '.join(layout['target_modules'])}")
        if layer >= layout["num_layers"]:
            raise LoraError(f"LoRA adapter {name!r}: tensor {tensor_name!r} is for layer {layer}; the model "
                            f"has {layout['num_layers']}")
        if (layer, module) not in shapes:
            raise LoraError(f"LoRA adapter {name!r}: tensor {tensor_name!r} targets {module}, which layer {layer} "
                            "of this model does not have")
        pairs.setdefault((layer, module), {})[which] = tensor

    alpha_pattern, rank_pattern = config.get("alpha_pattern") or {}, config.get("rank_pattern") or {}
    weights = {}
    for (layer, module), pair in sorted(pairs.items()):
        if set(pair) != {"A", "B"}:
            raise LoraError(f"LoRA adapter {name!r}: layer {layer} {module} has lora_{''.join(pair)} "
                            "but not its partner")
        a, b = pair["A"].astype(np.float32), pair["B"].astype(np.float32)
        rank = a.shape[0]
        in_features, out_features = shapes[(layer, module)]
        if a.shape != (rank, in_features) or b.shape != (out_features, rank):
            raise LoraError(f"LoRA adapter {name!r}: layer {layer} {module}: A {tuple(a.shape)} and B "
                            f"{tuple(b.shape)} do not match the base model's ({rank}, {in_features}) and "
                            f"({out_features}, {rank})")
        if rank > layout["max_rank"]:
            raise LoraError(f"LoRA adapter {name!r}: layer {layer} {module} has rank {rank}, above the "
                            f"engine's max_rank {layout['max_rank']}")
        key = next((k for k in alpha_pattern if re.search(k, f"layers.{layer}.{module}")), None)
        alpha = alpha_pattern[key] if key else config.get("lora_alpha", config.get("r", rank))
        declared_rank = rank_pattern.get(key, config.get("r", rank)) if key else config.get("r", rank)
        scale = alpha / math.sqrt(declared_rank) if config.get("use_rslora") else alpha / declared_rank
        weights[(layer, module)] = (a.astype(dtype), (b * scale).astype(dtype))
    if not weights:
        raise LoraError(f"LoRA adapter {name!r}: no LoRA weights found in {weights_path.name}")
    return LoraAdapter(name, weights)


def batch_inputs(adapters: list[LoraAdapter | None], layout: dict, dtype=np.float32) -> dict[str, np.ndarray]:
    """The graph's LoRA inputs for a batch whose row i uses adapters[i] (None = the base model)."""
    rank = max([a.max_rank for a in adapters if a is not None], default=1)
    batch = len(adapters)
    inputs = {}
    for layer in range(layout["num_layers"]):
        for group in lora_groups_at(layout, layer):
            modules = group["modules"]
            a = np.zeros((batch, rank * len(modules), group["in_features"]), dtype)
            b = np.zeros((batch, group["out_features"], rank * len(modules)), dtype)
            for row, adapter in enumerate(adapters):
                if adapter is None:
                    continue
                for j, module in enumerate(modules):
                    pair = adapter.weights.get((layer, module))
                    if pair is None:
                        continue
                    r, offset, width = pair[0].shape[0], group["out_offsets"][module], pair[1].shape[0]
                    a[row, j * rank: j * rank + r] = pair[0]
                    b[row, offset: offset + width, j * rank: j * rank + r] = pair[1]
            inputs[lora_input(group["name"], "a", layer)] = a
            inputs[lora_input(group["name"], "b", layer)] = b
    return inputs
