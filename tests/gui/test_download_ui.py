"""Downloading a catalog model from the Model Manager, from a loopback stand-in for the Hugging Face Hub
(real HTTP, real files in the app's cache): the row shows the download's progress, then "downloaded",
and the tray offers the model."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from app.core.status import Status
from app.ui.desktop import DesktopApp
from tests.conftest import profile_path
from tests.support.fileserver import Fault
from tests.support.hubserver import HubRepo, LoopbackHub
from tests.support.modelfiles import gguf_files
from tests.support.testrepos import loopback_hub

MODEL = "SmolLM2-135M-Instruct-GGUF"
REPO = "bartowski/SmolLM2-135M-Instruct-GGUF"  # its catalog checkpoint, served here from loopback
FILE = "SmolLM2-135M-Instruct-Q4_K_M.gguf"


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LoopbackHub]:
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path("cpu_only_x86")))
    with loopback_hub(tmp_path / "hf-cache", monkeypatch) as running:
        data = gguf_files("SmolLM2-135M-Instruct-Q4_K_M", tensor_kib=2048)[
            "SmolLM2-135M-Instruct-Q4_K_M.gguf"
        ]
        running.add(HubRepo(REPO, {FILE: data}, tags=("gguf",)))
        yield running


def test_download_shows_progress_then_the_model_is_ready_to_load(
    qtbot: QtBot, desktop: Callable[[], DesktopApp], hub: LoopbackHub
) -> None:
    size = len(hub.repos[REPO].files[FILE])
    app = desktop()
    models = app.window.models
    models.select(MODEL)
    assert models.row(MODEL).status.status is Status.NOT_DOWNLOADED
    # Selecting the row reads the model's header from the Hub for its fit, before any download.
    qtbot.waitUntil(lambda: models.row(MODEL).fit_exact, timeout=30_000)
    assert models.tree.currentItem().text(4) == "● fits"
    assert "KV cache" in models.tree.currentItem().toolTip(4)
    # Half the bytes and a cut; the resumed request sends a little more, then goes silent until released.
    hub.arm(REPO, FILE, Fault(cut_after=size // 2))
    hub.arm(REPO, FILE, Fault(hold_after=size // 8))
    assert models.load_button.isEnabled(), "Load is one click: it downloads first"
    try:
        models.download_button.click()
        qtbot.waitUntil(lambda: (models.row(MODEL).status.percent or 0) >= 50, timeout=30_000)
        row = models.row(MODEL)
        assert row.status.status is Status.DOWNLOADING
        assert models.tree.currentItem().text(3) == f"downloading {row.status.percent}%"
        assert models.download_button.text() == "Cancel download"
    finally:
        hub.served.release.set()
    # The held connection ends; the download resumes from where it was and finishes.
    qtbot.waitUntil(lambda: models.row(MODEL).status.status is Status.DOWNLOADED, timeout=60_000)
    assert models.load_button.isEnabled() and not models.download_button.isEnabled()
    assert MODEL in app.tray.load_actions()
    models.downloaded_only.setChecked(True)
    assert models.visible_names() == [MODEL]
