"""The Settings dialog holds every setting an error message points to, validates them, and saves them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialogButtonBox, QGroupBox, QLabel, QPushButton
from pytestqt.qtbot import QtBot

from app.store.settings import LOAD_TIMEOUT_RANGE_S, load_settings
from app.ui.desktop import DesktopApp
from app.ui.settings_dialog import SettingsDialog


@pytest.fixture
def opened(
    qtbot: QtBot, desktop: Callable[[], DesktopApp], lemon_home: Path, monkeypatch: pytest.MonkeyPatch
) -> SettingsDialog:
    monkeypatch.setenv("HF_TOKEN", "hf_from_the_environment")  # the keychain is not asked
    app = desktop()
    app.open_settings()
    dialog = app.dialog
    assert isinstance(dialog, SettingsDialog)
    qtbot.waitExposed(dialog)
    return dialog


def _save_button(dialog: SettingsDialog) -> QPushButton:
    button = dialog.buttons.button(QDialogButtonBox.StandardButton.Save)
    assert button is not None
    return button


def test_the_settings_that_messages_name_are_in_the_dialog(opened: SettingsDialog) -> None:
    labels = {label.text() for label in opened.findChildren(QLabel)}
    # The names error messages use: "raise the load timeout in Settings", "raise the request timeout in
    # Settings", "set its path in Settings" (llama-server), "choose another models folder in the settings".
    named = ("Load timeout", "Request timeout", "llama-server path", "Models folder", "Hugging Face token")
    assert set(named) <= labels
    assert (opened.load_timeout.value(), opened.load_timeout.suffix()) == (600, " s")
    assert (opened.request_timeout.value(), opened.request_timeout.suffix()) == (300, " s")


def test_timeouts_and_llama_server_path_are_saved(
    qtbot: QtBot, opened: SettingsDialog, tmp_path: Path
) -> None:
    server = tmp_path / "bin" / "llama-server"
    server.parent.mkdir()
    server.write_text("#!/bin/sh\necho 'version: 4242'\n")
    server.chmod(0o755)
    opened.load_timeout.clear()
    qtbot.keyClicks(opened.load_timeout, "1200")
    opened.request_timeout.setValue(45)
    opened.llama_server.setFocus()
    qtbot.keyClicks(opened.llama_server, str(server))
    save = _save_button(opened)
    assert save.isEnabled()
    with qtbot.waitSignal(opened.finished):
        qtbot.mouseClick(save, Qt.MouseButton.LeftButton)
    saved = load_settings().settings
    assert (saved.load_timeout_s, saved.request_timeout_s, saved.llama_server_path) == (
        1200.0,
        45.0,
        str(server),
    )


def test_a_llama_server_path_that_cannot_run_is_refused(
    qtbot: QtBot, opened: SettingsDialog, tmp_path: Path
) -> None:
    save = _save_button(opened)
    not_executable = tmp_path / "llama-server"
    not_executable.write_text("not a program")
    cases = {
        str(tmp_path / "missing" / "llama-server"): "There is no file at",
        str(not_executable): "is not executable",
        "bin/llama-server": "must be a full path",
    }
    for path, problem in cases.items():
        opened.llama_server.setText(path)
        assert problem in opened.problem.text() and opened.problem.isVisible()
        assert not save.isEnabled()
    opened.llama_server.clear()  # empty: llama-server is looked for on PATH
    assert save.isEnabled() and not opened.problem.isVisible()


def test_timeouts_stay_within_their_range(opened: SettingsDialog) -> None:
    opened.load_timeout.setValue(1)
    assert opened.load_timeout.value() == LOAD_TIMEOUT_RANGE_S[0]


def test_the_dialog_fits_a_laptop_screen_with_its_sections_on_three_pages(opened: SettingsDialog) -> None:
    # 1366 x 768 less a panel and the title bar: about 700 pixels high. It was 786 on one page.
    hint = opened.sizeHint()
    assert hint.height() <= 700 and hint.width() <= 1366 and opened.height() <= 700
    tabs = opened.pages
    pages = {tabs.tabText(i).replace("&", ""): tabs.widget(i) for i in range(tabs.count())}  # &: Alt+G, Alt+C
    titles = {name: [box.title() for box in page.findChildren(QGroupBox)] for name, page in pages.items()}
    assert titles == {
        "General": ["Downloads", "Engines"],
        "Connections": ["Local API", "Other machines (llama.cpp RPC)", "Remotes"],
        "Tools": ["MCP servers", "Tool calls"],
    }
    assert opened.keep_in_tray.parent() is pages["General"]
