"""The GGUF header walk on damaged and hostile headers: each ends in HeaderCutShort (the callers read more,
then refuse with the app's error) or a ModelError, never another exception."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from gguf import GGUFValueType

from app.core.errors import ModelError
from app.core.gguf import (
    HEADER_FIRST,
    HEADER_MAX,
    GrowingRead,
    HeaderCutShort,
    gguf_metadata,
    gguf_parameter_count,
)
from app.store.model_paths import local_gguf_metadata
from tests.support.modelfiles import gguf_array, gguf_key, raw_gguf

ARRAY, UINT32 = GGUFValueType.ARRAY, GGUFValueType.UINT32


def test_an_array_counting_more_than_the_header_holds_is_cut_short(tmp_path: Path) -> None:
    # 2**62 uint32s: a struct format that size raised struct.error before the bytes were counted.
    data = raw_gguf(gguf_key("general.x", ARRAY, gguf_array(UINT32, 1 << 62)))
    with pytest.raises(HeaderCutShort):
        gguf_metadata(data)
    with pytest.raises(HeaderCutShort):
        gguf_parameter_count(data)
    path = tmp_path / "huge.gguf"
    path.write_bytes(data)
    with pytest.raises(ModelError, match="cut short"):
        local_gguf_metadata(path)


def needs(size: int) -> Callable[[bytes], int]:
    """A parse that needs the first ``size`` bytes, as a header of that size does."""

    def parse(data: bytes) -> int:
        if len(data) < size:
            raise HeaderCutShort
        return size

    return parse


def test_the_read_grows_by_doubling_to_the_file_size_and_stops_at_the_cap() -> None:
    """The one grow-until-the-header-parses loop (the Hub's Range reads and the local file's both)."""
    read, asked = GrowingRead(needs(5 * HEADER_FIRST), "m.gguf", size=6 * HEADER_FIRST), []
    while (found := read.take(bytes(read.want))) is None:
        asked.append(read.want)
    assert found == 5 * HEADER_FIRST
    assert asked == [2 * HEADER_FIRST, 4 * HEADER_FIRST, 6 * HEADER_FIRST]  # never past the file
    too_big = GrowingRead(needs(HEADER_MAX + 1), "m.gguf")
    with pytest.raises(ModelError, match="is larger than 64 MB"):
        while too_big.take(bytes(too_big.want)) is None:
            assert too_big.want <= HEADER_MAX
    ended = GrowingRead(needs(3 * HEADER_FIRST), "m.gguf")  # the file ends before the header does
    assert ended.take(bytes(HEADER_FIRST)) is None
    with pytest.raises(ModelError, match="cut short"):
        ended.take(bytes(HEADER_FIRST + 1))


def nested(key: str, depth: int) -> bytes:
    """``key`` holding an array of one array of one array ... ``depth`` arrays deep, an empty uint32 array
    innermost."""
    return raw_gguf(gguf_key(key, ARRAY, gguf_array(ARRAY, 1) * (depth - 1) + gguf_array(UINT32, 0)))


@pytest.mark.parametrize("key", ["general.x", "tokenizer.x"])  # kept, and skipped
def test_arrays_nested_thousands_deep_are_refused(key: str) -> None:
    # 3000 levels, 12 bytes each: a RecursionError in the walk before.
    with pytest.raises(ModelError, match="nests arrays more than 4 deep"):
        gguf_metadata(nested(key, 3000))
    with pytest.raises(ModelError, match="nests arrays more than 4 deep"):
        gguf_parameter_count(nested(key, 3000))
    with pytest.raises(ModelError, match="nests arrays more than 4 deep"):
        gguf_metadata(nested(key, 5))
    # Four deep is still read (or skipped, for tokenizer.*).
    assert gguf_metadata(nested(key, 4))[key] == ([[[[]]]] if key == "general.x" else None)


def test_arrays_of_arrays_and_strings_are_read() -> None:
    pairs = gguf_array(UINT32, 2) + struct.pack("<II", 1, 2) + gguf_array(UINT32, 1) + struct.pack("<I", 3)
    words = gguf_array(GGUFValueType.STRING, 2) + struct.pack("<Q", 1) + b"a" + struct.pack("<Q", 2) + b"bc"
    data = raw_gguf(
        gguf_key("general.pairs", ARRAY, gguf_array(ARRAY, 2) + pairs),
        gguf_key("general.words", ARRAY, words),
    )
    assert gguf_metadata(data) == {"general.pairs": [[1, 2], [3]], "general.words": ["a", "bc"]}


def test_kept_arrays_past_a_million_entries_are_skipped() -> None:
    def uint8s(key: str, count: int) -> bytes:
        return gguf_key(key, ARRAY, gguf_array(GGUFValueType.UINT8, count) + bytes(count))

    # One array of 1M + 1 entries, or two that add up past the budget: a list of millions of Python
    # objects each before, a gigabyte from a 64 MB header.
    half = (1 << 19) + 1
    data = raw_gguf(
        uint8s("general.big", (1 << 20) + 1),
        uint8s("general.a", half),
        uint8s("general.b", half),
        gguf_key("general.architecture", GGUFValueType.STRING, struct.pack("<Q", 5) + b"llama"),
        uint8s("general.small", 3),
    )
    fields = gguf_metadata(data)
    assert fields["general.big"] is None and fields["general.b"] is None
    assert (len(fields["general.a"]), fields["general.small"]) == (half, [0, 0, 0])
    assert fields["general.architecture"] == "llama"
