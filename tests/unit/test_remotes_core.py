"""Remotes, the pure part and the store: names and addresses checked where they enter, ``@NAME/MODEL``,
what a remote sends checked before use, the state table, and ``remotes.json`` (its key only in the
keychain, an unreadable file set aside)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.core.errors import ConfigError
from app.core.remotes import (
    MAX_MODELS,
    RemoteModelStatus,
    RemoteRef,
    RemoteState,
    can_transition,
    check_remote_name,
    loaded_models,
    normalise_url,
    parse_model_list,
    parse_remote_model,
    remote_model_status,
)
from app.store import secrets
from app.store.remotes import RemoteRecord, load_remotes, remotes_path, save_remotes
from tests.support.keychain import private_keychain


@pytest.mark.parametrize(
    "given,root",
    [
        ("http://127.0.0.1:13305", "http://127.0.0.1:13305"),
        ("http://127.0.0.1:13305/", "http://127.0.0.1:13305"),
        ("http://127.0.0.1:13305/v1", "http://127.0.0.1:13305"),
        ("http://127.0.0.1:13305/v1/", "http://127.0.0.1:13305"),
        ("http://127.0.0.1:13305/api/v1", "http://127.0.0.1:13305"),
        ("  HTTPS://Box.Local:8443/lemon/api/v1 ", "https://box.local:8443/lemon"),
        ("http://[::1]:8000/v1", "http://[::1]:8000"),
        ("https://models.example.org", "https://models.example.org"),
    ],
)
def test_an_address_becomes_its_server_root(given: str, root: str) -> None:
    assert normalise_url(given) == root


@pytest.mark.parametrize(
    "bad,said",
    [
        ("127.0.0.1:13305", "not an http:// or https:// address"),
        ("ftp://host/v1", "not an http:// or https:// address"),
        ("http://", "names no usable host"),
        ("http://bad host:80", "names no usable host"),
        ("http://user:secret@host:80", "user name or password"),
        ("http://host:99999", "not a usable address"),
        ("http://host:0", "port 0"),
        ("http://host:80/v1?x=1", "query or fragment"),
        ("http://host:80/a b", "path with spaces"),
    ],
)
def test_a_bad_address_is_refused_saying_why(bad: str, said: str) -> None:
    with pytest.raises(ConfigError) as err:
        normalise_url(bad)
    assert said in str(err.value), str(err.value)
    assert "secret" not in str(err.value) or "user name" in str(err.value)


@pytest.mark.parametrize("name", ["box", "gpu-box.2", "B", "a_b"])
def test_plain_names_are_remote_names(name: str) -> None:
    assert check_remote_name(name) == name


@pytest.mark.parametrize("name", ["", "-x", ".x", "a/b", "a@b", "a b", "a..b", "x" * 65, "é"])
def test_other_names_are_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="cannot name a remote"):
        check_remote_name(name)


def test_remote_model_names_split_at_the_first_slash() -> None:
    assert parse_remote_model("@box/smol") == RemoteRef("box", "smol")
    assert parse_remote_model("@box/org/repo:Q4_K_M") == RemoteRef("box", "org/repo:Q4_K_M")
    assert RemoteRef("box", "org/repo").name == "@box/org/repo"
    for bad in ("smol", "@box", "@box/", "@/smol", "@a b/x"):
        with pytest.raises(ConfigError, match="not a remote model name"):
            parse_remote_model(bad)


def test_a_model_list_is_read_entry_by_entry_and_hostile_entries_left_out() -> None:
    payload = {
        "data": [
            {"id": "smol", "recipe": "llamacpp", "size": 0.1, "labels": ["tool-calling"], "status": "loaded"},
            {"id": "plain"},
            {"id": "@other/model"},  # the remote's own remote: one hop only
            {"id": "bad\nname"},
            {"id": "x" * 300},
            {"id": 7},
            "not an object",
            {"id": "huge", "size": 1e30, "labels": "nope", "recipe": 5},
            {"id": "plain"},  # twice: once
        ]
    }
    models = parse_model_list(payload, loaded=frozenset({"plain"}))
    assert [m.id for m in models] == ["smol", "plain", "huge"]
    smol, plain, huge = models
    assert smol.loaded and smol.size_bytes == 100_000_000 and smol.labels == ("tool-calling",)
    assert plain.loaded and plain.recipe == ""
    assert (huge.size_bytes, huge.labels, huge.recipe) == (0, (), "")
    many = {"data": [{"id": f"m{i}"} for i in range(MAX_MODELS + 10)]}
    assert len(parse_model_list(many)) == MAX_MODELS
    for not_a_list in ({}, {"data": "x"}, [], None):
        with pytest.raises(ValueError):
            parse_model_list(not_a_list)
    assert loaded_models({"all_models_loaded": [{"model_name": "a"}, {"model_name": 3}, "x"]}) == {"a"}
    assert loaded_models([]) == frozenset()


def test_every_pair_of_states_is_either_a_legal_move_or_not() -> None:
    legal = {
        (old, new) for old, new in itertools.product(RemoteState, RemoteState) if can_transition(old, new)
    }
    assert (RemoteState.UNKNOWN, RemoteState.REACHABLE) in legal
    assert (RemoteState.REACHABLE, RemoteState.UNREACHABLE) in legal
    assert (RemoteState.UNREACHABLE, RemoteState.REACHABLE) in legal
    assert (RemoteState.REFUSED, RemoteState.REACHABLE) in legal
    assert not any(new is RemoteState.UNKNOWN for _, new in legal), "nothing goes back to unknown"
    assert not any(old is new for old, new in legal), "staying is not a move"
    assert len(legal) == 9


def test_a_remote_models_status_comes_from_its_remotes_state() -> None:
    assert remote_model_status(RemoteState.REACHABLE, True) is RemoteModelStatus.LOADED
    assert remote_model_status(RemoteState.REACHABLE, False) is RemoteModelStatus.AVAILABLE
    assert remote_model_status(RemoteState.UNREACHABLE, True) is RemoteModelStatus.UNREACHABLE
    assert remote_model_status(RemoteState.REFUSED, False) is RemoteModelStatus.REFUSED
    assert remote_model_status(RemoteState.UNKNOWN, False) is RemoteModelStatus.CHECKING


# --- the store -----------------------------------------------------------------------------------------


@pytest.fixture
def keychain(tmp_path: Path) -> Iterator[None]:
    with private_keychain(tmp_path / "keyrings"):
        yield


def test_remotes_round_trip_and_the_key_is_only_in_the_keychain(keychain: None, lemon_home: Path) -> None:
    key = "remote-key-0123456789"
    secrets.set_remote_key("box", key)
    records = {"box": RemoteRecord("box", "http://10.0.0.2:13305", has_key=True)}
    save_remotes(records)
    assert load_remotes().items == records
    assert json.loads(remotes_path().read_text()) == {
        "schema": 1,
        "remotes": {"box": {"url": "http://10.0.0.2:13305", "key": True}},
    }
    assert secrets.get_remote_key("box") == key
    for path in lemon_home.rglob("*"):
        if path.is_file():
            assert key not in path.read_text(errors="replace"), path
    secrets.delete_remote_key("box")
    assert secrets.get_remote_key("box") is None
    secrets.delete_remote_key("box")  # deleting nothing is not an error


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        '{"schema": 1, "remotes": []}',
        '{"schema": 1, "remotes": {"a/b": {"url": "http://h:1"}}}',
        '{"schema": 1, "remotes": {"box": {"url": "ftp://h"}}}',
        '{"schema": 1, "remotes": {"box": {"url": "http://h:1/v1"}}}',
    ],
)
def test_an_unreadable_remotes_file_is_set_aside_not_deleted(lemon_home: Path, content: str) -> None:
    remotes_path().write_text(content)
    loaded = load_remotes()
    assert loaded.items == {} and "remotes file was unreadable" in loaded.warning
    kept = list(lemon_home.glob("remotes.json.corrupt-*"))
    assert len(kept) == 1 and kept[0].read_text() == content
    assert not remotes_path().exists()
