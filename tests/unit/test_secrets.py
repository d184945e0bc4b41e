"""The Hugging Face token lives in a real keychain, and nowhere else."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from app.core.errors import ConfigError
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


def delete_first(monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    """Make secretstorage's ``Item.<method>`` find its item deleted by someone else just before it runs
    (another process, say): the real Secret Service then answers as it does for an item that is gone."""
    import secretstorage

    real = getattr(secretstorage.Item, method)
    delete = secretstorage.Item.delete

    def after_someone_else_deleted(item: secretstorage.Item, *args: object) -> object:
        with closing(secretstorage.dbus_init()) as other:
            delete(secretstorage.Item(other, item.item_path))
        return real(item, *args)

    monkeypatch.setattr(secretstorage.Item, method, after_someone_else_deleted)


def test_a_secret_deleted_during_a_read_is_no_secret(keychain: None, monkeypatch: pytest.MonkeyPatch) -> None:
    secrets.set_remote_key("box", "remote-key")
    delete_first(monkeypatch, "get_secret")
    assert secrets.get_remote_key("box") is None  # secretstorage's ItemNotFoundException escaped


def test_a_secret_deleted_during_a_delete_is_deleted(keychain: None, monkeypatch: pytest.MonkeyPatch) -> None:
    secrets.set_hf_token(TOKEN)
    delete_first(monkeypatch, "delete")
    secrets.delete_hf_token()
    monkeypatch.undo()
    assert secrets.get_hf_token() is None


def test_a_keychain_that_went_away_is_said(
    keychain: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The Secret Service gone from the bus (its daemon stopped): a read logs why and finds nothing, a
    write and a delete say why in a ConfigError."""
    secrets.set_hf_token(TOKEN)
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", "unix:path=/nonexistent/bus")
    with caplog.at_level(logging.WARNING, logger="app.store.secrets"):
        assert secrets.get_hf_token() is None
    assert "could not read huggingface-token from the keychain" in caplog.text
    with pytest.raises(ConfigError) as refused:
        secrets.set_hf_token(TOKEN)
    assert "Could not store the token in the keychain" in refused.value.message
    with pytest.raises(ConfigError) as refused:
        secrets.delete_hf_token()
    assert "Could not remove the token from the keychain" in refused.value.message
