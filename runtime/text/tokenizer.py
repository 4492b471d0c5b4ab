"""The runtime's tokenizer: an engine's tokenizer/ folder read with `tokenizers` and jinja2 alone.

The folder is what transformers' `save_pretrained` wrote at build time: tokenizer.json (the whole
pipeline, as the model's tokenizer class built it), tokenizer_config.json (special tokens, flags)
and chat_template.jinja. Loading repeats what transformers does on top of tokenizer.json -- the
special-token map, the added tokens, the BOS/EOS post-processor when add_bos_token/add_eos_token
are set, split_special_tokens, no truncation or padding -- so ids, text and templates come out as
transformers' (tests/test_tokenizer.py compares them), on a device without transformers.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, processors
from tokenizers import Tokenizer as Backend

from trt_llm.runtime.text import chat_template

SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
TOKENIZER_FILE, CONFIG_FILE, TEMPLATE_FILE = "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"
LEGACY_SPECIAL_TOKENS_FILE, TEMPLATE_DIR = "special_tokens_map.json", "chat_templates"


class TokenizerError(ValueError):
    pass


def _as_added_token(value, special: bool = True) -> AddedToken:
    """A special-token value of the config (a string or a serialized AddedToken) as an AddedToken."""
    if isinstance(value, AddedToken):
        return value
    if isinstance(value, dict):
        fields = {k: v for k, v in value.items() if k != "__type"}
        return AddedToken(**fields)
    return AddedToken(value, special=special)


def _content(value) -> str:
    return value.content if isinstance(value, AddedToken) else str(value)


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise TokenizerError(f"{path}: unreadable: {error}") from None
    if not isinstance(data, dict):
        raise TokenizerError(f"{path}: expected a JSON object")
    return data


def _read_config(directory: Path) -> dict:
    config = _read_json(directory / CONFIG_FILE) if (directory / CONFIG_FILE).is_file() else {}
    legacy = directory / LEGACY_SPECIAL_TOKENS_FILE
    if "added_tokens_decoder" not in config and legacy.is_file():
        # Older saves keep the special tokens in their own file; its values win, as in transformers.
        for key, value in _read_json(legacy).items():
            if key in ("extra_special_tokens", "additional_special_tokens") and isinstance(value, list):
                existing = list(config.get("extra_special_tokens") or config.get("additional_special_tokens") or [])
                config["extra_special_tokens"] = existing + [t for t in value if t not in existing]
            else:
                config[key] = value
    if "additional_special_tokens" in config and not config.get("extra_special_tokens"):
        config["extra_special_tokens"] = config.pop("additional_special_tokens")
    return config


def _read_templates(directory: Path, config: dict) -> dict[str, str]:
    """name -> template source; the default one under "default"."""
    templates = {}
    value = config.get("chat_template")
    if isinstance(value, str):
        templates["default"] = value
    elif isinstance(value, list):
        templates.update({t["name"]: t["template"] for t in value})
    elif isinstance(value, dict):
        templates.update(value)
    if (directory / "chat_template.json").is_file():
        value = _read_json(directory / "chat_template.json").get("chat_template")
        if isinstance(value, str):
            templates["default"] = value
    if (directory / TEMPLATE_FILE).is_file():
        templates["default"] = (directory / TEMPLATE_FILE).read_text(encoding="utf-8")
    if (directory / TEMPLATE_DIR).is_dir():
        for path in sorted((directory / TEMPLATE_DIR).glob("*.jinja")):
            templates[path.name.removesuffix(".jinja")] = path.read_text(encoding="utf-8")
    return templates


class Tokenizer:
    """Encode, decode and apply the chat template; the names follow transformers' tokenizers."""

    def __init__(self, backend: Backend, config: dict | None = None, templates: dict[str, str] | None = None):
        self.backend = backend
        config = dict(config or {})
        self.templates = dict(templates or {})
        # Named special tokens: the standard ones, then model-specific `*_token` keys and a dict of
        # extra_special_tokens (image_token, ...), all passed to the chat template as variables.
        named: dict[str, object] = {}
        for key in SPECIAL_TOKEN_KEYS:
            if config.get(key) is not None:
                named[key] = config[key]
        for key, value in config.items():
            if key.endswith("_token") and key not in SPECIAL_TOKEN_KEYS and isinstance(value, (str, dict)):
                named[key] = value
        extra = config.get("extra_special_tokens") or []
        if isinstance(extra, dict):
            named.update(extra)
            extra = []
        self._named = {key: _as_added_token(value) for key, value in named.items()}
        self._extra = [_as_added_token(value) for value in extra]
        self.split_special_tokens = bool(config.get("split_special_tokens", False))
        self.clean_up_tokenization_spaces = bool(config.get("clean_up_tokenization_spaces", False))
        self._force_clean_up = bool(config.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"))
        self._sync_added_tokens(config)
        if "add_bos_token" in config or "add_eos_token" in config or backend.post_processor is None:
            self._set_post_processor(bool(config.get("add_bos_token")), bool(config.get("add_eos_token")))
        backend.no_truncation()
        backend.no_padding()
        backend.encode_special_tokens = self.split_special_tokens

    @classmethod
    def from_dir(cls, directory: str | Path) -> "Tokenizer":
        directory = Path(directory)
        path = directory / TOKENIZER_FILE
        if not path.is_file():
            raise TokenizerError(f"{directory}: no {TOKENIZER_FILE} (the tokenizer folder of an engine or bundle "
                                 "holds the fast tokenizer that trt-llm-build saved)")
        try:
            backend = Backend.from_file(str(path))
        except Exception as error:  # the Rust parser raises a bare Exception
            raise TokenizerError(f"{path}: not a tokenizers file: {error}") from None
        config = _read_config(directory)
        return cls(backend, config, _read_templates(directory, config))

    def _sync_added_tokens(self, config: dict) -> None:
        # As transformers does at load: the config's added tokens, and each special token that is
        # not an added token yet, are added to the backend (existing ones keep their ids).
        tokens = []
        for _, value in sorted((config.get("added_tokens_decoder") or {}).items(), key=lambda item: int(item[0])):
            tokens.append(_as_added_token(value))
        known = {t.content for t in self.backend.get_added_tokens_decoder().values()} | {t.content for t in tokens}
        for token in [*self._named.values(), *self._extra]:
            if token.content not in known:
                tokens.append(token)
                known.add(token.content)
        named = {t.content for t in self._named.values()}
        for token in tokens:
            if not token.special and token.content in named:
                token.special = True
        if tokens:
            self.backend.add_tokens(tokens)

    def _set_post_processor(self, add_bos: bool, add_eos: bool) -> None:
        """BOS/EOS around each sequence, as transformers' update_post_processor writes it."""
        bos, eos = self.bos_token, self.eos_token
        add_bos, add_eos = add_bos and bos is not None, add_eos and eos is not None
        single = f"{(bos + ':0 ') if add_bos else ''}$A:0{(' ' + eos + ':0') if add_eos else ''}"
        pair = f"{single}{(' ' + bos + ':1') if add_bos else ''} $B:1{(' ' + eos + ':1') if add_eos else ''}"
        special = ([(bos, self.backend.token_to_id(bos))] if add_bos else []) + \
                  ([(eos, self.backend.token_to_id(eos))] if add_eos else [])
        self.backend.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)

    # -- special tokens -------------------------------------------------------------------------

    @property
    def backend_tokenizer(self) -> Backend:
        return self.backend

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """Named special tokens (bos_token, eos_token, ...) -> their text."""
        return {key: token.content for key, token in self._named.items()}

    @property
    def all_special_tokens(self) -> list[str]:
        """Named, then extra special tokens, each once."""
        return list(dict.fromkeys([*self.special_tokens_map.values(), *(t.content for t in self._extra)]))

    @property
    def added_tokens_decoder(self) -> dict[int, AddedToken]:
        return dict(sorted(self.backend.get_added_tokens_decoder().items()))

    def special_token_texts(self) -> set[str]:
        """Every special token's text: the named ones and the backend's special added tokens."""
        return set(self.all_special_tokens) | {t.content for t in self.added_tokens_decoder.values() if t.special}

    def _named_token(self, key: str) -> str | None:
        token = self._named.get(key)
        return None if token is None else token.content

    @property
    def bos_token(self) -> str | None:
        return self._named_token("bos_token")

    @property
    def eos_token(self) -> str | None:
        return self._named_token("eos_token")

    @property
    def eos_token_id(self) -> int | None:
        return None if self.eos_token is None else self.backend.token_to_id(self.eos_token)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    # -- text <-> ids ---------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        """transformers' calling convention for one text: {"input_ids": [...]}."""
        return {"input_ids": self.encode(text, add_special_tokens)}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        text = self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        # transformers' cleanup was made for WordPiece and leaves BPE output alone unless forced.
        is_bpe = type(self.backend.model).__name__ == "BPE"
        if self.clean_up_tokenization_spaces and (not is_bpe or self._force_clean_up):
            for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                                  (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
                text = text.replace(before, after)
        return text

    # -- chat template --------------------------------------------------------------------------

    @property
    def chat_template(self) -> str | None:
        """The default template (the one apply_chat_template uses without tools)."""
        return self._template(None)

    def _template(self, tools) -> str | None:
        if tools is not None and "tool_use" in self.templates:
            return self.templates["tool_use"]
        if "default" in self.templates:
            return self.templates["default"]
        if len(self.templates) == 1:
            return next(iter(self.templates.values()))
        return None

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = False,
                            tools: list[dict] | None = None, documents: list[dict] | None = None, **kwargs) -> str:
        """The templated text (not tokenized); kwargs such as enable_thinking reach the template."""
        source = self._template(tools)
        if source is None:
            raise chat_template.ChatTemplateError(
                "this tokenizer has no chat template" if not self.templates else
                f"this tokenizer has several chat templates ({', '.join(self.templates)}) and no default")
        return chat_template.render(source, messages, special_tokens=self.special_tokens_map,
                                    add_generation_prompt=add_generation_prompt, tools=tools, documents=documents,
                                    **kwargs)
