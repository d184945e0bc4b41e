"""Parameter counts from model headers, with no I/O of their own: safetensors headers here, GGUF tensor
infos in ``app.core.gguf``. Callers read the bytes (HTTP Range in ``app.supervisor.modelmeta``, files
in ``app.store.model_paths``).

A safetensors file starts with an 8-byte little-endian length N, then N bytes of JSON: each tensor's
``dtype``, ``shape`` and ``data_offsets`` (and an optional ``__metadata__``). A model's count is the sum
over its tensors of the product of the shape, over every shard of a sharded repo. MLX's quantized
weights are stored packed (several values per ``U32``), so their headers count the packed elements,
as the header says; the Hub's own figure for such a repo is computed the same way.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from app.core.errors import ModelError

SAFETENSORS_HEADER_MAX = 100 << 20  # the format's own limit


def safetensors_header_length(first8: bytes, file_size: int) -> int:
    if len(first8) < 8:
        raise ModelError("The safetensors file is shorter than its 8-byte header length.")
    (length,) = struct.unpack("<Q", first8[:8])
    if not 2 <= length <= min(SAFETENSORS_HEADER_MAX, max(file_size - 8, 2)):
        raise ModelError(f"The safetensors header length {length} is not possible for this file.")
    return int(length)


def safetensors_parameter_count(header: bytes) -> int:
    """The sum over tensors of the product of their shapes, from a safetensors JSON header."""
    try:
        tensors: Any = json.loads(header)
    except (ValueError, RecursionError) as err:
        raise ModelError(f"The safetensors header is not JSON ({err}).") from None
    if not isinstance(tensors, dict):
        raise ModelError("The safetensors header is not a JSON object.")
    total = 0
    for name, info in tensors.items():
        if name == "__metadata__":
            continue
        shape = info.get("shape") if isinstance(info, dict) else None
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ModelError(f"The safetensors header gives {name!r} no usable shape.")
        count = 1
        for d in shape:
            count *= d
        total += count
    return total


def format_params(count: int | None) -> str:
    """``134.5M``, ``7.62B``: how model pages write parameter counts ("" when unknown)."""
    if count is None:
        return ""
    if count >= 10**9:
        return f"{count / 1e9:.3g}B"
    if count >= 10**6:
        return f"{count / 1e6:.4g}M"
    return f"{count / 1e3:.3g}K"
