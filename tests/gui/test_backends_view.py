"""The Backends view's rows, on the cpu_only_x86 profile (no engine, no download): each state in the
product's words, the reason for each "unsupported" under its row, and an install's error in full under
its own row. tests/gui/test_backends_ui.py installs for real."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from PySide6.QtCore import QRect, Qt
from PySide6.QtWidgets import QLabel
from pytestqt.qtbot import QtBot

from app.core.backends import BackendKey, BackendState
from app.ui.desktop import DesktopApp
from tests.conftest import profile_path

CPU = BackendKey("llamacpp", "cpu")
# As the bridge tells it when the release host cannot be reached (the real message, offline).
OFFLINE = (
    "Could not install llamacpp:cpu: Download of https://github.com/ggml-org/llama.cpp/releases/download/"
    "b10375/llama-b10375-bin-ubuntu-x64.tar.gz failed after 5 retries: ConnectError. Check the connection "
    "and try again; the download will resume where it stopped."
)


@pytest.fixture(autouse=True)
def cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path("cpu_only_x86")))


def needed_height(label: QLabel) -> int:
    """The height the label's wrapped text needs at its width."""
    width = label.contentsRect().width() - max(label.indent(), 0)
    metrics = label.fontMetrics()
    return metrics.boundingRect(QRect(0, 0, width, 100_000), Qt.TextFlag.TextWordWrap, label.text()).height()


def test_states_read_as_the_cli_says_them_and_every_unsupported_is_explained_in_its_row(
    qtbot: QtBot, desktop: Callable[[], DesktopApp]
) -> None:
    app = desktop()
    app.window.backends_action.trigger()
    dialog = app.backends
    assert dialog is not None and app.bridge.info is not None
    qtbot.waitExposed(dialog)
    statuses = {
        BackendKey(recipe, name): status
        for recipe, support in app.bridge.info.recipes.items()
        for name, status in support.backends.items()
    }
    assert statuses[CPU].state is BackendState.INSTALLABLE
    assert dialog.rows[CPU].state.text() == "installable"
    unsupported = [key for key, status in statuses.items() if status.state is BackendState.UNSUPPORTED]
    assert BackendKey("llamacpp", "cuda") in unsupported
    for key in unsupported:
        reason = dialog.rows[key].reason
        assert reason.isVisible() and reason.text() == statuses[key].message, key
        assert reason.height() >= needed_height(reason), key
    assert not dialog.rows[CPU].reason.isVisible()


def test_an_install_error_shows_whole_under_its_row(qtbot: QtBot, desktop: Callable[[], DesktopApp]) -> None:
    app = desktop()
    app.window.backends_action.trigger()
    dialog = app.backends
    assert dialog is not None
    qtbot.waitExposed(dialog)
    row = dialog.rows[CPU]
    below = [r.install for r in dialog.rows.values() if r.install.y() > row.install.y()]
    app.bridge.install_done.emit(CPU, OFFLINE)

    def whole() -> bool:
        message = row.message.geometry()
        return (
            row.message.isVisible()
            and row.message.height() >= needed_height(row.message)
            and message.top() > row.install.geometry().bottom()  # under its row, not over it
            and message.bottom() < min(b.geometry().top() for b in below)  # above the next one
            and message.right() <= dialog.contentsRect().right()
        )

    qtbot.waitUntil(whole)
