"""Request preparation: a validated request -> what the engine runs (token ids, limits, sampling,
LoRA adapter, stop strings, the system prompt's tokens). Shared by the file runner and the server.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trt_llm.runtime.text.detokenizer import IncrementalDetokenizer, markup_ids
from trt_llm.runtime.sampling.grammar import GrammarError, Grammars
from trt_llm.runtime.requests.lora import LoraAdapter, LoraError, load_adapter
from trt_llm.runtime.text.prompt import Prompt, PromptError, PromptFormatter
from trt_llm.runtime.sampling.sampler import SamplingParams
from trt_llm.runtime.engine.sequence import Sequence
from trt_llm.runtime.media.sequence_media import media_parts
from trt_llm.runtime.text.token_bytes import TokenBytes
from trt_llm.schemas.input_file import InputSettings, Request

if TYPE_CHECKING:  # (the speech modules are imported by the first request that needs them)
    from trt_llm.runtime.media.audio.longform import Transcription
    from trt_llm.runtime.media.audio.vad_transcription import VadTranscription

log = logging.getLogger(__name__)


@dataclass
class Prepared:
    index: int
    request: Request
    prompt: Prompt
    sequence: Sequence
    params: SamplingParams
    system_ids: list[int] | None  # the templated system prompt's tokens, when they prefix the prompt
    adapter: LoraAdapter | None = None
    seed: int | None = None  # this request's own sampling stream (request_seed)
    num_logprobs: int = 0  # K as its batch resolves it (batch-uniform, like the reference)
    save_group: bool = False  # its batch saves system prompts (batch-wide, like the reference)
    speculate: bool = True  # its batch may speculate (no request in it disables spec decode)
    context_policies: tuple[str, str] = ("use_cache", "including_generated_tokens")  # lookup, commit
    # A Whisper request decoded window by window (media/audio/longform.py; with VAD its speech chunks)
    transcription: Transcription | VadTranscription | None = None


def one_line(message: str) -> str:
    """A library's message on one line: its lines joined, a caret line under a quoted source dropped
    (the regex parser's "^" marks nothing once the lines are joined)."""
    lines = [line.strip() for line in message.splitlines()]
    return " ".join(line for line in lines if line and set(line) - set("^~ "))


def request_seed(seed: int | None, index: int) -> int | None:
    # One stream per request, derived from the file's seed and the request's index, so a request's
    # samples do not depend on its batch-mates or on the batch size.
    return None if seed is None else (seed * 1_000_003 + index) % (2**63)


def apply_batch_rules(batch: list[Prepared], settings: InputSettings) -> int:
    """The reference's batch-wide rules on the requests of one batch; returns the batch's K.

    Batch-uniform: the batch computes the largest num_logprobs any request asked for, and every
    request in it gets that K. Batch-wide: one request asking to save system prompts makes the
    whole batch save them; one request disabling speculative decoding disables it for the batch."""
    k = max(p.request.resolved_num_logprobs(settings) for p in batch)
    save = any(p.request.save_system_prompt_kv_cache for p in batch)
    speculate = not any(p.request.disable_spec_decode for p in batch)
    for p in batch:
        p.num_logprobs, p.save_group, p.speculate = k, save, speculate
    return k


class RequestPreparer:
    def __init__(self, tokenizer, token_bytes: TokenBytes, limits: dict, vocab_size: int,
                 lora_layout: dict | None, dtype, prefix_stats: dict, eos_token_ids: list[int], vision=None,
                 audio=None, task: str = "chat"):
        """vision: the engine's VisionEncoder (runtime/media/vision/encoder.py), when it has a vision component;
        audio: its AudioEncoder (runtime/media/audio/encoder.py), when it has an audio component; task: the
        family's (trt_llm/families/face.Family.task): "chat", or "transcription" (Whisper's prompts)."""
        self.tokenizer, self.token_bytes = tokenizer, token_bytes
        self.markup = markup_ids(tokenizer)  # special tokens the answers' parsers read, written out
        self.vision, self.audio, self.task = vision, audio, task
        self.limits, self.vocab_size = limits, vocab_size
        self.lora_layout, self.dtype = lora_layout, dtype
        self.prefix_stats = prefix_stats  # counts "fallbacks": prompts whose system prompt cannot be reused
        self._adapters: dict[tuple[str, str], LoraAdapter | LoraError] = {}  # read once per path
        self.grammars = Grammars(tokenizer, vocab_size, eos_token_ids)

    def prepare(self, index: int, request: Request, settings: InputSettings, formatter: PromptFormatter,
                where: str | None = None, warn_clamp: bool = True) -> Prepared:
        """Raises PromptError or ValueError naming `where` (default requests[index]) and the field.
        warn_clamp: log when the KV capacity clamps max_generate_length (a server asking for "as
        many as fit" does not want the warning)."""
        where = f"requests[{index}]" if where is None else where
        adapter = None
        if request.lora_name is not None:
            adapter = self._adapter(where, request.lora_name, settings.available_lora_weights[request.lora_name])
        media = rules = transcription = None
        if self.task == "transcription":  # Whisper
            if request.response_format is not None and request.response_format.type != "text":
                raise ValueError(f"{where}.response_format: a Whisper engine transcribes; it takes no "
                                 "structured output")
            if request.resolved_guided_decoding(settings)[0] is not None:
                raise ValueError(f"{where}.guided_decoding: a Whisper engine transcribes; it takes no "
                                 "guided decoding")
            from trt_llm.runtime.media.audio.transcription import transcription_prompt

            prompt, media, rules, transcription = transcription_prompt(
                self.audio, self.tokenizer, request.messages, formatter.media_dir, where, self.vocab_size,
                settings.whisper, settings.temperature, request_seed(settings.seed or 0, index),
                settings.max_generate_length)
        else:
            try:
                prompt = formatter.format(request.messages, request.tools)
            except PromptError as error:
                raise PromptError(f"{where}.{error}") from None
        # The media modules (Pillow, soundfile, the encoders) are imported by the first request that
        # has media: a text run's cold start does not pay for them.
        if self.vision is not None and media_parts(request.messages, "video"):  # videos, and images beside
            from trt_llm.runtime.media.video.prompt import attach_vision

            ids, media = attach_vision(self.vision, self.tokenizer, request.messages, prompt.token_ids,
                                       formatter.media_dir, where, self.limits["max_input_len"])
            prompt = dataclasses.replace(prompt, token_ids=ids)
        elif self.vision is not None and media_parts(request.messages, "image"):
            from trt_llm.runtime.media.vision.prompt import attach_images

            ids, media = attach_images(self.vision, request.messages, prompt, self.tokenizer, formatter.media_dir, where,
                                       self.limits["max_input_len"])
            prompt = dataclasses.replace(prompt, token_ids=ids)
        if self.audio is not None and not self.audio.cross_attention and media_parts(request.messages, "audio"):
            from trt_llm.runtime.media.audio.prompt import attach_audio

            ids, media = attach_audio(self.audio, request.messages, prompt.token_ids, formatter.media_dir, where,
                                      self.limits["max_input_len"], media)
            prompt = dataclasses.replace(prompt, token_ids=ids)
        prompt_len, max_input = len(prompt.token_ids), self.limits["max_input_len"]
        if prompt_len > max_input:
            raise ValueError(f"{where}: prompt is {prompt_len} tokens, longer than the engine's "
                             f"max_input_len {max_input}")
        if prompt_len == 0:
            raise ValueError(f"{where}: the prompt is empty after formatting")
        capacity = self.limits["max_kv_cache_capacity"]
        max_new = min(settings.max_generate_length, capacity - prompt_len)
        if max_new < settings.max_generate_length and warn_clamp:
            log.warning("%s: max_generate_length %d clamped to %d by the KV cache capacity %d "
                        "(prompt %d tokens)", where, settings.max_generate_length, max_new, capacity, prompt_len)
        bias = request.resolved_logit_bias(settings)
        outside = [token for token in bias if token >= self.vocab_size]
        if outside:
            raise ValueError(f"{where}.logit_bias: token id {outside[0]} is outside the vocabulary "
                             f"(size {self.vocab_size})")
        params = SamplingParams(settings.temperature, settings.top_k, settings.top_p, bias or None,
                                **request.resolved_penalties(settings))
        detokenizer = IncrementalDetokenizer(self.token_bytes, request.stop_list(), self.markup)
        sequence = Sequence(prompt.token_ids, max_new, detokenizer, constraint=rules, media=media)
        if rules is None:  # (a transcription's constraint is its token rules)
            sequence.constraint = self._constraint(where, request, settings)
        return Prepared(index, request, prompt, sequence, params, self._system_ids(where, prompt), adapter,
                        request_seed(settings.seed, index),
                        context_policies=request.resolved_context_policies(settings),
                        transcription=transcription)

    def _constraint(self, where: str, request: Request, settings: InputSettings):
        """The request's response_format or guided decoding (its own, else the file's default) as a
        grammar.Constraint; None for free text. Raises ValueError naming the field."""
        guided, default = request.resolved_guided_decoding(settings)
        if request.response_format is None and guided is None:
            return None
        field, suffix = "response_format", ""
        try:
            if request.response_format is not None:
                return self.grammars.constraint(request.response_format.model_dump(by_alias=True))
            field = "guided_decoding"
            suffix = " (the top-level guided_decoding)" if default else ""
            written, mode, value = guided.mode()
            return self.grammars.guided(mode, value, field=written)
        except GrammarError as error:
            raise ValueError(f"{where}.{field}.{one_line(str(error))}{suffix}") from None
        except ImportError as error:  # a broken install: this request fails, not the run
            what = "structured output" if field == "response_format" else "guided decoding"
            raise ValueError(f"{where}.{field}: {what} needs {error.name or 'llguidance'}, which is not "
                             "installed (it is a dependency of trt-llm: pip install llguidance)") from None

    def _adapter(self, where: str, name: str, path: str) -> LoraAdapter:
        if not self.lora_layout:
            raise ValueError(f"{where}.lora_name: this engine was built without LoRA inputs "
                             "(set lora: {max_rank: N} in the build config)")
        key = (name, path)
        if key not in self._adapters:
            try:
                self._adapters[key] = load_adapter(name, path, self.lora_layout, self.dtype)
            except LoraError as error:
                self._adapters[key] = error
        adapter = self._adapters[key]
        if isinstance(adapter, LoraError):
            raise ValueError(f"{where}.lora_name: {adapter}")
        return adapter

    def _system_ids(self, where: str, prompt: Prompt) -> list[int] | None:
        if not prompt.system_text:
            return None
        ids = self.tokenizer.encode(prompt.system_text, add_special_tokens=False)
        placeholders = {self.vision.image_token_id if self.vision else None,
                        self.vision.settings.get("video_token_id") if self.vision else None,
                        self.audio.audio_token_id if self.audio else None}
        if placeholders.intersection(ids):
            # A system prompt with an image or a clip: its KV depends on the media, which the cache's
            # key (the tokens) does not show; such prompts are prefilled whole.
            return None
        if prompt.token_ids[: len(ids)] != ids:
            # The template (or the tokenizer) merged across the system/user boundary: this prompt
            # cannot reuse a system-prompt KV and gets a full prefill.
            if not self.prefix_stats["fallbacks"]:
                log.warning("%s: the prompt's tokens do not start with its system prompt's tokens; "
                            "the system-prompt KV cache falls back to full prefills for such prompts", where)
            self.prefix_stats["fallbacks"] += 1
            return None
        return ids
