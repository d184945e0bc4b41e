"""Shared fixtures: every test gets its own LEMON_DESK_HOME and a clean environment."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

PROFILES = Path(__file__).parent / "profiles"

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


@pytest.fixture(autouse=True)
def lemon_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path / "lemon-home"
    monkeypatch.setenv("LEMON_DESK_HOME", str(home))
    for var in ("LEMON_DESK_MOCK_HARDWARE", "LEMON_DESK_RELEASE_MIRROR", "LEMON_DESK_BACKEND_VERSIONS"):
        monkeypatch.delenv(var, raising=False)
    yield home


def profile_path(name: str) -> Path:
    return PROFILES / f"{name}.json"
