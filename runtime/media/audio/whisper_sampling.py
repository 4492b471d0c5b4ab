"""Whisper's logits rules, per decode, as transformers' `WhisperForConditionalGeneration.generate` applies
them (generation/logits_process.py), and the sampler that applies them.

A decode of a Whisper window carries its rules in its sampling parameters (`WhisperParams.rules`);
the engine core of a Whisper engine samples with `WhisperSampler` (runner.engine_core), which hands
each such row's logits to its rules before sampling and the sampled token back after. The rules need
the logits themselves (the timestamp rule compares the timestamps' total probability with the best
text token's), which a mask-only constraint cannot see; and they record what the fallback heuristics
read (runtime/media/audio/longform.py): each token's log-probability under the processed logits and
the no-speech probability.

In transformers' order, at step t of a decode (t = 0 the first generated token):

1. no speech (t = 0): softmax of the raw logits at <|nocaptions|> (`no_timestamps_token_id - 1`),
   when <|startoftranscript|> is the prompt's last token (English-only models; a multilingual prompt
   ends <|lang|><|task|>, so its value comes from a probe decode: `ProbeRules`);
2. `begin_suppress_tokens` at t = 0, `suppress_tokens` always;
3. with timestamps (`WhisperTimeStampLogitsProcessor`): never <|notimestamps|>; timestamps come in
   pairs (after a pair only text, after a lone one no text, only a timestamp or <|endoftext|>);
   timestamps never decrease; t = 0 is a timestamp of at most `max_initial_timestamp_index`; and when
   the timestamps' summed probability beats every text token, a timestamp.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trt_llm.runtime.sampling.sampler import Sampler, SamplingParams

MAX_INITIAL_TIMESTAMP_INDEX = 50  # openai's max_initial_timestamp of 1 s in 0.02 s steps (the checkpoints' value)


@dataclass(frozen=True)
class WhisperTokens:
    """The token ids the rules and the prompts use, from the audio component's config."""
    eos: int
    sot: int
    prev: int
    no_timestamps: int
    vocab_size: int
    suppress: tuple[int, ...]
    begin_suppress: tuple[int, ...]
    multilingual: bool
    lang_to_id: dict
    task_to_id: dict
    max_target_positions: int
    max_initial_timestamp_index: int = MAX_INITIAL_TIMESTAMP_INDEX

    @property
    def timestamp_begin(self) -> int:
        return self.no_timestamps + 1

    @property
    def no_speech(self) -> int:
        return self.no_timestamps - 1

    @classmethod
    def from_settings(cls, s: dict, vocab_size: int) -> "WhisperTokens":
        # Whisper's vocabularies put <|endoftext|> just before <|startoftranscript|> (50256 / 50257 in
        # tiny.en, 50257 / 50258 in the multilingual ones); the config names the latter.
        return cls(eos=s["decoder_start_token_id"] - 1, sot=s["decoder_start_token_id"], prev=s["prev_token_id"],
                   no_timestamps=s["no_timestamps_token_id"], vocab_size=vocab_size,
                   suppress=tuple(t for t in s["suppress_tokens"] if t < vocab_size),
                   begin_suppress=tuple(t for t in s["begin_suppress_tokens"] if t < vocab_size),
                   multilingual=bool(s["is_multilingual"]), lang_to_id=dict(s.get("lang_to_id") or {}),
                   task_to_id=dict(s.get("task_to_id") or {}), max_target_positions=s["max_target_positions"],
                   max_initial_timestamp_index=s.get("max_initial_timestamp_index", MAX_INITIAL_TIMESTAMP_INDEX))


def log_softmax(x: np.ndarray) -> np.ndarray:
    top = np.max(x)
    if not np.isfinite(top):
        return np.full_like(x, -np.inf)
    shifted = x - top
    return shifted - np.log(np.exp(shifted).sum())


class WindowRules:
    """One decode's rules and records: `tokens` (what was sampled), `logprobs` (each token's
    log-probability under the processed logits: what avg_logprob averages), `no_speech_prob`."""

    def __init__(self, tokens: WhisperTokens, timestamps: bool, no_speech_from_logits: bool):
        self.t, self.timestamps = tokens, timestamps
        self.no_speech_from_logits = no_speech_from_logits
        self.generated: list[int] = []
        self.logprobs: list[float] = []
        self.no_speech_prob: float | None = None
        self._last: np.ndarray | None = None  # the last processed row's log-softmax

    def process(self, raw: np.ndarray) -> np.ndarray:
        t = self.t
        first = not self.generated
        x = np.asarray(raw, dtype=np.float64).copy()
        if first and self.no_speech_from_logits:
            self.no_speech_prob = float(np.exp(log_softmax(x)[t.no_speech]))
        if first and t.begin_suppress:
            x[list(t.begin_suppress)] = -np.inf
        if t.suppress:
            x[list(t.suppress)] = -np.inf
        if self.timestamps:
            x = self._timestamp_rules(x, first)
        else:
            self._last = log_softmax(x)
        return x

    def _timestamp_rules(self, x: np.ndarray, first: bool) -> np.ndarray:
        t, seq, begin = self.t, self.generated, self.t.timestamp_begin
        x[t.no_timestamps] = -np.inf
        last_was = len(seq) >= 1 and seq[-1] >= begin
        penultimate_was = len(seq) < 2 or seq[-2] >= begin
        if last_was:
            if penultimate_was:  # a pair just closed: text (or the end) next
                x[begin:] = -np.inf
            else:  # a lone timestamp: its pair, or the end
                x[: t.eos] = -np.inf
        stamps = [token for token in seq if token >= begin]
        lowest = begin
        if stamps:
            lowest = stamps[-1] if last_was and not penultimate_was else stamps[-1] + 1
        x[begin:lowest] = -np.inf
        if first:
            x[:begin] = -np.inf
            x[begin + t.max_initial_timestamp_index + 1:] = -np.inf
        logprobs = log_softmax(x)
        stamp_mass = np.logaddexp.reduce(logprobs[begin:])
        if stamp_mass > np.max(logprobs[:begin]):
            x[:begin] = -np.inf
            logprobs = log_softmax(x)
        self._last = logprobs
        return x

    def accept(self, token: int) -> None:
        self.generated.append(token)
        self.logprobs.append(float(self._last[token]))


class ProbeRules:
    """A one-token decode that only reads the logits at the prompt's last token: the language
    (transformers' `detect_language`: argmax over the language tokens) or the no-speech
    probability (a multilingual window's, at its <|startoftranscript|>)."""

    def __init__(self, tokens: WhisperTokens):
        self.t = tokens
        self.language_id: int | None = None
        self.no_speech_prob: float | None = None

    def process(self, raw: np.ndarray) -> np.ndarray:
        x = np.asarray(raw, dtype=np.float64)
        self.no_speech_prob = float(np.exp(log_softmax(x)[self.t.no_speech]))
        if self.t.lang_to_id:
            ids = np.array(sorted(self.t.lang_to_id.values()))
            self.language_id = int(ids[np.argmax(x[ids])])
        only = np.full_like(x, -np.inf)
        only[self.t.eos] = 0.0  # its one token ends it
        return only

    def accept(self, token: int) -> None:
        pass


@dataclass(frozen=True)
class WhisperParams(SamplingParams):
    """Sampling parameters that carry a decode's Whisper rules to the sampler."""
    rules: object = field(default=None, compare=False)


class WhisperSampler(Sampler):
    """The engine core's sampler on a Whisper engine: rows whose parameters carry rules have their
    logits processed by them first (other rows sample as any sampler's do)."""

    def __init__(self):
        super().__init__([])
        self._rules: dict[int, object] = {}

    def add(self, params: SamplingParams, seed: int | None = None) -> int:
        row = super().add(params, seed)
        rules = getattr(params, "rules", None)
        if rules is None:
            self._rules.pop(row, None)
        else:
            self._rules[row] = rules
        return row

    def release(self, row: int) -> None:
        super().release(row)
        self._rules.pop(row, None)

    def sample(self, logits, rows=None, counts=None) -> np.ndarray:
        logits = np.asarray(logits)
        indexes = range(len(logits)) if rows is None else rows
        ruled = [(i, self._rules[r]) for i, r in enumerate(indexes) if r in self._rules]
        if not ruled:
            return super().sample(logits, rows, counts)
        processed = np.array(logits, dtype=np.float32, copy=True)
        for i, rules in ruled:
            processed[i] = rules.process(logits[i])
        tokens = super().sample(processed, rows, counts)
        for i, rules in ruled:
            rules.accept(int(tokens[i]))
        return tokens
