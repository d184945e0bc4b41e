"""A tool call in the window: the stand-in engine (a real child process that streams a tool call as
llama-server does) and a real MCP server over stdio (written with the SDK). The reply's tool block asks
first; allowed, the call runs and the reply goes on with its result; the block opens to show the
arguments and the result, and the reply is kept with its tool calls in the history. Saved as PNGs in
light and dark (``LEMON_DESK_SCREENSHOTS`` when set) while asking and once done."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pytestqt.qtbot import QtBot

from app.core.chat import MessageState
from app.core.mcp import McpState
from app.core.tools import ToolOutcome
from app.store.history import History, StoredMessage
from app.store.settings import Settings
from app.ui.desktop import DesktopApp
from app.ui.main_window import DEFAULT_SPLIT
from tests.gui.test_look import SIZE, save, scheme
from tests.support.standin import make_standin_model
from tests.support.tool_setup import tool_home

__all__ = ["scheme"]
WAIT_MS = 60_000


def open_with_tools(
    qtbot: QtBot, desktop: Callable[[], DesktopApp], settings: Settings, folder: Path, **standin: Any
) -> DesktopApp:
    """The window on ``tool_home``'s set-up (the test MCP server "files", a stand-in model "user.helper"
    behaving as ``standin``), once the server is ready, with the model chosen."""
    home = tool_home(settings, make_standin_model(folder, "helper", **standin), folder)
    app = desktop()
    window = app.window
    qtbot.waitUntil(lambda: [v.state for v in app.bridge.mcp_servers()] == [McpState.READY], timeout=WAIT_MS)
    qtbot.waitUntil(lambda: window.models.row(home.model) is not None, timeout=WAIT_MS)
    window.models.select(home.model)
    return app


def test_a_tool_call_asks_runs_and_is_kept_in_light_and_dark(
    qtbot: QtBot, desktop: Callable[[], DesktopApp], standin_settings: Settings, scheme: str, tmp_path: Path
) -> None:
    call = {"name": "files__echo", "arguments": json.dumps({"text": "the notes of Tuesday"})}
    app = open_with_tools(
        qtbot,
        desktop,
        standin_settings,
        tmp_path,
        reply="Let me look that up.",
        tool_call=call,
        tool_rounds=1,
    )
    window, bridge = app.window, app.bridge
    window.resize(*SIZE)
    window.splitter.setSizes(DEFAULT_SPLIT)

    chat = window.chat
    chat.composer.setPlainText("What did I write on Tuesday?")
    with qtbot.waitSignal(bridge.tool_permission, timeout=WAIT_MS) as asked:
        chat.submit()
    assert asked.args[0].tool == "echo" and asked.args[0].server == "files"
    reply = chat.transcript.views()[-1]
    block = reply.tools[asked.args[0].call_id]
    qtbot.waitUntil(lambda: block.question.isVisible())
    assert block.details.isVisible() and "the notes of Tuesday" in block.arguments.text()
    save(window, "tool-asks", scheme, tmp_path)

    with qtbot.waitSignal(chat.reply_finished, timeout=WAIT_MS):
        block.allow_once.click()
    assert reply.message.state is MessageState.COMPLETE
    assert reply.message.content.endswith("tool said: echo: the notes of Tuesday")
    assert not block.question.isVisible() and block.state.text().startswith("done")
    assert not block.details.isVisible()  # closed once done: a click opens it
    block.toggle.click()
    assert block.result.text() == "echo: the notes of Tuesday"
    save(window, "tool-done", scheme, tmp_path)

    history = History()
    try:
        [stored] = [
            m
            for c in history.list_conversations()
            for m in history.conversation(c.id).messages
            if m.role == "assistant"
        ]  # type: ignore[union-attr]
    finally:
        history.close()
    assert [(c["tool"], c["outcome"]) for c in stored.tool_calls] == [("echo", ToolOutcome.OK.value)]


def test_stop_while_a_call_asks_drops_the_question_and_runs_nothing(
    qtbot: QtBot, desktop: Callable[[], DesktopApp], standin_settings: Settings, tmp_path: Path
) -> None:
    call = {"name": "files__echo", "arguments": json.dumps({"text": "x"})}
    app = open_with_tools(qtbot, desktop, standin_settings, tmp_path, tokens=2, tool_call=call, tool_rounds=1)
    bridge, window = app.bridge, app.window
    chat = window.chat
    chat.composer.setPlainText("go")
    with qtbot.waitSignal(bridge.tool_permission, timeout=WAIT_MS) as asked:
        chat.submit()
    reply = chat.transcript.views()[-1]
    block = reply.tools[asked.args[0].call_id]
    chat.stop()
    assert reply.message.state is MessageState.STOPPED
    assert block.state.text() == "stopped" and not block.question.isVisible()
    qtbot.waitUntil(lambda: not bridge._asking)  # the question went with the reply's task
    assert not (tmp_path / "calls.jsonl").exists()


def test_a_chat_can_leave_a_servers_tools_out(
    qtbot: QtBot, desktop: Callable[[], DesktopApp], standin_settings: Settings, tmp_path: Path
) -> None:
    call = {"name": "files__echo", "arguments": json.dumps({"text": "x"})}
    app = open_with_tools(qtbot, desktop, standin_settings, tmp_path, tokens=2, tool_call=call, tool_rounds=1)
    bridge, window = app.bridge, app.window
    chat = window.chat
    qtbot.waitUntil(lambda: chat.tools_button.text() == "Tools: 1 of 1", timeout=WAIT_MS)
    [files] = chat.tools_menu.actions()
    files.setChecked(False)  # this chat only
    assert chat.tools_button.text() == "Tools: 0 of 1" and chat.chosen_servers() == []
    asked: list[object] = []
    bridge.tool_permission.connect(asked.append)
    chat.composer.setPlainText("go")
    with qtbot.waitSignal(chat.reply_finished, timeout=WAIT_MS):
        chat.submit()
    reply = chat.transcript.views()[-1]
    assert asked == [] and reply.tools == {} and not (tmp_path / "calls.jsonl").exists()
    chat.new_conversation()  # another chat offers them again
    assert chat.chosen_servers() == ["files"] and chat.tools_menu.actions()[0].isChecked()


def _stored_reply() -> StoredMessage:
    """The chat's reply as the history file has it now (read through a connection of its own)."""
    history = History()
    try:
        [conversation] = history.list_conversations()
        found = history.conversation(conversation.id)
        assert found is not None
        return found.messages[-1]
    finally:
        history.close()


def test_each_tool_call_is_saved_as_it_ends_not_only_with_the_reply(
    qtbot: QtBot, desktop: Callable[[], DesktopApp], standin_settings: Settings, tmp_path: Path
) -> None:
    """A crash mid-reply keeps the calls that ran: the first round's call is in the history while the
    second round's question still waits (the reply has not ended)."""
    call = {"name": "files__echo", "arguments": json.dumps({"text": "x"})}
    app = open_with_tools(qtbot, desktop, standin_settings, tmp_path, tokens=2, tool_call=call, tool_rounds=2)
    bridge, window = app.bridge, app.window
    chat = window.chat
    chat.composer.setPlainText("go")
    with qtbot.waitSignal(bridge.tool_permission, timeout=WAIT_MS) as first:
        chat.submit()
    reply = chat.transcript.views()[-1]
    with qtbot.waitSignal(bridge.tool_permission, timeout=WAIT_MS) as second:
        reply.tools[first.args[0].call_id].allow_once.click()
    assert second.args[0].call_id != first.args[0].call_id
    stored = _stored_reply()
    assert stored.state is MessageState.STREAMING  # the reply goes on
    assert [(c["call_id"], c["outcome"]) for c in stored.tool_calls] == [
        (first.args[0].call_id, ToolOutcome.OK.value)
    ]
    with qtbot.waitSignal(chat.reply_finished, timeout=WAIT_MS):
        reply.tools[second.args[0].call_id].deny.click()
    assert [c["outcome"] for c in _stored_reply().tool_calls] == ["ok", "denied"]


def test_a_model_that_takes_no_tools_is_offered_none_and_its_reply_says_why(
    qtbot: QtBot, desktop: Callable[[], DesktopApp], standin_settings: Settings, tmp_path: Path
) -> None:
    call = {"name": "files__echo", "arguments": json.dumps({"text": "x"})}
    caps = {"supports_tools": False, "supports_tool_calls": False}
    app = open_with_tools(
        qtbot, desktop, standin_settings, tmp_path, tokens=2, tool_call=call, template_caps=caps
    )
    bridge, window = app.bridge, app.window
    chat = window.chat
    qtbot.waitUntil(lambda: chat.tools_button.text() == "Tools: 1 of 1", timeout=WAIT_MS)
    asked: list[object] = []
    bridge.tool_permission.connect(asked.append)
    chat.composer.setPlainText("go")
    with qtbot.waitSignal(chat.reply_finished, timeout=WAIT_MS):
        chat.submit()
    reply = chat.transcript.views()[-1]
    assert reply.note.isVisible()
    assert reply.note.text().startswith("No tools for user.helper: its chat template does not take tools.")
    assert asked == [] and reply.tools == {} and not (tmp_path / "calls.jsonl").exists()
    assert chat.chosen_servers() == ["files"]  # the chat's choice stays as it was
