"""Response building: a finished sequence -> its Response (text, log-probabilities, counts), and
the responses of requests that failed. Shared by the file runner and the server."""

from __future__ import annotations

import logging

from trt_llm.runtime.requests.prepare import Prepared
from trt_llm.runtime.text.reasoning import split_reasoning
from trt_llm.runtime.text.token_bytes import TokenBytes
from trt_llm.schemas.input_file import InputSettings, LoadedInput
from trt_llm.schemas.output_file import LogprobCandidate, OutputFile, Response

log = logging.getLogger(__name__)


class ResponseBuilder:
    def __init__(self, token_bytes: TokenBytes):
        self.token_bytes = token_bytes

    def response(self, p: Prepared, batch_idx: int, started: float, messages) -> Response:
        """started: when the request was admitted (its time to first token counts from there)."""
        s = p.sequence
        logprobs = sampled_tokens = None
        if s.top_logprobs:
            logprobs = [[self.candidate(t, v) for t, v in zip(ids, values)] for ids, values in s.top_logprobs]
            sampled_tokens = [self.candidate(t, v) for t, v in zip(s.generated, s.token_logprobs)]
        # The text is the generated tokens' bytes (special tokens skipped, the stop string and
        # what follows cut off), decoded as UTF-8 with invalid bytes as U+FFFD.
        text = s.detokenizer.finish()
        reasoning, content = split_reasoning(text, p.prompt.reasoning)
        error = None
        if s.error:  # the constraint stopped it: the request failed, its answer so far kept
            field, suffix = constraint_field(p.request)
            error = f"requests[{p.index}].{field}.{s.error}{suffix}"
            log.error("%s", error)
        return Response(
            request_idx=p.index, batch_idx=batch_idx, output_text=text, reasoning_text=reasoning,
            content_text=content if reasoning is not None else None,
            finish_reason=s.finish_reason, error=error, messages=messages, logprobs=logprobs,
            sampled_tokens=sampled_tokens,
            formatted_system_prompt=p.prompt.system_text, formatted_complete_request=p.prompt.text,
            prompt_tokens=len(s.prompt_ids), generated_tokens=len(s.generated),
            reused_tokens=s.reused_tokens,
            output_token_ids=s.generated,
            time_to_first_token_ms=(None if s.first_token_time is None  # (timed out before its first token)
                                    else round((s.first_token_time - started) * 1000, 3)),
        )

    def candidate(self, token_id: int, logprob: float) -> LogprobCandidate:
        return LogprobCandidate(token_id=token_id, token=self.token_bytes.text_of(token_id),
                                bytes=list(self.token_bytes.bytes_of(token_id)), logprob=logprob)


def constraint_field(request) -> tuple[str, str]:
    """(the field of a request's constraint, a suffix when it is the file's default), as prepare.py
    names them."""
    if request.response_format is not None:
        return "response_format", ""
    return "guided_decoding", "" if "guided_decoding" in request.model_fields_set else \
        " (the top-level guided_decoding)"


def error_response(index: int, batch_idx: int, message: str, messages) -> Response:
    return Response(request_idx=index, batch_idx=batch_idx, output_text="", finish_reason="error",
                    error=message, messages=messages if isinstance(messages, list) else [])


def logged_error(index: int, batch_idx: int, message: str, messages) -> Response:
    log.error("%s", message)
    return error_response(index, batch_idx, message, messages)


def interrupted_output(loaded: LoadedInput, settings: InputSettings, finished: list[Response],
                       why: str) -> OutputFile:
    """The output of a run stopped by a signal: every finished response, and the others failed
    with `why`, so that nothing that was computed is lost."""
    done = {response.request_idx: response for response in finished}
    responses = [done.get(index) or error_response(index, index % settings.batch_size, f"requests[{index}]: {why}",
                                                   loaded.messages(index))
                 for index in range(len(loaded.raw_requests))]
    return OutputFile(input_file=loaded.source, responses=responses)
