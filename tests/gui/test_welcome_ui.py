"""The first-run welcome without a Hub to reach: it still offers the model that suits the machine and
says why the download time is unknown; its button (or the tray's) fails with the reason and can be tried
again; a model that arrives another way (an import) takes the welcome away."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from PySide6.QtCore import QRect, Qt
from pytestqt.qtbot import QtBot

from app.supervisor.router import ModelView
from app.ui.desktop import DesktopApp
from tests.conftest import profile_path
from tests.support.modelfiles import gguf_files


def test_without_the_hub_the_welcome_says_why_and_its_button_can_be_tried_again(
    qtbot: QtBot, desktop: Callable[[], DesktopApp], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path("cpu_only_x86")))
    app = desktop()
    window, welcome = app.window, app.window.welcome
    qtbot.waitUntil(lambda: window.center.currentWidget() is welcome)
    qtbot.waitUntil(welcome.button.isEnabled, timeout=30_000)
    assert welcome.model == "Qwen3-0.6B-GGUF"
    assert "380 MB download" in welcome.facts.text() and "MB/s" not in welcome.facts.text()
    assert "Could not reach the Hugging Face Hub" in welcome.reason.text()

    assert app.tray.welcome_action.isVisible(), "the tray offers the same"
    app.tray.welcome_action.trigger()  # as the welcome's button does
    assert not welcome.button.isEnabled()
    qtbot.waitUntil(lambda: welcome.button.text() == "Try again", timeout=30_000)
    assert welcome.button.isEnabled() and "Could not reach the Hugging Face Hub" in welcome.line.text()
    assert window.center.currentWidget() is welcome
    assert "Could not reach" not in welcome.reason.text(), "told once, as the failure"
    assert "runs on the CPU" in welcome.reason.text(), "why this model is still said"
    reason = welcome.reason
    wrapped = reason.fontMetrics().boundingRect(
        QRect(0, 0, reason.width(), 10_000), Qt.TextFlag.TextWordWrap, reason.text()
    )
    assert reason.height() <= wrapped.height() + 2, "its shorter text leaves no gap around it"
    status = window.engine_status.text()
    assert status.startswith("Qwen3-0.6B-GGUF failed: Could not reach the Hugging Face Hub"), status


def test_statuses_read_before_the_load_began_do_not_end_it_in_the_status_bar(
    qtbot: QtBot, desktop: Callable[[], DesktopApp], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The statuses are read in a thread while the router goes on: on a busy machine a read that began
    before the one-click load came after its first phase, said "not downloaded", and the status bar
    took that for the load's end (and kept it, missing the failure that came next). Here every read
    takes half a second after it has looked, and one is under way when the load starts."""
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path("cpu_only_x86")))
    app = desktop()
    window, welcome = app.window, app.window.welcome
    qtbot.waitUntil(welcome.button.isEnabled, timeout=30_000)
    statuses = app.bridge.router.statuses

    def slow_statuses() -> list[ModelView]:
        seen = statuses()
        time.sleep(0.5)
        return seen

    monkeypatch.setattr(app.bridge.router, "statuses", slow_statuses)
    app.bridge.refresh()
    app.tray.welcome_action.trigger()
    qtbot.waitUntil(lambda: welcome.button.text() == "Try again", timeout=30_000)
    qtbot.waitUntil(lambda: "failed" in window.engine_status.text(), timeout=30_000)
    status = window.engine_status.text()
    assert status.startswith("Qwen3-0.6B-GGUF failed: Could not reach the Hugging Face Hub"), status


def test_a_model_imported_while_the_welcome_shows_takes_it_away(
    qtbot: QtBot, desktop: Callable[[], DesktopApp], tmp_path: Path
) -> None:
    app = desktop()
    window = app.window
    qtbot.waitUntil(lambda: window.center.currentWidget() is window.welcome)
    path = tmp_path / "tiny.gguf"
    path.write_bytes(gguf_files("tiny", tensor_kib=16)["tiny.gguf"])
    with qtbot.waitSignal(app.bridge.model_added, timeout=30_000):
        window.models.add(str(path))
    qtbot.waitUntil(lambda: window.center.currentWidget() is window.chat)
    assert not app.tray.welcome_action.isVisible()
