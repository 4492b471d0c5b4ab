"""The profile file of ``trt-llm-run --profile-output``: the reference's figures plus time to first token."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

_FORBID = ConfigDict(extra="forbid")


class StageStats(BaseModel):
    """Timing of one stage over all its runs, in milliseconds."""
    model_config = _FORBID
    count: int = Field(ge=0)
    total_ms: float = Field(ge=0)
    min_ms: float = Field(ge=0)
    max_ms: float = Field(ge=0)
    mean_ms: float = Field(ge=0)
    median_ms: float = Field(ge=0)
    p95_ms: float = Field(ge=0)
    p99_ms: float = Field(ge=0)


class PrefillStats(BaseModel):
    model_config = _FORBID
    runs: int = Field(ge=0)
    reused_tokens: int = Field(ge=0, description="Prompt tokens restored from the system-prompt KV cache.")
    computed_tokens: int = Field(ge=0, description="Prompt tokens run through the model.")
    tokens_per_second: float = Field(ge=0)
    ms_per_token: float = Field(ge=0)


class GenerationStats(BaseModel):
    model_config = _FORBID
    runs: int = Field(ge=0, description="Decode steps (one forward pass each).")
    generated_tokens: int = Field(ge=0, description="Tokens produced by decode steps (first tokens come from prefill).")
    tokens_per_second: float = Field(ge=0)
    ms_per_token: float = Field(ge=0)


class RequestSpeculation(BaseModel):
    model_config = _FORBID
    passes: int = Field(ge=0, description="Its verification passes with a proposal.")
    proposed_tokens: int = Field(ge=0, description="Tokens proposed for it.")
    accepted_tokens: int = Field(ge=0, description="Of them, the tokens the base took.")
    mean_accepted_length: float = Field(ge=0, description="Tokens a pass emitted for it (taken + the base's own).")


class SpeculativeStats(BaseModel):
    model_config = _FORBID
    strategy: str = Field("none", description="The run's decoding strategy: eagle, mtp, prompt-lookup or none.")
    iterations: int = Field(ge=0, description="Verification passes, counted per row (EAGLE / MTP: every round; "
                                               "prompt lookup: the rows' passes that had a proposal).")
    generated_tokens: int = Field(ge=0, description="Tokens those passes emitted.")
    mean_accepted_length: float = Field(ge=0, description="generated_tokens / iterations.")
    proposed_tokens: int = Field(0, ge=0, description="Tokens drafted (EAGLE / MTP: the nodes verified) or proposed "
                                                       "from the rows' own text (prompt lookup).")
    accepted_tokens: int = Field(0, ge=0, description="Of them, the tokens the base took.")
    per_request: dict[str, RequestSpeculation] = Field(default_factory=dict, description="request_idx -> what "
                                                       "speculation did for it (requests with a proposal).")


class MultimodalStats(BaseModel):
    model_config = _FORBID
    images: int = Field(ge=0)
    image_tokens: int = Field(ge=0)
    ms_per_token: float = Field(ge=0, description="The vision encoder's time per image token it encoded.")
    clips: int = Field(0, ge=0, description="Audio clips in the requests.")
    audio_seconds: float = Field(0.0, ge=0, description="Their length.")
    audio_encoder_ms_per_second: float = Field(0.0, ge=0, description="The audio encoder's time per second of "
                                               "audio it encoded (a clip sent again comes from its cache).")
    real_time_factor: float = Field(0.0, ge=0, description="The run's wall time per second of audio (< 1: faster "
                                    "than real time); 0 without audio.")


class TimeToFirstToken(BaseModel):
    model_config = _FORBID
    requests: int = Field(ge=0)
    mean_ms: float = Field(ge=0)
    median_ms: float = Field(ge=0)
    p95_ms: float = Field(ge=0)
    max_ms: float = Field(ge=0)
    per_request_ms: dict[str, float] = Field(description="request_idx -> time to first token (ms).")


class StartupStats(BaseModel):
    """Where a cold run's time before its first token went (the loads themselves are `stages`:
    load_engine_dir, load_embedding, load_session, load_tokenizer), from the process's start (Linux:
    its start time in /proc, 10 ms ticks; elsewhere from the profiler's creation)."""
    model_config = _FORBID
    before_run_ms: float = Field(ge=0, description="Process start -> the run begins: the interpreter, the "
                                 "imports and the flags.")
    to_first_token_ms: float = Field(ge=0, description="Process start -> the run's first token (0: none).")


class CacheStats(BaseModel):
    """What one row of the engine's pool holds, from its layers' specs."""
    model_config = _FORBID
    attention_bytes_per_token: int = Field(ge=0, description="Keys and values of one token over every "
                                           "attention layer (a sliding layer holds only its window's).")
    state_bytes_per_row: int = Field(ge=0, description="The recurrent layers' states of one row, whatever "
                                     "its length (0: a model without recurrent layers).")
    recurrent_layers: int = Field(ge=0)


class Profile(BaseModel):
    model_config = _FORBID
    prefill: PrefillStats
    generation: GenerationStats
    speculative: SpeculativeStats
    multimodal: MultimodalStats
    time_to_first_token: TimeToFirstToken
    stages: dict[str, StageStats] = Field(description="Per-stage timing statistics.")
    startup: StartupStats | None = Field(None, description="A cold run's time before its first token.")
    cache: CacheStats | None = Field(None, description="What one row of the engine's cache pool holds.")
    peak_memory_mb: float = Field(ge=0, description="Peak resident memory of the process (its high-water "
                                  "mark: the weights' pages, the sessions' buffers and the KV pool).")
    wall_time_s: float = Field(ge=0)


__all__ = ["CacheStats", "Profile", "StageStats", "StartupStats"]
