"""The runtime's tokenizer (tokenizers + jinja2, no transformers) equals transformers on the same
folder: ids with and without special tokens, decoded text, the special tokens, and the rendered chat
templates (enable_thinking, tools, default system prompts) -- on the tiny ChatML tokenizer, SmolLM2,
the real Qwen3 and Llama 3.1 tokenizers, and synthetic SentencePiece and WordPiece ones."""

import json

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from assets import CORPUS
from trt_llm.runtime.text.chat_template import ChatTemplateError
from trt_llm.runtime.text.prompt import PromptError, PromptFormatter
from trt_llm.runtime.text.tokenizer import Tokenizer, TokenizerError
from trt_llm.schemas.input_file import Message

TEXTS = [
    "", "Hello world!", "  leading spaces and trailing  ", "line\n\nbreaks\tand tabs\r\n",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>", "<think>\nreasoning\n</think>\n\nanswer",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nx<|eot_id|>", "<s> [INST] </s> <unk> [CLS] [SEP]",
    "中文：你好，世界！ 日本語 한국어", "emoji 🤖🎉 ❤️ and combining e\u0301", "don't , . ? ! it's I'm we've they're",
    "Numbers 3.14159 1e-5 -7 +15 2048", "def add(a, b):\n    return a + b\n",
]

CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"}, {"role": "user", "content": "And 3+3?"}],
    [{"role": "user", "content": "Tell me a story"}, {"role": "assistant", "content": "Once upon a time.",
                                                      "reasoning_content": "a short one"},
     {"role": "user", "content": "Another, 中文 🤖"}],
]

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city, in °C",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "e.g. Zürich"}},
                   "required": ["city"]}}}]

THINKING = [{}, {"enable_thinking": False}, {"enable_thinking": True}]


def _sentencepiece_tokenizer():
    """Llama-2-like: byte fallback, U+2581 word marks, BOS added by the post-processor, an image token."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers, trainers

    base = Backend(models.BPE())
    base.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    base.train_from_iterator([line for line in CORPUS.splitlines() if line.isascii()],
                             trainer=trainers.BpeTrainer(vocab_size=400, min_frequency=2, show_progress=False))
    trained = json.loads(base.to_str())["model"]
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    pieces += sorted(trained["vocab"], key=trained["vocab"].get)
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in trained["merges"]]
    tok = Backend(models.BPE(vocab={p: i for i, p in enumerate(pieces)}, merges=merges, unk_token="<unk>",
                             byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(replacement="▁", prepend_scheme="always")])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", add_bos_token=True,
        extra_special_tokens={"image_token": "<image>"},
        chat_template="{{ bos_token }}{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}")


def _wordpiece_tokenizer():
    """BERT-like: lower-casing normalizer, [CLS]/[SEP] around each text, decode clean-up on."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Backend(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(CORPUS.splitlines(), trainer=trainers.WordPieceTrainer(
        vocab_size=600, special_tokens=specials, show_progress=False))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]",
                                   cls_token="[CLS]", mask_token="[MASK]", clean_up_tokenization_spaces=True)


@pytest.fixture(scope="module", params=["tiny", "smollm2", "qwen3", "llama3_1", "sentencepiece", "wordpiece"])
def folder(request, tmp_path_factory):
    """A tokenizer folder as an engine has it: saved by transformers' save_pretrained."""
    name = request.param
    if name == "tiny":
        source = AutoTokenizer.from_pretrained(request.getfixturevalue("tokenizer_dir"))
    elif name == "smollm2":
        source = AutoTokenizer.from_pretrained(request.getfixturevalue("smollm2_dir"))
    elif name in ("qwen3", "llama3_1"):
        source = AutoTokenizer.from_pretrained(request.getfixturevalue("npm_tokenizer")(name))
    else:
        source = _sentencepiece_tokenizer() if name == "sentencepiece" else _wordpiece_tokenizer()
    out = tmp_path_factory.mktemp(f"tok-{name}")
    source.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def pair(folder):
    return AutoTokenizer.from_pretrained(folder), Tokenizer.from_dir(folder)


def test_ids_and_text_equal_transformers(pair):
    hf, ours = pair
    for text in TEXTS:
        for special in (True, False):
            ids = hf(text, add_special_tokens=special)["input_ids"]
            assert ours.encode(text, add_special_tokens=special) == ids, (text, special)
            assert ours(text, add_special_tokens=special)["input_ids"] == ids
            for skip in (False, True):
                assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), text


def test_special_tokens_equal_transformers(pair):
    hf, ours = pair
    assert ours.special_tokens_map == hf.special_tokens_map
    assert ours.all_special_tokens == hf.all_special_tokens
    assert {i: repr(t) for i, t in ours.added_tokens_decoder.items()} == \
           {i: repr(t) for i, t in hf.added_tokens_decoder.items()}
    assert ours.eos_token_id == hf.eos_token_id and ours.bos_token == hf.bos_token


def test_chat_templates_equal_transformers(pair):
    hf, ours = pair
    assert ours.chat_template == hf.chat_template
    if hf.chat_template is None:  # the WordPiece one: both refuse to render a conversation
        with pytest.raises(ValueError, match="chat_template is not set"):
            hf.apply_chat_template(CONVERSATIONS[0], tokenize=False)
        with pytest.raises(ChatTemplateError, match="^this tokenizer has no chat template$"):
            ours.apply_chat_template(CONVERSATIONS[0])
        return
    uses_tools = "tools" in hf.chat_template
    for messages in CONVERSATIONS:
        for generation_prompt in (False, True):
            for extra in THINKING + ([{"tools": TOOLS}] if uses_tools else []):
                expected = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt,
                                                  **extra)
                assert ours.apply_chat_template(messages, add_generation_prompt=generation_prompt, **extra) == \
                    expected, (messages, generation_prompt, extra)


def test_raw_mode_adds_bos_as_transformers_does(pair):
    """Raw prompts (apply_chat_template: false) get the tokenizer's BOS when it adds one."""
    hf, ours = pair
    formatter = PromptFormatter(ours, apply_chat_template=False, add_generation_prompt=True, enable_thinking=True)
    prompt = formatter.format([Message(role="user", content="Hello world")])
    assert prompt.token_ids == hf("Hello world", add_special_tokens=True)["input_ids"]


def test_the_sentencepiece_tokenizer_adds_bos(tmp_path):
    _sentencepiece_tokenizer().save_pretrained(tmp_path)
    ours = Tokenizer.from_dir(tmp_path)
    ids = ours.encode("the fox")
    assert ids[0] == ours.token_to_id("<s>") and ours.encode("the fox", add_special_tokens=False) == ids[1:]
    assert ours.special_tokens_map["image_token"] == "<image>"


# A template that exercises the environment: whitespace control, loop controls, namespace, dict,
# tojson's options, the generation tag, strftime_now, special tokens and extra variables.
FEATURES = """{%- set ns = namespace(count=0) -%}
{{ bos_token }}
{% for m in messages %}
    {% if m.role == 'skip' %}{% continue %}{% endif %}
    {% set ns.count = ns.count + 1 %}
    [{{ loop.index }}:{{ m.role }}] {{ m.content | trim }}
    {% if m.content == 'STOP' %}{% break %}{% endif %}
{% endfor %}
{{ dict(a=1, b='é') | tojson }} {{ {'x': ['ü', 1]} | tojson(indent=2) }}
{{ {'b': [3, 1], 'a': '"<&>"'} | tojson(separators=(',', ':'), sort_keys=true) }}
{% generation %}count={{ ns.count }}{% endgeneration %} year={{ strftime_now('%Y') }}
{% if tools %}{{ tools | tojson }}{% endif %}{% if documents %}docs={{ documents | length }}{% endif %}
{%- if add_generation_prompt %}<gen>{% endif %}
{%- if custom_flag is defined %} flag={{ custom_flag }}{% endif %}
{{ eos_token }}|{{ pad_token }}|{{ messages[-1].thinking | default('') }}"""


@pytest.fixture(scope="module")
def features(tokenizer_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("features")
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    tok.chat_template = FEATURES
    tok.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder), Tokenizer.from_dir(folder)


def test_template_environment_equals_transformers(features):
    hf, ours = features
    messages = [{"role": "system", "content": "  sys  "}, {"role": "skip", "content": "x"},
                {"role": "user", "content": "STOP"}, {"role": "user", "content": "never", "reasoning": "why"}]
    for kwargs in ({}, {"add_generation_prompt": True, "custom_flag": "on"},
                   {"tools": TOOLS, "documents": [{"title": "t", "text": "x"}]}, {"eos_token": "overridden"}):
        expected = hf.apply_chat_template(messages, tokenize=False, **kwargs)
        assert ours.apply_chat_template(messages, **kwargs) == expected, kwargs


@pytest.mark.parametrize("template, message", [
    ("{% if messages[0].role != 'user' %}{{ raise_exception('first message must be user') }}{% endif %}x",
     "first message must be user"),
    ("{% set ns = namespace(_hidden=1) %}x", "underscore-prefixed"),
    ("{{ messages[0].content + none }}", "TypeError"),
])
def test_template_errors_are_chat_template_errors(tokenizer_dir, tmp_path, template, message):
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    tok.chat_template = template
    tok.save_pretrained(tmp_path)
    ours = Tokenizer.from_dir(tmp_path)
    messages = [{"role": "system", "content": "s"}]
    with pytest.raises(ChatTemplateError, match=message):
        ours.apply_chat_template(messages)
    with pytest.raises(Exception):  # transformers fails on the same input
        AutoTokenizer.from_pretrained(tmp_path).apply_chat_template(messages, tokenize=False)
    formatter = PromptFormatter(ours, True, True, False)
    with pytest.raises(PromptError, match="messages: the chat template refused them: .*" + message):
        formatter.format([Message(role="system", content="s")])


def test_a_folder_without_tokenizer_json_is_one_clear_error(tmp_path):
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="not a tokenizers file"):
        Tokenizer.from_dir(tmp_path)
