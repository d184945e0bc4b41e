"""The chat pane driven through its widgets and keys, with the bridge's calls made by the test."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QLabel
from pytestqt.qtbot import QtBot

from app.core.chat import ChatMessage, MessageState
from app.core.context import ContextCount, CountSource, Overflow
from app.ui.chat import markdown_view
from app.ui.chat.markdown_view import BLOCKS_PER_FRAME, CodeBlockView, MarkdownView
from app.ui.chat.pane import ChatPane, PaneState

REPLY = "Use this:\n\n```python\nprint('hi')\n```\n\nThen **run** it.\n"


def make_pane(qtbot: QtBot) -> ChatPane:
    pane = ChatPane()
    qtbot.addWidget(pane)
    pane.resize(900, 700)
    pane.show()
    qtbot.waitExposed(pane)
    pane.activateWindow()
    qtbot.waitUntil(pane.isActiveWindow)
    pane.composer.setFocus()
    return pane


def type_and_send(qtbot: QtBot, pane: ChatPane, text: str) -> list[object]:
    qtbot.keyClicks(pane.composer, text)
    with qtbot.waitSignal(pane.send_requested) as sent:
        qtbot.keyClick(pane.composer, Qt.Key.Key_Return)
    return sent.args


def stream(qtbot: QtBot, pane: ChatPane, text: str, reasoning: str = "") -> None:
    pane.begin_reply()
    if reasoning:
        pane.append_reply("", reasoning)
    for i in range(0, len(text), 3):
        pane.append_reply(text[i : i + 3])
    reply = pane.transcript.views()[-1]
    assert isinstance(reply.body, MarkdownView)
    qtbot.waitUntil(lambda: not reply.body.has_pending())  # type: ignore[union-attr]


def test_enter_sends_shift_enter_adds_a_line_and_params_go_along(qtbot: QtBot) -> None:
    pane = make_pane(qtbot)
    pane.system_toggle.click()
    qtbot.keyClicks(pane.system_prompt, "Be brief.")
    pane.temperature.setValue(0.3)
    pane.top_p.setValue(0.5)
    pane.max_tokens.setValue(512)
    pane.composer.setFocus()
    qtbot.keyClicks(pane.composer, "first line")
    qtbot.keyClick(pane.composer, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    assert pane.composer.toPlainText() == "first line\n"
    assert pane.state is PaneState.IDLE
    conversation_id, messages, params = type_and_send(qtbot, pane, "second line")
    assert conversation_id == pane.conversation_id
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "first line\nsecond line"},
    ]
    assert params == {"temperature": 0.3, "top_p": 0.5, "max_tokens": 512}
    assert pane.composer.toPlainText() == ""
    assert pane.state is PaneState.WAITING
    assert pane.send_button.text() == "Stop"
    assert pane.transcript.views()[-1].status.text() == "Waiting for the model…"


def test_a_streamed_reply_renders_markdown_code_with_copy_reasoning_and_telemetry(qtbot: QtBot) -> None:
    pane = make_pane(qtbot)
    type_and_send(qtbot, pane, "How do I print?")
    stream(qtbot, pane, REPLY, reasoning="The user wants Python.")
    reply = pane.transcript.views()[-1]
    assert reply.reasoning_toggle.isVisible() and reply.reasoning.isVisible()
    assert reply.reasoning.text() == "The user wants Python."
    qtbot.mouseClick(reply.reasoning_toggle, Qt.MouseButton.LeftButton)
    assert not reply.reasoning.isVisible()
    blocks = reply.body.code_blocks()  # type: ignore[union-attr]
    assert len(blocks) == 1 and blocks[0].code() == "print('hi')"
    qtbot.mouseClick(blocks[0].copy_button, Qt.MouseButton.LeftButton)
    assert QGuiApplication.clipboard().text() == "print('hi')"
    assert blocks[0].copy_button.text() == "Copied"
    labels = [w for w in reply.body.findChildren(QLabel) if "<strong>run</strong>" in w.text()]
    assert len(labels) == 1
    with qtbot.waitSignal(pane.reply_finished) as finished:
        pane.finish_reply({"ttft_s": 0.25, "prompt_tps": 800.0, "decode_tps": 42.5, "completion_tokens": 17})
    message = finished.args[1]
    assert isinstance(message, ChatMessage)
    assert (message.content, message.reasoning, message.state) == (
        REPLY,
        "The user wants Python.",
        MessageState.COMPLETE,
    )
    assert reply.status.text() == "TTFT 0.25 s · prompt 800 tok/s · decode 42.5 tok/s · 17 tokens"
    assert pane.state is PaneState.IDLE and pane.send_button.text() == "Send"
    assert reply.regenerate_button.isVisible()


def test_finished_blocks_are_not_rendered_again_as_the_reply_grows(qtbot: QtBot) -> None:
    pane = make_pane(qtbot)
    type_and_send(qtbot, pane, "Go")
    stream(qtbot, pane, "First paragraph.\n\nSecond")
    body = pane.transcript.views()[-1].body
    assert isinstance(body, MarkdownView)
    assert body.count() == 1  # one tail: the blank line alone does not end a block
    stream(qtbot, pane, " paragraph.\n\nThird")
    assert body.count() == 2
    (first,) = [w for w in body.findChildren(QLabel) if "First paragraph." in w.text()]
    first_text = first.text()
    assert first_text == "<p>First paragraph.</p>\n"
    stream(qtbot, pane, " paragraph.\n\n" + "more words " * 200)
    assert first.text() == first_text  # the same widget, not rendered again
    assert body.count() == 3
    assert [w for w in body.findChildren(QLabel) if "First paragraph." in w.text()] == [first]


def test_escape_stops_the_reply_and_keeps_what_arrived(qtbot: QtBot) -> None:
    pane = make_pane(qtbot)
    type_and_send(qtbot, pane, "Count")
    stream(qtbot, pane, "one two")
    with qtbot.waitSignal(pane.stop_requested), qtbot.waitSignal(pane.reply_finished) as finished:
        qtbot.keyClick(pane.composer, Qt.Key.Key_Escape)
    assert finished.args[1].state is MessageState.STOPPED
    assert finished.args[1].content == "one two"
    pane.begin_reply()  # late calls for the stopped reply change nothing
    pane.append_reply(" three")
    pane.finish_reply(None)
    assert len(pane.messages()) == 2
    assert pane.messages()[-1].content == "one two"
    assert pane.transcript.views()[-1].status.text() == "Stopped."
    assert pane.state is PaneState.IDLE


def test_the_stop_button_stops_too(qtbot: QtBot) -> None:
    pane = make_pane(qtbot)
    type_and_send(qtbot, pane, "Count")
    with qtbot.waitSignal(pane.stop_requested):
        qtbot.mouseClick(pane.send_button, Qt.MouseButton.LeftButton)
    assert pane.state is PaneState.IDLE


def test_regenerate_asks_again_without_the_last_reply(qtbot: QtBot) -> None:
    pane = make_pane(qtbot)
    type_and_send(qtbot, pane, "Tell a joke")
    stream(qtbot, pane, "A bad joke.")
    pane.finish_reply(None)
    reply = pane.transcript.views()[-1]
    with qtbot.waitSignal(pane.send_requested) as sent:
        qtbot.mouseClick(reply.regenerate_button, Qt.MouseButton.LeftButton)
    assert sent.args[1] == [{"role": "user", "content": "Tell a joke"}]
    assert [m.role for m in pane.messages()] == ["user", "assistant"]
    assert pane.messages()[-1].content == ""  # the new reply, waiting


def test_edit_and_resend_replaces_the_message_and_what_followed(qtbot: QtBot) -> None:
    pane = make_pane(qtbot)
    type_and_send(qtbot, pane, "Capital of France?")
    stream(qtbot, pane, "Paris.")
    pane.finish_reply(None)
    type_and_send(qtbot, pane, "And Spain?")
    stream(qtbot, pane, "Madrid.")
    pane.finish_reply(None)
    first = pane.transcript.views()[0]
    qtbot.mouseClick(first.edit_button, Qt.MouseButton.LeftButton)
    assert pane.composer.toPlainText() == "Capital of France?"
    assert pane.edit_banner.isVisible()
    qtbot.keyClick(pane.composer, Qt.Key.Key_Escape)  # cancel
    assert not pane.edit_banner.isVisible() and pane.composer.toPlainText() == ""
    qtbot.mouseClick(first.edit_button, Qt.MouseButton.LeftButton)
    pane.composer.selectAll()
    messages = type_and_send(qtbot, pane, "Capital of Italy?")[1]
    assert messages == [{"role": "user", "content": "Capital of Italy?"}]
    assert [(m.role, m.content) for m in pane.messages()] == [
        ("user", "Capital of Italy?"),
        ("assistant", ""),
    ]


def test_ctrl_n_starts_a_new_conversation(qtbot: QtBot) -> None:
    pane = make_pane(qtbot)
    type_and_send(qtbot, pane, "Hello")
    old = pane.conversation_id
    with qtbot.waitSignal(pane.conversation_changed) as changed, qtbot.waitSignal(pane.stop_requested):
        qtbot.keyClick(pane.composer, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert changed.args[0] == pane.conversation_id != old
    assert pane.messages() == [] and pane.transcript.placeholder.isVisible()
    assert pane.title.text() == "New chat"


def test_a_failed_reply_says_why(qtbot: QtBot) -> None:
    pane = make_pane(qtbot)
    type_and_send(qtbot, pane, "Hello")
    with qtbot.waitSignal(pane.reply_finished) as finished:
        pane.fail_reply("No model is loaded. Load one from the Models list.")
    assert finished.args[1].state is MessageState.FAILED
    status = pane.transcript.views()[-1].status.text()
    assert status == "Failed: No model is loaded. Load one from the Models list."
    # A failed empty reply is not sent back to the model with the next message.
    assert type_and_send(qtbot, pane, "Again")[1] == [
        {"role": "user", "content": "Hello"},
        {"role": "user", "content": "Again"},
    ]


def test_a_long_code_block_streams_in_pieces_and_copies_whole(qtbot: QtBot) -> None:
    pane = make_pane(qtbot)
    type_and_send(qtbot, pane, "Code please")
    code = "\n".join(f"x{i} = {i}" for i in range(100))
    stream(qtbot, pane, f"```python\n{code}\n```\nDone.\n")
    pane.finish_reply(None)
    body = pane.transcript.views()[-1].body
    assert isinstance(body, MarkdownView)
    (block,) = body.code_blocks()
    assert isinstance(block, CodeBlockView)
    assert block.code() == code
    assert block.count() > 3  # header and several pieces
    assert block.height() > 100 * block.fontMetrics().lineSpacing() * 0.9  # every line is shown


def test_stored_messages_show_with_their_state(qtbot: QtBot) -> None:
    pane = make_pane(qtbot)
    messages = [
        ChatMessage("user", "Hi"),
        ChatMessage("assistant", "Hel", "plan", MessageState.STREAMING),
    ]
    pane.show_conversation("abc", "Greeting", "Be nice.", messages)
    reply = pane.transcript.views()[-1]
    assert reply.status.text().startswith("Interrupted")
    assert not reply.reasoning_toggle.isHidden() and reply.reasoning.isHidden()  # collapsed when stored
    assert not pane.system_prompt.isHidden() and pane.system_prompt.toPlainText() == "Be nice."
    assert pane.title.text() == "Greeting" and pane.conversation_id == "abc"


def test_a_frame_shows_at_most_a_few_finished_blocks_and_the_rest_follows(qtbot: QtBot) -> None:
    view = MarkdownView()
    qtbot.addWidget(view)
    view.resize(600, 400)
    view.show()
    view.append("".join(f"Paragraph {i}.\n\n" for i in range(10)) + "Tail\n")
    view.show_pending()
    assert view.count() == BLOCKS_PER_FRAME and view.has_pending()  # the tail waits for its turn
    frames = 1
    while view.has_pending():
        view.show_pending()
        frames += 1
    assert view.count() == 11 and frames == 4
    labels = [w for w in view.findChildren(QLabel) if w.isVisibleTo(view)]
    assert [label.text() for label in labels][-1] == "<p>Tail</p>\n"
    assert view.height() > 11 * view.fontMetrics().lineSpacing()


def test_a_finished_code_block_is_highlighted_in_one_step_and_shown_in_the_next(
    qtbot: QtBot, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The two halves of showing a finished piece of code (pygments, then Qt's layout of its rich
    text) go in steps of their own, so a turn of the loop that can take one step takes one of them."""
    highlighted: list[str] = []
    monkeypatch.setattr(markdown_view, "code_html", lambda code, *a: highlighted.append(code) or code)
    view = MarkdownView()
    qtbot.addWidget(view)
    view.resize(600, 400)
    view.show()
    view.append("```python\nprint('hi')\n```\n\nDone.")
    shown: list[tuple[str, ...]] = []
    while view.has_pending():
        view.show_pending(until=0.0)  # no time left after a call's first step
        labels = [label for block in view.code_blocks() for label in block.findChildren(QLabel)]
        shown.append(tuple(label.text() for label in labels))
    opened, lit, set_ = shown[:3]
    assert opened == lit == ("python", "")  # the header, and a code label not set yet
    assert set_ == ("python", "print('hi')") and highlighted == ["print('hi')"]  # highlighted once
    assert view.code_blocks()[0].code() == "print('hi')"


def test_leaving_out_n_oldest_messages_leaves_out_n_sent_ones_past_replies_with_no_text(qtbot: QtBot) -> None:
    """The guard's count (given by the test, as the bridge would) says how many of the oldest messages
    sent must go; a reply that ended with no text is not sent, so it does not count as one of them."""
    pane = make_pane(qtbot)
    guard = pane.guard
    guard.enabled = True
    said = ["one", "", "two", "", "three", "four"]  # two replies with no text (stopped before any)
    roles = ["user", "assistant", "user", "assistant", "user", "assistant"]
    pane.show_conversation("c", "Chat", "", [ChatMessage(r, t) for r, t in zip(roles, said, strict=True)])
    pane.composer.setPlainText("five")
    with qtbot.waitSignal(guard.count_wanted) as asked:
        guard.count_now()
    asked_id, messages, _, servers = asked.args
    assert [m["content"] for m in messages] == ["one", "two", "three", "four", "five"] and servers == []
    guard.show_count(asked_id, ContextCount(1200, 1000, 0, CountSource.TOKENIZER, leave_out=2))
    pane.submit()
    assert guard.choices.isVisible()
    with qtbot.waitSignal(pane.send_requested) as sent:
        guard.choices.buttons[Overflow.LEAVE_OUT].click()  # clearly fits now: it goes
    assert [m["content"] for m in sent.args[1]] == ["three", "four", "five"]
    assert [v.message.left_out for v in pane.transcript.views()[:6]] == [True] * 3 + [False] * 3
    guard.stop()
