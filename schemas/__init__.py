"""File formats of trt-llm: the build config (YAML), the input file and the output file (JSON).

The models here are the single source of truth; ``schemas/json/*.schema.json`` are generated
from them (``python -m trt_llm.schemas.generate``).
"""

from .build_config import BuildConfig, ConfigError, load_build_config, parse_build_config
from .input_file import (AudioContent, ContentItem, ImageContent, InputFile, InputFileError, InputSettings,
                         LoadedInput, Message, Request, RequestError, TextContent, VideoContent,
                         load_input_file, parse_input_dict)
from .output_file import FinishReason, LogprobCandidate, OutputFile, Response

__all__ = [
    "BuildConfig", "ConfigError", "load_build_config", "parse_build_config",
    "AudioContent", "ContentItem", "ImageContent", "InputFile", "InputFileError", "InputSettings",
    "LoadedInput", "Message", "Request", "RequestError", "TextContent", "VideoContent",
    "load_input_file", "parse_input_dict",
    "FinishReason", "LogprobCandidate", "OutputFile", "Response",
]
