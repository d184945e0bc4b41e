"""The GGUF header walk: a model file's key/value metadata from its first bytes, with no I/O of its own
(the callers read the bytes: over HTTP Range in ``app.supervisor.modelmeta``, from disk in
``app.store.model_paths``; ``GrowingRead`` tells both how many, growing until the header parses).

The walk uses the ``gguf`` package's format definitions (magic, versions, value types) but not its
``GGUFReader``, which turns every vocabulary entry into numpy views: two seconds for a 49k-token
vocabulary, several for the 150k-token ones, where this walk skips them in milliseconds. The tests
check the two agree on a real model file. Those definitions are imported on the first parse, not with
this module: ``gguf`` imports numpy, a tenth of a second of start-up that the window does not need.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from app.core.errors import ModelError

T = TypeVar("T")

HEADER_FIRST = 1 << 20
HEADER_MAX = 64 << 20
SKIPPED_PREFIX = "tokenizer."  # vocabularies and merges: large, and no help to a memory estimate
# llama.cpp refuses arrays of arrays outright; a few levels are allowed here, but a hostile header nesting
# thousands deep (12 bytes a level) would otherwise exhaust Python's recursion limit.
ARRAY_DEPTH_MAX = 4
# Kept arrays are per-layer lists and short tags, thousands of entries at most; a 64 MB header could
# otherwise become lists of 60M Python objects, gigabytes. An array past what is left of this budget is
# skipped (its value is None), as the tokenizer's are.
KEPT_ELEMENTS_MAX = 1 << 20


@dataclass(frozen=True)
class _Format:
    """What the walk needs from the ``gguf`` package's definitions."""

    magic: int
    versions: frozenset[int]
    string: int  # the value type of a string
    array: int  # the value type of an array
    scalars: dict[int, str]  # value type -> struct format


@functools.cache
def _format() -> _Format:
    from gguf import GGUF_MAGIC, GGUFValueType
    from gguf.gguf_reader import READER_SUPPORTED_VERSIONS

    scalars: dict[int, str] = {
        GGUFValueType.UINT8: "B",
        GGUFValueType.INT8: "b",
        GGUFValueType.UINT16: "H",
        GGUFValueType.INT16: "h",
        GGUFValueType.UINT32: "I",
        GGUFValueType.INT32: "i",
        GGUFValueType.FLOAT32: "f",
        GGUFValueType.BOOL: "?",
        GGUFValueType.UINT64: "Q",
        GGUFValueType.INT64: "q",
        GGUFValueType.FLOAT64: "d",
    }
    return _Format(
        GGUF_MAGIC, frozenset(READER_SUPPORTED_VERSIONS), GGUFValueType.STRING, GGUFValueType.ARRAY, scalars
    )


class HeaderCutShort(Exception):
    """The bytes ran out before the metadata did."""


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0
        self.format = _format()
        self.kept_left = KEPT_ELEMENTS_MAX

    def take_all(self, fmt: str) -> tuple[Any, ...]:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise HeaderCutShort
        values = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return values

    def take(self, fmt: str) -> Any:
        return self.take_all(fmt)[0]

    def skip(self, n: int) -> None:
        if self.pos + n > len(self.data):
            raise HeaderCutShort
        self.pos += n

    def string(self) -> str:
        n = self.take("<Q")
        start = self.pos
        self.skip(n)
        return self.data[start : self.pos].decode("utf-8", errors="replace")

    def value(self, vtype: int, keep: bool, depth: int = 0) -> Any:
        if vtype == self.format.string:
            text = self.string()
            return text if keep else None
        if vtype == self.format.array:
            if depth >= ARRAY_DEPTH_MAX:
                raise ModelError(
                    f"The GGUF metadata nests arrays more than {ARRAY_DEPTH_MAX} deep: the file is damaged.",
                    "Download the model again or pick another file.",
                )
            itype, count = self.take("<I"), self.take("<Q")
            if keep and count > self.kept_left:
                keep = False
            elif keep:
                self.kept_left -= count
            fmt = self.format.scalars.get(itype)
            if fmt is not None:
                size = count * struct.calcsize(fmt)
                if self.pos + size > len(self.data):
                    # Counted before the format is built: a count of 2**62 is no struct format at all.
                    raise HeaderCutShort
                if not keep:
                    self.skip(size)
                    return None
                return list(self.take_all(f"<{count}{fmt}"))
            if keep:
                return [self.value(itype, keep, depth + 1) for _ in range(count)]
            if itype == self.format.string:
                self._skip_strings(count)
                return None
            return self._skip_all(itype, count, depth + 1)
        fmt = self.format.scalars.get(vtype)
        if fmt is None:
            raise ModelError(f"The GGUF metadata has an unknown value type {vtype}.")
        return self.take(f"<{fmt}")

    def _skip_strings(self, count: int) -> None:
        """Skip ``count`` length-prefixed strings: a vocabulary's worth (50k-150k) in a few milliseconds,
        where a ``value()`` call per string takes a tenth of a second."""
        data, pos, end = self.data, self.pos, len(self.data)
        unpack = struct.Struct("<Q").unpack_from
        for _ in range(count):
            if pos + 8 > end:
                raise HeaderCutShort
            pos += 8 + unpack(data, pos)[0]
        if pos > end:
            raise HeaderCutShort
        self.pos = pos

    def _skip_all(self, itype: int, count: int, depth: int) -> None:
        for _ in range(count):
            self.value(itype, keep=False, depth=depth)


def _opened(data: bytes) -> tuple[_Cursor, int, int]:
    """A cursor past the file's magic and version, the tensor count and the key/value count."""
    cursor = _Cursor(data)
    if cursor.take("<I") != cursor.format.magic:
        raise ModelError("The file is not a GGUF model (no GGUF magic at its start).")
    version = cursor.take("<I")
    if version not in cursor.format.versions:
        raise ModelError(f"GGUF version {version} is not supported (big-endian or too new).")
    return cursor, cursor.take("<Q"), cursor.take("<Q")


MAX_DIMS = 8  # GGML_MAX_DIMS is 4; anything far past it is a damaged or hostile header


def gguf_parameter_count(data: bytes) -> int:
    """The number of parameters in a GGUF file (one shard of a split model counts its own tensors):
    the tensor infos after the metadata (name, dimensions, type, offset), summed as products of their
    dimensions. The dimensions are logical elements, so every quant of a model gives the same count.

    Raises ``HeaderCutShort`` when ``data`` ends before the tensor infos do.
    """
    cursor, tensors, kv_count = _opened(data)
    for _ in range(kv_count):
        cursor.string()
        cursor.value(cursor.take("<I"), keep=False)
    total = 0
    for _ in range(tensors):
        cursor.string()
        dims = cursor.take("<I")
        if dims > MAX_DIMS:
            raise ModelError(f"The GGUF tensor table says a tensor has {dims} dimensions: it is damaged.")
        count = 1
        for size in cursor.take_all(f"<{dims}Q"):
            count *= size
        cursor.skip(12)  # the type (uint32) and the data offset (uint64)
        total += count
    return total


def gguf_metadata(data: bytes) -> dict[str, Any]:
    """The key/value metadata of a GGUF file from its first bytes (``tokenizer.*`` values skipped).

    Raises ``HeaderCutShort`` when ``data`` ends before the metadata does.
    """
    cursor, _tensors, kv_count = _opened(data)
    fields: dict[str, Any] = {}
    for _ in range(kv_count):
        key = cursor.string()
        fields[key] = cursor.value(cursor.take("<I"), keep=not key.startswith(SKIPPED_PREFIX))
    return fields


def header_too_big(what: str) -> ModelError:
    return ModelError(
        f"The GGUF metadata of {what} is larger than {HEADER_MAX >> 20} MB or cut short.",
        "The fit cannot be estimated.",
    )


class GrowingRead(Generic[T]):
    """The one "read more until the header parses" loop, without the reading: read the file's first
    ``want`` bytes and ``take`` them; a header not whole yet doubles ``want`` (up to the file's size and
    ``HEADER_MAX``), and one that is not whole by then, or a file that ends first, is ``header_too_big``.

        read = GrowingRead(gguf_metadata, "model.gguf", size)
        while (found := read.take(first_bytes(read.want))) is None: ...
    """

    def __init__(self, parse: Callable[[bytes], T], what: str, size: int | None = None) -> None:
        self._parse = parse
        self._what = what
        self._limit = HEADER_MAX if size is None else min(size, HEADER_MAX)
        self.want = min(HEADER_FIRST, self._limit)

    def take(self, data: bytes) -> T | None:
        """The parse of ``data`` (the file's first ``want`` bytes, or fewer where it ends), or None when
        more is needed (``want`` has grown)."""
        try:
            return self._parse(data)
        except HeaderCutShort:
            if len(data) < self.want or self.want >= self._limit:
                raise header_too_big(self._what) from None
            self.want = min(self.want * 2, self._limit)
            return None
