"""A Hugging Face Llama directory -> an F32 (or Q4_0 / Q8_0) GGUF file that llama.cpp reads (written with
the `gguf` package).

    python benchmarks/sidebyside/gguf_convert.py HF_DIR OUT.gguf [--type Q4_0]

--type Q4_0 / Q8_0: every matmul weight in that block type, by gguf's own quantizer (llama.cpp's
reference rounding), the token embedding (the tied LM head) in Q8_0, the norms in F32.

llama.cpp's own `convert_hf_to_gguf.py` ships with its source tree, not with `llama-cpp-python` or the
`gguf` package; this does the same for `LlamaForCausalLM` (SmolLM2, Llama 3.x rope scaling included) and
nothing else: every tensor in float32, renamed to GGUF's names, q/k rows permuted into llama.cpp's rotary
layout, the GPT-2 BPE vocabulary, merges, special ids and chat template copied from the tokenizer files.
The weights are bit-for-bit those of the HF directory, so llama.cpp runs the very model the other engines do.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np


class ConversionError(RuntimeError):
    pass


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    # HF rotates halves of each head (rotate_half); llama.cpp's LLAMA rope rotates adjacent pairs.
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _llama3_rope_factors(rope: dict, theta: float, head_dim: int) -> np.ndarray:
    """The per-frequency divisors of Llama 3's rope scaling (llama.cpp reads them as `rope_freqs`)."""
    factor = rope.get("factor", 8.0)
    low, high = rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old = rope.get("original_max_position_embeddings", 8192)
    factors = []
    for freq in 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim):
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            factors.append(1.0)
        elif wavelen > old / low:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def _vocab(hf_dir: Path, vocab_size: int):
    import gguf

    path = hf_dir / "tokenizer.json"
    if not path.is_file():
        raise ConversionError(f"{path} is missing (a fast GPT-2 BPE tokenizer is needed)")
    tok = json.loads(path.read_text(encoding="utf-8"))
    model = tok["model"]
    if model.get("type") != "BPE" or model.get("byte_fallback") or (tok.get("decoder") or {}).get("type") != "ByteLevel":
        raise ConversionError("only byte-level BPE tokenizers (GPT-2 style) are converted")
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [gguf.TokenType.UNUSED] * vocab_size
    for text, i in model["vocab"].items():
        if i < vocab_size:
            tokens[i], types[i] = text, gguf.TokenType.NORMAL
    for added in tok.get("added_tokens", []):
        i = added["id"]
        if i < vocab_size:
            tokens[i] = added["content"]
            types[i] = gguf.TokenType.CONTROL if added.get("special") else gguf.TokenType.USER_DEFINED
    return tokens, types


def _tensors(hf_dir: Path):
    """(name, float32 array) for every tensor of the checkpoint's safetensors files."""
    from safetensors import safe_open

    files = sorted(hf_dir.glob("*.safetensors"))
    if not files:
        raise ConversionError(f"no .safetensors files in {hf_dir}")
    for file in files:
        with safe_open(str(file), "np") as f:
            for key in f.keys():
                if f.get_slice(key).get_dtype() == "BF16":  # numpy has no bfloat16: through torch
                    import torch

                    with safe_open(str(file), "pt") as g:
                        yield key, g.get_tensor(key).to(torch.float32).numpy()
                else:
                    yield key, f.get_tensor(key).astype(np.float32, copy=False)


def convert(hf_dir: Path, out: Path, matmul_type: str = "F32") -> Path:
    import gguf

    hf_dir = Path(hf_dir)
    config = json.loads((hf_dir / "config.json").read_text())
    if config.get("architectures") != ["LlamaForCausalLM"]:
        raise ConversionError(f"only LlamaForCausalLM is converted, not {config.get('architectures')}")
    if config.get("attention_bias") or config.get("mlp_bias"):
        raise ConversionError("Llama checkpoints with biases are not converted")
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    layers, vocab_size = config["num_hidden_layers"], config["vocab_size"]
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", "llama3"):
        raise ConversionError(f"rope type {rope_type!r} is not converted")

    writer = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA])
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(hf_dir.name)
    writer.add_file_type({"F32": gguf.LlamaFileType.ALL_F32, "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
                          "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[matmul_type])
    writer.add_vocab_size(vocab_size)
    writer.add_context_length(config.get("max_position_embeddings", 2048))
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(theta))
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-6)))

    tokens, types = _vocab(hf_dir, vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")  # pre-tokenization only matters for text input; we feed token ids
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    special = gguf.SpecialVocab(hf_dir, load_merges=True, n_vocab=vocab_size)
    special.add_to_gguf(writer, quiet=True)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, layers)
    tied = config.get("tie_word_embeddings", False)
    if rope_type == "llama3":
        writer.add_tensor(gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight", _llama3_rope_factors(rope, theta, head_dim))
    for key, array in _tensors(hf_dir):
        if key.endswith("rotary_emb.inv_freq") or (tied and key == "lm_head.weight"):
            continue
        name = names.get_name(key, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ConversionError(f"no GGUF name for tensor {key!r}")
        if key.endswith("self_attn.q_proj.weight"):
            array = _permute(array, heads)
        elif key.endswith("self_attn.k_proj.weight"):
            array = _permute(array, kv_heads)
        array = np.ascontiguousarray(array)
        block_type = None
        if matmul_type != "F32" and array.ndim == 2:
            block_type = gguf.GGMLQuantizationType["Q8_0" if name.startswith("token_embd") else matmul_type]
        if block_type is None:
            writer.add_tensor(name, array)
        else:
            writer.add_tensor(name, gguf.quants.quantize(array, block_type), raw_dtype=block_type)

    out.parent.mkdir(parents=True, exist_ok=True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    matmul_type = "F32"
    if len(argv) == 4 and argv[2] == "--type" and argv[3] in ("F32", "Q4_0", "Q8_0"):
        matmul_type, argv = argv[3], argv[:2]
    if len(argv) != 2:
        print(__doc__.split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    out = Path(argv[1])
    tmp = out.with_name(out.name + ".partial")
    try:
        convert(Path(argv[0]), tmp, matmul_type)
    except ConversionError as error:
        tmp.unlink(missing_ok=True)
        print(f"gguf_convert: {error}", file=sys.stderr)
        return 2
    tmp.replace(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
