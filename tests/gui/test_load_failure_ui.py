"""A load that fails, as the window shows it: the engine's last words below the Models list, the options
as the user typed them (to fix in place), and the status bar's lines within the bar. The engine is the
stand-in (tests/support/standin_engine.py) told to exit while loading, as llama-server does on a bad
argument."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pytestqt.qtbot import QtBot

from app.core.status import Status
from app.store.settings import Settings, save_settings
from app.ui.desktop import DesktopApp
from tests.support.standin import make_standin_model


def test_a_failed_load_shows_the_engines_last_words_and_keeps_the_typed_arguments(
    qtbot: QtBot, desktop: Callable[[], DesktopApp], standin_settings: Settings, tmp_path: Path
) -> None:
    save_settings(standin_settings)
    app = desktop()
    window, models, options = app.window, app.window.models, app.window.options
    window.resize(1000, 700)  # the line must be cut short of the figures
    window.show_telemetry({"ttft_s": 0.05, "prompt_tps": 243, "decode_tps": 83.0, "completion_tokens": 32})
    with qtbot.waitSignal(app.bridge.model_added) as added:
        models.add(str(make_standin_model(tmp_path, "dies", crash_on_load=True)))
    name = added.args[0]
    qtbot.waitUntil(lambda: options.model == name)
    options.backend.setCurrentIndex(options.backend.findData("system"))
    options.args.setText("--no-such-flag")
    assert not models.problem.isVisible() and not models.last_words.isVisible()

    options.load_button.click()
    qtbot.waitUntil(lambda: models.row(name).status.status is Status.FAILED, timeout=30_000)
    qtbot.waitUntil(lambda: window.statusBar().currentMessage().startswith(f"{name} did not load"))

    assert options.args.text() == "--no-such-flag", "kept, to be fixed in place"
    assert options.backend.currentData() == "system"
    assert models.problem.isVisible() and models.last_words.isVisible()
    assert "exited while loading" in models.problem.text()
    assert "simulated load failure (crash_on_load)" in models.last_words.toPlainText()

    figures = window.telemetry_status.x()
    message = window.statusBar().currentMessage()
    assert "\n" not in message and message.endswith("…")
    assert window.statusBar().fontMetrics().horizontalAdvance(message) < figures
    window.statusBar().clearMessage()  # the engine's line shows again
    qtbot.waitUntil(window.engine_status.isVisible)
    assert window.engine_status.text().startswith(f"{name} failed: llama-server exited while loading")
    assert window.engine_status.geometry().right() < figures
