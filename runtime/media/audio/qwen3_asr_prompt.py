"""A Qwen3-ASR transcription as a chat request, and its answer's text: what transformers'
Qwen3ASRProcessor does in `apply_transcription_request` and `decode(..., return_format="parsed")`.

The request is one user turn holding the clip; a context text (hot words, the domain: OpenAI's
`prompt`) is the system turn; a language forced (one of LANGUAGES, by code or name) is the start of
the answer, `language <Name><asr_text>` after the generation prompt (`forced_language`). The checkpoint's chat template writes
`<|im_start|>system\\n{context}<|im_end|>\\n<|im_start|>user\\n<|audio_start|><|audio_pad|><|audio_end|>
<|im_end|>\\n<|im_start|>assistant\\n`, and runtime/media/audio/prompt.py widens the <|audio_pad|> to
the clip's tokens. The model answers `language <Name><asr_text><transcription>` (`language None` for
a clip without speech); the transcription is what follows the marker, the whole text without one.
Before it is split, the text loses its runaway repeats as transformers' parser (and the reference
Qwen3-ASR library) removes them: a character repeated more than 20 times in a row is kept once,
then a pattern of up to 20 characters repeated 20 times or more is kept once (`collapse_repeats`).
"""

from __future__ import annotations

from itertools import groupby

MARKER = "<asr_text>"
REPEATS = 20  # the reference's threshold
LONGEST_PATTERN = 20  # characters


def collapse_repeats(text: str, limit: int = REPEATS, longest: int = LONGEST_PATTERN) -> str:
    """The text with runaway repeats removed, the reference's two passes (module docstring)."""
    runs = "".join(ch if len(run) > limit else run for ch, run in ((ch, "".join(g)) for ch, g in groupby(text)))
    return _collapse_patterns(runs, limit, longest)


def _collapse_patterns(text: str, limit: int, longest: int) -> str:
    """Scanning left to right: at the first place where a pattern of 1..longest characters (the
    shortest first) starts `limit` back-to-back copies of itself, every further copy goes too and the
    pattern is kept once; the scan goes on after them. Nothing is looked for in the last
    2 * limit - 1 characters."""
    n, out, i = len(text), [], 0
    while i <= n - 2 * limit:
        size = next((k for k in range(1, longest + 1) if i + k * limit <= n
                     and all(text[i + r * k:i + (r + 1) * k] == text[i:i + k] for r in range(1, limit))), None)
        if size is None:
            out.append(text[i])
            i += 1
            continue
        unit, end = text[i:i + size], i + limit * size
        while end + size <= n and text[end:end + size] == unit:
            end += size
        out.append(unit)
        i = end
    out.append(text[i:])
    return "".join(out)


# The languages the model was trained to be told, by ISO code: the full names of its forced-language
# prefix (transformers' LANGUAGE_CODE_TO_NAME for Qwen3-ASR).
LANGUAGES = {
    "ar": "Arabic", "yue": "Cantonese", "zh": "Chinese", "cs": "Czech", "da": "Danish", "nl": "Dutch",
    "en": "English", "fil": "Filipino", "fi": "Finnish", "fr": "French", "de": "German", "el": "Greek",
    "hi": "Hindi", "hu": "Hungarian", "id": "Indonesian", "it": "Italian", "ja": "Japanese", "ko": "Korean",
    "mk": "Macedonian", "ms": "Malay", "fa": "Persian", "pl": "Polish", "pt": "Portuguese", "ro": "Romanian",
    "ru": "Russian", "es": "Spanish", "sv": "Swedish", "th": "Thai", "tr": "Turkish", "vi": "Vietnamese",
}


def forced_language(language: str) -> str:
    """The answer's prefix that forces `language` (a code or a name of LANGUAGES, any case);
    ValueError names the ones there are."""
    by_name = {name.lower(): name for name in LANGUAGES.values()}
    key = language.strip().lower()
    name = LANGUAGES.get(key) or by_name.get(key)
    if name is None:
        raise ValueError(f"{language!r} is not one of the model's languages: "
                         f"{', '.join(f'{code} ({name})' for code, name in LANGUAGES.items())}")
    return f"language {name}{MARKER}"


def transcription_messages(audio_source: str, context: str | None = None) -> list[dict]:
    """The input file's messages of a transcription of `audio_source` (a path or URL)."""
    messages = [{"role": "system", "content": context}] if context else []
    return messages + [{"role": "user", "content": [{"type": "audio", "audio": audio_source}]}]


def parse_output(text: str) -> tuple[str | None, str]:
    """(language or None, transcription) of the model's answer, as the processor parses it."""
    text = text.strip()
    if "assistant\n" in text:
        text = text.split("assistant\n", 1)[-1]
    text = collapse_repeats(text)
    if MARKER not in text:
        return None, text.strip()
    prefix, transcription = text.split(MARKER, 1)
    prefix = prefix.strip()
    language = None
    for line in prefix.splitlines():  # the first non-empty line: "language <Name>"
        line = line.strip()
        if line:
            language = line[len("language "):].strip() if line.lower().startswith("language ") else line
            break
    if language is not None and language.lower() == "none":
        language = None
    return language or None, transcription.strip()
