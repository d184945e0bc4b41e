"""The window opens; the app's event loop survives a long run of callbacks; signals quit it."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Callable

import pytest
import qasync
from PySide6.QtCore import QObject, Qt
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import QApplication, QLineEdit, QMenu
from pytestqt.qtbot import QtBot

from app.store.history import History
from app.ui.chat.keeper import HistoryKeeper
from app.ui.event_loop import DesktopLoop
from app.ui.launch import QuitOnSignals
from app.ui.main_window import WINDOW_TITLE, MainWindow

SOAK_CALLBACKS = 60_000


def test_main_window_opens(qtbot: QtBot) -> None:
    window = MainWindow()
    qtbot.addWidget(window)
    window.show()
    qtbot.waitExposed(window)
    assert window.windowTitle() == WINDOW_TITLE


@pytest.mark.parametrize("make_loop", [qasync.QEventLoop, DesktopLoop], ids=["qasync", "app"])
def test_qasync_soak(qapp: QApplication, make_loop: Callable[[QApplication], qasync.QEventLoop]) -> None:
    """PySide6 6.12 on CPython 3.11 aborts after ~20,000 qasync callbacks; the pinned Qt must not, on
    qasync's own loop or the app's."""
    loop = make_loop(qapp)
    asyncio.set_event_loop(loop)

    async def spin() -> int:
        for _ in range(SOAK_CALLBACKS):
            await asyncio.sleep(0)
        return SOAK_CALLBACKS

    try:
        assert loop.run_until_complete(spin()) == SOAK_CALLBACKS
    finally:
        loop.close()
        asyncio.set_event_loop(None)


def test_lemon_desk_without_arguments_opens_the_window() -> None:
    """The real entry point: a window appears, nothing is warned about, and SIGTERM ends the app."""
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "LEMON_DESK_PRINT_READY": "1"}
    env.pop("XDG_RUNTIME_DIR", None)  # as on a machine without a login session
    with subprocess.Popen(
        [sys.executable, "-m", "app"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    ) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.strip() == f"window shown: {WINDOW_TITLE}"
        finally:
            proc.send_signal(signal.SIGTERM)
            _, stderr = proc.communicate(timeout=20)
    assert proc.returncode == 0, stderr
    assert "Warning" not in stderr, stderr


def test_a_signal_before_the_event_loop_runs_quits_once_it_does(qapp: QApplication) -> None:
    """The window shows before the app's loop runs; SIGTERM in between is not lost, nor acted on early."""
    quits: list[int] = []
    owner = QObject()
    signals = QuitOnSignals(owner, lambda: quits.append(len(quits)))
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert quits == []  # handled (the process lives), waiting for the loop
        signals.loop_runs()
        assert quits == [0]
        os.kill(os.getpid(), signal.SIGTERM)
        assert quits == [0, 1]  # once the loop runs, at once
    finally:
        signals.close()


def test_a_long_chat_title_is_elided_and_the_panes_keep_their_size(qtbot: QtBot) -> None:
    """Renamed with F2 to a long title, a chat's header ends in "…" (the whole title in its tooltip) and
    the list shows no horizontal scroll bar: the models, the options and the chat keep their widths."""
    window = MainWindow()
    qtbot.addWidget(window)
    history = History()
    try:
        history.create_conversation("lemons", "Lemons", "")
        HistoryKeeper(history, window.chat, window.conversations)
        window.show()
        qtbot.waitExposed(window)
        window.activateWindow()
        qtbot.waitUntil(window.isActiveWindow)
        sizes = window.splitter.sizes()
        listed = window.conversations.list
        listed.setCurrentRow(0)
        listed.setFocus()
        qtbot.keyClick(listed, Qt.Key.Key_F2)
        editor = listed.findChild(QLineEdit)
        assert editor is not None
        title = "Renamed ünïcødé chat with a very very long title that keeps going and going and going along"
        editor.setText(title)
        qtbot.keyClick(editor, Qt.Key.Key_Return)
        qtbot.waitUntil(lambda: window.chat.title.text() == title)
        qtbot.wait(50)  # a layout pass

        assert window.splitter.sizes() == sizes
        shown = window.chat.title.shown_text()
        assert shown.endswith("…") and title.startswith(shown[:-1]) and window.chat.title.toolTip() == title
        assert listed.item(0).text() == title and listed.horizontalScrollBar().maximum() == 0
        reload = window.models.load_button
        assert reload.width() >= reload.sizeHint().width()
    finally:
        history.close()


def test_file_new_chat_shows_ctrl_n_and_the_key_still_starts_a_new_chat(qtbot: QtBot) -> None:
    window = MainWindow()
    qtbot.addWidget(window)
    window.show()
    qtbot.waitExposed(window)
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow)
    file_menu = window.menuBar().actions()[0].menu()
    assert isinstance(file_menu, QMenu)
    new_chat = next(a for a in file_menu.actions() if a.text() == "New chat")
    assert new_chat.shortcut() == QKeySequence(QKeySequence.StandardKey.New)

    before = window.chat.conversation_id
    window.models.tree.setFocus()
    qtbot.keyClick(window.models.tree, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert window.chat.conversation_id != before  # one shortcut for the key: not ambiguous
    assert window.chat.composer.hasFocus()
