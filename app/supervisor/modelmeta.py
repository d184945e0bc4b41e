"""A model's shape before it is downloaded: GGUF metadata from the file's first megabytes (HTTP Range),
or ``config.json`` for MLX. Local GGUF files (imports) are read the same way.

The GGUF walk uses the ``gguf`` package's format definitions (magic, versions, value types) but not its
``GGUFReader``, which turns every vocabulary entry into numpy views: two seconds for a 49k-token
vocabulary, several for the 150k-token ones, where this walk skips them in milliseconds. The tests
check the two agree on a real model file. Those definitions are imported on the first parse, not with
this module: ``gguf`` imports numpy, a tenth of a second of start-up that the window does not need.
"""

from __future__ import annotations

import asyncio
import functools
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core.errors import ModelError
from app.core.fit import ModelShape, shape_from_config, shape_from_gguf
from app.core.refs import GGUF_RECIPE, FileSet
from app.supervisor.hub import HubClient

HEADER_FIRST = 1 << 20
HEADER_MAX = 64 << 20
SKIPPED_PREFIX = "tokenizer."  # vocabularies and merges: large, and no help to a memory estimate


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


class _Short(Exception):
    """The bytes ran out before the metadata did."""


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0
        self.format = _format()

    def take_all(self, fmt: str) -> tuple[Any, ...]:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise _Short
        values = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return values

    def take(self, fmt: str) -> Any:
        return self.take_all(fmt)[0]

    def skip(self, n: int) -> None:
        if self.pos + n > len(self.data):
            raise _Short
        self.pos += n

    def string(self) -> str:
        n = self.take("<Q")
        start = self.pos
        self.skip(n)
        return self.data[start : self.pos].decode("utf-8", errors="replace")

    def value(self, vtype: int, keep: bool) -> Any:
        if vtype == self.format.string:
            text = self.string()
            return text if keep else None
        if vtype == self.format.array:
            itype, count = self.take("<I"), self.take("<Q")
            fmt = self.format.scalars.get(itype)
            if fmt is not None:
                if not keep:
                    self.skip(count * struct.calcsize(fmt))
                    return None
                return list(self.take_all(f"<{count}{fmt}"))
            return [self.value(itype, keep) for _ in range(count)] if keep else self._skip_all(itype, count)
        fmt = self.format.scalars.get(vtype)
        if fmt is None:
            raise ModelError(f"The GGUF metadata has an unknown value type {vtype}.")
        return self.take(f"<{fmt}")

    def _skip_all(self, itype: int, count: int) -> None:
        for _ in range(count):
            self.value(itype, keep=False)


def gguf_metadata(data: bytes) -> dict[str, Any]:
    """The key/value metadata of a GGUF file from its first bytes (``tokenizer.*`` values skipped).

    Raises ``_Short`` when ``data`` ends before the metadata does.
    """
    cursor = _Cursor(data)
    if cursor.take("<I") != cursor.format.magic:
        raise ModelError("The file is not a GGUF model (no GGUF magic at its start).")
    version = cursor.take("<I")
    if version not in cursor.format.versions:
        raise ModelError(f"GGUF version {version} is not supported (big-endian or too new).")
    _tensors, kv_count = cursor.take("<Q"), cursor.take("<Q")
    fields: dict[str, Any] = {}
    for _ in range(kv_count):
        key = cursor.string()
        fields[key] = cursor.value(cursor.take("<I"), keep=not key.startswith(SKIPPED_PREFIX))
    return fields


def _too_big(what: str) -> ModelError:
    return ModelError(
        f"The GGUF metadata of {what} is larger than {HEADER_MAX >> 20} MB or cut short.",
        "The fit cannot be estimated.",
    )


async def remote_gguf_metadata(
    hub: HubClient, repo_id: str, revision: str, path: str, size: int
) -> dict[str, Any]:
    """Read the first megabyte of a file on the Hub, then more (doubling) until the metadata is whole."""
    data = b""
    want = min(HEADER_FIRST, size)
    while True:
        data += await hub.read_range(repo_id, revision, path, len(data), want)
        try:
            return await asyncio.to_thread(gguf_metadata, data)  # a large vocabulary takes a while
        except _Short:
            if want >= min(size, HEADER_MAX) or len(data) < want:
                raise _too_big(f"{repo_id}/{path}") from None
            want = min(want * 2, size, HEADER_MAX)


def local_gguf_metadata(path: Path) -> dict[str, Any]:
    want = HEADER_FIRST
    with path.open("rb") as f:
        while True:
            f.seek(0)
            data = f.read(want)
            try:
                return gguf_metadata(data)
            except _Short:
                if len(data) < want or want >= HEADER_MAX:
                    raise _too_big(str(path)) from None
                want *= 2


async def remote_shape(hub: HubClient, files: FileSet) -> ModelShape:
    """The shape of the model ``files`` make up, read from the Hub without downloading the weights."""
    if files.recipe == GGUF_RECIPE and files.main is not None:
        main = next(f for f in files.files if f.path == files.main)
        return shape_from_gguf(
            await remote_gguf_metadata(hub, files.repo_id, files.revision, main.path, main.size)
        )
    config = await hub.read_json(files.repo_id, files.revision, "config.json")
    if not isinstance(config, dict):
        raise ModelError(f"config.json in {files.repo_id} is not a JSON object.")
    return shape_from_config(config)
