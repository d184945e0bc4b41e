"""Hugging Face search in the window and the downloads panel, against the loopback Hub (real HTTP, real
files in the app's cache): search, choose a variant, Add; pause, resume, cancel keeping the partial
file, and a download cut short by quitting that goes on by itself when the app starts again."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from app.core.downloads import INTERRUPTED, DownloadState
from app.core.status import Status
from app.store.downloads import load_downloads
from app.ui.desktop import DesktopApp
from tests.conftest import profile_path
from tests.gui.conftest import quit_and_wait
from tests.support.hubserver import HubRepo, LoopbackHub
from tests.support.modelfiles import gguf_files
from tests.support.testrepos import BIG, loopback_hub

MODEL = "SmolLM2-135M-Instruct-GGUF"
REPO = "bartowski/SmolLM2-135M-Instruct-GGUF"  # its catalog checkpoint, served here from loopback
FILE = "SmolLM2-135M-Instruct-Q4_K_M.gguf"
RATE = 500_000  # bytes a second: slow enough to pause and quit part way
WAIT_MS = 60_000


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LoopbackHub]:
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path("cpu_only_x86")))
    with loopback_hub(tmp_path / "hf-cache", monkeypatch) as running:
        data = gguf_files("SmolLM2-135M-Instruct-Q4_K_M", tensor_kib=4096)[FILE]
        running.add(HubRepo(REPO, {FILE: data}, tags=("gguf",), downloads=1234, likes=56))
        yield running


def throttle(hub: LoopbackHub, rate: int | None) -> None:
    path = hub.file_path(REPO, FILE, hub.repos[REPO].commit)
    if rate is None:
        hub.served.throttle.pop(path, None)
    else:
        hub.served.throttle[path] = rate


def download_starts(hub: LoopbackHub) -> list[int]:
    """Where each request for the file's bytes began (header reads for the fit, ``bytes=0-N``, left out)."""
    ranges = [r for r in hub.requests_for(REPO, FILE) if r is None or r.endswith("-")]
    return [int(r.split("=")[1].split("-")[0]) if r else 0 for r in ranges]


def test_hub_search_lists_variants_with_size_and_fit_and_add_downloads_the_chosen_one(
    qtbot: QtBot, desktop: Callable[[], DesktopApp], hub: LoopbackHub
) -> None:
    app = desktop()
    window = app.window
    search = window.hub_search
    window.model_tabs.setCurrentWidget(search)
    search.query.setText("big")
    with qtbot.waitSignal(app.bridge.hub_results, timeout=WAIT_MS):
        search.run_search()
    (repo,) = search.items()
    assert repo.isFirstColumnSpanned()
    assert repo.text(0).startswith(BIG) and "↓ 50" in repo.text(0) and "♥ 5" in repo.text(0)
    variants = {repo.child(i).text(0): repo.child(i) for i in range(repo.childCount())}
    assert set(variants) == {"Q4_K_M", "Q8_0"}
    for item in variants.values():
        assert item.text(2).endswith((" GB", " MB")) and item.text(3) == "● fits"
        assert "KV cache" in item.toolTip(3) and "needs" in item.toolTip(3)
    assert not search.add_button.isEnabled()

    search.choose(f"{BIG}:Q8_0")
    assert search.add_button.isEnabled()
    with qtbot.waitSignal(app.bridge.model_added, timeout=WAIT_MS) as added:
        search.add_button.click()
    name = added.args[0]
    assert name == "user.Big-GGUF-Q8_0"
    assert window.models.selected() == name
    assert window.side.currentWidget() is window.downloads
    qtbot.waitUntil(lambda: window.models.row(name).status.status is Status.DOWNLOADED, timeout=WAIT_MS)
    row = window.downloads.row(name)
    assert row is not None and row.record.state is DownloadState.DONE
    # Only the chosen variant came down: the other quant's shards were never asked for.
    fetched = {path for path, _ in hub.served.log if "/resolve/" in path}
    assert any(p.endswith("Big-Q8_0.gguf") for p in fetched)
    assert not any("Q4_K_M/" in p and "00002" in p for p in fetched)


def test_a_search_that_finds_nothing_says_what_to_try(
    qtbot: QtBot, desktop: Callable[[], DesktopApp], hub: LoopbackHub
) -> None:
    app = desktop()
    search = app.window.hub_search
    search.query.setText("no-such-model")
    with qtbot.waitSignal(app.bridge.hub_results, timeout=WAIT_MS):
        search.run_search()
    assert not search.items() and "Nothing found" in search.status.text()


def test_pause_resume_and_a_download_cut_by_quitting_goes_on_at_the_next_start(
    qtbot: QtBot, desktop: Callable[[], DesktopApp], hub: LoopbackHub, lemon_home: Path
) -> None:
    size = len(hub.repos[REPO].files[FILE])
    throttle(hub, RATE)
    app = desktop()
    models, panel = app.window.models, app.window.downloads
    assert not panel.empty.isHidden() and "No downloads yet" in panel.empty.text()
    models.select(MODEL)
    models.download_button.click()
    qtbot.waitUntil(lambda: (row := panel.row(MODEL)) is not None and row.bar.value() > 20, timeout=WAIT_MS)
    row = panel.row(MODEL)
    assert row is not None and panel.empty.isHidden()
    assert "MB/s" in row.detail.text() and "left" in row.detail.text()
    assert app.window.side.tabText(app.window.side.indexOf(panel)) == "Downloads (1)"

    row.pause.click()  # Pause
    qtbot.waitUntil(lambda: row.record.state is DownloadState.PAUSED, timeout=WAIT_MS)
    paused_at = row.record.done_bytes
    assert 0 < paused_at < size and "Paused" in row.detail.text()
    qtbot.waitUntil(lambda: models.row(MODEL).status.status is Status.PAUSED)  # the rows follow
    assert models.download_button.text() == "Resume download"

    asked = len(download_starts(hub))
    row.pause.click()  # the same button now resumes
    qtbot.waitUntil(lambda: len(download_starts(hub)) > asked, timeout=WAIT_MS)
    assert download_starts(hub)[-1] >= paused_at
    qtbot.waitUntil(lambda: row.bar.value() > 1000 * paused_at // size + 5, timeout=WAIT_MS)

    quit_and_wait(qtbot, app)  # the app quits part way through the download
    (record,) = load_downloads().items.values()
    assert record.state is DownloadState.PAUSED and record.message == INTERRUPTED
    cut_at = record.done_bytes
    assert 0 < cut_at < size

    throttle(hub, None)
    again = desktop()  # the next start: the download goes on by itself, from where it was
    qtbot.waitUntil(
        lambda: again.window.models.row(MODEL).status.status is Status.DOWNLOADED, timeout=WAIT_MS
    )
    assert download_starts(hub)[-1] >= cut_at
    done = again.window.downloads.row(MODEL)
    assert done is not None and done.record.state is DownloadState.DONE


def test_cancel_asks_whether_to_keep_the_partial_file(
    qtbot: QtBot, desktop: Callable[[], DesktopApp], hub: LoopbackHub
) -> None:
    throttle(hub, RATE)
    app = desktop()
    models, panel = app.window.models, app.window.downloads
    models.select(MODEL)
    models.download_button.click()
    qtbot.waitUntil(lambda: (row := panel.row(MODEL)) is not None and row.bar.value() > 20, timeout=WAIT_MS)

    models.download_button.click()  # "Cancel download" asks, as the panel's Cancel does
    question = panel.question
    assert question is not None and "Keep the partial file" in question.text()
    keep = next(b for b in question.buttons() if b.text() == "Keep partial file")
    keep.click()
    row = panel.row(MODEL)
    assert row is not None
    qtbot.waitUntil(lambda: row.record.state is DownloadState.CANCELLED, timeout=WAIT_MS)
    kept = row.record.done_bytes
    assert kept > 0, "the partial file is kept"
    qtbot.waitUntil(lambda: models.row(MODEL).status.status is Status.NOT_DOWNLOADED)

    throttle(hub, None)
    models.download_button.click()  # a new download goes on from the kept partial file
    qtbot.waitUntil(lambda: models.row(MODEL).status.status is Status.DOWNLOADED, timeout=WAIT_MS)
    assert download_starts(hub)[-1] >= kept
