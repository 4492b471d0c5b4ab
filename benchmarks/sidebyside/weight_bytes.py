"""Bytes of weights a batch-1 decode step reads: the roofline's numerator (with sidebyside/bandwidth.py).

What is counted, exactly:
- every weight tensor as stored (quantized blocks with their scales, norms in their own type), read once
  per token;
- the token embedding table only where the LM head reads it: a tied head (no separate output tensor)
  multiplies the whole table every token, so it counts once, whole; an untied model's embedding lookup
  reads one row a token (counted as one row) and its separate LM head counts whole.
KV cache and activations are not counted (at a 64-token context they are a few hundred kB of ~90 MB).

GGUF: from the file's tensor table (gguf's reader). ONNX: the initializers of the graph the engine runs;
one that only Gather nodes read (an embedding looked up, not multiplied) counts as one row.
"""

from __future__ import annotations

from pathlib import Path


def gguf_bytes_per_token(path: Path) -> dict:
    from gguf import GGUFReader

    tensors = {t.name: t for t in GGUFReader(str(path)).tensors}
    total = sum(int(t.n_bytes) for t in tensors.values())
    embd = tensors.get("token_embd.weight")
    tied = "output.weight" not in tensors
    if embd is not None and not tied:
        rows = int(embd.shape[-1])  # GGUF lists ne0 (the row width) first
        total -= int(embd.n_bytes) - int(embd.n_bytes) // rows
    return {"bytes": total, "file_bytes": Path(path).stat().st_size, "tied_head": tied,
            "rule": "all GGUF tensors as stored; a tied token_embd (the LM head) whole, else one row of it"}


def onnx_bytes_per_token(path: Path) -> dict:
    import numpy as np
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    readers: dict[str, set] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, set()).add(node.op_type)
    total, gathered = 0, 0
    for init in model.graph.initializer:
        size = int(np.prod(init.dims, dtype=np.int64)) * np.dtype(
            onnx.helper.tensor_dtype_to_np_dtype(init.data_type)).itemsize
        if readers.get(init.name) == {"Gather"} and len(init.dims) == 2:
            gathered += size
            size //= max(1, int(init.dims[0]))
        total += size
    return {"bytes": total, "gathered_tables_bytes": gathered,
            "rule": "all initializers of the graph; a table only Gather reads counts one row"}
