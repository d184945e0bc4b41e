"""The Telemetry tab draws again only what changed on screen: a sample whose points land on pixels the
curve already covers leaves the curve as it was drawn (its title still shows the latest figure), one
that moves a pixel hands the curve its points again, and nothing is drawn while the tab is hidden."""

from __future__ import annotations

from pytestqt.qtbot import QtBot

from app.supervisor.sampler import EngineNow, SystemSample
from app.ui.telemetry_view import SYSTEM, TelemetryView

START = 1_800_000_000.0
GB = 1_000_000_000


def sample(at: float, cpu: float, ram_gb: float) -> SystemSample:
    engine = EngineNow("user.smol", 0.0, 220_000_000, None)
    return SystemSample(at, cpu, int(ram_gb * GB), 16 * GB, None, None, None, False, (engine,))


def drawn_points(view: TelemetryView, chart: str, series: str) -> int:
    curve = view._curves.get((chart, series))
    xs = None if curve is None else curve.xData  # the points last handed to pyqtgraph
    return 0 if xs is None else len(xs)


def shown_view(qtbot: QtBot) -> TelemetryView:
    view = TelemetryView()
    qtbot.addWidget(view)
    view.resize(700, 2000)  # every chart on screen
    view.show()
    qtbot.waitUntil(view.built)
    for i in range(1200):  # 20 minutes of an idle machine: over a pixel's worth of seconds per pixel
        view.add_sample(sample(START + i, 2.0, 6.0))
    qtbot.waitUntil(lambda: drawn_points(view, "ram", SYSTEM) == 1200)
    return view


def test_a_point_on_a_pixel_already_drawn_leaves_the_curve_and_updates_the_title(qtbot: QtBot) -> None:
    view = shown_view(qtbot)
    # A hundredth of a second on: the same pixel column (of a 20-minute chart under 700 px wide), row
    # and time window.
    view.add_sample(sample(START + 1199.01, 2.0, 6.0001))
    qtbot.waitUntil(lambda: not view._dirty)
    assert drawn_points(view, "ram", SYSTEM) == 1200
    assert len(view.charts["ram"].series[SYSTEM].xs) == 1201  # kept, and drawn with the next change
    title = view._title_labels["ram"].text()
    view.add_sample(sample(START + 1199.02, 2.0, 6.2))  # rows higher: drawn, with the point before
    qtbot.waitUntil(lambda: drawn_points(view, "ram", SYSTEM) == 1202)
    assert view._title_labels["ram"].text() != title and "6.20" in view._title_labels["ram"].text()


def test_nothing_is_drawn_while_hidden_and_all_is_drawn_when_shown_again(qtbot: QtBot) -> None:
    view = shown_view(qtbot)
    view.hide()
    for i in range(1200, 1260):  # a minute, far off the rows drawn
        view.add_sample(sample(START + i, 50.0, 9.0))
    assert not view._slicer.isActive()
    assert drawn_points(view, "cpu", SYSTEM) == 1200
    view.show()
    qtbot.waitUntil(lambda: drawn_points(view, "cpu", SYSTEM) == 1260)
