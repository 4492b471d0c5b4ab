"""The step-level engine: its core and scheduler (engine_core.py), a request's token state
(sequence.py), one engine call (step.py), the model (model.py)."""

# The prefill chunk of in-flight batching (trt-llm-serve, --scheduling continuous): prompt tokens a row
# takes in one pass, and all prefilling rows together while others decode. Small enough that a pass
# costs the running streams about one decode step, large enough that a prompt's prefill stays
# efficient (benchmarks/chunked_prefill.py).
DEFAULT_PREFILL_CHUNK = 64
