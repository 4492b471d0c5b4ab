"""Read an engine directory's manifest and refuse, clearly, one this runtime cannot serve."""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from trt_llm.common.cli_args import FlagError
from trt_llm.schemas.graph_spec import PER_LAYER_INPUTS
from trt_llm.schemas.manifest import FORMAT_VERSION

RUNNABLE_BACKENDS = ("cpu", "tensorrt", "tensorrt-rtx")  # the TensorRT ones need their module and a GPU


def backend_missing(backend: str) -> str | None:
    """Why engines of `backend` cannot run on this machine, or None when they can."""
    if backend == "cpu":
        return None
    if backend in ("tensorrt", "tensorrt-rtx"):
        from trt_llm.common.trt_import import runtime_missing

        return runtime_missing(backend)
    return f"this runtime runs {', '.join(RUNNABLE_BACKENDS)}"


class EngineDirError(ValueError):
    pass


@contextmanager
def loading(what: str, path: Path) -> Iterator[None]:
    """Any failure while a file of the engine directory loads (a truncated graph or tensor file, a
    damaged tokenizer) means the directory is unusable: one EngineDirError naming the file. A setting
    the user gave that the load cannot use (FlagError: a flag, an environment variable) is not the
    directory's fault and passes as it is."""
    try:
        yield
    except (EngineDirError, FlagError):
        raise
    except Exception as error:  # ONNX Runtime, safetensors and tokenizers each raise their own kinds
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise EngineDirError(f"{path}: cannot load the {what} ({first[:300]}); the engine directory is "
                             "damaged: rebuild it with trt-llm-build") from None


def graph_mismatch(manifest, path: Path) -> str | None:
    """What of the manifest (typed: schemas/manifest.Manifest) the decoder graph's own inputs
    contradict, naming the manifest's key: layers cut or added, a layer of another kind (hybrid layers
    reordered), a sliding window the graph lacks, another geometry. Read from the ONNX graph the
    session will load, without its weights (runtime/onnx_inputs.py); None when it agrees (or a plan
    has no ONNX graph beside it to read)."""
    from trt_llm.runtime.onnx_inputs import graph_inputs
    from trt_llm.schemas.graph_spec import decoder_spec, window_lengths
    from trt_llm.schemas.layer_spec import owns_cache

    llm = manifest.components.llm
    graph_file = next((path / f for f in (llm.engine, llm.graph) if f and f.endswith(".onnx") and (path / f).is_file()),
                      None)
    if graph_file is None:
        return None
    with loading("engine" if graph_file == path / (llm.engine or "") else "graph", graph_file):
        found = graph_inputs(graph_file)
    model, layers = manifest.model, manifest.model.layers
    kinds: dict[int, str] = {}
    for name in found:  # each layer's kind as the graph has it: past_key_<i> (attention) or past_<state>_<i>
        head, _, index = name.rpartition("_")
        if name.startswith("past_") and index.isdigit() and not name.startswith("past_lengths"):
            kinds.setdefault(int(index), "attention" if head == "past_key" else "recurrent")
    owning = [i for i, layer in enumerate(layers) if owns_cache(layer)]  # (a kv_source reader has no cache inputs)
    if kinds and len(kinds) != len(owning):
        noun = "layers" if len(owning) == len(layers) else "layers with a cache"
        return f"model.layers: {len(owning)} {noun}, the graph has {len(kinds)}"
    for index, layer in enumerate(layers):
        kind = "recurrent" if layer.kind == "recurrent" else "attention"
        if index in kinds and kinds[index] != kind:
            return f"model.layers[{index}]: kind {layer.kind!r}, the graph's layer {index} is {kinds[index]}"
    prefix = window_lengths(0).removesuffix("0")  # past_lengths_w<W>: one input per sliding window
    windows = sorted(int(n.removeprefix(prefix)) for n in found if n.startswith(prefix) and n[len(prefix):].isdigit())
    for index, layer in enumerate(layers):
        if layer.kind == "sliding" and layer.window not in windows:
            return (f"model.layers[{index}].window: {layer.window}, a window the graph does not have (its windows: "
                    f"{', '.join(map(str, windows)) or 'none'})")
    spec = decoder_spec(layers, eagle=model.eagle is not None, lora_layout=manifest.lora.model_dump() if manifest.lora
                        else None, mrope=bool(model.mrope), deepstack=model.deepstack_layers,
                        masked=model.bidirectional_block > 0, per_layer=_per_layer_width(model))
    for tensor in spec.inputs:
        if tensor.name not in found:
            return f"the graph has no input {tensor.name!r}, which the manifest's model and lora sections call for"
        have = found[tensor.name]
        want = _fixed_dims(tensor.name, layers, model)
        for axis, (named, got, wanted) in enumerate(zip(tensor.dims, have, want or ())):
            if named is None and wanted is not None and isinstance(got, int) and got != wanted:
                return f"{_key_of(tensor.name, axis, layers)}: {wanted}, the graph's {tensor.name} has {got}"
        if len(have) != len(tensor.dims):
            return f"the graph's {tensor.name} has {len(have)} dimensions, the manifest's layers make {len(tensor.dims)}"
    extra = [name for name in found if name not in set(spec.input_names)]
    if extra:
        return f"the graph's input {extra[0]!r} is not one the manifest's model and lora sections call for"
    return None


def _per_layer_width(model) -> int:
    """The width of the graph's per_layer_inputs (Gemma 4's layers * P), 0 without one."""
    table = model.per_layer_inputs
    return table.layers * table.width if table is not None else 0


def _fixed_dims(name: str, layers, model) -> list | None:
    """The model-fixed sizes of a decoder input (None where a dimension is dynamic)."""
    if name == "inputs_embeds":
        return [None, None, model.dims.hidden_size]
    if name == PER_LAYER_INPUTS:
        return [None, None, _per_layer_width(model)]
    head, _, index = name.rpartition("_")
    if not (name.startswith("past_") and index.isdigit()) or int(index) >= len(layers):
        return None
    layer = layers[int(index)]
    if layer.kind == "recurrent":
        state = next((s for s in layer.states if head == f"past_{s.name}"), None)
        return [None, *state.shape] if state is not None else None
    return [None, layer.kv_heads, None, layer.head_dim]


def _key_of(name: str, axis: int, layers) -> str:
    """The manifest key that sets dimension `axis` of the decoder input `name`."""
    if name == "inputs_embeds":
        return "model.dims.hidden_size"
    if name == PER_LAYER_INPUTS:
        return "model.per_layer_inputs.layers x width"
    head, _, index = name.rpartition("_")
    layer = layers[int(index)]
    if layer.kind == "recurrent":
        which = next(i for i, s in enumerate(layer.states) if head == f"past_{s.name}")
        return f"model.layers[{index}].states[{which}].shape[{axis - 1}]"
    return f"model.layers[{index}].{'kv_heads' if axis == 1 else 'head_dim'}"


@dataclass
class EngineDir:
    path: Path
    manifest: dict

    @classmethod
    def open(cls, path: str | Path) -> "EngineDir":
        from trt_llm.schemas.manifest import ManifestError, validate_manifest

        path = Path(path)
        manifest_path = path / "manifest.json"
        if not manifest_path.is_file():
            raise EngineDirError(f"engine directory {str(path)!r}: no manifest.json (build one with trt-llm-build)")
        try:
            manifest = json.loads(manifest_path.read_bytes().decode("utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as error:
            raise EngineDirError(f"{manifest_path}: unreadable manifest: {error}") from None
        if isinstance(manifest, dict) and manifest.get("kind") == "bundle":
            raise EngineDirError(f"{path}: a portable bundle, not an engine directory; compile it first: "
                                 f"trt-llm-compile {path} --backend cpu -o ENGINE_DIR")
        version = manifest.get("format_version") if isinstance(manifest, dict) else None
        if isinstance(manifest, dict) and version != FORMAT_VERSION:
            raise EngineDirError(
                f"{manifest_path}: engine format version {version!r}, this runtime reads version "
                f"{FORMAT_VERSION}; rebuild the engine with this version of trt-llm-build")
        if isinstance(manifest, dict) and isinstance(manifest.get("model"), dict) and "layers" not in manifest["model"]:
            raise EngineDirError(f"{manifest_path}: built by an earlier trt-llm-build, before layer specs "
                                 "(model.layers); rebuild the engine with this version of trt-llm-build")
        try:
            typed = validate_manifest(manifest, str(manifest_path))
        except ManifestError as error:
            raise EngineDirError(str(error)) from None
        from trt_llm.families.registry import UnsupportedArchitecture, family_named

        try:  # the family's face says what the runtime does with its requests and components
            family_named(typed.model.family)
        except UnsupportedArchitecture as error:
            raise EngineDirError(f"{manifest_path}: model.family: {error}; rebuild the engine with this version "
                                 "of trt-llm-build") from None
        backend = typed.backend
        why = backend_missing(backend) if backend else "no backend named"
        if why:
            raise EngineDirError(f"{manifest_path}: backend {backend!r} cannot run here: {why}")
        built_with = typed.components.llm.tensorrt_version
        if built_with is not None:
            from trt_llm.common.trt_import import import_tensorrt

            running = import_tensorrt(backend).__version__
            if running != built_with:  # plans are tied to the exact TensorRT version that built them
                raise EngineDirError(
                    f"{manifest_path}: the engine was built with {backend} {built_with}, this machine "
                    f"has {running}; rebuild it with trt-llm-build here")
        engine = cls(path, manifest)
        components = typed.components
        files = [("llm", "engine", components.llm.engine), ("llm", "embedding", components.llm.embedding)]
        if components.llm.per_layer_embedding is not None:
            files.append(("llm", "per_layer_embedding", components.llm.per_layer_embedding))
        if components.draft is not None:
            files += [("draft", "engine", components.draft.engine), ("draft", "tensors", components.draft.tensors)]
        for component, key, relative in files:
            if relative is None:
                raise EngineDirError(f"{manifest_path}: corrupt manifest: components.{component}.{key}: "
                                     "required field missing; rebuild the engine with trt-llm-build")
            if not (path / relative).is_file():
                raise EngineDirError(f"{path}: missing {relative} ({component} {key}); rebuild the engine")
        if not (path / components.tokenizer.dir / "tokenizer.json").is_file():
            raise EngineDirError(f"{path}: missing {components.tokenizer.dir}/tokenizer.json; rebuild the engine")
        why = graph_mismatch(typed, path)
        if why is not None:
            raise EngineDirError(f"{manifest_path}: {why}; the manifest no longer describes the engine's graph: undo "
                                 "the edit or rebuild the engine with trt-llm-build")
        return engine

    @property
    def identity(self) -> str:
        """Names this engine (its manifest and weights file size): keys what is cached for it."""
        import hashlib

        digest = hashlib.sha256((self.path / "manifest.json").read_bytes())
        digest.update(str(self.component_path("llm", "engine").stat().st_size).encode())
        llm = self.manifest["components"]["llm"]
        for data in sorted({self.path / (llm[key] + ".data") for key in ("graph", "engine")}):  # whichever has weights
            if data.is_file():
                digest.update(str(data.stat().st_size).encode())
        return digest.hexdigest()[:32]

    @property
    def family(self):
        """The model family's face (trt_llm/families/face.Family)."""
        from trt_llm.families.registry import family_named

        return family_named(self.manifest["model"]["family"])

    def adapter_name(self, component: str) -> str:
        """The name of the `vision` or `audio` component's runtime adapter (trt_llm/families/adapters.py):
        the one the manifest names, else the family's own (an engine built before the manifest named it)."""
        return self.manifest["components"][component].get("adapter") or getattr(self.family, component).adapter

    def component_path(self, component: str, key: str) -> Path:
        return self.path / self.manifest["components"][component][key]

    def layers(self, component: str = "llm") -> list:
        """The typed layer specs (schemas/layer_spec.py) of the base model or the draft."""
        from trt_llm.schemas.layer_spec import parse_layers

        if component == "llm":
            return parse_layers(self.manifest["model"]["layers"])
        return parse_layers(self.manifest["components"][component]["layers"])

    @property
    def dims(self) -> dict:
        return self.manifest["model"]["dims"]

    @property
    def limits(self) -> dict:
        return self.manifest["limits"]

    @property
    def eos_token_ids(self) -> list[int]:
        return list(self.manifest["model"]["eos_token_ids"])

    @property
    def tokenizer_dir(self) -> Path:
        return self.path / self.manifest["components"]["tokenizer"]["dir"]
