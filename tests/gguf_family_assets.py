"""Tiny GGUF files of the families beyond Llama / Qwen (tests/family_assets.py), written from their
tiny HF checkpoints with the `gguf` package's writer the way llama.cpp's convert_hf_to_gguf.py lays
them out: its tensor names (`gguf.get_tensor_name_map`), its per-architecture metadata keys, its value
transforms (Llama's q/k rows permuted for its rotary layout, Gemma's norm weights stored as w + 1,
Qwen3-MoE's experts stacked per layer), and the tokenizer as `tokenizer.ggml.*` metadata (byte-level
BPE as model "gpt2" with its merges, Gemma's SentencePiece vocabulary as model "llama" without them,
as llama.cpp writes it from tokenizer.model). Tensors are F32, or Q8_0 for the matmul weights.

A GGUF states less than a config.json, and transformers 5.24's GGUF loader (the legacy path,
modeling_gguf_pytorch_utils.py + integrations/ggml.py, which these architectures take) reads less
than the file states. What each family's config loses on the way, so that the model transformers
loads from the file is the checkpoint's only with GGUF_EXACT's overrides (`make_family_model(family,
dir, cache, **GGUF_EXACT[family])`), is in LOST below. The writer writes what llama.cpp would either way.
"""

from __future__ import annotations

import json
from pathlib import Path

import family_assets

# What transformers' GGUF loader does not read back for each family, with the value it puts in its
# place (the config class's default): measured on transformers 5.24 / gguf 0.19.
LOST = {
    "gemma3": "layer_types (from sliding_window_pattern 6: every layer of 3 sliding), query_pre_attn_scalar "
              "(256), final_logit_softcapping (None), the full layers' linear rope scaling, the sliding layers' "
              "rope base (rope_local_base_freq 10,000 by default)",
    "gemma2": "query_pre_attn_scalar (256); the soft-caps and layer_types are not read either (the class's 30, "
              "50 and alternating sliding-first, which the tiny checkpoint happens to use)",
    "mistral": "the architecture: read as Llama (LlamaConfig, model_type llama), so sliding_window (none)",
    "phi3": "partial_rotary_factor (rope.dimension_count is dropped: 1.0), the LongRoPE factors and original "
            "context (rope_factors_long/short tensors and rope.scaling.* are not read: default rope)",
    "qwen3_moe": "moe_intermediate_size (expert_feed_forward_length is not mapped: 768), mlp_only_layers (every "
                 "layer sparse), decoder_sparse_step",
}

# Overrides of family_assets' tiny checkpoints that hold only what the GGUF loader reads back, so the
# model transformers loads from the file is the checkpoint (same logits).
GGUF_EXACT = {
    "gemma3": dict(num_hidden_layers=6, layer_types=None, query_pre_attn_scalar=256,
                   final_logit_softcapping=None, rope_parameters=None),
    "gemma2": dict(query_pre_attn_scalar=256),
    "mistral": dict(sliding_window=None),
    "phi3": dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    "qwen3_moe": dict(moe_intermediate_size=768, mlp_only_layers=[]),
}

ARCH = {"gemma3": "gemma3", "gemma2": "gemma2", "mistral": "llama", "phi3": "phi3", "qwen3_moe": "qwen3moe"}
QUANTIZABLE = ("attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def _tokenizer_metadata(writer, hf_dir: Path, config) -> None:
    """The checkpoint's tokenizer.json as llama.cpp's tokenizer.ggml.* keys."""
    from transformers import AutoTokenizer

    import gguf

    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    data = json.loads((hf_dir / "tokenizer.json").read_text())
    model = data["model"]
    vocab = dict(model["vocab"])
    added = {token["content"]: token for token in data["added_tokens"]}
    for content, token in added.items():
        vocab[content] = token["id"]
    size = max(config.vocab_size, max(vocab.values()) + 1)
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = [gguf.TokenType.UNUSED] * size
    for content, index in vocab.items():
        tokens[index] = content
        token = added.get(content)
        if token is not None:
            types[index] = gguf.TokenType.CONTROL if token["special"] else gguf.TokenType.USER_DEFINED
        else:
            types[index] = gguf.TokenType.NORMAL
    sentencepiece = bool(model.get("byte_fallback"))  # Gemma's: a SentencePiece vocabulary in BPE form
    if sentencepiece:
        for index, content in enumerate(tokens):
            if len(content) == 6 and content.startswith("<0x") and content.endswith(">"):
                types[index] = gguf.TokenType.BYTE
        if model.get("unk_token") in vocab:
            types[vocab[model["unk_token"]]] = gguf.TokenType.UNKNOWN
        writer.add_tokenizer_model("llama")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(tokens)
        writer.add_token_scores([-float(i) for i in range(size)])  # SentencePiece scores: file order
        writer.add_token_types(types)
        writer.add_add_space_prefix(False)
    else:
        pre = "qwen2" if "<|im_start|>" in vocab else "llama-bpe"
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(pre)
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in model["merges"]])
    for add, token_id in ((writer.add_bos_token_id, tokenizer.bos_token_id), (writer.add_eos_token_id, config.eos_token_id),
                          (writer.add_pad_token_id, config.pad_token_id), (writer.add_unk_token_id, tokenizer.unk_token_id)):
        if token_id is not None:
            add(int(token_id))
    writer.add_add_bos_token(tokenizer.bos_token_id is not None and sentencepiece)
    if tokenizer.chat_template:
        writer.add_chat_template(tokenizer.chat_template)


def _hparams(writer, family: str, config) -> None:
    """The architecture's metadata keys, as convert_hf_to_gguf.py writes them."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    # llama.cpp writes Mistral as "llama". transformers would read it back as Mistral only were general.name
    # exactly "mistral" (it tests `"mistral" in [name]`), and then fails (gguf 0.19 has no arch "mistral"
    # to map its tensor names): any other name reads as Llama
    writer.add_name(f"tiny-{family}")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    rope = config.rope_parameters or {}
    rope = rope.get("full_attention", rope) if family == "gemma3" else rope
    writer.add_rope_freq_base(float(rope.get("rope_theta", 10000.0)))
    if family in ("gemma2", "gemma3"):
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
        writer.add_sliding_window(config.sliding_window)
        if config.final_logit_softcapping is not None:
            writer.add_final_logit_softcapping(config.final_logit_softcapping)
        if family == "gemma2" and config.attn_logit_softcapping is not None:
            writer.add_attn_logit_softcapping(config.attn_logit_softcapping)
        if family == "gemma3" and rope.get("rope_type") == "linear":
            writer.add_rope_scaling_type(__import__("gguf").RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(rope["factor"])
    elif family == "mistral":
        writer.add_rope_dimension_count(head_dim)
        if config.sliding_window is not None:
            writer.add_sliding_window(config.sliding_window)
    elif family == "phi3":
        writer.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 1.0)))
        if rope.get("rope_type") == "longrope":
            writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    elif family == "qwen3_moe":
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
        writer.add_expert_count(config.num_experts)
        writer.add_expert_used_count(config.num_experts_per_tok)
        writer.add_expert_feed_forward_length(config.moe_intermediate_size)


def _permute(weights, heads: int):
    """llama.cpp's q/k row order for Llama: each head's two rotary halves interleaved."""
    return weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(
        weights.shape)


def make_family_gguf(family: str, hf_dir, path, *, matmul_type: str = "F32") -> Path:
    """Write the tiny `family` checkpoint in `hf_dir` (family_assets.make_family_model) as a GGUF file
    at `path`: F32 tensors, or the matmul weights as `matmul_type` (say "Q8_0"). Returns `path`."""
    import numpy as np
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    import gguf

    hf_dir, path = Path(hf_dir), Path(path)
    config = AutoConfig.from_pretrained(hf_dir)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    arch = ARCH[family]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], config.num_hidden_layers)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), arch)
    _hparams(writer, family, config)
    _tokenizer_metadata(writer, hf_dir, config)
    tied = config.tie_word_embeddings
    tensors = []
    for hf_name, tensor in model.state_dict().items():
        if tied and hf_name == "lm_head.weight":
            continue
        data = tensor.detach().numpy().astype(np.float32)
        base, _, suffix = hf_name.rpartition(".")
        if suffix not in ("weight", "bias"):  # Qwen3-MoE's stacked experts: gate_up_proj, down_proj
            base, suffix = hf_name, "weight"
        if base.endswith("mlp.experts.gate_up_proj"):  # [E, 2I, H]: gate rows first, then up
            block = base.split(".")[2]
            gate, up = np.split(data, 2, axis=1)
            tensors += [(f"blk.{block}.ffn_gate_exps.weight", gate), (f"blk.{block}.ffn_up_exps.weight", up)]
            continue
        name = names.get_name(base)
        if name is None:
            raise ValueError(f"{family}: no GGUF name for {hf_name}")
        if family in ("gemma2", "gemma3") and "norm" in name:
            data = data + 1  # llama.cpp stores Gemma's (1 + w) RMSNorm weights whole
        if family == "mistral" and name.endswith(("attn_q", "attn_k")):
            data = _permute(data, config.num_attention_heads if name.endswith("attn_q") else config.num_key_value_heads)
        tensors.append((f"{name}.{suffix}", data))
    quantized = matmul_type != "F32"
    writer.add_file_type(gguf.LlamaFileType[f"MOSTLY_{matmul_type}"] if quantized else gguf.LlamaFileType.ALL_F32)
    for name, data in tensors:
        if quantized and data.ndim == 2 and name.split(".")[-2] in QUANTIZABLE:
            qtype = gguf.GGMLQuantizationType[matmul_type]
            writer.add_tensor(name, gguf.quants.quantize(np.ascontiguousarray(data), qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(name, np.ascontiguousarray(data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def load_gguf(path):
    """transformers' model and tokenizer from the GGUF file at `path`, in fp32."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return model, tokenizer


def make_family_gguf_model(family: str, directory, cache_dir, *, exact: bool = True, **options) -> Path:
    """A tiny `family` checkpoint (GGUF_EXACT's overrides when `exact`) in `directory`/hf and its GGUF
    at `directory`/<family>.gguf; returns the GGUF's path."""
    directory = Path(directory)
    hf_dir = family_assets.make_family_model(family, directory / "hf", cache_dir,
                                             **(GGUF_EXACT[family] if exact else {}))
    return make_family_gguf(family, hf_dir, directory / "gguf" / f"{family}.gguf", **options)
