"""The token embedding table: stored as the build chose (the graph's dtype, fp16, or int8 with a
scale per block of a row, Q8_0's layout; `quantization.embedding`), looked up in the graph's dtype.

The runtime does the lookup itself (so image and audio rows can stand in for tokens), so a table
stored smaller than the graph's dtype stays small in memory too: only the looked-up rows widen.
Gemma's rows are scaled by sqrt(hidden) as they are looked up (the manifest's model.embedding_scale,
rounded to the graph's dtype as transformers rounds it), here and not in the graph, so that an
image's rows, which take a token's place unscaled, are not.

Gemma 4's per-layer table (model.per_layer_inputs: [vocab, layers * P], as large as the model's
other weights together) is read the same way, memory-mapped: only the pages of the rows looked up are
ever read.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

ACTIVATION_DTYPES = {"fp32": np.float32, "fp16": np.float16}


class EmbeddingTable:
    """Indexable like the array [V, H] it stands for: `table[ids]` is the rows in `dtype`."""

    def __init__(self, rows: np.ndarray, dtype, scales: np.ndarray | None = None, multiplier: float | None = None,
                 zero_point: int = 0):
        self.rows = rows  # [V, H]: float, or int8 with scales [V, H / G] (G values of a row per scale)
        self.scales = scales
        self.zero_point = zero_point  # what an integer row's values are around (an LM head's uint8: 128)
        self.dtype = np.dtype(dtype)
        # every row times this, in the graph's dtype (Gemma's embedding scale); None: as stored
        self.multiplier = None if multiplier is None else self.dtype.type(multiplier)
        self.shape = rows.shape
        if scales is not None and (scales.shape[0] != rows.shape[0] or rows.shape[1] % scales.shape[1]):
            raise ValueError(f"int8 table {list(rows.shape)} with scales {list(scales.shape)}: not blocks of its rows")

    def __getitem__(self, ids) -> np.ndarray:
        rows = self.rows[ids]
        if self.scales is None:
            rows = rows if rows.dtype == self.dtype else rows.astype(self.dtype)
        else:
            scales = self.scales[ids]
            blocks = rows.reshape(*rows.shape[:-1], scales.shape[-1], -1).astype(np.float32)
            blocks = (blocks - self.zero_point if self.zero_point else blocks) * scales[..., None]
            rows = blocks.reshape(rows.shape).astype(self.dtype)
        return rows if self.multiplier is None else rows * self.multiplier


def load_embedding(path: Path, graph_dtype: str, dims: dict, scale: float | None = None) -> EmbeddingTable | np.ndarray:
    """The table of an engine directory (its manifest's model dtype, dims and embedding_scale); a
    table stored in the graph's dtype and not scaled is the plain array."""
    from safetensors.numpy import load_file

    tensors = load_file(str(path))
    rows = tensors["embedding"]
    if rows.shape != (dims["vocab_size"], dims["hidden_size"]):
        raise ValueError(f"shape {list(rows.shape)}, the manifest says [{dims['vocab_size']}, {dims['hidden_size']}]")
    dtype = ACTIVATION_DTYPES.get(graph_dtype, rows.dtype)
    if "scales" not in tensors and rows.dtype == dtype and scale is None:
        return rows
    return EmbeddingTable(rows, dtype, tensors.get("scales"), scale)


def engine_embedding(engine_dir) -> EmbeddingTable | np.ndarray:
    """An engine directory's table, as its manifest says to look it up."""
    model, path = engine_dir.manifest["model"], engine_dir.component_path("llm", "embedding")
    head = engine_dir.manifest["components"]["llm"].get("embedding_from_head")
    if head is not None:  # the LM head's 8-bit blocks in the engine's weight file (build/tied_embedding.py)
        vocab, hidden = engine_dir.dims["vocab_size"], engine_dir.dims["hidden_size"]
        rows = np.memmap(path, np.uint8, "r", head["rows_offset"], (vocab, hidden))
        scales = np.memmap(path, np.float32, "r", head["scales_offset"], (vocab, hidden // head["block"]))
        return EmbeddingTable(rows, ACTIVATION_DTYPES[model["dtype"]], scales, model.get("embedding_scale"),
                              head["zero_point"])
    return load_embedding(path, model["dtype"], engine_dir.dims, model.get("embedding_scale"))


_SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "I8": np.int8}


def mapped_tensors(path: Path) -> dict[str, np.ndarray]:
    """A safetensors file's tensors as read-only memory maps (its header: 8 bytes of length, then JSON
    naming each tensor's dtype, shape and byte range after the header)."""
    with open(path, "rb") as handle:
        length = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(length))
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = _SAFETENSORS_DTYPES.get(entry["dtype"])
        if dtype is None:
            raise ValueError(f"{name}: dtype {entry['dtype']}, not one of {', '.join(_SAFETENSORS_DTYPES)}")
        shape, (start, end) = tuple(entry["shape"]), entry["data_offsets"]
        if end - start != int(np.prod(shape)) * np.dtype(dtype).itemsize:
            raise ValueError(f"{name}: {end - start} bytes for shape {list(shape)}")
        tensors[name] = np.memmap(path, dtype=dtype, mode="r", offset=8 + length + start, shape=shape)
    return tensors


def engine_per_layer_table(engine_dir) -> EmbeddingTable | None:
    """An engine directory's per-layer table (Gemma 4), memory-mapped; None for a model without one."""
    model = engine_dir.manifest["model"]
    section = model.get("per_layer_inputs")
    if section is None:
        return None
    tensors = mapped_tensors(engine_dir.component_path("llm", "per_layer_embedding"))
    rows = tensors["embedding"]
    want = (section["vocab_size"], section["layers"] * section["width"])
    if rows.shape != want:
        raise ValueError(f"per-layer table of shape {list(rows.shape)}, the manifest says {list(want)}")
    return EmbeddingTable(rows, ACTIVATION_DTYPES.get(model["dtype"], rows.dtype), tensors.get("scales"),
                          section["scale"])
