"""The Hugging Face token lives in a real keychain, and nowhere else."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.store import secrets
from app.store.settings import Settings, save_settings
from tests.support.keychain import private_keychain

TOKEN = "hf_test_0123456789abcdef"


@pytest.fixture
def keychain(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with private_keychain(tmp_path / "keyrings"):
        yield


def test_token_round_trips_through_the_keychain(keychain: None, lemon_home: Path) -> None:
    assert secrets.get_hf_token() is None
    secrets.set_hf_token(TOKEN)
    assert secrets.get_hf_token() == TOKEN
    save_settings(Settings())
    for path in lemon_home.rglob("*"):
        if path.is_file():
            assert TOKEN not in path.read_text(errors="replace"), path
    secrets.delete_hf_token()
    assert secrets.get_hf_token() is None
    secrets.delete_hf_token()  # deleting nothing is not an error


def test_environment_token_wins(keychain: None, monkeypatch: pytest.MonkeyPatch) -> None:
    secrets.set_hf_token(TOKEN)
    monkeypatch.setenv("HF_TOKEN", "hf_from_env")
    assert secrets.get_hf_token() == "hf_from_env"
    secrets.delete_hf_token()
