"""The GGUF header walk on damaged and hostile headers: each ends in HeaderCutShort (the callers read more,
then refuse with the app's error) or a ModelError, never another exception."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from gguf import GGUFValueType

from app.core.errors import ModelError
from app.core.gguf import HeaderCutShort, gguf_metadata, gguf_parameter_count
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
