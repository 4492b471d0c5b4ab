"""A cpu engine's token embedding read from its LM head's blocks, where they are the same numbers.

A GGUF file ties the LM head to its Q8_0 token embedding (llama.cpp reads both from one tensor), and
the build keeps those blocks for both: the embedding file holds int8 rows with a scale per 32
(build/quantize/embedding.py) and the head is an 8-bit MatMulNBits over the same values, stored
unsigned around 128 with the same scales. The embedding file is then the head's bytes a second time
(SmolLM2-135M: 31.9 MB of a 134.5 MB engine from a 91.7 MB Q4_0 file). Where every value and scale
is equal, the engine keeps the head's only: the manifest's components.llm.embedding names the
engine's weight file and `embedding_from_head` where in it the head's rows and scales are, which
runtime/backends/embedding.py maps and widens row by row, as it does the int8 file's. Anything else
(an untied head, another block size or precision, rows that differ) keeps its embedding file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

ZERO_POINT = 128  # MatMulNBits' 8-bit values without a zero_points input: unsigned, around 128


def share_embedding_with_head(directory: Path, llm: dict) -> bool:
    """Point the llm component (its manifest entry, changed here) at the LM head's blocks in the engine's
    weight file and delete the embedding file, where the two hold the same values; True if it did."""
    import onnx
    from onnx import helper
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data
    from safetensors import safe_open

    engine, table = directory / llm["engine"], directory / llm["embedding"]
    with safe_open(str(table), "np") as tensors:
        if set(tensors.keys()) != {"embedding", "scales"}:
            return False
        rows, scales = tensors.get_tensor("embedding"), tensors.get_tensor("scales")
    vocab, hidden = rows.shape
    if rows.dtype != np.int8 or scales.dtype != np.float32 or hidden % scales.shape[1]:
        return False
    block = hidden // scales.shape[1]
    graph = onnx.load(str(engine), load_external_data=False).graph
    initializers = {t.name: t for t in graph.initializer}
    for node in graph.node:
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if (node.op_type != "MatMulNBits" or len(node.input) != 3 or attributes.get("bits") != 8
                or (attributes.get("N"), attributes.get("K"), attributes.get("block_size")) != (vocab, hidden, block)):
            continue
        weight, weight_scales = (initializers.get(name) for name in node.input[1:])
        if not all(t is not None and uses_external_data(t) for t in (weight, weight_scales)):
            continue
        where = {name: ExternalDataInfo(t) for name, t in (("rows", weight), ("scales", weight_scales))}
        data = engine.parent / where["rows"].location
        if where["scales"].location != where["rows"].location or where["rows"].length != rows.size:
            continue
        head_rows = np.memmap(data, np.uint8, "r", where["rows"].offset or 0, rows.shape)
        head_scales = np.memmap(data, np.float32, "r", where["scales"].offset or 0, scales.shape)
        same = np.array_equal(head_scales, scales) and all(
            np.array_equal(head_rows[start: start + 4096].astype(np.int16) - ZERO_POINT, rows[start: start + 4096])
            for start in range(0, vocab, 4096))
        del head_rows, head_scales
        if not same:
            continue
        llm["embedding"] = data.relative_to(directory).as_posix()
        llm["embedding_from_head"] = {"rows_offset": where["rows"].offset or 0, "scales_offset": where["scales"].offset or 0,
                                      "block": block, "zero_point": ZERO_POINT}
        table.unlink()
        return True
    return False
