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
    """Per-token raw bytes of a Hugging Face fast tokenizer, precomputed for the whole vocabulary.

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
        space_mark = next((c["replacement"] for c in decoder + pre if c.get("type") == "Metaspace"),
                          "\u2581")
        byte_fallback = "ByteFallback" in types or bool(getattr(backend.model, "byte_fallback", False))

        added = backend.get_added_tokens_decoder()  # id -> AddedToken
        vocab = backend.get_vocab(with_added_tokens=False)  # token string -> id
        size = max(backend.get_vocab_size(with_added_tokens=True), vocab_size or 0, max(vocab.values(), default=-1) + 1,
                   max(added, default=-1) + 1)
        table = [b""] * size  # holes (ids with no token) stay empty

        if self.byte_level:
            for token, i in vocab.items():
                table[i] = _byte_level_bytes(token)
        else:
            for token, i in vocab.items():
                m = _BYTE_TOKEN.fullmatch(token) if byte_fallback else None
                table[i] = bytes([int(m[1], 16)]) if m else token.replace(space_mark, " ").encode()

        # Added tokens are matched and emitted verbatim, never through the model's alphabet.
        for i, tok in added.items():
            table[i] = tok.content.encode()
        self.table: list[bytes] = table
        self.special_ids: frozenset[int] = frozenset(i for i, tok in added.items() if tok.special)

    def __len__(self) -> int:
        return len(self.table)

    def bytes_of(self, token_id: int) -> bytes:
        return self.table[token_id]

    def is_special(self, token_id: int) -> bool:
        """Special added tokens (<|im_end|>, ...): output text skips them."""
        return token_id in self.special_ids

    def text_of(self, token_id: int) -> str:
        """The token alone as text; lossy (U+FFFD) when it holds part of a character."""
        return self.table[token_id].decode("utf-8", errors="replace")
