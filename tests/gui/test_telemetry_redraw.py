"""The Telemetry tab draws again only what changed on screen: a sample whose points land on pixels the
curve already covers leaves the curve as it was drawn and paints no chart (its title still shows the
latest figure), one that moves a pixel hands the curve its points again, at most once in ``CURVE_S`` of
its time; a minute of an idle machine draws a line about once a pixel, not once a sample, and one whose
every sample moves a pixel once in ``CURVE_S``; a new figure lays out nothing and paints its legend and
the "Now" line once, no title; and nothing is drawn, and no timer runs, while the tab is hidden or its
window minimized."""

from __future__ import annotations

import random
from collections import Counter

from PySide6.QtCore import QEvent, QObject, QTimer
from pytestqt.qtbot import QtBot

from app.supervisor.sampler import EngineNow, SystemSample
from app.ui.main_window import MainWindow
from app.ui.telemetry_view import CURVE_S, POINTS, SYSTEM, Series, TelemetryView

START = 1_800_000_000.0
GB = 1_000_000_000


def sample(at: float, cpu: float, ram_gb: float) -> SystemSample:
    engine = EngineNow("user.smol", 0.0, 220_000_000, None)
    return SystemSample(at, cpu, int(ram_gb * GB), 16 * GB, None, None, None, False, (engine,))


def drawn_points(view: TelemetryView, chart: str, series: str) -> int:
    curve = view._curves.get((chart, series))
    xs = None if curve is None else curve.xData  # the points last handed to pyqtgraph
    return 0 if xs is None else len(xs)


class Events(QObject):
    """Counts the events of the kinds asked for that reach the objects it watches, by object."""

    def __init__(self, kinds: tuple[QEvent.Type, ...]) -> None:
        super().__init__()
        self.kinds = kinds
        self.counts: Counter[tuple[str, QEvent.Type]] = Counter()

    def watch(self, name: str, target: QObject) -> None:
        target.setObjectName(name)
        target.installEventFilter(self)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() in self.kinds:
            self.counts[(watched.objectName(), event.type())] += 1
        return False

    def total(self, kind: QEvent.Type) -> int:
        return sum(n for (_name, k), n in self.counts.items() if k == kind)


def chart_paints(view: TelemetryView) -> Events:
    """Counts the paints of every chart (a chart's picture is its viewport's)."""
    paints = Events((QEvent.Type.Paint,))
    for key, plot in view._plots.items():
        paints.watch(key, plot.viewport())
    return paints


def settled(view: TelemetryView) -> bool:
    """Every chart drawn, at the size it has now (a chart's left axis fits its width to its labels when
    painted, and the chart is drawn again at its new width)."""
    sizes = {
        key: (float(plot.getPlotItem().vb.width()), float(plot.getPlotItem().vb.height()))
        for key, plot in view._plots.items()
        if plot.isVisible()
    }
    drawn_at = {key: view._axes.get(key, (0.0,) * 5)[3:] for key in sizes}
    return not view._dirty and not view._slicer.isActive() and drawn_at == sizes


def shown_view(qtbot: QtBot, seconds: int = 1200) -> TelemetryView:
    view = TelemetryView()
    qtbot.addWidget(view)
    view.resize(700, 2000)  # every chart on screen
    view.show()
    qtbot.waitUntil(view.built)
    for i in range(seconds):  # by default 20 minutes of an idle machine
        view.add_sample(sample(START + i, 2.0, 6.0))
    qtbot.waitUntil(lambda: drawn_points(view, "ram", SYSTEM) == seconds and settled(view))
    return view


def test_a_point_on_a_pixel_already_drawn_leaves_the_curve_and_updates_the_title(qtbot: QtBot) -> None:
    view = shown_view(qtbot)
    # A hundredth of a second on: the same pixel column (of a 20-minute chart under 700 px wide), row
    # and time window.
    qtbot.waitUntil(lambda: settled(view))
    qtbot.wait(100)  # the last chart's paint
    paints = chart_paints(view)
    view.add_sample(sample(START + 1199.01, 2.0, 6.0001))
    qtbot.waitUntil(lambda: settled(view))
    qtbot.wait(100)  # a paint, were one asked for, would come in this time
    assert drawn_points(view, "ram", SYSTEM) == 1200
    assert paints.total(QEvent.Type.Paint) == 0, paints.counts
    assert len(view.charts["ram"].series[SYSTEM].xs) == 1201  # kept, and drawn with the next change
    title = view._titles["ram"].legend.text()
    view.add_sample(sample(START + 1199.02, 2.0, 6.2))  # rows higher, but a line is drawn at most once
    qtbot.waitUntil(lambda: settled(view))  # in CURVE_S of its time: the title says it at once
    assert view._titles["ram"].legend.text() != title and "6.20" in view._titles["ram"].legend.text()
    assert drawn_points(view, "ram", SYSTEM) == 1200
    view.add_sample(sample(START + 1199 + CURVE_S, 2.0, 6.2))  # drawn, with the points before
    qtbot.waitUntil(lambda: drawn_points(view, "ram", SYSTEM) == 1203)
    qtbot.waitUntil(lambda: paints.counts[("ram", QEvent.Type.Paint)] > 0)


def test_a_minute_of_an_idle_machine_draws_a_line_about_once_a_pixel_not_once_a_sample(
    qtbot: QtBot,
) -> None:
    # Two minutes after start: a chart of the last 30 minutes holds seconds a pixel from the first minute
    # on (a window as wide as the data held a fraction of a second, and every sample moved a pixel).
    view = shown_view(qtbot, seconds=120)
    qtbot.waitUntil(lambda: settled(view))
    qtbot.wait(100)
    paints, updates = chart_paints(view), view.curve_updates
    for i in range(120, 180):  # a minute more of the same figures, a second apart
        view.add_sample(sample(START + i, 2.0, 6.0))
        qtbot.waitUntil(lambda: settled(view))
    qtbot.wait(100)
    lines = 4  # CPU and RAM, each the system's and the engine's
    assert view.curve_updates - updates <= 60 * lines / 2, "at most one a line every two samples"
    assert paints.counts[("cpu", QEvent.Type.Paint)] <= 60 / 2, paints.counts
    assert drawn_points(view, "cpu", SYSTEM) >= 170, "and the line still follows the samples"


def test_a_line_whose_every_sample_moves_a_pixel_is_drawn_once_in_curve_s(qtbot: QtBot) -> None:
    # An idle machine's CPU chart is a few percent high: its jitter moves a row with most samples.
    view = shown_view(qtbot, seconds=120)
    qtbot.waitUntil(lambda: settled(view))
    draws = 0
    for i in range(120, 180):
        before = view._drawn[("cpu", SYSTEM)]
        view.add_sample(sample(START + i, 2.0 if i % 2 else 3.5, 6.0))
        qtbot.waitUntil(lambda: settled(view))
        draws += view._drawn[("cpu", SYSTEM)] != before
    assert draws <= 60 / CURVE_S + 2, "once in CURVE_S, and when the time window moves (at most twice)"
    assert drawn_points(view, "cpu", SYSTEM) >= 180 - CURVE_S, "and the line still follows the samples"


def test_a_sample_between_two_curve_s_sets_the_figures_and_queues_no_chart(qtbot: QtBot) -> None:
    view = shown_view(qtbot, seconds=120)
    qtbot.waitUntil(lambda: settled(view))
    due, cpu_legend = view._lines_due, view._titles["cpu"].legend.text()
    view.add_sample(sample(due - 1.0, 40.0, 9.0))  # rows higher: drawn with the next due sample
    assert not view._dirty and not view._slicer.isActive()
    assert view._titles["cpu"].legend.text() != cpu_legend and "9.00" in view._titles["ram"].legend.text()
    view.add_sample(sample(due, 40.0, 9.0))
    assert {"cpu", "ram"} <= view._dirty and view._slicer.isActive()
    qtbot.waitUntil(lambda: drawn_points(view, "ram", SYSTEM) == 122)
    qtbot.waitUntil(lambda: settled(view))
    view.add_sample(sample(due - 3600.0, 2.0, 6.0))  # the clock set back an hour: not held for it
    assert {"cpu", "ram"} <= view._dirty and view._lines_due == due - 3600.0 + CURVE_S


def test_new_figures_lay_out_nothing_and_keep_their_height(qtbot: QtBot) -> None:
    view = shown_view(qtbot, seconds=60)
    qtbot.waitUntil(lambda: settled(view))
    qtbot.wait(100)
    layouts = Events((QEvent.Type.LayoutRequest,))
    for name, widget in (("view", view), ("body", view.body), ("scroll", view.chart_scroll)):
        layouts.watch(name, widget)
    heights = {view.summary_box.height()}
    for i, (cpu, ram) in enumerate(((2.0, 6.0), (37.5, 6.25), (100.0, 12.5), (3.0, 6.0))):
        view.add_sample(sample(START + 60 + i, cpu, ram))  # figures a digit wider or narrower
        qtbot.waitUntil(lambda: settled(view))
        qtbot.wait(50)
        heights.add(view.summary_box.height())
    assert "12.50" in view._titles["ram"].legend.text() or "6.00" in view._titles["ram"].legend.text()
    assert layouts.total(QEvent.Type.LayoutRequest) == 0, layouts.counts
    assert len(heights) == 1, f"the Now line changed height: {heights}"


def test_a_new_figure_paints_its_legend_and_the_now_line_once_and_no_title(qtbot: QtBot) -> None:
    # A rich-text label lays its text out as a document and was painted twice for each new figure.
    view = shown_view(qtbot, seconds=60)
    qtbot.waitUntil(lambda: settled(view))
    qtbot.wait(100)
    paints = Events((QEvent.Type.Paint,))
    title = view._titles["ram"]
    for name, widget in (("header", title.header), ("legend", title.legend), ("now", view.summary)):
        paints.watch(name, widget)
    view.add_sample(sample(START + 60.5, 2.0, 6.4))  # a new RAM figure; the line waits for CURVE_S
    qtbot.waitUntil(lambda: settled(view))
    qtbot.wait(100)  # a second paint, were one asked for, would come in this time
    assert "6.40" in title.legend.text() and "RAM 6.4 of 16.0 GB" in view.summary.text()
    assert title.legend.accessibleName() == title.legend.text()  # as a label told a screen reader
    assert paints.counts[("legend", QEvent.Type.Paint)] == 1, paints.counts
    assert paints.counts[("now", QEvent.Type.Paint)] == 1, paints.counts
    assert paints.counts[("header", QEvent.Type.Paint)] == 0, paints.counts


def active_timers(view: TelemetryView) -> list[QTimer]:
    return [timer for timer in view.findChildren(QTimer) if timer.isActive()]


def test_nothing_is_drawn_and_no_timer_runs_while_the_window_is_minimized(qtbot: QtBot) -> None:
    window = MainWindow()
    qtbot.addWidget(window)
    view = window.telemetry
    window.side.setCurrentWidget(view)
    window.show()
    qtbot.waitUntil(view.built)
    for i in range(60):
        view.add_sample(sample(START + i, 2.0, 6.0))
    qtbot.waitUntil(lambda: not view._dirty and not view._slicer.isActive())
    window.showMinimized()
    qtbot.waitUntil(window.isMinimized)
    updates = view.curve_updates
    view.add_request(START + 60, {"decode_tps": 80.0, "prompt_tps": 900.0, "ttft_s": 0.05})
    view.add_sample(sample(START + 61, 50.0, 9.0))  # one taken as sampling stopped
    assert active_timers(view) == []
    qtbot.wait(200)  # a slice, were one started, would have drawn by now
    assert view.curve_updates == updates
    window.showNormal()
    qtbot.waitUntil(lambda: drawn_points(view, "decode", "Reply") == 1)  # on screen: the top chart


def test_nothing_is_drawn_while_hidden_and_all_is_drawn_when_shown_again(qtbot: QtBot) -> None:
    view = shown_view(qtbot)
    view.hide()
    for i in range(1200, 1260):  # a minute, far off the rows drawn
        view.add_sample(sample(START + i, 50.0, 9.0))
    assert active_timers(view) == []
    assert drawn_points(view, "cpu", SYSTEM) == 1200
    view.show()
    qtbot.waitUntil(lambda: drawn_points(view, "cpu", SYSTEM) == 1260)


def test_a_series_keeps_the_highest_of_its_last_30_minutes() -> None:
    rng = random.Random(7)
    series = Series()
    assert series.top() == 0.0
    for i in range(POINTS * 2 + 37):
        # Falling runs and rising runs, so that the highest point keeps falling out of the window.
        series.add(float(i), rng.random() * 10 + (i % 500) * (1 if (i // 500) % 2 else -1))
        if i % 97 == 0 or i >= POINTS * 2:
            assert series.top() == max(series.ys)
