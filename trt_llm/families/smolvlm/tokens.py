"""The ids of the special tokens an image's prompt text is made of (transformers' Idefics3 / SmolVLM
processors: `<fake_token_around_image>`, `<global-img>`, `<row_i_col_j>`, and the newlines between a
split image's rows), read from the checkpoint's tokenizer at build time into the vision component's
config, so the runtime lays the prompt out without tokenizing text of its own."""

from __future__ import annotations

import re

FAKE, GLOBAL = "<fake_token_around_image>", "<global-img>"
ROW_COL = re.compile(r"<row_(\d+)_col_(\d+)>")


def special_token_ids(config) -> dict:
    """fake_token_id, global_token_id, row_col_ids {"r,c": id}, and the ids of "\\n" and "\\n\\n"
    as the tokenizer encodes them between special tokens; config is the checkpoint's (its folder's
    tokenizer is read)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(config._name_or_path)
    vocab = tokenizer.get_vocab()
    missing = [token for token in (FAKE, GLOBAL) if token not in vocab]
    if missing:
        raise ValueError(f"the tokenizer of {config._name_or_path} lacks {', '.join(missing)}, which the "
                         "SmolVLM / Idefics3 processor writes around every image")
    found = {(int(m[1]), int(m[2])): token_id for text, token_id in vocab.items() if (m := ROW_COL.fullmatch(text))}
    row_col = {f"{r},{c}": found[r, c] for r, c in sorted(found)}
    return {"fake_token_id": vocab[FAKE], "global_token_id": vocab[GLOBAL], "row_col_ids": row_col,
            "newline_ids": tokenizer.encode("\n", add_special_tokens=False),
            "double_newline_ids": tokenizer.encode("\n\n", add_special_tokens=False)}
