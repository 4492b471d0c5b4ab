"""File formats of trt-llm: the build config (YAML), the input file and the output file (JSON).

The models here are the single source of truth; ``schemas/json/*.schema.json`` are generated
from them (``python -m trt_llm.schemas.generate``).
"""

import importlib

# Each name is imported from its module when first asked for (PEP 562): a run reading an input file
# does not build the build config's models, nor a build the output file's.
_MODULES = {
    "build_config": ("BuildConfig", "ConfigError", "load_build_config", "parse_build_config"),
    "input_file": ("AudioContent", "ContentItem", "ImageContent", "InputFile", "InputFileError", "InputSettings",
                   "LoadedInput", "Message", "Request", "RequestError", "TextContent", "VideoContent",
                   "load_input_file", "parse_input_dict"),
    "output_file": ("FinishReason", "LogprobCandidate", "OutputFile", "Response"),
}
_MODULE_OF = {name: module for module, names in _MODULES.items() for name in names}


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_MODULE_OF[name]}", __name__), name)


__all__ = [
    "BuildConfig", "ConfigError", "load_build_config", "parse_build_config",
    "AudioContent", "ContentItem", "ImageContent", "InputFile", "InputFileError", "InputSettings",
    "LoadedInput", "Message", "Request", "RequestError", "TextContent", "VideoContent",
    "load_input_file", "parse_input_dict",
    "FinishReason", "LogprobCandidate", "OutputFile", "Response",
]
