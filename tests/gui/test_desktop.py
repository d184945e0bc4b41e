"""The app around the window: tray menu, closing to the tray, settings, window state, single instance."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QIcon, QPalette
from PySide6.QtWidgets import QApplication, QLineEdit, QMessageBox
from pytestqt.qtbot import QtBot

from app.core.chat import ChatMessage, MessageState
from app.core.models import Model
from app.core.status import ModelStatus, Status
from app.store import secrets
from app.store.library import ModelFiles
from app.store.settings import load_settings, save_settings
from app.supervisor.router import ModelView
from app.ui.chat.markdown_view import CodeBlockView
from app.ui.chat.render import DARK, LIGHT
from app.ui.desktop import DesktopApp
from app.ui.main_window import WINDOW_TITLE
from app.ui.settings_dialog import SettingsDialog
from app.ui.single_instance import SingleInstance
from app.ui.tray import Tray
from tests.support.keychain import private_keychain

TOKEN = "hf_ui_test_secret_0123456789"


def rows(names: list[str], loaded: set[str]) -> list[ModelView]:
    views = []
    for name in names:
        model = Model(name, "llamacpp", f"/models/{name}.gguf", size_gb=1.0, user=True)
        status = ModelStatus(Status.LOADED if name in loaded else Status.DOWNLOADED)
        views.append(ModelView(model, status, True, 10**9, ModelFiles(model, None)))
    return views


def test_tray_menu_is_driven_by_data_and_emits_intents(qtbot: QtBot) -> None:
    tray = Tray(QIcon())
    tray.set_models(["llama-3b", "qwen-7b", "smollm2"], {"qwen-7b"})
    loads = tray.load_actions()
    assert list(loads) == ["llama-3b", "qwen-7b", "smollm2"]
    assert [a.isChecked() for a in loads.values()] == [False, True, False]
    with qtbot.waitSignal(tray.load_requested) as load:
        loads["smollm2"].trigger()
    assert load.args == ["smollm2"]
    assert not tray.load_actions()["smollm2"].isChecked()  # not loaded yet: no check mark
    tray.set_models(["llama-3b", "qwen-7b", "smollm2"], {"qwen-7b", "smollm2"})  # the load finished
    assert tray.load_actions()["smollm2"].isChecked()
    with qtbot.assertNotEmitted(tray.load_requested):
        tray.load_actions()["qwen-7b"].trigger()  # already loaded: nothing to do
    assert tray.load_actions()["qwen-7b"].isChecked()
    unloads = tray.unload_actions()
    assert list(unloads) == ["qwen-7b", "smollm2", "Unload all"]
    with qtbot.waitSignal(tray.unload_requested) as unload:
        unloads["qwen-7b"].trigger()
    assert unload.args == ["qwen-7b"]
    with qtbot.waitSignal(tray.unload_all_requested):
        unloads["Unload all"].trigger()
    tray.set_models(["llama-3b", "qwen-7b"], {"qwen-7b"}, frozenset({"qwen-7b"}))
    pins = {a.text(): a for a in tray.pin_menu.actions()}
    assert [a.isChecked() for a in pins.values()] == [False, True]
    with qtbot.waitSignal(tray.pin_requested) as pin:
        pins["llama-3b"].trigger()
    assert pin.args == ["llama-3b", True]
    with qtbot.waitSignal(tray.pin_requested) as pin:
        pins["qwen-7b"].trigger()
    assert pin.args == ["qwen-7b", False]
    with qtbot.waitSignal(tray.open_requested):
        tray.open_action.trigger()
    with qtbot.waitSignal(tray.notified) as note:
        tray.notify("Model loaded", "smollm2 is ready.")
    assert note.args == ["Model loaded", "smollm2 is ready."]
    tray.set_models([], set())
    assert not tray.unload_actions()["Unload all"].isEnabled()
    assert [a.text() for a in tray.load_menu.actions()] == ["No downloaded models"]


def test_closing_the_window_keeps_the_app_in_the_tray_when_set(
    qtbot: QtBot, desktop: Callable[[], DesktopApp], qapp: QApplication
) -> None:
    app = desktop()
    assert not qapp.quitOnLastWindowClosed()
    # With no tray on this screen, keep-in-tray would hide the window for good: closing quits instead.
    assert app.settings.keep_in_tray and not Tray.available()
    assert not app.window.keep_in_tray
    app.window.keep_in_tray = True  # as on a desktop with a tray
    with qtbot.assertNotEmitted(app.window.closed):
        app.window.close()
    assert app.window.isHidden()
    with qtbot.waitSignal(app.tray.open_requested):
        app.tray.open_action.trigger()
    assert app.window.isVisible()
    app.window.keep_in_tray = False
    with qtbot.waitSignal(app.window.closed):
        app.window.close()
    assert app.quitting


def test_tray_notifications_show_in_the_status_bar(qtbot: QtBot, desktop: Callable[[], DesktopApp]) -> None:
    app = desktop()
    app.tray.notify("Load failed", "The engine exited: out of memory.", error=True)
    assert app.window.statusBar().currentMessage() == "Load failed: The engine exited: out of memory."


def test_window_state_is_remembered(
    qtbot: QtBot, desktop: Callable[[], DesktopApp], lemon_home: Path
) -> None:
    app = desktop()
    app.window.set_rows(rows(["alpha", "beta", "gamma"], {"beta"}))
    app.window.models.select("gamma")
    app.window.resize(760, 560)  # within the offscreen screen (800 x 600), which restoring respects
    app.window.splitter.setSizes([150, 460, 150])
    size, sizes = app.window.size(), app.window.splitter.sizes()
    assert size.width() == 760 and sizes[0] == 150
    app.quit()
    qtbot.waitUntil(lambda: app.finished)
    assert (lemon_home / "window.ini").is_file()
    again = desktop()
    again.window.set_rows(rows(["alpha", "beta", "gamma"], set()))
    assert again.window.size() == size
    assert again.window.splitter.sizes() == sizes
    assert again.window.models.selected() == "gamma"
    assert again.window.last_model() == "gamma"


def test_model_list_and_status_bar_follow_the_data(qtbot: QtBot, desktop: Callable[[], DesktopApp]) -> None:
    app = desktop()
    window = app.window
    assert window.model_status.text() == "No model loaded"
    window.set_rows(rows(["alpha", "beta"], {"beta"}))
    assert window.models.visible_names() == ["alpha", "beta"]
    assert window.models.tree.topLevelItem(1).text(3) == "● loaded"
    assert window.model_status.text() == "Loaded: beta"
    window.chat.composer.setPlainText("hi")
    window.chat.submit()  # no engine is loaded: the bridge answers at once
    reply = window.chat.messages()[-1]
    assert reply.state is MessageState.FAILED and "No model is loaded" in reply.error
    window.show_telemetry({"ttft_s": 0.5, "decode_tps": 12.0, "completion_tokens": 3})
    assert window.telemetry_status.text() == "TTFT 0.50 s · decode 12.0 tok/s · 3 tokens"


@pytest.fixture
def keychain(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with private_keychain(tmp_path / "keyrings"):
        yield


def test_settings_dialog_saves_settings_and_keeps_the_token_in_the_keychain_only(
    qtbot: QtBot,
    desktop: Callable[[], DesktopApp],
    keychain: None,
    lemon_home: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    app = desktop()
    app.window.activateWindow()
    qtbot.waitUntil(app.window.isActiveWindow)
    qtbot.keyClick(app.window, Qt.Key.Key_Comma, Qt.KeyboardModifier.ControlModifier)
    dialog = app.dialog
    assert isinstance(dialog, SettingsDialog)
    assert dialog.token.echoMode() == QLineEdit.EchoMode.Password
    assert not dialog.remove_token.isEnabled()  # nothing stored yet
    qtbot.keyClicks(dialog.token, TOKEN)
    dialog.mirror.setFocus()
    qtbot.keyClicks(dialog.mirror, "ftp://mirror.example")
    save = dialog.buttons.button(dialog.buttons.StandardButton.Save)
    assert not save.isEnabled() and "http" in dialog.problem.text()
    dialog.mirror.clear()
    qtbot.keyClicks(dialog.mirror, "http://127.0.0.1:8123")
    assert save.isEnabled()
    dialog.max_loaded.setText('{"gpu": 0}')
    assert not save.isEnabled() and "gpu must be a whole number" in dialog.problem.text()
    dialog.max_loaded.setText("3")
    dialog.idle_unload.setValue(15)
    dialog.keep_in_tray.setChecked(False)
    with qtbot.waitSignal(dialog.finished):
        qtbot.mouseClick(save, Qt.MouseButton.LeftButton)
    saved = load_settings().settings
    assert (saved.release_mirror, saved.max_loaded_models, saved.keep_in_tray) == (
        "http://127.0.0.1:8123",
        3,
        False,
    )
    live = app.bridge.router.settings  # applied at once: no restart
    assert (live.max_loaded_models, live.idle_unload_minutes, live.release_mirror) == (
        3,
        15,
        "http://127.0.0.1:8123",
    )
    assert secrets.get_hf_token() == TOKEN
    for path in lemon_home.rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path
    out, err = capfd.readouterr()
    assert TOKEN not in out + err

    app.open_settings()  # again: the token is there but not shown; remove it
    dialog = app.dialog
    assert isinstance(dialog, SettingsDialog)
    assert dialog.token.text() == "" and dialog.remove_token.isEnabled()
    assert "keychain" in dialog.token.placeholderText()
    qtbot.mouseClick(dialog.remove_token, Qt.MouseButton.LeftButton)
    with qtbot.waitSignal(dialog.finished):
        qtbot.mouseClick(dialog.buttons.button(dialog.buttons.StandardButton.Save), Qt.MouseButton.LeftButton)
    assert secrets.get_hf_token() is None
    assert load_settings().settings.max_loaded_models == 3


def test_a_bad_settings_file_is_reported_and_set_aside(
    qtbot: QtBot, desktop: Callable[[], DesktopApp], lemon_home: Path
) -> None:
    save_settings(load_settings().settings)
    (lemon_home / "settings.json").write_text("{not json")
    app = desktop()
    (box,) = app.window.findChildren(QMessageBox)
    assert box.text().startswith("Settings file was unreadable") and box.isVisible()
    assert list(lemon_home.glob("settings.json.corrupt-*"))
    assert app.settings == load_settings().settings


def _launch(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "app"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def test_a_second_launch_raises_the_first_window_and_exits(lemon_home: Path) -> None:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "LEMON_DESK_PRINT_READY": "1"}
    with _launch(env) as first:
        try:
            assert first.stdout is not None
            assert first.stdout.readline().strip() == f"window shown: {WINDOW_TITLE}"
            second = subprocess.run(
                [sys.executable, "-m", "app"], env=env, capture_output=True, text=True, timeout=60
            )
            assert second.returncode == 0, second.stderr
            assert "window shown" not in second.stdout  # no second window
            assert first.stdout.readline().strip() == "asked to show the window"
        finally:
            first.send_signal(signal.SIGTERM)
            _, stderr = first.communicate(timeout=30)
        assert first.returncode == 0, stderr
    # The window state was saved on the way out.
    assert (lemon_home / "window.ini").is_file()


def _lock_is_held(instance: SingleInstance) -> bool:
    with instance.path.with_suffix(".lock").open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False


def test_a_launch_during_the_first_ones_start_up_waits_then_hands_over(qtbot: QtBot) -> None:
    """The first instance listens only once its window shows; until then it holds the lock, which a
    second launch waits for before it looks for the socket."""
    first = SingleInstance()
    assert first.claim()
    assert _lock_is_held(first)  # from the check until listening: another launch waits here
    first.listen()
    assert not _lock_is_held(first)
    with qtbot.waitSignal(first.activation_requested):
        assert not SingleInstance().claim()  # it found the first listening and asked it to show
    first.close()


def test_an_instance_that_died_does_not_block_the_next_launch(lemon_home: Path) -> None:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "LEMON_DESK_PRINT_READY": "1"}
    with _launch(env) as first:
        assert first.stdout is not None
        assert first.stdout.readline().startswith("window shown")
        first.kill()  # leaves its socket file behind
    with _launch(env) as second:
        try:
            assert second.stdout is not None
            assert second.stdout.readline().strip() == f"window shown: {WINDOW_TITLE}"
        finally:
            second.send_signal(signal.SIGTERM)
            second.communicate(timeout=30)
    assert second.returncode == 0


def test_install_desktop_entry_writes_the_entry_and_icons(tmp_path: Path) -> None:
    data_home = tmp_path / "xdg-data"
    env = {**os.environ, "XDG_DATA_HOME": str(data_home)}
    done = subprocess.run(
        [sys.executable, "-m", "app", "--install-desktop-entry"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    entry = (data_home / "applications" / "lemon-desk.desktop").read_text()
    fields = dict(line.split("=", 1) for line in entry.splitlines() if "=" in line)
    assert entry.startswith("[Desktop Entry]\n")
    assert (
        fields["Type"] == "Application" and fields["Name"] == "Lemon Desk" and fields["Icon"] == "lemon-desk"
    )
    executable = fields["Exec"].split()[0]
    assert os.access(executable, os.X_OK)
    hicolor = data_home / "icons" / "hicolor"
    assert (hicolor / "scalable" / "apps" / "lemon-desk.svg").read_text().startswith("<svg")
    for size in (16, 32, 48, 64, 128, 256):
        png = (hicolor / f"{size}x{size}" / "apps" / "lemon-desk.png").read_bytes()
        assert png.startswith(b"\x89PNG\r\n\x1a\n")
        assert int.from_bytes(png[16:20], "big") == size  # the IHDR width
    # The launcher's command really starts the app: ask it for its version.
    version = subprocess.run([executable, "--version"], capture_output=True, text=True, timeout=60)
    assert version.stdout.startswith("lemon-desk ")


def test_install_desktop_entry_into_an_unwritable_place_is_one_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    env = {**os.environ, "XDG_DATA_HOME": str(blocker)}
    done = subprocess.run(
        [sys.executable, "-m", "app", "--install-desktop-entry"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.startswith("error: Could not write the desktop entry")
    assert "Traceback" not in done.stderr


def test_colours_follow_the_system_scheme(
    qtbot: QtBot, desktop: Callable[[], DesktopApp], qapp: QApplication
) -> None:
    app = desktop()
    chat = app.window.chat
    chat.show_conversation(
        "c", "Code", "", [ChatMessage("user", "x"), ChatMessage("assistant", "```py\nx = 1\n```")]
    )
    (block,) = chat.transcript.views()[-1].body.findChildren(CodeBlockView)
    assert LIGHT.code_background in block.styleSheet()
    light = qapp.palette()
    dark = QPalette(light)
    for role, colour in ((QPalette.ColorRole.Window, "#232629"), (QPalette.ColorRole.WindowText, "#eff0f1")):
        dark.setColor(role, QColor(colour))
    qapp.setPalette(dark)
    try:
        QGuiApplication.styleHints().colorSchemeChanged.emit(Qt.ColorScheme.Dark)
        (block,) = chat.transcript.views()[-1].body.findChildren(CodeBlockView)
        assert DARK.code_background in block.styleSheet()
        assert [m.content for m in chat.messages()] == ["x", "```py\nx = 1\n```"]
    finally:
        qapp.setPalette(light)


def test_a_start_that_fails_is_explained_and_the_app_quits(
    qtbot: QtBot, qapp: QApplication, qt_loop: object, monkeypatch: pytest.MonkeyPatch, lemon_home: Path
) -> None:
    """A history that cannot be opened (a fake failure: root writes anywhere, so no real unwritable home)
    must not leave a window that can do nothing."""

    def unwritable(*_: object, **__: object) -> None:
        raise PermissionError(13, "Permission denied", str(lemon_home / "history.sqlite3"))

    monkeypatch.setattr("app.store.history.History.__init__", unwritable)
    app = DesktopApp(qapp)
    app.exit_app = lambda: None
    qtbot.addWidget(app.window)
    app.window.show()
    app.start_or_explain()
    box = app.start_failure
    assert box is not None and box.isVisible() and not app.started
    assert "Permission denied" in box.text() and f"Check that {lemon_home} is writable" in box.text()
    box.accept()
    qtbot.waitUntil(lambda: app.finished)
