"""The one registry of the families' runtime adapters: a component's adapter by the name the
manifest records (components.<vision|audio>.adapter; the family's face names it at build time).

An audio adapter (`cross_attention`, `token_count(frames)`, `feeds(features, frames, dtype)`) turns
decoded clips into its encoder graph's inputs and says how many prompt tokens a clip takes; a vision
adapter (`feeds(grids)`) gives its tower's host inputs for the images' patch grids. Each is made from
its component's config.json (`from_settings`), and gives its plan's TensorRT profile
(`tensorrt_profile(build_config, settings)`: each dynamic dimension's (min, opt, max)). Torch-free: imported by the runtime, the
server and the build alike, each module only when an engine names it.
"""

from __future__ import annotations

from importlib import import_module

ADAPTERS = {
    "qwen2_audio": "trt_llm.families.qwen2_audio.host:AudioRows",
    "qwen3_asr": "trt_llm.families.qwen3_asr.host:AudioChunks",
    "whisper": "trt_llm.families.whisper.host:CrossAttention",
    "qwen2_5_vl": "trt_llm.families.qwen_vl.host:WindowedTower",
    "qwen3_vl": "trt_llm.families.qwen_vl.host:InterpolatedTower",
    "smolvlm": "trt_llm.families.smolvlm.host:TiledTower",
    "gemma3": "trt_llm.families.gemma3.host:SoftTokenTower",
    "gemma4": "trt_llm.families.gemma4.host:PatchTower",
    "gemma4_audio": "trt_llm.families.gemma4.audio_host:AudioSoftTokens",
}


class UnknownAdapter(ValueError):
    pass


def adapter_class(name: str):
    """The class of the adapter `name`."""
    if name not in ADAPTERS:
        raise UnknownAdapter(f"unknown component adapter {name!r}; this version knows {', '.join(sorted(ADAPTERS))}")
    module, attribute = ADAPTERS[name].split(":")
    return getattr(import_module(module), attribute)


def adapter(name: str, settings: dict):
    """The adapter `name`, made from its component's settings."""
    return adapter_class(name).from_settings(settings)
