"""Read and write the safetensors format (a JSON header, then the tensors' raw little-endian bytes).

The layout (https://huggingface.co/docs/safetensors): 8 bytes, the header's length N as an unsigned
little-endian integer; N bytes of UTF-8 JSON, `{name: {"dtype": "F16", "shape": [...], "data_offsets": [begin,
end]}, ..., "__metadata__": {str: str}}`, padded with spaces; then the byte buffer, each tensor row-major at
its offsets (relative to the buffer's start), the tensors covering it without holes or overlaps. Written here
(about a hundred lines) instead of adding the `safetensors` package to the core dependencies; the tests check
both directions against that package when it is installed.
"""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Mapping
from os import PathLike
from pathlib import Path

import torch

DTYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "I32": torch.int32,
    "I64": torch.int64, "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32,
    "F64": torch.float64,
}
_NAMES = {v: k for k, v in DTYPES.items()}
_MAX_HEADER = 100 * 2**20  # the reference implementation's limit on the header's length


def _check_host() -> None:
    if sys.byteorder != "little":
        raise RuntimeError("safetensors files hold little-endian bytes; this host is big-endian")


def save_tensors(tensors: Mapping[str, torch.Tensor], path: str | PathLike,
                 metadata: Mapping[str, str] | None = None) -> None:
    """Write `tensors` (names sorted, each its own contiguous CPU copy) and string `metadata` to `path`."""
    _check_host()
    header: dict[str, object] = {}
    if metadata:
        bad = [k for k, v in metadata.items() if not isinstance(k, str) or not isinstance(v, str)]
        if bad:
            raise ValueError(f"safetensors metadata maps strings to strings; {bad[0]!r} does not")
        header["__metadata__"] = dict(metadata)
    blobs, offset = [], 0
    for name in sorted(tensors):
        t = tensors[name]
        if not isinstance(t, torch.Tensor) or t.dtype not in _NAMES:
            allowed = ", ".join(str(d).removeprefix("torch.") for d in DTYPES.values())
            raise ValueError(f"cannot store {name!r} ({getattr(t, 'dtype', type(t).__name__)}); safetensors "
                             f"dtypes written here: {allowed}")
        data = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the buffer starts 8-byte aligned
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for data in blobs:
            f.write(data)
    tmp.replace(path)


def load_tensors(path: str | PathLike) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors on the CPU, metadata) of a safetensors file; ValueError names what is wrong with a bad one."""
    _check_host()
    raw = Path(path).read_bytes()
    if len(raw) < 8:
        raise ValueError(f"{path} is too short for a safetensors file ({len(raw)} bytes)")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > min(_MAX_HEADER, len(raw) - 8):
        raise ValueError(f"{path} is not a safetensors file: its header length {n} exceeds the file")
    try:
        header = json.loads(raw[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not a safetensors file: its header is not JSON ({e})") from e
    if not isinstance(header, dict):
        raise ValueError(f"{path} is not a safetensors file: its header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    buffer = memoryview(raw)[8 + n:]
    tensors, spans = {}, []
    for name, entry in header.items():
        try:
            dtype = DTYPES[entry["dtype"]]
            shape = [int(s) for s in entry["shape"]]
            begin, end = (int(o) for o in entry["data_offsets"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: tensor {name!r} has a malformed entry {entry!r} (dtypes read here: "
                             f"{', '.join(DTYPES)})") from e
        numel = 1
        for s in shape:
            numel *= s
        size = numel * torch.empty((), dtype=dtype).element_size()
        if min(shape, default=0) < 0 or not 0 <= begin <= end <= len(buffer) or end - begin != size:
            raise ValueError(f"{path}: tensor {name!r} of shape {shape} ({entry['dtype']}) does not fit its "
                             f"offsets [{begin}, {end}) in a {len(buffer)}-byte buffer")
        spans.append((begin, end))
        data = bytearray(buffer[begin:end])  # a writable copy: the tensor owns its memory
        t = torch.frombuffer(data, dtype=torch.uint8) if size else torch.empty(0, dtype=torch.uint8)
        tensors[name] = t.view(dtype).reshape(shape)
    covered = 0
    for begin, end in sorted(spans):
        if begin != covered:
            raise ValueError(f"{path}: the tensors' byte ranges overlap or leave a hole at byte {covered}")
        covered = end
    if covered != len(buffer):
        raise ValueError(f"{path}: {len(buffer) - covered} bytes after the last tensor")
    return tensors, dict(metadata)
