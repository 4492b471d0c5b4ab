"""A GGUF file's own blocks, read as they are: Q4_0, Q4_1 and Q8_0 are the weight-only matmul op's
int4 / int8 blocks of 32 bit for bit, so an int4 (group 32) or int8 build keeps them instead of
requantizing transformers' dequantized copy.

    Q8_0  34 bytes a block: d (fp16), 32 int8 q          w = d * q
    Q4_0  18 bytes: d, 16 bytes of nibbles               w = d * (q - 8), q in [0, 15]
    Q4_1  20 bytes: d, m (fp16), 16 bytes of nibbles     w = d * q + m: stored as q - 8 with offset m + 8d
A block's 16 bytes hold element j in the low nibble of byte j and element j + 16 in its high one.

Rows come in llama.cpp's order: its converter permutes Llama's q/k rows for its rotary layout, and
transformers' own tensor processor undoes that when it loads the file; the same processor, run on
the row numbers, gives the permutation applied here to the blocks' rows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from trt_llm.build.quantize import QuantizedWeight

BLOCK = 32
KEPT_TYPES = ("Q4_0", "Q4_1", "Q8_0")


def _fields(rows: np.ndarray, block_bytes: int, count: int) -> tuple[np.ndarray, ...]:
    """[N, nb * block_bytes] uint8 -> per block: the fp16 header values [N, nb] (count of them) and
    the payload bytes [N, nb, rest]."""
    blocks = rows.reshape(rows.shape[0], -1, block_bytes)
    headers = [blocks[:, :, 2 * i: 2 * i + 2].copy().view(np.float16)[..., 0].astype(np.float32) for i in range(count)]
    return (*headers, blocks[:, :, 2 * count:])


def _nibbles(payload: np.ndarray) -> np.ndarray:
    """[N, nb, 16] bytes -> [N, nb * 32] values in [0, 15], in element order."""
    values = np.concatenate([payload & 0xF, payload >> 4], axis=-1)  # j, then j + 16
    return values.reshape(payload.shape[0], -1).astype(np.int16)


def decode(type_name: str, rows: np.ndarray) -> QuantizedWeight:
    """A GGUF tensor's raw rows [N, bytes] -> its QuantizedWeight (K = its row length)."""
    if type_name == "Q8_0":
        d, payload = _fields(rows, 2 + BLOCK, 1)
        q = payload.copy().view(np.int8).reshape(rows.shape[0], -1).astype(np.int16)
        return _weight(q, d, None, 8)
    if type_name == "Q4_0":
        d, payload = _fields(rows, 2 + BLOCK // 2, 1)
        return _weight(_nibbles(payload) - 8, d, None, 4)
    if type_name == "Q4_1":
        d, m, payload = _fields(rows, 4 + BLOCK // 2, 2)
        return _weight(_nibbles(payload) - 8, d, m + 8 * d, 4)
    raise ValueError(f"GGUF type {type_name} is not kept as blocks (kept: {', '.join(KEPT_TYPES)})")


def _weight(q: np.ndarray, d: np.ndarray, offsets: np.ndarray | None, bits: int) -> QuantizedWeight:
    # GGUF rows are output features: q [N, K], d [N, nb] -> the op's [K, N] and [nb, N].
    return QuantizedWeight.from_values(torch.from_numpy(q.T.copy()), torch.from_numpy(d.T.copy()), None, bits, BLOCK,
                                       None if offsets is None else torch.from_numpy(offsets.T.copy()))


def permuted(weight: QuantizedWeight, order: np.ndarray) -> QuantizedWeight:
    """The weight with its output features (columns) in `order`."""
    q, _ = weight.values()
    index = torch.from_numpy(order)
    return QuantizedWeight.from_values(q[:, index], weight.scales[:, index], None, weight.bits, weight.group_size,
                                       None if weight.offsets is None else weight.offsets[:, index])


def read_blocks(path: str | Path, hf_model) -> dict[str, tuple[str, QuantizedWeight | None]]:
    """{HF module name: (GGUF type, its blocks)} for every quantized weight of `path`: the blocks of
    Q4_0, Q4_1 and Q8_0 with rows in transformers' order, None for other types (K-quants). A tied
    LM head (no `output.weight`) gets the token embedding's, as llama.cpp uses them."""
    import gguf
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    reader = gguf.GGUFReader(str(path))
    architecture = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=hf_model.config.to_dict())
    names = get_gguf_hf_weights_map(hf_model, processor)
    blocks = {}
    for tensor in reader.tensors:
        type_name = tensor.tensor_type.name
        hf_name = names.get(tensor.name)
        if type_name in ("F32", "F16", "BF16") or hf_name is None or not hf_name.endswith(".weight"):
            continue
        if type_name not in KEPT_TYPES:
            blocks[hf_name.removesuffix(".weight")] = (type_name, None)
            continue
        weight = decode(type_name, np.asarray(tensor.data))
        rows = weight.out_features
        order = processor.process(weights=np.arange(rows), name=tensor.name).weights
        if not np.array_equal(order, np.arange(rows)):
            weight = permuted(weight, np.asarray(order))
        blocks[hf_name.removesuffix(".weight")] = (type_name, weight)
    embedding = hf_model.get_input_embeddings()
    embedding_name = next(name for name, module in hf_model.named_modules() if module is embedding)
    if "lm_head" not in blocks and embedding_name in blocks and hf_model.config.tie_word_embeddings:
        blocks["lm_head"] = blocks[embedding_name]
    return blocks
