"""Conversations saved as they stream, listed, searched, renamed, deleted and exported through the UI."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QFileDialog, QLineEdit, QMessageBox, QWidget
from pytestqt.qtbot import QtBot

from app.core.chat import MessageState
from app.store.history import History, history_path
from app.ui.chat.keeper import SAVE_INTERVAL_MS, HistoryKeeper
from app.ui.chat.pane import ChatPane
from app.ui.chat.sidebar import ConversationList


@dataclass
class ChatUI:
    window: QWidget
    pane: ChatPane
    sidebar: ConversationList
    keeper: HistoryKeeper
    history: History

    def titles(self) -> list[str]:
        return [self.sidebar.list.item(i).text() for i in range(self.sidebar.list.count())]


@pytest.fixture
def chat_ui(qtbot: QtBot) -> Iterator[Callable[[], ChatUI]]:
    uis: list[ChatUI] = []

    def make() -> ChatUI:
        window = QWidget()
        qtbot.addWidget(window)
        sidebar = ConversationList(window)
        pane = ChatPane(window)
        sidebar.setGeometry(0, 0, 260, 700)
        pane.setGeometry(260, 0, 800, 700)
        history = History()
        ui = ChatUI(window, pane, sidebar, HistoryKeeper(history, pane, sidebar), history)
        window.resize(1060, 700)
        window.show()
        qtbot.waitExposed(window)
        window.activateWindow()
        qtbot.waitUntil(window.isActiveWindow)
        uis.append(ui)
        return ui

    yield make
    for ui in uis:
        ui.history.close()


def chat(qtbot: QtBot, ui: ChatUI, text: str, reply: str, telemetry: dict[str, float] | None = None) -> None:
    ui.pane.composer.setFocus()
    qtbot.keyClicks(ui.pane.composer, text)
    with qtbot.waitSignal(ui.pane.send_requested):
        qtbot.keyClick(ui.pane.composer, Qt.Key.Key_Return)
    ui.pane.begin_reply()
    ui.pane.append_reply(reply, "thinking")
    with qtbot.waitSignal(ui.pane.reply_finished):
        ui.pane.finish_reply(telemetry)


def test_a_conversation_is_saved_listed_and_found_after_a_restart(
    qtbot: QtBot, chat_ui: Callable[[], ChatUI]
) -> None:
    ui = chat_ui()
    chat(qtbot, ui, "What is the capital of France?", "Paris.", {"ttft_s": 0.1, "decode_tps": 20.0})
    assert ui.titles() == ["What is the capital of France?"]
    assert ui.pane.title.text() == "What is the capital of France?"
    chat(qtbot, ui, "And of Spain?", "Madrid.")
    stored = ui.history.conversation(ui.pane.conversation_id)
    assert stored is not None
    assert [(m.role, m.content, m.state) for m in stored.messages] == [
        ("user", "What is the capital of France?", MessageState.COMPLETE),
        ("assistant", "Paris.", MessageState.COMPLETE),
        ("user", "And of Spain?", MessageState.COMPLETE),
        ("assistant", "Madrid.", MessageState.COMPLETE),
    ]
    assert stored.messages[1].telemetry == {"ttft_s": 0.1, "decode_tps": 20.0}
    assert stored.messages[1].reasoning == "thinking"
    conversation_id = ui.pane.conversation_id

    qtbot.keyClick(ui.pane.composer, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    chat(qtbot, ui, "Second chat", "Sure.")
    assert ui.titles() == ["Second chat", "What is the capital of France?"]  # newest first

    restarted = chat_ui()  # a new window over the same file
    assert restarted.titles() == ["Second chat", "What is the capital of France?"]
    restarted.sidebar.list.setFocus()
    restarted.sidebar.list.setCurrentRow(1)
    assert restarted.pane.conversation_id == conversation_id
    assert [m.content for m in restarted.pane.messages()] == [
        "What is the capital of France?",
        "Paris.",
        "And of Spain?",
        "Madrid.",
    ]
    # Regenerate there: the old reply goes from the store too.
    last = restarted.pane.transcript.views()[-1]
    with qtbot.waitSignal(restarted.pane.send_requested):
        qtbot.mouseClick(last.regenerate_button, Qt.MouseButton.LeftButton)
    restarted.pane.begin_reply()
    restarted.pane.append_reply("Madrid, of course.")
    restarted.pane.finish_reply(None)
    stored = restarted.history.conversation(conversation_id)
    assert stored is not None
    assert [m.content for m in stored.messages][-2:] == ["And of Spain?", "Madrid, of course."]


def test_a_hand_edited_conversation_is_listed_and_opens(qtbot: QtBot, chat_ui: Callable[[], ChatUI]) -> None:
    """A title that is a blob and an update time that is text stopped the window at start (the list's
    first refresh); a reply whose state is unknown or whose figures are a list stopped it opening."""
    history = History()
    history.create_conversation("c", "Damaged")
    history.append_message("c", "user", "hello")
    reply = history.append_message("c", "assistant", "hi there")
    history.update_message(reply, "hi there", telemetry={"ttft_s": 0.1})
    history.close()
    db = sqlite3.connect(history_path())
    db.execute("UPDATE conversations SET title = X'4869', updated_at = 'soon'")
    db.execute("UPDATE messages SET state = 'bogus', telemetry = '[1, 2]' WHERE role = 'assistant'")
    db.commit()
    db.close()
    ui = chat_ui()
    assert ui.titles() == ["Hi"]
    ui.sidebar.list.setFocus()
    ui.sidebar.list.setCurrentRow(0)
    assert ui.pane.conversation_id == "c"
    assert [(m.role, m.content, m.state, m.telemetry) for m in ui.pane.messages()] == [
        ("user", "hello", MessageState.COMPLETE, None),
        ("assistant", "hi there", MessageState.COMPLETE, None),
    ]


def test_a_streaming_reply_is_written_while_it_arrives(qtbot: QtBot, chat_ui: Callable[[], ChatUI]) -> None:
    ui = chat_ui()
    qtbot.keyClicks(ui.pane.composer, "Tell me a story")
    qtbot.keyClick(ui.pane.composer, Qt.Key.Key_Return)
    ui.pane.begin_reply()
    ui.pane.append_reply("Once upon a time", "plot")

    def partial_saved() -> bool:
        stored = ui.history.conversation(ui.pane.conversation_id)
        assert stored is not None
        reply = stored.messages[-1]
        return reply.state is MessageState.STREAMING and reply.content == "Once upon a time"

    qtbot.waitUntil(partial_saved, timeout=SAVE_INTERVAL_MS * 8)
    with qtbot.waitSignal(ui.pane.stop_requested):
        qtbot.keyClick(ui.pane.composer, Qt.Key.Key_Escape)
    stored = ui.history.conversation(ui.pane.conversation_id)
    assert stored is not None
    assert (stored.messages[-1].state, stored.messages[-1].reasoning) == (MessageState.STOPPED, "plot")


def test_search_rename_and_delete_from_the_list(qtbot: QtBot, chat_ui: Callable[[], ChatUI]) -> None:
    ui = chat_ui()
    chat(qtbot, ui, "Boiling eggs", "Nine minutes for hard-boiled.")
    qtbot.keyClick(ui.pane.composer, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    chat(qtbot, ui, "Rust lifetimes", "They describe how long references live.")
    egg_id = ui.sidebar.list.item(1).data(Qt.ItemDataRole.UserRole)

    qtbot.keyClicks(ui.sidebar.search, "hard-boil")  # a word inside a reply
    qtbot.waitUntil(lambda: ui.titles() == ["Boiling eggs"])
    ui.sidebar.search.clear()
    qtbot.waitUntil(lambda: len(ui.titles()) == 2)

    # Rename with F2 and typing.
    ui.sidebar.list.setFocus()
    ui.sidebar.list.setCurrentRow(1)
    assert ui.pane.conversation_id == egg_id
    qtbot.keyClick(ui.sidebar.list, Qt.Key.Key_F2)
    editor = ui.sidebar.list.findChild(QLineEdit)
    assert editor is not None
    editor.selectAll()
    qtbot.keyClicks(editor, "Eggs, boiled")
    qtbot.keyClick(editor, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: "Eggs, boiled" in ui.titles())
    stored = ui.history.conversation(egg_id)
    assert stored is not None and stored.title == "Eggs, boiled"
    assert ui.pane.title.text() == "Eggs, boiled"

    # Delete with the Delete key, after saying yes.
    row = ui.titles().index("Eggs, boiled")
    ui.sidebar.list.setCurrentRow(row)
    ui.sidebar.list.setFocus()
    qtbot.keyClick(ui.sidebar.list, Qt.Key.Key_Delete)
    box = ui.sidebar.dialog
    assert isinstance(box, QMessageBox) and "Eggs, boiled" in box.text()
    qtbot.mouseClick(box.button(QMessageBox.StandardButton.Cancel), Qt.MouseButton.LeftButton)
    assert ui.history.conversation(egg_id) is not None  # Cancel keeps it
    qtbot.keyClick(ui.sidebar.list, Qt.Key.Key_Delete)
    box = ui.sidebar.dialog
    assert isinstance(box, QMessageBox)
    qtbot.mouseClick(box.button(QMessageBox.StandardButton.Yes), Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: ui.titles() == ["Rust lifetimes"])
    assert ui.history.conversation(egg_id) is None
    assert ui.pane.conversation_id != egg_id and ui.pane.messages() == []  # it was open: a new chat now


def test_delete_and_f2_act_on_a_chat_just_clicked_but_not_while_typing(
    qtbot: QtBot, chat_ui: Callable[[], ChatUI]
) -> None:
    """Clicking a chat in the list leaves the focus there, so Delete and F2 act on it; in the message
    box, Delete deletes a character, never a chat."""
    ui = chat_ui()
    chat(qtbot, ui, "Boiling eggs", "Nine minutes.")
    qtbot.keyClick(ui.pane.composer, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    chat(qtbot, ui, "Rust lifetimes", "How long references live.")
    listed = ui.sidebar.list
    assert ui.titles() == ["Rust lifetimes", "Boiling eggs"] and listed.currentRow() == 0
    egg_id = listed.item(1).data(Qt.ItemDataRole.UserRole)

    where = listed.visualItemRect(listed.item(1)).center()
    qtbot.mouseClick(listed.viewport(), Qt.MouseButton.LeftButton, pos=where)
    qtbot.waitUntil(lambda: ui.pane.conversation_id == egg_id)
    focused = QApplication.focusWidget()
    assert focused is listed
    qtbot.keyClick(focused, Qt.Key.Key_Delete)
    box = ui.sidebar.dialog
    assert isinstance(box, QMessageBox) and "Boiling eggs" in box.text()
    qtbot.mouseClick(box.button(QMessageBox.StandardButton.Cancel), Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: ui.sidebar.dialog is None)
    qtbot.keyClick(listed, Qt.Key.Key_F2)
    editor = listed.findChild(QLineEdit)
    assert editor is not None and editor.text() == "Boiling eggs"
    qtbot.keyClick(editor, Qt.Key.Key_Escape)

    ui.pane.composer.setFocus()
    qtbot.keyClicks(ui.pane.composer, "abc")
    qtbot.keyClick(ui.pane.composer, Qt.Key.Key_Home)
    qtbot.keyClick(ui.pane.composer, Qt.Key.Key_Delete)
    assert ui.pane.composer.toPlainText() == "bc" and ui.sidebar.dialog is None
    assert ui.titles() == ["Rust lifetimes", "Boiling eggs"]


@pytest.mark.parametrize("fmt", ["markdown", "json"])
def test_export(qtbot: QtBot, chat_ui: Callable[[], ChatUI], tmp_path: Path, fmt: str) -> None:
    ui = chat_ui()
    chat(qtbot, ui, "Export me", "Exported **reply**.")
    ui.sidebar.list.setCurrentRow(0)
    action = ui.sidebar.export_json_action if fmt == "json" else ui.sidebar.export_markdown_action
    action.trigger()
    dialog = ui.sidebar.dialog
    assert isinstance(dialog, QFileDialog)
    target = tmp_path / ("out.json" if fmt == "json" else "out.md")
    with qtbot.waitSignal(dialog.fileSelected):
        dialog.selectFile(str(target))
        dialog.accept()
    if fmt == "json":
        data = json.loads(target.read_text())
        assert [m["content"] for m in data["messages"]] == ["Export me", "Exported **reply**."]
    else:
        assert target.read_text().startswith("# Export me\n")
        assert "## Assistant\n" in target.read_text() and "Exported **reply**." in target.read_text()


CRASHING_APP = textwrap.dedent(
    """
    import sys
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication, QWidget
    from app.store.history import History, history_path
    from app.ui.chat.keeper import HistoryKeeper
    from app.ui.chat.pane import ChatPane
    from app.ui.chat.sidebar import ConversationList

    app = QApplication([])
    window = QWidget()
    pane, sidebar = ChatPane(window), ConversationList(window)
    keeper = HistoryKeeper(History(), pane, sidebar)
    window.show()
    pane.composer.setPlainText("Write forever")
    pane.submit()
    pane.begin_reply()
    count = 0

    def more():
        global count
        pane.append_reply(f"w{count} ")
        count += 1
        if count % 50 == 0:
            print(pane.conversation_id, count, flush=True)

    timer = QTimer()
    timer.timeout.connect(more)
    timer.start(1)
    app.exec()
    """
)


def test_killing_the_app_mid_reply_keeps_the_partial_reply_and_all_before_it(lemon_home: Path) -> None:
    """The real window parts in a child process, streaming a reply, killed with SIGKILL."""
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    with subprocess.Popen(
        [sys.executable, "-c", CRASHING_APP],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    ) as proc:
        assert proc.stdout is not None
        conversation_id, shown = "", 0
        while shown < 600:  # well past a few save intervals at one token a millisecond
            conversation_id, count = proc.stdout.readline().split()
            shown = int(count)
        proc.send_signal(signal.SIGKILL)
    history = History()
    try:
        stored = history.conversation(conversation_id)
        assert stored is not None and stored.title == "Write forever"
        user, reply = stored.messages
        assert (user.role, user.content) == ("user", "Write forever")
        assert reply.state is MessageState.STREAMING
        words = reply.content.split()
        assert len(words) >= 100  # saved while streaming, not only at the end
        assert words == [f"w{i}" for i in range(len(words))]  # a clean prefix of what was streamed
    finally:
        history.close()
