"""A GGUF file's metadata and tensor table, read in one pass over the memory-mapped header.

`gguf.GGUFReader` builds a numpy view per metadata element: for a model with a 49K-token BPE vocab
(SmolLM2: ~196K strings in `tokenizer.ggml.tokens` and `.merges`) that is ~7.5 CPU-s per open, and
a server opens the file four times (start-up checks, tokenizer, each rank's config and weights).
This reader decodes the same layout (GGUF v2/v3, little-endian) with `struct` over one `bytes`
header (~0.2 s) and keeps each tensor's data as a view of one read-only `numpy.memmap`, shaped as
`gguf.quants.dequantize` expects (raw bytes per row for block-quantized and bf16 types).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import quant_shape_to_byte_shape

GGUF_MAGIC = b"GGUF"
_HEADER_PROBE = 1 << 20  # read this much first; grow while the metadata runs past it

# value type id -> struct format of a scalar (GGUF's ids; 8 = string, 9 = array)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_NUMPY = {"B": np.uint8, "b": np.int8, "H": np.uint16, "h": np.int16, "I": np.uint32, "i": np.int32}
_NUMPY.update({"f": np.float32, "?": np.bool_, "Q": np.uint64, "q": np.int64, "d": np.float64})
_STRING, _ARRAY = 8, 9
# tensor types stored as plain numpy elements; every other type is handed out as raw bytes
_PLAIN = {
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16,
    GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


@dataclass
class GGUFTensorInfo:
    """One tensor: `shape` in GGUF order (fastest dim first), `data` a read-only memmap view."""

    name: str
    shape: tuple[int, ...]
    tensor_type: GGMLQuantizationType
    data: np.ndarray


@dataclass
class GGUFFile:
    """Decoded metadata (`fields`: str, int, float, bool or lists of them) and the tensor table."""

    path: str
    version: int
    fields: dict[str, Any] = field(default_factory=dict)
    tensors: list[GGUFTensorInfo] = field(default_factory=list)

    def value(self, key: str, default: Any = None) -> Any:
        """The value of metadata `key`, or `default` when the file has none."""
        return self.fields.get(key, default)


class _Cursor:
    """Sequential little-endian reads over the header bytes; `_Grow` when they run out."""

    def __init__(self, buf: bytes):
        self.buf, self.pos = buf, 0

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.buf):
            raise _Grow
        out = self.buf[self.pos : end]
        self.pos = end
        return out

    def scalar(self, fmt: str) -> Any:
        size = struct.calcsize("<" + fmt)
        return struct.unpack("<" + fmt, self.take(size))[0]

    def string(self) -> str:
        return self.take(self.scalar("Q")).decode("utf-8", errors="replace")

    def strings(self, count: int) -> list[str]:
        buf, pos, out = self.buf, self.pos, []
        unpack = struct.Struct("<Q").unpack_from
        for _ in range(count):
            if pos + 8 > len(buf):
                raise _Grow
            (n,) = unpack(buf, pos)
            if pos + 8 + n > len(buf):
                raise _Grow
            out.append(buf[pos + 8 : pos + 8 + n].decode("utf-8", errors="replace"))
            pos += 8 + n
        self.pos = pos
        return out

    def value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = self.scalar("I"), self.scalar("Q")
            if etype == _STRING:
                return self.strings(count)
            if etype == _ARRAY:
                return [self.value(_ARRAY) for _ in range(count)]
            fmt = _scalar_format(etype)
            return np.frombuffer(self.take(struct.calcsize(fmt) * count), dtype=_NUMPY[fmt]).tolist()
        return self.scalar(_scalar_format(vtype))


class _Grow(Exception):
    """The header runs past the bytes read so far."""


def _scalar_format(vtype: int) -> str:
    if vtype not in _SCALARS:
        raise ValueError(f"unknown GGUF value type {vtype}")
    return _SCALARS[vtype]


def read_gguf(path: str) -> GGUFFile:
    """Parse `path`'s header and tensor table (ValueError for a file that is not GGUF v2/v3)."""
    data = np.memmap(path, dtype=np.uint8, mode="r")
    probe = _HEADER_PROBE
    while True:
        try:
            return _parse(path, data, bytes(data[:probe]))
        except _Grow:
            if probe >= len(data):
                raise ValueError(f"{path!r}: truncated GGUF header") from None
            probe *= 4


def _parse(path: str, data: np.memmap, header: bytes) -> GGUFFile:
    cur = _Cursor(header)
    if cur.take(4) != GGUF_MAGIC:
        raise ValueError(f"{path!r} is not a GGUF file (bad magic)")
    version = cur.scalar("I")
    if version not in (2, 3):
        raise ValueError(f"{path!r}: GGUF version {version} is not supported (2 or 3, little-endian)")
    n_tensors, n_fields = cur.scalar("Q"), cur.scalar("Q")
    out = GGUFFile(path=path, version=version)
    for _ in range(n_fields):
        key = cur.string()
        out.fields[key] = cur.value(cur.scalar("I"))
    table = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = tuple(cur.scalar("Q") for _ in range(cur.scalar("I")))
        table.append((name, dims, GGMLQuantizationType(cur.scalar("I")), cur.scalar("Q")))
    align = int(out.fields.get("general.alignment", 32))
    start = -(-cur.pos // align) * align
    names = set()
    for name, dims, qtype, offset in table:
        if name in names:
            raise ValueError(f"{path!r}: tensor {name!r} appears twice")
        names.add(name)
        out.tensors.append(GGUFTensorInfo(name, dims, qtype, _tensor_view(data, start + offset, dims, qtype)))
    return out


def _tensor_view(
    data: np.memmap, offset: int, dims: tuple[int, ...], qtype: GGMLQuantizationType
) -> np.ndarray:
    """The tensor's bytes as numpy sees them: elements for plain types, bytes per row otherwise."""
    np_shape = tuple(reversed(dims))
    n_elems = int(np.prod(dims)) if dims else 1
    if qtype in _PLAIN:
        dtype = np.dtype(_PLAIN[qtype])
        return data[offset : offset + n_elems * dtype.itemsize].view(dtype).reshape(np_shape)
    block, type_size = GGML_QUANT_SIZES[qtype]
    n_bytes = n_elems * type_size // block
    return data[offset : offset + n_bytes].reshape(quant_shape_to_byte_shape(np_shape, qtype))
