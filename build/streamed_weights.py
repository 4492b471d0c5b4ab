"""A safetensors checkpoint read one module at a time, so the build never holds the whole model.

The model transformers would load is made on the meta device (its shapes and names, no memory);
the build asks for each module's weights as it converts it (`load`), empties them once its own copy
exists, and reads a mixture of experts one expert at a time (`experts`): a Qwen3-30B-A3B checkpoint
is 60 GB in bf16, its int4 engine 16 GB, and a layer of its experts alone 2.4 GB in fp32.

    weights = StreamedWeights.open(directory, meta_model)   # None when the folder cannot be streamed
    weights.load(model.model.layers[0])                     # its parameters read, as fp32
    for gate, up, down in weights.experts(layer.mlp.experts): ...

A folder streams when every tensor the model has is in its files under the model's own names (what
`save_pretrained` writes); the experts may be stored per expert (`experts.<e>.gate_proj.weight`, as
published) or stacked (`experts.gate_up_proj`). Anything else (renamed keys, a checkpoint format
transformers converts on load) is loaded whole as before: `open` returns None.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Iterator

import torch
from torch import Tensor, nn

log = logging.getLogger(__name__)

EXPERT_PARTS = ("gate_proj", "up_proj", "down_proj")
SLICE_BYTES = 64 << 20  # a tensor larger than this is read in slices of rows
_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I8": 1, "U8": 1, "F8_E4M3": 1}


def meta_model(loader, config) -> nn.Module:
    """`loader.from_config(config)` with every parameter on the meta device. The rotary modules'
    tables (buffers computed from the config, in no file) are made again on the cpu."""
    with torch.device("meta"):
        model = loader.from_config(config, dtype=torch.float32).eval()
    for name, module in list(model.named_modules()):
        tables = [b for key, b in module.named_buffers(recurse=False) if "inv_freq" in key]
        if tables and any(b.is_meta for b in tables):
            parent, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent), leaf, type(module)(module.config))
    return model


def is_experts(module: nn.Module) -> bool:
    """transformers' stacked experts (Qwen3MoeExperts: gate_up_proj [E, 2I, H], down_proj [E, H, I])."""
    return isinstance(getattr(module, "gate_up_proj", None), nn.Parameter) and module.gate_up_proj.dim() == 3


class StreamedWeights:
    """The tensors of a safetensors folder by name, read on demand (see the module docstring)."""

    def __init__(self, files: dict[str, Path], model: nn.Module, aliases: dict[str, str]):
        self.model = model  # on the meta device until each module is loaded
        self.files = files  # tensor name -> the file holding it
        self.names = {id(module): name for name, module in model.named_modules()}
        self.aliases = aliases  # a model tensor -> the file tensor it reads (a tied LM head)

    @classmethod
    def open(cls, directory: Path, model: nn.Module) -> "StreamedWeights | None":
        """The folder's weights for `model` (a `meta_model`), or None (and why, in the log) when they
        are not all there under its names."""
        files = _tensor_files(Path(directory))
        if files is None:
            return None
        aliases = {}
        config = getattr(model.config, "text_config", model.config)
        if getattr(config, "tie_word_embeddings", False) or getattr(model.config, "tie_word_embeddings", False):
            embedding = _name_of(model, model.get_input_embeddings())
            head = model.get_output_embeddings()
            if head is not None and f"{_name_of(model, head)}.weight" not in files:
                aliases[f"{_name_of(model, head)}.weight"] = f"{embedding}.weight"
        missing = []
        experts = {name for name, module in model.named_modules() if is_experts(module)}
        for key in model.state_dict():
            owner, _, leaf = key.rpartition(".")
            if owner in experts:
                count = model.get_submodule(owner).gate_up_proj.shape[0]
                stacked = [f"{owner}.{p}" for p in ("gate_up_proj", "down_proj")]
                per_expert = [f"{owner}.{e}.{p}.weight" for e in range(count) for p in EXPERT_PARTS]
                if not all(k in files for k in stacked) and not all(k in files for k in per_expert):
                    missing.append(f"{owner}.*")
            elif aliases.get(key, key) not in files:
                missing.append(key)
        if missing:
            log.info("%s: loaded whole (its files lack %d of the model's tensors, e.g. %s)", directory,
                     len(missing), missing[0])
            return None
        return cls(files, model, aliases)

    def mismatches(self) -> tuple[list[tuple[str, list, list]], list[str]]:
        """What the files hold that the model does not take, from their headers (no tensor read):
        (name, stored shape, model shape) of each tensor whose shape differs (an expert stored per
        expert against its share of the stacked tensor; a stored expert past num_experts counts as
        the stacked tensor's mismatch), and the names of the model's kinds of tensor that it has no
        place for (a layer past num_hidden_layers, a mixer layer_types does not give that layer).
        build/checkpoint.check_tensors refuses either in one line."""
        import re

        stored = self._shapes()
        mismatched, state = [], self.model.state_dict()
        experts = {name: module for name, module in self.model.named_modules() if is_experts(module)}
        for key, tensor in state.items():
            owner, _, leaf = key.rpartition(".")
            wanted = list(tensor.shape)
            if owner in experts:
                name = f"{owner}.{leaf}"
                if name in stored:
                    if stored[name] != wanted:
                        mismatched.append((name, stored[name], wanted))
                    continue
                count, rows = wanted[0], wanted[1]  # gate_up_proj [E, 2I, H], down_proj [E, H, I]
                parts = [("gate_proj", [rows // 2, wanted[2]]), ("up_proj", [rows // 2, wanted[2]])] \
                    if leaf == "gate_up_proj" else [("down_proj", wanted[1:])]
                for e in range(count):
                    for part, shape in parts:
                        name = f"{owner}.{e}.{part}.weight"
                        if stored.get(name, shape) != shape:
                            mismatched.append((name, stored[name], shape))
                if f"{owner}.{count}.{parts[0][0]}.weight" in stored:  # more experts stored than the config has
                    found = 1 + max(int(m.group(1)) for n in stored
                                    if (m := re.fullmatch(rf"{re.escape(owner)}\.(\d+)\.{parts[0][0]}\.weight", n)))
                    mismatched.append((key, [found, *wanted[1:]], wanted))
            elif self._key(key) in stored and stored[self._key(key)] != wanted:
                mismatched.append((key, stored[self._key(key)], wanted))
        kinds = {re.sub(r"\.\d+\.", ".#.", key) for key in state}
        unexpected = [name for name in stored if name not in state and re.sub(r"\.\d+\.", ".#.", name) in kinds
                      and not any(name.startswith(f"{owner}.") for owner in experts)]  # experts: above
        return mismatched, unexpected

    def _shapes(self) -> dict[str, list[int]]:
        """Every tensor's shape from its file's header, each file opened once."""
        from safetensors import safe_open

        by_file: dict[Path, list[str]] = {}
        for name, file in self.files.items():
            by_file.setdefault(file, []).append(name)
        shapes = {}
        for file, names in by_file.items():
            with safe_open(str(file), framework="pt") as handle:
                for name in names:
                    shapes[name] = list(handle.get_slice(name).get_shape())
        return shapes

    def read(self, name: str, dtype: torch.dtype | None = torch.float32) -> Tensor:
        """One tensor of the files (dtype None: as stored). A large one (an embedding table, an LM
        head) is read in slices of rows into the result: the file's pages and the result's copy are
        never both resident whole, nor the tensor in two dtypes."""
        with self._file(name) as handle:
            part = handle.get_slice(name)
            shape, stored = part.get_shape(), part.get_dtype()
            if not shape or _numel(shape) * _BYTES.get(stored, 4) <= SLICE_BYTES:
                tensor = handle.get_tensor(name)
                return tensor if dtype is None else tensor.to(dtype)
        rows = max(1, SLICE_BYTES // (_numel(shape[1:]) * _BYTES.get(stored, 4)))
        result = None
        for start in range(0, shape[0], rows):
            with self._file(name) as handle:
                chunk = handle.get_slice(name)[start: start + rows]
            if result is None:
                result = torch.empty(shape, dtype=dtype or chunk.dtype)
            result[start: start + rows] = chunk
        return result

    def load(self, module: nn.Module, dtype: torch.dtype | None = torch.float32) -> nn.Module:
        """Read `module`'s meta parameters and buffers from the files (dtype None: as stored), except
        stacked experts', which `experts` reads one at a time."""
        prefix = self.names[id(module)]
        for owner_name, owner in module.named_modules():
            if is_experts(owner):
                continue
            base = ".".join(p for p in (prefix, owner_name) if p)
            for leaf, param in list(owner.named_parameters(recurse=False)):
                if param.is_meta:
                    owner._parameters[leaf] = nn.Parameter(self.read(self._key(f"{base}.{leaf}"), dtype),
                                                           requires_grad=False)
            for leaf, buffer in list(owner.named_buffers(recurse=False)):
                key = f"{base}.{leaf}"
                if buffer is not None and buffer.is_meta and key in self.files:
                    owner._buffers[leaf] = self.read(key, dtype)
        return module

    def experts(self, module: nn.Module) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        """Each expert's (gate [I, H], up [I, H], down [H, I]) in fp32 from a stacked experts module's
        tensors, one expert in memory at a time."""
        prefix = self.names[id(module)]
        count = module.gate_up_proj.shape[0]
        if f"{prefix}.0.gate_proj.weight" in self.files:
            for e in range(count):
                yield tuple(self.read(f"{prefix}.{e}.{part}.weight") for part in EXPERT_PARTS)
            return
        for e in range(count):
            with self._file(f"{prefix}.gate_up_proj") as handle:
                gate, up = handle.get_slice(f"{prefix}.gate_up_proj")[e].float().chunk(2, dim=0)  # [gate | up] rows
            with self._file(f"{prefix}.down_proj") as handle:
                down = handle.get_slice(f"{prefix}.down_proj")[e].float()
            yield gate, up, down

    def _key(self, name: str) -> str:
        return self.aliases.get(name, name)

    def _file(self, name: str):
        """The file holding `name`, opened for one read: a handle kept open keeps every page it read
        mapped into the process (a layer of experts would stay resident, counted in its memory)."""
        from safetensors import safe_open

        return safe_open(str(self.files[name]), framework="pt")


def _tensor_files(directory: Path) -> dict[str, Path] | None:
    """Every tensor name of the folder's safetensors files -> its file (the index's map when there is one)."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map") or {}
        return {name: directory / file for name, file in weight_map.items()}
    single = directory / "model.safetensors"
    if not single.is_file():
        return None
    from safetensors import safe_open

    with safe_open(str(single), framework="pt") as handle:
        return {name: single for name in handle.keys()}


def _numel(shape) -> int:
    count = 1
    for n in shape:
        count *= n
    return count


def _name_of(model: nn.Module, target: nn.Module) -> str:
    return next(name for name, module in model.named_modules() if module is target)
