"""Prompts the base writes itself (draft_training/self_prompts.py) and train_draft's --extra-prompts."""

import json

import pytest
import torch
from transformers import AutoTokenizer

from trt_llm.draft_training import self_prompts, train_draft


def test_user_turn_prefix_is_the_chat_template_up_to_the_message(tiny_model):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model("llama"))
    prefix = tokenizer.decode(self_prompts.user_turn_prefix(tokenizer))
    whole = tokenizer.apply_chat_template([{"role": "user", "content": "Hello there"}], tokenize=False)
    assert prefix.endswith("user\n") and whole.startswith(prefix + "Hello there")


def test_keep_drops_short_repeated_and_marked_samples():
    seen: set[str] = set()
    special = ["<|im_start|>", "<|im_end|>"]
    assert self_prompts.keep("How do I bake bread at home?", seen, special)
    assert not self_prompts.keep("how do I  bake bread at HOME?", seen, special)  # case and spacing aside
    assert not self_prompts.keep("Why?", seen, special)  # under 12 characters
    assert not self_prompts.keep("Tell me a joke<|im_start|>assistant", seen, special)
    assert self_prompts.keep("Tell me a joke about cats.", seen, special)
    assert len(seen) == 2


@pytest.mark.slow
def test_smollm2_writes_distinct_whole_prompts_reproducibly(smollm2_dir, tmp_path):
    """Each kept prompt is a whole user message the model ended itself; the same seed gives the same
    prompts (sample i draws with seed + i, whatever the batch), so a data cache keyed on them holds."""
    out = tmp_path / "prompts.json"
    assert self_prompts.main(["--base", str(smollm2_dir), "--count", "3", "--out", str(out), "--max-tokens", "48",
                              "--seed", "5", "--batch-size", "4"]) == 0
    prompts = json.loads(out.read_text())
    assert len(prompts) == 3 and len({p.lower() for p in prompts}) == 3
    for text in prompts:
        assert len(text) >= self_prompts.MIN_CHARS and "<|im" not in text
        assert sum(c.isalpha() or c.isspace() for c in text) > 0.7 * len(text)  # text, not token soup
    again = self_prompts.write_prompts(str(smollm2_dir), 2, seed=5, max_tokens=48, batch_size=1)
    assert again == prompts[:2]


def test_train_draft_appends_extra_prompts(tiny_model, tmp_path):
    base = tiny_model("llama", num_hidden_layers=6)
    extra = ["Describe a walk in a quiet forest.", "What makes a good cup of tea?"]
    (tmp_path / "extra.json").write_text(json.dumps(extra))
    assert train_draft.main(["--base", str(base), "--out", str(tmp_path / "draft"), "--prompts", "3",
                             "--extra-prompts", str(tmp_path / "extra.json"), "--gen-tokens", "4", "--epochs", "1",
                             "--threads", "1", "--draft-vocab", "64", "--data-cache", str(tmp_path / "data.pt")]) == 0
    sequences = torch.load(tmp_path / "data.pt", weights_only=True)["sequences"]
    tokenizer = AutoTokenizer.from_pretrained(base)
    expected = train_draft.chat_prompt_ids(tokenizer, extra)
    assert len(sequences) == 5
    assert [s["ids"][:s["prompt_len"]].tolist() for s in sequences[3:]] == expected
    (tmp_path / "bad.json").write_text(json.dumps(["fine", ""]))
    with pytest.raises(SystemExit, match="bad.json: expected a JSON list of non-empty strings"):
        train_draft.main(["--base", str(base), "--out", str(tmp_path / "x"), "--extra-prompts", str(tmp_path / "bad.json")])
