"""The window's look, in the light and the dark palette: the first-run welcome, the Model Manager with
Hugging Face results, and the downloads panel, against the loopback Hub. Each is saved as a PNG (in
``LEMON_DESK_SCREENSHOTS`` when set, for people to look at) and checked for what can be checked: names
shown whole while there is room, marks and badges present, text readable on its background."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication, QWidget
from pytestqt.qtbot import QtBot

from app.core.downloads import DownloadState
from app.ui.desktop import DesktopApp
from app.ui.main_window import DEFAULT_SPLIT
from tests.conftest import profile_path
from tests.support.hubserver import HubRepo, LoopbackHub
from tests.support.modelfiles import gguf_files
from tests.support.testrepos import loopback_hub

SIZE = (1280, 820)
WAIT_MS = 60_000
QWEN = "unsloth/Qwen3-0.6B-GGUF"  # the catalog's suggestion for a CPU-only machine, served from loopback
SMOL = "bartowski/SmolLM2-135M-Instruct-GGUF"
DARK = {
    QPalette.ColorRole.Window: "#202124",
    QPalette.ColorRole.WindowText: "#e8eaed",
    QPalette.ColorRole.Base: "#17181a",
    QPalette.ColorRole.AlternateBase: "#232427",
    QPalette.ColorRole.Text: "#e8eaed",
    QPalette.ColorRole.Button: "#2d2e31",
    QPalette.ColorRole.ButtonText: "#e8eaed",
    QPalette.ColorRole.Highlight: "#3b6fd8",
    QPalette.ColorRole.HighlightedText: "#ffffff",
    QPalette.ColorRole.ToolTipBase: "#2d2e31",
    QPalette.ColorRole.ToolTipText: "#e8eaed",
    QPalette.ColorRole.PlaceholderText: "#9aa0a6",
    QPalette.ColorRole.Mid: "#3c4043",
}


@pytest.fixture(params=["light", "dark"])
def scheme(request: pytest.FixtureRequest, qapp: QApplication) -> Iterator[str]:
    """The app with a light or a dark palette, as a desktop in that scheme gives it. Only the palette
    changes: replacing the application's style under live widgets let a deleted style's timer fire."""
    old_palette = qapp.palette()
    palette = qapp.style().standardPalette()
    if request.param == "dark":
        for role, colour in DARK.items():
            palette.setColor(role, QColor(colour))
        for role in (QPalette.ColorRole.Text, QPalette.ColorRole.WindowText, QPalette.ColorRole.ButtonText):
            palette.setColor(QPalette.ColorGroup.Disabled, role, QColor("#74787d"))
    qapp.setPalette(palette)
    yield request.param
    qapp.setPalette(old_palette)


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LoopbackHub]:
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path("cpu_only_x86")))
    with loopback_hub(tmp_path / "hf-cache", monkeypatch) as running:
        qwen = gguf_files("Qwen3-0.6B-Q4_0", tensor_kib=2048)["Qwen3-0.6B-Q4_0.gguf"]
        running.add(
            HubRepo(QWEN, {"Qwen3-0.6B-Q4_0.gguf": qwen}, tags=("gguf",), downloads=91_000, likes=310)
        )
        smol = gguf_files("SmolLM2-135M-Instruct-Q4_K_M", tensor_kib=4096)[
            "SmolLM2-135M-Instruct-Q4_K_M.gguf"
        ]
        running.add(HubRepo(SMOL, {"SmolLM2-135M-Instruct-Q4_K_M.gguf": smol}, tags=("gguf",)))
        yield running


def save(widget: QWidget, name: str, scheme: str, tmp_path: Path) -> Path:
    folder = Path(os.environ.get("LEMON_DESK_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{scheme}.png"
    QApplication.sendPostedEvents()  # the layout requests of what just changed, as the loop would
    assert widget.grab().save(str(path))
    return path


def readable(fg: QColor, bg: QColor) -> bool:
    return abs(fg.lightness() - bg.lightness()) > 90


def test_welcome_search_results_and_downloads_in_light_and_dark(
    qtbot: QtBot, desktop: Callable[[], DesktopApp], hub: LoopbackHub, scheme: str, tmp_path: Path
) -> None:
    app = desktop()
    window = app.window
    window.resize(*SIZE)
    window.splitter.setSizes(DEFAULT_SPLIT)
    welcome = window.welcome
    qtbot.waitUntil(lambda: welcome.button.isEnabled(), timeout=WAIT_MS)
    assert window.center.currentWidget() is welcome
    palette = welcome.palette()
    assert readable(palette.color(QPalette.ColorRole.WindowText), palette.color(QPalette.ColorRole.Window))
    # The card takes the height its wrapped text needs (it was once cut short).
    card = welcome.card
    qtbot.waitUntil(lambda: card.height() >= card.minimumSizeHint().height())
    assert welcome.reason.height() >= welcome.reason.heightForWidth(welcome.reason.width())
    assert not window.conversations.empty.isHidden() and "No chats yet" in window.conversations.empty.text()
    save(window, "welcome", scheme, tmp_path)

    # The Model Manager: every catalog row with its badge, size and fit mark, names whole.
    models = window.models
    for item in (models.tree.topLevelItem(i) for i in range(models.tree.topLevelItemCount())):
        assert item is not None and item.text(4)[:2] in ("● ", "○ ")
        width = models.tree.fontMetrics().horizontalAdvance(item.text(0))
        assert width <= models.tree.columnWidth(0), f"{item.text(0)} is cut though the panel is wide"
    save(window, "models", scheme, tmp_path)

    search = window.hub_search
    window.model_tabs.setCurrentWidget(search)
    search.query.setText("-")
    with qtbot.waitSignal(app.bridge.hub_results, timeout=WAIT_MS):
        search.run_search()
    assert len(search.items()) == 4
    search.choose(f"{QWEN}:Q4_0")
    save(window, "hub-search", scheme, tmp_path)

    # Downloads: one done, one paused part way, one running slowly.
    smol_path = hub.file_path(SMOL, "SmolLM2-135M-Instruct-Q4_K_M.gguf", hub.repos[SMOL].commit)
    hub.served.throttle[smol_path] = 400_000
    with qtbot.waitSignal(app.bridge.model_added, timeout=WAIT_MS):
        search.add_requested.emit(f"{QWEN}:Q4_0")
    panel = window.downloads
    qtbot.waitUntil(
        lambda: (r := panel.row("Qwen3-0.6B-GGUF")) is not None and r.record.state is DownloadState.DONE,
        timeout=WAIT_MS,
    )
    window.models.select("SmolLM2-135M-Instruct-GGUF")
    window.models.download_button.click()
    qtbot.waitUntil(
        lambda: (r := panel.row("SmolLM2-135M-Instruct-GGUF")) is not None and r.bar.value() > 30,
        timeout=WAIT_MS,
    )
    window.side.setCurrentWidget(panel)
    save(window, "downloads", scheme, tmp_path)
    # Quitting (the fixture's) pauses it; the next start would resume it.
