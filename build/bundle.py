"""The export stage: checkpoint -> portable bundle (ONNX graphs, embedding, configs, tokenizer).

This is where the training stack lives (transformers, the checkpoint loaders, our torch forward
pass). The bundle it writes is everything the compile stage needs, so `trt-llm-compile` runs on a
device that has none of it; `trt-llm-build` runs this stage and the compile stage in one go.

What the graph fixes at export is recorded in the manifest and cannot change at compile: the
dtype, the KV cache capacity (the rotary tables' length), the LoRA inputs and the EAGLE draft.
max_batch_size, max_input_len and rtx_compute_capability are only the compile's defaults.
"""

from __future__ import annotations

import logging
from pathlib import Path

from trt_llm.build.engine_dir import BUNDLE, tool_versions, write_manifest
from trt_llm.schemas.manifest import FORMAT_VERSION
from trt_llm.build.progress import Steps
from trt_llm.schemas.build_config import BuildConfig

log = logging.getLogger(__name__)


def write_tokenizer(checkpoint, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    checkpoint.tokenizer.save_pretrained(directory)
    checkpoint.generation_config.to_json_file(directory / "generation_config.json")


def write_embedding(checkpoint, path: Path, storage: str, blocks=None, module=None, pad_rows=(), pad=None) -> None:
    """The runtime does the embedding lookup itself (so image/audio rows can be inserted later);
    storage: fp32, fp16, bf16 or int8 (quantization.embedding); blocks: a GGUF's own Q8_0 table.
    module: another table than the token embedding (Gemma 4's per-layer one), stored the same way;
    pad_rows: its rows that are the `pad` row's (its media tokens': transformers looks up pad for them)."""
    from safetensors.torch import save_file

    from trt_llm.build.quantize.embedding import embedding_tensors

    from trt_llm.build.checkpoint import TORCH_DTYPES

    dtype = TORCH_DTYPES.get(storage)  # int8: as stored, quantized in slices
    table = checkpoint.embedding_table(dtype) if module is None else checkpoint.module_weight(module, dtype)
    for row in pad_rows:  # (in place: the checkpoint's table is read no more)
        table[row] = table[pad]
    save_file(embedding_tensors(table, storage, blocks if storage == "int8" else None), str(path))


def per_layer_section(graph, graphs, checkpoint, directory: Path, storage: str, dtype) -> dict | None:
    """Gemma 4's per-layer table written beside the embedding (llm/per_layer_embedding.safetensors) and
    the manifest's model.per_layer_inputs; None for a decoder without one."""
    if not graph.per_layer_width:
        return None
    import torch

    module = graphs.per_layer_embedding(checkpoint.model)
    media, pad = graphs.media_token_ids(checkpoint.model) if checkpoint.family.multimodal else ([], None)
    write_embedding(checkpoint, directory / "llm" / "per_layer_embedding.safetensors", storage, module=module,
                    pad_rows=media, pad=pad)
    width = graph.per_layer_size
    return {"layers": len(graph.layer_specs), "width": width, "vocab_size": module.num_embeddings,
            # transformers' scale, rounded to the weights' dtype as it rounds it
            "scale": float(torch.tensor(width ** 0.5, dtype=dtype))}


def encoder_decoder_config(config: BuildConfig, checkpoint) -> BuildConfig:
    """An encoder-decoder's build (Whisper) as it can be: refused with what it does not support, the
    prompt and cache limits within its max_target_positions (it has no positions past them).

    `quantization:` (int8, int4; round to nearest) covers the decoder's and the encoder's linears on
    the cpu backend (trt_llm/families/whisper/graphs.py). The TensorRT backends refuse it: their weight-only
    plans of these two graphs are not built or checked yet. AWQ is refused: its calibration runs the
    model as a text decoder over text."""
    from trt_llm.build.compile import TENSORRT_BACKENDS, BuildError

    name = checkpoint.family.architecture
    for key, unsupported in (("lora", config.lora is not None), ("draft", config.draft is not None)):
        if unsupported:
            raise BuildError(f"{key}: not supported for {name} (an encoder-decoder); build without it")
    quantization = config.quantization
    if quantization.weights != "none" and config.backend in TENSORRT_BACKENDS:
        raise BuildError(f"quantization: a quantized {name} is built for the cpu backend only (on "
                         f"{config.backend!r}: quantization: none)")
    if quantization.weights != "none" and quantization.method == "awq":
        raise BuildError(f"quantization.method: awq calibrates a text decoder on text, not {name}; use rtn")
    positions = checkpoint.model.config.max_target_positions
    if config.max_kv_cache_capacity > positions or config.max_input_len > positions:
        log.info("%s: max_input_len and max_kv_cache_capacity set to at most its %d decoder positions", name, positions)
    return config.model_copy(update={"max_kv_cache_capacity": min(config.max_kv_cache_capacity, positions),
                                     "max_input_len": min(config.max_input_len, positions)})


def refuse_unsupported(graph, draft) -> None:
    """What a decoder's layers rule out, refused in one line before the export."""
    from trt_llm.build.compile import BuildError

    long_rope = any(getattr(spec, "rotary", None) is not None and spec.rotary.long_rows for spec in graph.layer_specs)
    if draft is not None and long_rope:
        raise BuildError("draft: an EAGLE draft on a LongRoPE model is not supported (its draft turns by other "
                         "tables); build without draft:")
    if long_rope and graph.windows:
        raise BuildError(f"model: LongRoPE with a sliding window of {graph.windows[0]} tokens is not supported "
                         "(switching to the long factors recomputes the whole sequence); build with "
                         "max_kv_cache_capacity at most the window")


def hybrid_lora_layout(config: BuildConfig, checkpoint, graphs, hf_config) -> dict:
    """The LoRA layout of a family that takes adapters on `graphs.LORA_TARGETS` only (a hybrid: its
    MLPs, which every layer has; its mixers differ layer by layer). The default target_modules mean
    those; another module is refused in one line."""
    from trt_llm.build import lora
    from trt_llm.build.compile import BuildError
    from trt_llm.schemas.build_config import LORA_MODULES

    allowed, name = list(graphs.LORA_TARGETS), checkpoint.family.architecture
    if getattr(hf_config, "num_experts", 0):  # Qwen3-Next: the MLPs are experts, which take none
        allowed = []
    if not allowed:
        raise BuildError(f"lora: not supported for {name} yet; build without lora:")
    wanted = config.lora.target_modules
    targets = allowed if set(wanted) == set(LORA_MODULES) else list(wanted)
    other = [m for m in targets if m not in allowed]
    if other:
        raise BuildError(f"lora: target_modules {', '.join(other)}: {name}'s adapters go on "
                         f"{', '.join(allowed)} only (its mixers differ from layer to layer)")
    return lora.layout(graphs.ModelDims(hf_config), hf_config.intermediate_size, config.lora.max_rank, targets)


def has_tower(checkpoint, kind: str) -> bool:
    """Whether the checkpoint has its face's `kind` ("vision", "audio") tower: a model may be published
    without one its architecture can hold (Gemma 4's 26B and 31B have no audio tower: audio_config null)."""
    return getattr(checkpoint.model.config, f"{kind}_config", True) is not None


def export_bundle(config: BuildConfig, directory: Path, steps: Steps) -> dict:
    """Write the bundle of `config` into the empty folder `directory`; returns its manifest.

    Three steps of `steps`: loading, writing tokenizer and embedding, exporting."""
    from trt_llm.build import lora
    from trt_llm.build.checkpoint import TORCH_DTYPES, eos_token_ids, load_checkpoint
    from trt_llm.build.eagle.stage import export_eagle_draft, load_eagle_draft, manifest_entries
    from trt_llm.build.export import export_decoder
    from trt_llm.build.quantize.factory import factory_for

    dtype = TORCH_DTYPES[config.dtype]
    (directory / "llm").mkdir(parents=True, exist_ok=True)
    with steps.step("loading checkpoint"):
        # Streamed (each module read as it is converted) unless a step needs the whole model: AWQ's
        # calibration runs it, an EAGLE draft is checked against its embedding and LM head.
        stream = config.draft is None and config.quantization.method != "awq"
        checkpoint = load_checkpoint(config.model, config.dtype, config.trust_remote_code, stream)
    if checkpoint.family.encoder_decoder:
        config = encoder_decoder_config(config, checkpoint)
    mtp_head = None
    if config.mtp:  # refused before the export's minutes where there is no head to build
        from trt_llm.build.mtp.stage import read_mtp_head

        mtp_head = read_mtp_head(config, checkpoint)

    with steps.step("writing tokenizer and embedding"):
        write_tokenizer(checkpoint, directory / "tokenizer")
        make_linear = factory_for(config, checkpoint, dtype)
        blocks = getattr(make_linear, "embedding_blocks", None)
        # A GGUF's Q8_0 table is kept as it is unless another storage is asked for.
        storage = config.quantization.embedding or ("int8" if blocks is not None else
                                                    config.quantization.effective_embedding(config.dtype))
        write_embedding(checkpoint, directory / "llm" / "embedding.safetensors", storage, blocks)
        checkpoint.model.config.to_json_file(directory / "llm" / "config.json")

    with steps.step("exporting to ONNX"):
        graphs = checkpoint.family.load()  # build/models/<module>.py builds its graph
        lora_layout, draft, graph_deepstack, embedding_scale, block, per_layer = None, None, 0, None, 0, None
        if checkpoint.family.encoder_decoder:  # Whisper: the module exports its own decoder
            dims, layers = graphs.export_llm(checkpoint.model, directory / "llm" / "model.onnx", dtype, make_linear)
        else:
            hf_config = graphs.text_decoder(checkpoint.model).config
            if config.lora and hasattr(graphs, "LORA_TARGETS"):  # a family whose layers take adapters on some modules
                lora_layout = hybrid_lora_layout(config, checkpoint, graphs, hf_config)
            elif config.lora:
                first = graphs.text_decoder(checkpoint.model).model.layers[0]
                packed = hasattr(first.self_attn, "qkv_proj")
                # experts in place of the MLP take no adapters; Gemma 4's run beside a dense MLP, which does
                experts = (getattr(hf_config, "num_experts", 0) or 0) > 0 and not getattr(graphs, "MLP_BESIDE_EXPERTS",
                                                                                         False)
                try:
                    targets = lora.targets_of(config.lora.target_modules, packed, experts=experts)
                except ValueError as error:
                    from trt_llm.build.compile import BuildError

                    raise BuildError(str(error)) from None
                if getattr(graphs, "LORA_PER_LAYER", False):  # layers of different shapes: each its own groups
                    lora_layout = lora.layered_layout(graphs.text_decoder(checkpoint.model).model.layers,
                                                      config.lora.max_rank, targets)
                else:
                    lora_layout = lora.layout(graphs.ModelDims(hf_config), hf_config.intermediate_size,
                                              config.lora.max_rank, targets, packed)
            if config.draft and getattr(graphs, "NO_DRAFT", None):  # a family that says why it takes none
                from trt_llm.build.compile import BuildError

                raise BuildError(f"draft: {graphs.NO_DRAFT}; build without draft:")
            draft = load_eagle_draft(config, checkpoint) if config.draft else None
            graph = graphs.DecoderGraph(checkpoint.model, checkpoint.family, config.max_kv_cache_capacity, dtype,
                                        lora.graph_groups(lora_layout),
                                        feature_layers=draft.aux_layer_ids if draft is not None else None,
                                        make_linear=make_linear, release_layers=True, weights=checkpoint.weights)
            dims, graph_deepstack, layers = graph.dims.to_dict(), graph.deepstack_layers, graph.layer_specs
            embedding_scale, block = graph.embed_scale, graph.bidirectional_block
            refuse_unsupported(graph, draft)
            per_layer = per_layer_section(graph, graphs, checkpoint, directory, storage, dtype)
            export_decoder(graph, directory / "llm" / "model.onnx", dtype, lora_layout)
            del graph
        components = {"llm": {"graph": "llm/model.onnx", "embedding": "llm/embedding.safetensors",
                              "config": "llm/config.json"},
                      "tokenizer": {"dir": "tokenizer"}}
        if per_layer is not None:
            components["llm"]["per_layer_embedding"] = "llm/per_layer_embedding.safetensors"
        if checkpoint.family.vision and has_tower(checkpoint, "vision"):
            from trt_llm.build.vision_stage import export_vision_component

            components["vision"] = export_vision_component(checkpoint, config, directory / "vision", dtype)
        if checkpoint.family.audio and has_tower(checkpoint, "audio"):
            from trt_llm.build.audio_stage import export_audio_component

            # Whisper's encoder takes the decoder's linear factory (quantized with it); the others stay float.
            components["audio"] = export_audio_component(checkpoint, config, directory / "audio", dtype,
                                                         make_linear if checkpoint.family.encoder_decoder else None)
        eagle = None
        if draft is not None:
            export_eagle_draft(draft, checkpoint, config, directory / "draft", dtype)
            components["draft"], eagle = manifest_entries(draft, config)
        if mtp_head is not None:  # the head is the draft; the base keeps no EAGLE taps (model.eagle None)
            from trt_llm.build.mtp.stage import export_mtp_head

            components["draft"] = export_mtp_head(mtp_head, checkpoint, config, directory / "draft", dtype)

    manifest = {
        "format_version": FORMAT_VERSION,
        "kind": BUNDLE,
        "backend": None,
        # The export's config; the compile fills in the backend and its own choices.
        "build_config": {**config.model_dump(), "backend": None},
        "model": {
            "source": checkpoint.source,
            "family": checkpoint.family.name,
            "architecture": checkpoint.family.architecture,
            "dtype": config.dtype,
            "dims": dims,
            "eos_token_ids": eos_token_ids(checkpoint),
            "eagle": eagle,
            "mrope": checkpoint.family.mrope,
            "deepstack_layers": graph_deepstack,
            "embedding_scale": embedding_scale,
            "bidirectional_block": block,
            "per_layer_inputs": per_layer,
            "layers": [spec.model_dump() for spec in layers],
            "quantization": make_linear.summary(config.quantization, storage)
            if config.quantization.weights != "none" else None,
        },
        "limits": {
            "max_batch_size": config.max_batch_size,
            "max_input_len": config.max_input_len,
            "max_kv_cache_capacity": config.max_kv_cache_capacity,
        },
        "components": components,
        "lora": lora_layout,
        "tool_versions": tool_versions(),
    }
    return write_manifest(directory, manifest)
