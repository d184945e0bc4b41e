"""A loopback Hugging Face Hub for the model tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.hubserver import LoopbackHub
from tests.support.testrepos import loopback_hub


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LoopbackHub]:
    with loopback_hub(tmp_path / "hf-cache", monkeypatch) as running:
        yield running
