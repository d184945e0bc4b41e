"""The bridge translates and the desktop does no file or keychain I/O on the window's thread: the reply's
signals carry the router's dataclasses, the router says which model a message goes to, start-up makes
the router in a worker thread, and saving the settings writes the file and the keychain from one."""

from __future__ import annotations

import dataclasses
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from huggingface_hub.constants import HF_HUB_CACHE
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.client.events import ChatDelta, ChatDone
from app.core.chat import MessageState
from app.core.errors import RequestError
from app.core.runcard import RunCard
from app.store import secrets
from app.store.paths import resource
from app.store.settings import Settings, load_settings, save_settings
from app.ui.desktop import DesktopApp
from app.ui.settings_dialog import SettingsDialog
from tests.support.keychain import private_keychain
from tests.support.standin import make_standin_model

Desktop = Callable[[], DesktopApp]

# Python's audit hook sees every file Python opens ("open": open(), io.open, os.open), with the thread
# that opened it. A hook cannot be removed, so one is added once and records only while asked.
_recording: list[tuple[str, str]] = []  # (thread name, path)
_on: list[bool] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _on and event == "open" and isinstance(args[0], str | Path):
        _recording.append((threading.current_thread().name, str(args[0])))


sys.addaudithook(_audit)


@pytest.fixture
def opened_files() -> Iterator[list[tuple[str, str]]]:
    """The files opened while the test runs, with the name of the thread that opened each."""
    _recording.clear()
    _on.append(True)
    yield _recording
    _on.clear()


@pytest.fixture
def keychain(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with private_keychain(tmp_path / "keyrings"):
        yield


def on_ui_thread(opened: list[tuple[str, str]], *roots: Path) -> list[str]:
    """The files under ``roots`` opened on the window's thread (Python's own imports aside)."""
    main = threading.main_thread().name
    return [
        p
        for thread, p in opened
        if thread == main
        and any(Path(p).is_relative_to(r) for r in roots)
        and not p.endswith((".py", ".pyc"))
    ]


def app_files(home: Path) -> tuple[Path, ...]:
    """Where the app's own files are: its home, its resources (the catalog), the models' cache."""
    return home, resource("server_models.json").parent, Path(HF_HUB_CACHE)


def test_start_up_opens_none_of_the_apps_files_on_the_windows_thread(
    qtbot: QtBot, qapp: Any, qt_loop: object, lemon_home: Path, opened_files: list[tuple[str, str]]
) -> None:
    """The settings and the window's state are read before the loop runs, for the first paint; from
    ``start()`` on (catalog, saved options, remotes, downloads, backends), files are read in workers."""
    save_settings(Settings(api_enabled=False))
    (lemon_home / "models").mkdir(parents=True)
    app = DesktopApp(qapp)
    app.exit_app = lambda: None
    qtbot.addWidget(app.window)
    app.window.show()
    qtbot.waitExposed(app.window)
    opened_files.clear()
    app.start()
    with qtbot.waitSignal(app.bridge.downloads_changed, timeout=30_000):
        pass  # the downloads the last run left are opened near the end of start-up
    with qtbot.waitSignal(app.bridge.models_changed, timeout=30_000):
        pass  # and the models read again, last
    roots = app_files(lemon_home)
    try:
        read = [p for _, p in opened_files if any(Path(p).is_relative_to(r) for r in roots)]
        assert resource("server_models.json") in map(Path, read), "the catalog was read (in a worker)"
        assert on_ui_thread(opened_files, *roots) == []
    finally:
        app.quit()
        qtbot.waitUntil(lambda: app.finished, timeout=60_000)


def test_saving_settings_writes_the_file_and_the_keychain_from_a_worker_thread(
    qtbot: QtBot,
    desktop: Desktop,
    keychain: None,
    lemon_home: Path,
    opened_files: list[tuple[str, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keychain_threads: list[str] = []
    real_set = secrets.set_hf_token

    def set_hf_token(token: str) -> None:  # the real keychain, noting the thread that asked it
        keychain_threads.append(threading.current_thread().name)
        real_set(token)

    monkeypatch.setattr(secrets, "set_hf_token", set_hf_token)
    app = desktop()
    app.open_settings()
    dialog = app.dialog
    assert isinstance(dialog, SettingsDialog)
    opened_files.clear()
    dialog.token.setText("hf_worker_thread_token")
    dialog.idle_unload.setValue(7)
    with qtbot.waitSignal(dialog.finished):
        qtbot.mouseClick(dialog.buttons.button(dialog.buttons.StandardButton.Save), Qt.MouseButton.LeftButton)
    opened = list(opened_files)  # what the test reads next is its own
    assert load_settings().settings.idle_unload_minutes == 7
    assert secrets.get_hf_token() == "hf_worker_thread_token"
    assert keychain_threads and threading.main_thread().name not in keychain_threads
    assert any("settings.json" in Path(p).name for _, p in opened), "written (in a worker)"
    assert on_ui_thread(opened, *app_files(lemon_home)) == []


def test_the_reply_signals_carry_the_routers_dataclasses(
    qtbot: QtBot, desktop: Desktop, standin_settings: Settings, tmp_path: Path
) -> None:
    save_settings(dataclasses.replace(standin_settings, api_enabled=False))
    app = desktop()
    bridge = app.bridge
    with qtbot.waitSignal(bridge.model_added) as added:
        bridge.import_model(str(make_standin_model(tmp_path, "said", tokens=5)))
    name = added.args[0]
    bridge.save_options(name, dataclasses.replace(bridge.options(name), backend="system"))
    app.window.models.select(name)
    assert bridge.selected == name
    deltas: list[object] = []
    cards: list[object] = []
    ends: list[object] = []
    bridge.reply_delta.connect(deltas.append)
    bridge.reply_card.connect(cards.append)
    bridge.reply_finished.connect(ends.append)
    chat = app.window.chat
    chat.composer.setPlainText("hello")
    chat.submit()
    qtbot.waitUntil(lambda: chat.messages()[-1].state is MessageState.COMPLETE, timeout=120_000)
    reply = chat.messages()[-1]
    assert deltas and all(isinstance(d, ChatDelta) for d in deltas)
    assert reply.content == "".join(d.content for d in deltas if isinstance(d, ChatDelta))
    (card,) = cards
    assert isinstance(card, RunCard) and card.model == name
    assert reply.run_card is not None and reply.run_card["model"] == name
    (end,) = ends
    assert isinstance(end, ChatDone)
    assert reply.telemetry == end.telemetry.to_json()


def test_the_router_says_which_model_a_message_goes_to(
    qtbot: QtBot, desktop: Desktop, standin_settings: Settings, tmp_path: Path
) -> None:
    save_settings(dataclasses.replace(standin_settings, api_enabled=False))
    app = desktop()
    bridge = app.bridge
    with qtbot.waitSignal(bridge.model_added) as added:
        bridge.import_model(str(make_standin_model(tmp_path, "where", tokens=2)))
    name = added.args[0]
    router = bridge.router
    assert router.chat_target(name, {name}) == name  # on disk: loaded on demand
    assert router.chat_target(name, set()) == ""  # neither on disk nor loaded, and nothing else is
    assert router.chat_target("@nowhere/model", set()) == ""  # a remote nobody knows
    with qtbot.waitSignal(bridge.reply_failed) as failed:
        bridge.send("@nowhere/model", [{"role": "user", "content": "hi"}], {})
    assert failed.args[0].startswith("No model is loaded")
    # A reply of a model with no engine says its error alone: there are no last words to quote.
    error = RequestError("The engine answered 500.", "Try again.")
    assert router.failure_message(name, error) == str(error)
