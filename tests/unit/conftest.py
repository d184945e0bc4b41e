"""A loopback Hugging Face Hub for the model tests, with HF_ENDPOINT and HF_HUB_CACHE pointing at it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.hubserver import LoopbackHub
from tests.support.testrepos import add_standard_repos


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LoopbackHub]:
    loopback = LoopbackHub()
    add_standard_repos(loopback)
    with loopback.running() as base:
        monkeypatch.setenv("HF_ENDPOINT", base)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        for var in ("HF_HOME", "HF_TOKEN"):
            monkeypatch.delenv(var, raising=False)
        yield loopback
