"""Subtitle files of a transcription's segments: SubRip (srt) and WebVTT (vtt), as OpenAI's API and
openai-whisper write them: one cue per segment, its text stripped, times to the millisecond."""

from __future__ import annotations


def _clock(seconds: float, separator: str) -> str:
    millis = max(0, round(seconds * 1000))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{millis:03d}"


def _cue_text(text: str) -> str:
    # A blank line would end the cue: a segment's own line breaks become spaces.
    return " ".join(text.split()) or "..."


def srt(segments) -> str:
    """segments: objects with start, end (seconds) and text."""
    return "".join(f"{i}\n{_clock(s.start, ',')} --> {_clock(s.end, ',')}\n{_cue_text(s.text)}\n\n"
                   for i, s in enumerate(segments, 1))


def vtt(segments) -> str:
    return "WEBVTT\n\n" + "".join(f"{_clock(s.start, '.')} --> {_clock(s.end, '.')}\n{_cue_text(s.text)}\n\n"
                                  for s in segments)
