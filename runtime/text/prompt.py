"""Turn a request's messages into prompt text and token ids, with the tokenizer's own chat template."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from trt_llm.runtime.text.chat_template import ChatTemplateError
from trt_llm.runtime.text.reasoning import ReasoningMode, reasoning_mode
from trt_llm.runtime.text.tokenizer import Tokenizer
from trt_llm.schemas.input_file import Message


class PromptError(ValueError):
    pass


@dataclass
class Prompt:
    text: str  # the whole templated prompt (formatted_complete_request)
    system_text: str  # its leading system part (formatted_system_prompt)
    token_ids: list[int]
    reasoning: ReasoningMode | None = None  # how the output's <think> block splits off (runtime/text/reasoning.py)


def _plain_messages(messages: list[Message], images: bool = False, audio: bool = False) -> list[dict]:
    """Messages as chat templates expect them: text content joined into a string; with images or
    audio (an engine with that encoder) a message that has media parts keeps its parts, each as
    {"type": "image", "image": source} or {"type": "audio", "audio": source} (the template writes its
    placeholder)."""
    readable = {"image": images, "audio": audio, "video": images}  # a vision tower reads videos too
    plain = []
    for m_index, message in enumerate(messages):
        parts = []
        for c_index, part in enumerate(message.parts()):
            if part.type == "text":
                parts.append({"type": "text", "text": part.text})
            elif readable.get(part.type):
                # with its source under its type's key too: templates test `'audio' in content`
                parts.append({"type": part.type, part.type: getattr(part, part.type)})
            else:
                raise PromptError(
                    f"messages[{m_index}].content[{c_index}]: this engine has no {part.type} encoder "
                    f"({'audio' if part.type == 'audio' else 'vision'} inputs need an engine built with one)")
        if any(p["type"] != "text" for p in parts):
            item = {"role": message.role, "content": parts}
        else:
            item = {"role": message.role, "content": "".join(p["text"] for p in parts)}
        if message.tool_calls:
            item["tool_calls"] = [_tool_call(call) for call in message.tool_calls]
        for key in ("tool_call_id", "reasoning_content"):
            if getattr(message, key) is not None:
                item[key] = getattr(message, key)
        plain.append(item)
    return plain


def _tool_call(call) -> dict:
    """An earlier call as templates read it (vLLM's form): arguments given as a JSON string become
    the object they hold (templates write `arguments | tojson`; Qwen's writes a string as it is)."""
    arguments = call.function.arguments
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            parsed = None
        arguments = parsed if isinstance(parsed, dict) else arguments
    out = {"type": call.type, "function": {"name": call.function.name, "arguments": arguments}}
    if call.id is not None:
        out["id"] = call.id
    return out


class PromptFormatter:
    def __init__(self, tokenizer: Tokenizer, apply_chat_template: bool, add_generation_prompt: bool,
                 enable_thinking: bool, images: bool = False, media_dir: Path | None = None,
                 audio: bool = False, tools: list[dict] | None = None):
        """images / audio: the engine reads image / audio parts (a vision / audio component);
        media_dir: where their relative paths start (the input file's folder); tools: the function
        definitions the template gets (apply_chat_template's tools=), per request (format's)."""
        self.tokenizer = tokenizer
        self.tools = tools
        self.images, self.audio, self.media_dir = images, audio, media_dir
        self.apply_chat_template = apply_chat_template and tokenizer.chat_template is not None
        self.template_kwargs = {"add_generation_prompt": add_generation_prompt,
                                "enable_thinking": enable_thinking}
        self._special = sorted(tokenizer.special_token_texts(), key=len)

    def format(self, messages: list[Message], tools: list[dict] | None = None) -> Prompt:
        """tools: the request's function definitions (default: the formatter's)."""
        plain = _plain_messages(messages, self.images, self.audio)
        tools = self.tools if tools is None else tools
        if not self.apply_chat_template:
            if any(not isinstance(m["content"], str) for m in plain):
                raise PromptError("messages: image and audio parts need the chat template (apply_chat_template: "
                                  "true), which places their tokens")
            # Raw mode feeds the content itself; the tokenizer adds its BOS if it has one.
            text = "\n".join(m["content"] for m in plain)
            return Prompt(text, "", self.tokenizer.encode(text, add_special_tokens=True))
        try:
            text = self._render(plain, tools, **self.template_kwargs)
        except ChatTemplateError as error:
            raise PromptError(f"messages: the chat template refused them: {error}") from None
        # The template wrote every special token itself (BOS included): add none.
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return Prompt(text, self._system_part(plain, tools), ids,
                      reasoning_mode(self.tokenizer._template(tools), text))

    def _render(self, messages: list[dict], tools: list[dict] | None = None, **kwargs) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=tools or None, **kwargs)

    def _system_part(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        """The templated system block, including a default one the template inserts by itself.

        Rendering the same system messages followed by a user turn and by an assistant turn gives
        two texts that agree up to where the next turn's header starts; cutting the next turn's
        opening special token off that common prefix leaves the system block.
        """
        system = [m for m in messages[:1] if m["role"] == "system"]
        try:
            as_user = self._render(system + [{"role": "user", "content": "\x00user"}], tools,
                                   add_generation_prompt=False)
            as_assistant = self._render(system + [{"role": "assistant", "content": "\x00assistant"}], tools,
                                        add_generation_prompt=False)
        except Exception:  # templates may insist on alternation or a first user turn
            return ""
        common = 0
        for a, b in zip(as_user, as_assistant):
            if a != b:
                break
            common += 1
        # A template that renders both turns alike agrees up to the probe text itself: stop there.
        prefix = as_user[:common].split("\x00", 1)[0]
        return self._strip_turn_opener(prefix)

    def _strip_turn_opener(self, text: str) -> str:
        """Drop the next turn's opening special token, whole or cut short, from the end of `text`."""
        for token in reversed(self._special):  # longest first
            if token and text.endswith(token):
                return text[: -len(token)]
        for size in range(min(len(text), max(map(len, self._special), default=0)), 0, -1):
            tail = text[-size:]
            if any(token.startswith(tail) for token in self._special):
                return text[:-size]
        return text
