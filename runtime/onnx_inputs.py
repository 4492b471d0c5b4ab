"""An ONNX graph's inputs (names and dimensions) read straight from the file's protobuf, without the
`onnx` package (its import alone is ~90 ms of a cold start) and without reading the weights: the
file is mapped and every field but the graph's inputs is skipped by its length. What
runtime/engine_dir.py checks a manifest against before any session starts.

    graph_inputs(path) -> {"inputs_embeds": ["batch", "seq", 576], ...}   (in the graph's order)

Only what is needed is decoded: ModelProto.graph (7) -> GraphProto.input (11) -> ValueInfoProto
name (1), type (2) -> TypeProto.tensor_type (1) -> shape (2) -> dim (1): dim_value (1) or dim_param (2).
"""

from __future__ import annotations

import mmap
from pathlib import Path


def _varint(buf, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _fields(buf, start: int, end: int):
    """(field number, value) of a message's fields: an int for a varint, (start, end) for bytes."""
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield field, value
        elif wire == 2:
            length, pos = _varint(buf, pos)
            yield field, (pos, pos + length)
            pos += length
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise ValueError(f"not an ONNX file (protobuf wire type {wire})")


def _first(buf, span: tuple[int, int], number: int):
    return next((value for field, value in _fields(buf, *span) if field == number), None)


def _input(buf, span: tuple[int, int]) -> tuple[str, list]:
    name_span = _first(buf, span, 1)
    name = bytes(buf[name_span[0]:name_span[1]]).decode("utf-8") if name_span else ""
    dims = []
    kind = _first(buf, span, 2)
    tensor = _first(buf, kind, 1) if kind else None
    shape = _first(buf, tensor, 2) if tensor else None
    if shape:
        for field, dim in _fields(buf, *shape):
            if field != 1:
                continue
            value = None
            for part, data in _fields(buf, *dim):
                if part == 1:
                    value = data
                elif part == 2:
                    value = bytes(buf[data[0]:data[1]]).decode("utf-8")
            dims.append(value)
    return name, dims


def graph_inputs(path: str | Path) -> dict[str, list]:
    """The graph's inputs by name, in order, each its dimensions (an int, a dynamic name, or None)."""
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        try:
            graph = _first(buf, (0, len(buf)), 7)
            if graph is None or graph[1] > len(buf):
                raise ValueError("not an ONNX model, or cut short (no whole graph)")
            return dict(_input(buf, span) for field, span in _fields(buf, *graph) if field == 11)
        except IndexError:  # a length or varint running past the end
            raise ValueError(f"cut short: {len(buf)} bytes, the graph runs past them") from None
