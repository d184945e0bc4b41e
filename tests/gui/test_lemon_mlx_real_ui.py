"""The window on the REAL lemon-mlx engine (lemon-mlx-engine b1050-stable's Linux CPU ``server``, see
tests/support/lemon_mlx_engine.py): installed from the loopback release mirror into an empty home, the
tiny Qwen3-shaped MLX model (tests/support/qwen3_model.py) shown in the Model Manager from the Hugging
Face cache under its catalog repo id, loaded with the options panel's lemon-mlx options, and chatted
with: the reply, its reasoning, the telemetry footer and the run card say what the engine did.

The window is saved as a PNG in the light and the dark palette (in ``LEMON_DESK_SCREENSHOTS`` when set,
for people to look at)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from app.core.chat import MessageState
from app.core.status import Status
from app.ui.desktop import DesktopApp
from app.ui.options_panel import slider_from_ctx
from tests.gui.test_look import SIZE, save, scheme
from tests.integration.conftest import lemon_desk
from tests.integration.mlx.test_lemon_mlx_real import (
    CATALOG_NAME,
    REPO,
    Qwen3,
    answer_of,
    engine_zip,
    hf_home,
    mirror,
    qwen3,
)
from tests.support.fileserver import Served

pytestmark = pytest.mark.integration
__all__ = ["engine_zip", "hf_home", "mirror", "qwen3", "scheme"]
LOAD_MS = 120_000
REPLY_MS = 120_000
CTX = 2048


def test_a_chat_on_the_real_lemon_mlx_engine_shows_its_reply_reasoning_telemetry_and_run_card(
    qtbot: QtBot,
    desktop: Callable[[], DesktopApp],
    mirror: Served,
    lemon_home: Path,
    hf_home: Path,
    qwen3: Qwen3,
    scheme: str,
    tmp_path: Path,
) -> None:
    assert not lemon_home.exists()  # an empty home: nothing installed
    installed = lemon_desk("backends", "install", "lemon-mlx:cpu", "--json")
    assert installed.returncode == 0, installed.stderr
    app = desktop()
    window, models, options = app.window, app.window.models, app.window.options
    window.resize(*SIZE)
    window.show()

    qtbot.waitUntil(lambda: models.row(CATALOG_NAME) is not None)
    models.select(CATALOG_NAME)
    row = models.row(CATALOG_NAME)
    assert row is not None and row.model.recipe == "lemon-mlx"
    assert models.tree.currentItem().text(1) == "lemon-mlx"
    assert models.tree.currentItem().text(2).endswith(" kB")  # the tiny model, not "0.00 GB"
    assert "--kv-bits" in options.args.placeholderText() and options.rpc.isHidden()
    assert options.model == CATALOG_NAME
    qtbot.waitUntil(lambda: options.backend.findData("cpu") >= 0)
    index = options.backend.findData("cpu")
    assert "installed" in options.backend.itemText(index), options.backend.itemText(index)
    options.backend.setCurrentIndex(index)
    options.ctx_auto.setChecked(False)
    options.ctx_slider.setValue(slider_from_ctx(CTX))
    options.load_button.click()  # loads with what the panel shows
    qtbot.waitUntil(lambda: models.row(CATALOG_NAME).status.status is Status.LOADED, timeout=LOAD_MS)
    engine = app.bridge.router.supervisor.engine(CATALOG_NAME)
    assert (engine.request.recipe, engine.request.backend, engine.request.model) == ("lemon-mlx", "cpu", REPO)
    assert engine.request.ctx_size == CTX
    assert engine.request.binary == str(lemon_home / "engines" / "lemon-mlx" / "cpu" / "server")

    chat = window.chat
    chat.max_tokens.setValue(64)
    chat.composer.setPlainText("Hello")
    chat.submit()
    qtbot.waitUntil(
        lambda: len(chat.messages()) == 2 and chat.messages()[-1].state is not MessageState.STREAMING,
        timeout=REPLY_MS,
    )
    reply = chat.messages()[-1]
    assert reply.state is MessageState.COMPLETE, reply.error
    thought = qwen3.text.removeprefix("<think>").split("</think>")[0]
    assert (reply.content, reply.reasoning) == (answer_of(qwen3.text), thought)
    assert "Sure, é lemon!" in reply.content and "Let me think" in reply.reasoning
    view = chat.transcript.views()[-1]
    assert view.reasoning_toggle.isVisible() and "Let me think" in view.reasoning.text()
    assert "<think>" not in view.body.text()

    telemetry = reply.telemetry
    assert telemetry is not None
    # The engine counts its end token as generated (b1050-stable); its own speed line gives decode_tps.
    assert telemetry["completion_tokens"] == len(qwen3.tokens) + 1
    [generation] = [line for line in engine.output if line.startswith("Generation:")][-1:]
    assert telemetry["decode_tps"] == float(generation.split()[3])
    footer = view.status.text()
    assert (
        'href="card"' in footer
        and f"{telemetry['completion_tokens']} tokens" in footer
        and "decode " in footer
    ), footer

    card = reply.run_card
    assert card is not None
    assert (card["model"], card["recipe"], card["backend"]) == (CATALOG_NAME, "lemon-mlx", "cpu")
    assert (card["engine_version"], card["checkpoint"], card["ctx_size"]) == ("b1050-stable", REPO, CTX)
    assert card["completion_tokens"] == telemetry["completion_tokens"]
    assert card["decode_tps"] == telemetry["decode_tps"] > 0
    assert card["prompt_tokens"] == telemetry["prompt_tokens"] > 0 and card["ttft_s"] > 0
    view.status.linkActivated.emit("card")  # what a click on the footer does
    assert view.card.isVisible()
    shown = view.card.text()
    assert "lemon-mlx:cpu b1050-stable" in shown and f"{CTX:,} tokens" in shown
    assert card["resumes"] is False and "does not resume from disk on this engine" in shown
    assert f"{card['completion_tokens']} tokens at" in shown
    view.reasoning_toggle.setChecked(True)
    save(window, "lemon-mlx-chat", scheme, tmp_path)
