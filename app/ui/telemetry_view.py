"""The Telemetry tab: charts over time of each reply's decode and prompt speed and time to first token,
and of CPU, RAM, GPU and VRAM for the machine and each engine.

It samples nothing itself: it says when it is on screen (``watching_changed``) and the desktop asks the
router for a ``SystemSample`` a second only then, so an idle app with the tab hidden costs nothing.
The last 30 minutes are kept in memory (ring buffers); per-reply figures also come from the history
database when the tab is first shown. pyqtgraph (with numpy) is imported when the tab is first shown,
not at start-up. Charts are redrawn at most once a second, one per slice (``SLICE_MS`` apart), off the
token path: a reply streaming into the chat never waits for them.

Only what changed on screen is drawn again: a sample adds points to CPU and RAM (and to GPU and VRAM where the
machine has them), and the time window all charts share is always the last 30 minutes, moved in steps of
``WINDOW_STEP_S`` rather than with every sample (60 s is 10 px of a 300 px chart), so the per-reply charts and
the time axes are drawn again once a minute, not every second (a step draws every shown chart's time axis and
lines again: 15-20 ms of CPU). A line is handed to pyqtgraph again only when a new point moves a pixel
(``_Drawn``), and the sampled charts at most once in ``CURVE_S`` of their time (a sample between queues no
chart and starts no timer): a 30-minute chart holds a second or more a pixel (a window as wide as the data,
minutes after start, held a fraction of a second, and every sample moved the line), and an idle machine's
figures mostly stay on the same pixel row; but a chart a thousand pixels wide gains a column every other
sample, and the CPU chart of an idle machine, whose axis is a few percent high, moves a row with most of them,
so the lines follow their legends by up to ``CURVE_S`` (a few pixels). The charts' legends with their latest
figures and the "Now" figures change once a sample, as plain text: a legend paints its runs itself
(``_Legend``), "Now" is a plain-text label (``_Steady``). A rich-text label laid its text out as a document
and was painted twice for each new figure, about half of what an idle tab cost. Each is in a box of its own
without a layout: a label's new text asks its parent's layout to run, and that ran up through the tab, the
splitter and the window's layout (with an animation object for the central widget) every second; in its box it
stops there and repaints only the text, never a chart. The "Now" box keeps the height its text needed at its
width, so a figure a digit wider that wraps a line sooner does not make the page jump. The axes are cached as
pixmaps (unchanged, an axis replayed the text of its tick labels on every paint), and lines are 1 px wide,
which Qt draws without a stroker (at 1.5 px a chart's paint cost about three times as much). A sample costs
the UI thread about 2 ms of CPU instead of 20, and the longest chart paint about 2 ms instead of 4. Nothing
runs while the tab is hidden or its window minimized: no sampling (the desktop stops it) and no timer (the
slicer stops, and what came meanwhile is drawn when the tab is back on screen).
"""

from __future__ import annotations

import functools
import html
import math
import os
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QPoint, QRect, Qt, QTimer, Signal
from PySide6.QtGui import (
    QColor,
    QGuiApplication,
    QHideEvent,
    QPainter,
    QPaintEvent,
    QPalette,
    QResizeEvent,
    QShowEvent,
)
from PySide6.QtWidgets import (
    QGraphicsItem,
    QHBoxLayout,
    QLabel,
    QScrollArea,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from app.core.runcard import RunCard, dialect_label
from app.core.units import GB
from app.ui import heap
from app.ui.chat.markdown_view import current_theme

if TYPE_CHECKING:
    from app.supervisor.sampler import SystemSample

WINDOW_S = 30 * 60
POINTS = WINDOW_S  # one a second
NOT_AVAILABLE = "not available"
SYSTEM = "System"
# Distinct on light and dark backgrounds; the system series is always the first.
SLICE_MS = 40  # between two charts' updates
WINDOW_STEP_S = 60  # the shared time window moves in steps of this (3.3% of the 30 minutes shown)
# A sampled line is handed its points again at most once in this much of its time: 6 px of a 1,000 px
# chart of 30 minutes. At a pixel a second or two (a wide chart, an idle machine's jitter on its CPU
# chart's rows) a line was drawn again with most samples, most of the tab's cost; at 5 s a line's
# update and paint were still a fifth of it.
CURVE_S = 10.0
PER_REPLY = ("decode", "prompt", "ttft")
CHAT_REPLY = "Reply"  # the line of this app's own chat replies
API_REPLIES_SHOWN = 4
UNIFIED_TITLE = "Unified memory used by engines"
COLOURS = ("#e67e22", "#2980b9", "#27ae60", "#8e44ad", "#c0392b", "#16a085", "#7f8c8d")


@dataclass
class Series:
    """One line of a chart: times and values, at most the last 30 minutes, and the highest of those
    values kept as they come (the chart's y range asks for it with every draw: scanning 1,800 values a
    line was about 0.15 ms of the 1.3 ms an idle sample cost the UI thread)."""

    xs: deque[float] = field(default_factory=lambda: deque(maxlen=POINTS))
    ys: deque[float] = field(default_factory=lambda: deque(maxlen=POINTS))
    # (index, value) of each point no later point is as high as: the highest first, the latest last
    _peaks: deque[tuple[int, float]] = field(default_factory=deque)
    _added: int = 0

    def add(self, x: float, y: float) -> None:
        self.xs.append(x)
        self.ys.append(y)
        peaks = self._peaks
        while peaks and peaks[-1][1] <= y:
            peaks.pop()
        peaks.append((self._added, y))
        self._added += 1
        if peaks[0][0] < self._added - POINTS:  # the point that just fell out of the 30 minutes
            peaks.popleft()

    def top(self) -> float:
        """The highest value kept (0 with none)."""
        return self._peaks[0][1] if self._peaks else 0.0


@dataclass
class _Drawn:
    """What a line chart's curve shows: its points up to ``last_x``, and the pixel column of its last
    point with the rows its points cover there (peak thinning draws a column's lowest to highest)."""

    axes: tuple[float, ...]  # the view (x and y ranges) and its size in pixels these were worked out for
    last_x: float
    column: int
    low: int
    high: int


@dataclass
class ChartData:
    title: str
    unit: str
    series: dict[str, Series] = field(default_factory=dict)
    missing: str = ""  # why there is nothing to draw ("" when there is)

    def add(self, name: str, x: float, y: float) -> None:
        self.series.setdefault(name, Series()).add(x, y)

    def points(self) -> int:
        return sum(len(s.xs) for s in self.series.values())


class _Steady(QWidget):
    """A plain-text label in a box without a layout: a new text lays out nothing but the box (see the
    module docstring). The box is as high as the text needs at its width, and no lower than it has been
    at that width. Its height is worked out only for a text of other lines or longer than any fitted at
    this width: the same lines with other figures need no more room than the longest before them."""

    def __init__(self, parent: QWidget) -> None:
        super().__init__(parent)
        self.label = QLabel(self)
        self.label.setTextFormat(Qt.TextFormat.PlainText)
        self.label.setWordWrap(True)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self.setFixedHeight(0)
        self._fitted = (-1, -1)  # the lines and the length of the longest text fitted at this width

    def set_text(self, text: str) -> None:
        if self.label.text() == text:
            return
        self.label.setText(text)
        lines, longest = self._fitted
        if text.count("\n") != lines or len(text) > longest:
            self._fit(grow_only=True)

    def _fit(self, grow_only: bool) -> None:
        label, text = self.label, self.label.text()
        needed = label.heightForWidth(self.width())
        needed = needed if needed >= 0 else label.sizeHint().height()
        if needed > self.height() or (not grow_only and needed != self.height()):
            self.setFixedHeight(needed)
        lines, longest = self._fitted
        same_lines = text.count("\n") == lines and grow_only
        self._fitted = (text.count("\n"), max(longest, len(text)) if same_lines else len(text))

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self.label.setGeometry(self.rect())
        if event.size().width() != event.oldSize().width():
            self._fit(grow_only=False)


class _Legend(QWidget):
    """A chart's lines, each a coloured square, its name and its latest figure, painted as runs of plain
    text (see the module docstring). Too long for its width, it is cut off, as a title is."""

    GAP = "   "

    def __init__(self, parent: QWidget) -> None:
        super().__init__(parent)
        self._items: tuple[tuple[str, str], ...] = ()  # (colour, text) of each line

    def set_items(self, items: Iterable[tuple[str, str]]) -> None:
        items = tuple(items)
        if items != self._items:
            self._items = items
            self.setAccessibleName(self.text())  # what a label's text told a screen reader
            self.update()  # no geometry changes: nothing is laid out again

    def text(self) -> str:
        return self.GAP.join(text for _colour, text in self._items)

    def paintEvent(self, event: QPaintEvent) -> None:
        painter = QPainter(self)
        metrics = self.fontMetrics()
        x = 0
        for colour, text in self._items:
            painter.setPen(QColor(colour))
            painter.drawText(x, metrics.ascent(), text)
            x += metrics.horizontalAdvance(text + self.GAP)


class _Title(QWidget):
    """A chart's title over its legend, in a box of a fixed height without a layout: a new figure
    repaints the legend alone, and lays out nothing (a chart resized is drawn from scratch)."""

    def __init__(self, parent: QWidget) -> None:
        super().__init__(parent)
        self.header = QLabel(self)
        self._header = ("", "")  # the title and unit it says
        self.legend = _Legend(self)
        font = self.font()
        font.setPointSize(9)
        for part in (self.header, self.legend):
            part.setFont(font)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self.setFixedHeight(2 * self.legend.fontMetrics().lineSpacing() + 2)

    def set_header(self, title: str, unit: str) -> None:
        if self._header != (title, unit):
            self._header = (title, unit)
            self.header.setText(f"<b>{html.escape(title)}</b> ({html.escape(unit)})")

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        line = self.height() // 2
        self.header.setGeometry(0, 0, self.width(), line)
        self.legend.setGeometry(0, line, self.width(), self.height() - line)


class TelemetryView(QWidget):
    watching_changed = Signal(bool)  # on screen or not: sample only while it is

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.charts: dict[str, ChartData] = {
            "decode": ChartData("Decode speed per reply", "tok/s"),
            "prompt": ChartData("Prompt speed per reply", "tok/s"),
            "ttft": ChartData("Time to first token per reply", "s"),
            "cpu": ChartData("CPU", "% of one core"),
            "ram": ChartData("Memory", "GB"),
            "gpu": ChartData("GPU busy", "%"),
            "vram": ChartData("VRAM", "GB"),
        }
        self._plots: dict[str, Any] = {}  # chart key -> pyqtgraph PlotWidget, once built
        self._curves: dict[tuple[str, str], Any] = {}
        self._missing_labels: dict[str, QLabel] = {}
        self._dirty: set[str] = set()  # charts whose data changed since they were drawn
        self._window: tuple[float, float] | None = None  # the time window the charts show
        self._drawn: dict[tuple[str, str], tuple[int, float]] = {}  # a curve's points and last time
        self._shown: dict[tuple[str, str], _Drawn] = {}  # a line's pixels as drawn
        self._titles: dict[str, _Title] = {}
        self._minimized = False  # the window is: nothing is drawn, as while the tab is hidden
        self._lines_due = 0.0  # the sample time from which the sampled charts' lines are drawn again
        self._axes: dict[str, tuple[float, ...]] = {}  # each chart's view and size as last set
        self._slicer = QTimer(self)
        self._slicer.setInterval(SLICE_MS)
        self._slicer.timeout.connect(self._draw_next)
        self.samples = 0
        self.requests = 0
        self.curve_updates = 0  # lines handed to pyqtgraph again

        self.note = QLabel(
            "Sampled once a second while this tab is shown. Replies are plotted when they finish.", self
        )
        self.note.setWordWrap(True)
        self.note.setStyleSheet(f"color: {current_theme().muted}; font-size: 11px;")
        now = QWidget(self)  # "Now", and its figures in a box of one height, whatever they are
        now_title = QLabel("<b>Now</b>", now)
        now_title.setAlignment(Qt.AlignmentFlag.AlignTop)
        self.summary_box = _Steady(now)
        self.summary = self.summary_box.label
        row = QHBoxLayout(now)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(now_title)
        row.addWidget(self.summary_box, 1)
        self.api_replies: deque[tuple[float, RunCard]] = deque(maxlen=API_REPLIES_SHOWN)
        self.last_api = QLabel("", self)  # the last replies the local API gave, by dialect
        self.last_api.setWordWrap(True)
        self.last_api.hide()
        self.body = QWidget(self)
        self.charts_layout = QVBoxLayout(self.body)
        self.charts_layout.setContentsMargins(0, 0, 0, 0)
        self.charts_layout.setSpacing(10)
        self.chart_scroll = scroll = QScrollArea(self)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        scroll.setWidget(self.body)
        # Charts scrolled into view are drawn then, not a second later.
        scroll.verticalScrollBar().valueChanged.connect(lambda _v: self._redraw(set(self.charts)))
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 6, 8, 8)
        layout.addWidget(self.note)
        layout.addWidget(now)
        layout.addWidget(self.last_api)
        layout.addWidget(scroll, 1)

    # --- on screen or not -------------------------------------------------------------------------

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        if not self._plots:
            self._build()
        self._redraw(set(self.charts))
        self.watching_changed.emit(True)

    def hideEvent(self, event: QHideEvent) -> None:
        super().hideEvent(event)
        self._slicer.stop()
        self.watching_changed.emit(False)

    def set_minimized(self, minimized: bool) -> None:
        """The window was minimized (nothing is drawn, no timer runs) or brought back (all is drawn)."""
        self._minimized = minimized
        if minimized:
            self._slicer.stop()
        else:
            self._redraw(set(self.charts))

    def on_screen(self) -> bool:
        return self.isVisible() and not self._minimized

    def built(self) -> bool:
        return bool(self._plots)

    # --- data in ----------------------------------------------------------------------------------

    def add_request(self, when: float, telemetry: dict[str, Any], origin: str = CHAT_REPLY) -> None:
        """A finished reply's figures, on the line of its ``origin``: this app's chat, or the local
        API's dialect that asked for it ("Ollama API")."""
        for key, field_name in (("decode", "decode_tps"), ("prompt", "prompt_tps"), ("ttft", "ttft_s")):
            value = telemetry.get(field_name)
            if isinstance(value, int | float) and value > 0:
                self.charts[key].add(origin, when, float(value))
                self._changed({key})
        self.requests += 1

    def add_api_reply(self, when: float, card: RunCard) -> None:
        """A reply the local API gave another app: on the charts by its dialect, its run card in the
        last replies' list."""
        self.add_request(when, card.to_json(), dialect_label(card.dialect))
        self.api_replies.appendleft((when, card))
        rows = [
            f"{time.strftime('%H:%M:%S', time.localtime(at))} · "
            f"<b>{html.escape(dialect_label(c.dialect))}</b> · {html.escape(c.model)} · "
            f"{c.completion_tokens:,} tokens at {c.decode_tps:,.1f} tok/s, first after {c.ttft_s:.3f} s"
            for at, c in self.api_replies
        ]
        rows += ["&nbsp;"] * (API_REPLIES_SHOWN - len(rows))  # of one height: the charts below stay put
        self.last_api.setText("<b>Last replies to other apps</b><br>" + "<br>".join(rows))
        self.last_api.setToolTip("\n".join(f"{label}: {value}" for label, value in card.lines()))
        self.last_api.show()

    def add_requests(self, rows: Iterable[tuple[float, dict[str, Any]]]) -> None:
        for when, telemetry in rows:
            self.add_request(when, telemetry)

    def add_sample(self, sample: SystemSample) -> None:
        at = sample.at
        charts = self.charts
        changed = {"cpu", "ram"}
        charts["cpu"].add(SYSTEM, at, sample.cpu_percent * (_cores()))
        charts["ram"].add(SYSTEM, at, sample.memory_used / GB)
        for engine in sample.engines:
            if engine.cpu_percent is not None:
                charts["cpu"].add(engine.model, at, engine.cpu_percent)
            charts["ram"].add(engine.model, at, engine.rss_bytes / GB)
            if engine.vram_bytes is not None:
                charts["vram"].add(engine.model, at, engine.vram_bytes / GB)
                changed.add("vram")
        if sample.gpu_percent is not None:
            charts["gpu"].add(SYSTEM, at, sample.gpu_percent)
            changed.add("gpu")
        if sample.vram_used is not None:
            charts["vram"].add(SYSTEM, at, sample.vram_used / GB)
            changed.add("vram")
        missing = {
            "gpu": "" if charts["gpu"].points() else f"GPU load: {NOT_AVAILABLE} on this machine.",
            "vram": "" if charts["vram"].points() else f"VRAM: {NOT_AVAILABLE} on this machine.",
        }
        shown = False  # a chart or its note shown instead, or a title, changed: drawn at once
        if sample.unified_memory and charts["vram"].title != UNIFIED_TITLE:
            charts["vram"].title = UNIFIED_TITLE
            changed.add("vram")
            shown = True
        for key, text in missing.items():
            if charts[key].missing != text:
                charts[key].missing = text
                changed.add(key)
                shown = True
        self.samples += 1
        self._show_summary(sample)
        # The legends say each sample; the lines are drawn again at most once in CURVE_S of its time.
        draw = shown or not 0 < self._lines_due - at <= CURVE_S  # (a clock set back waits for nothing)
        if draw:
            self._lines_due = at + CURVE_S
        self._changed(changed, draw)

    def _show_summary(self, s: SystemSample) -> None:
        gpu = f"{s.gpu_percent:.0f}%" if s.gpu_percent is not None else NOT_AVAILABLE
        vram = (
            f"{s.vram_used / GB:.1f} of {s.vram_total / GB:.1f} GB"
            if s.vram_used is not None and s.vram_total
            else NOT_AVAILABLE
        )
        engines = "\n".join(
            f"{e.model}: CPU {_percent(e.cpu_percent)} of one core · {e.rss_bytes / GB:.2f} GB"
            for e in s.engines
        )
        self.summary_box.set_text(
            f"machine: CPU {s.cpu_percent:.0f}% · RAM {s.memory_used / GB:.1f} of "
            f"{s.memory_total / GB:.1f} GB\nGPU {gpu} · VRAM {vram}\n" + (engines or "No engine is running.")
        )

    # --- drawing ----------------------------------------------------------------------------------

    def _build(self) -> None:
        import pyqtgraph as pg

        heap.after_import()
        palette = QGuiApplication.palette()
        pg.setConfigOptions(
            antialias=False,
            background=palette.color(QPalette.ColorRole.Base),
            foreground=palette.color(QPalette.ColorRole.Text),
        )
        for key, chart in self.charts.items():
            axis = pg.DateAxisItem(orientation="bottom")
            plot = pg.PlotWidget(axisItems={"bottom": axis})
            plot.setMinimumHeight(140)
            plot.setMouseEnabled(x=False, y=False)
            plot.hideButtons()
            plot.setMenuEnabled(False)
            plot.showGrid(x=False, y=True, alpha=0.25)
            plot.getPlotItem().vb.setLimits(yMin=0)
            # Resized (the left axis fits its width to its labels when painted): its pixels are others.
            plot.getPlotItem().vb.sigResized.connect(lambda _box, k=key: self._redraw({k}))
            for side in ("left", "bottom"):  # kept as pixmaps: drawn again only when their range moves
                plot.getAxis(side).setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
            title = _Title(self.body)
            title.set_header(chart.title, chart.unit)
            missing = QLabel("", self.body)
            missing.setAlignment(Qt.AlignmentFlag.AlignCenter)
            missing.setStyleSheet(f"color: {current_theme().muted}; padding: 8px;")
            missing.hide()
            self.charts_layout.addWidget(title)
            self.charts_layout.addWidget(plot)
            self.charts_layout.addWidget(missing)
            self._titles[key] = title
            self._plots[key] = plot
            self._missing_labels[key] = missing
        self.charts_layout.addStretch(1)

    def _changed(self, keys: set[str], draw: bool = True) -> None:
        """``keys`` have new points: their titles say so, and with ``draw`` their charts are drawn; every
        chart is drawn if the shared window moved."""
        window = self._span()
        if window != self._window:
            self._window = window
            keys, draw = set(self.charts), True
        self._redraw(keys, draw)

    def _redraw(self, keys: set[str], draw: bool = True) -> None:
        """Set the titles of ``keys`` now and, with ``draw``, queue their charts for drawing, one chart per
        ``SLICE_MS``, so that no turn of the event loop pays for more than one chart's update and paint
        (a reply may be streaming meanwhile)."""
        if draw:
            self._dirty |= keys
        if not (self._plots and self.on_screen()):
            return
        for key in keys:
            self._set_title(key)
        if self._dirty and not self._slicer.isActive():
            self._slicer.start()

    def _set_title(self, key: str) -> None:
        """A chart's title, with a line for each origin or process and its latest figure, or the note
        that says why there is no chart: set at once, so that the charts are laid out before the
        slices draw them (a chart drawn and then resized would be drawn again)."""
        chart, note, title = self.charts[key], self._missing_labels[key], self._titles[key]
        note.setText(chart.missing)
        drawn = not chart.missing
        for widget, shown in ((note, not drawn), (self._plots[key], drawn), (title, drawn)):
            if widget.isVisibleTo(self) != shown:
                widget.setVisible(shown)
        if chart.missing:
            return
        title.set_header(chart.title, chart.unit)
        digits = _digits(chart.unit)
        title.legend.set_items(  # per reply: a line for each origin (chat, each dialect)
            (
                COLOURS[index % len(COLOURS)],
                f"■ {name}" + (f" {series.ys[-1]:,.{digits}f}" if series.ys else ""),
            )
            for index, (name, series) in enumerate(chart.series.items())
        )

    def _draw_next(self) -> None:
        visible = self._plots and self.on_screen()
        while visible and self._dirty:
            key = next(k for k in self.charts if k in self._dirty)
            self._dirty.discard(key)
            if self._draw(key):
                return  # the rest in the next slices
        self._slicer.stop()

    def _draw(self, key: str) -> bool:
        """Bring one chart up to date; False when there was nothing to paint (scrolled out of view, or
        no pixel of it changed)."""
        chart, plot = self.charts[key], self._plots[key]
        if chart.missing:
            return False  # its note is shown instead (``_set_title``)
        viewport = self.chart_scroll.viewport()
        if not QRect(plot.mapTo(viewport, QPoint(0, 0)), plot.size()).intersects(viewport.rect()):
            return False  # scrolled out of view: drawn when scrolled back
        per_reply = key in PER_REPLY
        top = max((series.top() for series in chart.series.values()), default=0.0)
        # From zero (no made-up swings), to a round number that changes rarely: an axis whose range
        # moves is drawn again from scratch.
        y_top = _nice(top * 1.1)
        view_box = plot.getPlotItem().vb
        window = self._window or (0.0, 1.0)
        axes = (*window, y_top, float(view_box.width()), float(view_box.height()))
        moved = self._axes.get(key) != axes
        if moved:
            self._axes[key] = axes
            plot.setYRange(0, y_top, padding=0)
            if self._window is not None:  # one time window for every chart, so that they line up
                plot.setXRange(*self._window, padding=0.02)
        painted = moved
        for index, (name, series) in enumerate(chart.series.items()):
            curve = self._curve(key, name, COLOURS[index % len(COLOURS)], per_reply)
            drawn = (len(series.xs), series.xs[-1] if series.xs else 0.0)
            if self._drawn.get((key, name)) == drawn:
                if moved and not per_reply and series.xs:  # the same points, on new pixels
                    self._shown[(key, name)] = self._pixels(series, axes)
                continue
            if not per_reply and not moved and not self._moves_a_pixel((key, name), series, axes):
                continue
            self._drawn[(key, name)] = drawn
            curve.setData(list(series.xs), list(series.ys))
            self.curve_updates += 1
            if not per_reply and series.xs:
                self._shown[(key, name)] = self._pixels(series, axes)
            painted = True
        return painted  # painted in the next turn of the loop, when the scene hands its changes to the view

    def _curve(self, key: str, name: str, colour: str, per_reply: bool) -> Any:
        import pyqtgraph as pg

        curve = self._curves.get((key, name))
        if curve is None:
            # Replies are separate events: dots, not a line that suggests values in between.
            curve = self._plots[key].plot(
                [],
                [],
                pen=None if per_reply else pg.mkPen(colour, width=1),
                symbol="o" if per_reply else None,
                symbolSize=6,
                symbolBrush=colour,
                symbolPen=None,
            )
            # 1,800 points a line on a chart a few hundred pixels wide: draw about one per pixel.
            curve.setDownsampling(auto=True, method="peak")
            curve.setClipToView(True)
            self._curves[(key, name)] = curve
        return curve

    @staticmethod
    def _pixel(x: float, y: float, axes: tuple[float, ...]) -> tuple[int, int]:
        """Where a point falls on a chart of ``axes``: its pixel column and row."""
        start, end, y_top, width, height = axes
        span = (end - start) * 1.04  # the x range's 2% padding each side
        column = math.floor((x - start + (end - start) * 0.02) / span * width) if span > 0 else 0
        return column, math.floor(y / y_top * height) if y_top > 0 else 0

    def _pixels(self, series: Series, axes: tuple[float, ...]) -> _Drawn:
        column, row = self._pixel(series.xs[-1], series.ys[-1], axes)
        low = high = row
        for x, y in zip(reversed(series.xs), reversed(series.ys), strict=True):
            at, row = self._pixel(x, y, axes)
            if at != column:
                break
            low, high = min(low, row), max(high, row)
        return _Drawn(axes, series.xs[-1], column, low, high)

    def _moves_a_pixel(self, curve: tuple[str, str], series: Series, axes: tuple[float, ...]) -> bool:
        """Whether the points added since the curve was drawn would change a pixel of it: one in a
        new column, or above or below what its last column shows."""
        shown = self._shown.get(curve)
        if shown is None or shown.axes != axes:
            return True
        for x, y in zip(reversed(series.xs), reversed(series.ys), strict=True):
            if x <= shown.last_x:
                return False
            column, row = self._pixel(x, y, axes)
            if column != shown.column or not shown.low <= row <= shown.high:
                return True
        return False

    def _span(self) -> tuple[float, float] | None:
        """The 30 minutes up to the latest point, their end rounded up to a whole ``WINDOW_STEP_S``: the
        window moves once a step, not with every sample, so the charts whose data did not change are
        left as drawn, and it is always 30 minutes wide, so a pixel holds as many seconds from the
        first minute on."""
        ends = [s.xs[-1] for c in self.charts.values() for s in c.series.values() if s.xs]
        if not ends:
            return None
        end = (math.floor(max(ends) / WINDOW_STEP_S) + 1) * WINDOW_STEP_S
        return end - WINDOW_S, end


def _nice(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that is at least ``value`` (1 for nothing)."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return float(next(step * power for step in (1, 2, 2.5, 5, 10) if step * power >= value))


def _percent(value: float | None) -> str:
    return f"{value:.0f}%" if value is not None else "…"


def _digits(unit: str) -> int:
    return 2 if unit in ("GB", "s") else 0


@functools.cache
def _cores() -> int:
    """psutil's machine-wide CPU % is of all cores; charts show % of one core, as per engine. Read once:
    ``os.cpu_count`` reads a file in /sys each time, and this is asked once a sample."""
    return os.cpu_count() or 1
