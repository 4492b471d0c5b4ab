"""trt-llm: build LLM engines from Hugging Face checkpoints and run JSON request files on them."""

__version__ = "0.1.0"
