"""The Logs tab: the selected engine's lines, live, narrowed by the filter."""

from __future__ import annotations

from pathlib import Path

from pytestqt.qtbot import QtBot

from app.ui.logs_view import MAX_LINES, LogsView


def test_live_lines_of_the_shown_engine_only_and_the_filter(qtbot: QtBot, tmp_path: Path) -> None:
    view = LogsView()
    qtbot.addWidget(view)
    assert view.shown_lines() == [] and not view.open_button.isEnabled()
    view.show_engine(
        "smol", ["load_model: loading", "srv listening on http://127.0.0.1:4000"], tmp_path / "e.log"
    )
    assert view.open_button.isEnabled()
    view.append("smol", "slot launch_slot_: id 3 | task 0 | processing task")
    view.append("other", "a line of another engine")
    assert view.shown_lines() == [
        "load_model: loading",
        "srv listening on http://127.0.0.1:4000",
        "slot launch_slot_: id 3 | task 0 | processing task",
    ]
    qtbot.keyClicks(view.filter, "SLOT")
    assert view.shown_lines() == ["slot launch_slot_: id 3 | task 0 | processing task"]
    view.append("smol", "srv stop: cancel task")
    view.append("smol", "slot release: id 3 | task 0 | stop processing")
    assert view.shown_lines() == [
        "slot launch_slot_: id 3 | task 0 | processing task",
        "slot release: id 3 | task 0 | stop processing",
    ]
    view.filter.clear()
    assert len(view.shown_lines()) == 5


def test_the_view_keeps_as_many_lines_as_the_engine_buffer(qtbot: QtBot) -> None:
    view = LogsView()
    qtbot.addWidget(view)
    view.show_engine("smol", [], None)
    for i in range(MAX_LINES + 50):
        view.append("smol", f"line {i}")
    lines = view.shown_lines()
    assert len(lines) == MAX_LINES and lines[0] == "line 50" and lines[-1] == f"line {MAX_LINES + 49}"
