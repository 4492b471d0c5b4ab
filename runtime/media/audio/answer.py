"""A finished Whisper transcription (runtime/media/audio/longform.py) as the output file's Response:
its text, its tokens (transformers' `sequences`: the segments' tokens, timestamps included), and with
timestamps its segments as OpenAI's verbose_json has them, the language and the clip's length."""

from __future__ import annotations

from trt_llm.runtime.media.audio.longform import Transcription
from trt_llm.schemas.output_file import Response, Segment


def text_of(tokens: list[int], token_bytes, timestamp_begin: int) -> str:
    """The text of `tokens`: its text tokens' bytes (timestamps and special tokens left out)."""
    data = b"".join(token_bytes.bytes_of(t) for t in tokens
                    if t < timestamp_begin and not token_bytes.is_special(t))
    return data.decode("utf-8", errors="replace")


def segments_of(t: Transcription, token_bytes) -> list[Segment]:
    begin = t.tokens.timestamp_begin
    return [Segment(id=i, seek=s.seek, start=s.start, end=s.end, text=text_of(s.tokens, token_bytes, begin),
                    tokens=s.tokens, temperature=s.temperature, avg_logprob=s.avg_logprob,
                    compression_ratio=s.compression_ratio, no_speech_prob=s.no_speech_prob)
            for i, s in enumerate(t.segments)]


def transcription_response(p, token_bytes, batch_idx: int, started: float, messages) -> Response:
    """p: a runtime.requests.prepare.Prepared whose transcription has finished."""
    t: Transcription = p.transcription
    tokens = t.output_tokens()
    segments = segments_of(t, token_bytes) if t.options.timestamps else None
    text = "".join(s.text for s in segments) if segments is not None else \
        text_of(tokens, token_bytes, t.tokens.timestamp_begin)
    ended = bool(t.options.timestamps or (tokens and tokens[-1] == t.tokens.eos) or not tokens)
    prompt = t.first_prompt or p.prompt.token_ids
    prompt_text = b"".join(token_bytes.bytes_of(token) for token in prompt).decode("utf-8", errors="replace")
    ttft = None if t.first_token_time is None else round(max(0.0, t.first_token_time - started) * 1000, 3)
    return Response(request_idx=p.index, batch_idx=batch_idx, output_text=text,
                    finish_reason="end-of-sequence" if ended else "max-length", messages=messages,
                    formatted_complete_request=prompt_text, prompt_tokens=len(prompt),
                    generated_tokens=len(tokens), output_token_ids=tokens, time_to_first_token_ms=ttft,
                    segments=segments, language=t.language, duration=round(t.seconds, 3))
