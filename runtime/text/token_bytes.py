"""Raw bytes of every token id, for logprob candidates and incremental detokenization.

Decoding token by token with `tokenizer.decode` is lossy (a token may hold half a UTF-8
character) and slow; instead each token's exact bytes are precomputed once, so output text
is rebuilt by concatenating bytes and logprob candidates get their `bytes` field for free.
"""

from __future__ import annotations

import json
import re

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _gpt2_byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (as in `bytes_to_unicode`)."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)}
    mapping, extra = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:  # control/space/non-printable bytes are shifted to 256+ so they stay visible
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


# Byte-level token string -> bytes in two C-level steps: str.translate maps each alphabet
# character to the character whose code point is its byte, then latin-1 encodes it 1:1.
# Characters below U+0100 that are not in the alphabet are sent above U+00FF so that the
# encode fails for any token with a foreign character (see `_byte_level_bytes`).
_BYTE_LEVEL_TRANSLATION = {c: "\uffff" for c in range(256)}
_BYTE_LEVEL_TRANSLATION.update({ord(ch): b for b, ch in _gpt2_byte_alphabet().items()})


def _byte_level_bytes(token: str) -> bytes:
    try:
        return token.translate(_BYTE_LEVEL_TRANSLATION).encode("latin-1")
    except UnicodeEncodeError:  # not in the alphabet: the ByteLevel decoder keeps its UTF-8
        return token.encode()


def _components(state: bytes | None) -> list[dict]:
    """Flatten a decoder/pre-tokenizer JSON state, expanding `Sequence`s."""
    if not state:
        return []
    stack, out = [json.loads(state)], []
    while stack:
        node = stack.pop()
        children = node.get("decoders") or node.get("pretokenizers")
        if node.get("type") == "Sequence" and children:
            stack.extend(children)
        else:
            out.append(node)
    return out


class TokenBytes:
    """Per-token raw bytes of a Hugging Face fast tokenizer, each token's computed when first asked
    for and kept (a run touches a few hundred of a vocabulary's 50-250k tokens: building the whole
    table up front cost SmolLM2's cold start 40 ms).

    `vocab_size` may be the model's embedding size: ids past the tokenizer's vocabulary
    (padding rows) get b"".
    """

    def __init__(self, tokenizer, vocab_size: int | None = None):
        backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
        decoder = _components(backend.decoder.__getstate__() if backend.decoder else None)
        pre = _components(backend.pre_tokenizer.__getstate__() if backend.pre_tokenizer else None)
        types = {c.get("type") for c in decoder + pre}
        self.byte_level = "ByteLevel" in types
        # SentencePiece marks word starts with U+2581 (configurable in Metaspace).
        self._space_mark = next((c["replacement"] for c in decoder + pre if c.get("type") == "Metaspace"),
                                "\u2581")
        self._byte_fallback = "ByteFallback" in types or bool(getattr(backend.model, "byte_fallback", False))
        self._backend = backend

        added = backend.get_added_tokens_decoder()  # id -> AddedToken
        size = max(backend.get_vocab_size(with_added_tokens=True), vocab_size or 0, max(added, default=-1) + 1)
        self._table: list[bytes | None] = [None] * size  # None: not computed yet
        # Added tokens are matched and emitted verbatim, never through the model's alphabet.
        for i, tok in added.items():
            self._table[i] = tok.content.encode()
        self.special_ids: frozenset[int] = frozenset(i for i, tok in added.items() if tok.special)

    def __len__(self) -> int:
        return len(self._table)

    def bytes_of(self, token_id: int) -> bytes:
        data = self._table[token_id]
        if data is None:  # two threads may both compute it: the same bytes
            data = self._table[token_id] = self._model_bytes(token_id)
        return data

    def _model_bytes(self, token_id: int) -> bytes:
        token = self._backend.id_to_token(token_id)
        if token is None:  # a hole in the vocabulary, or a padding row past it
            return b""
        if self.byte_level:
            return _byte_level_bytes(token)
        m = _BYTE_TOKEN.fullmatch(token) if self._byte_fallback else None
        return bytes([int(m[1], 16)]) if m else token.replace(self._space_mark, " ").encode()

    def is_special(self, token_id: int) -> bool:
        """Special added tokens (<|im_end|>, ...): output text skips them."""
        return token_id in self.special_ids

    def text_of(self, token_id: int) -> str:
        """The token alone as text; lossy (U+FFFD) when it holds part of a character."""
        return self.bytes_of(token_id).decode("utf-8", errors="replace")
