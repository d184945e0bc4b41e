"""The Telemetry tab: charts over time of each reply's decode and prompt speed and time to first token,
and of CPU, RAM, GPU and VRAM for the machine and each engine.

It samples nothing itself: it says when it is on screen (``watching_changed``) and the desktop asks the
router for a ``SystemSample`` a second only then, so an idle app with the tab hidden costs nothing.
The last 30 minutes are kept in memory (ring buffers); per-reply figures also come from the history
database when the tab is first shown. pyqtgraph (with numpy) is imported when the tab is first shown,
not at start-up. Charts are redrawn at most once a second, off the token path: a reply streaming into
the chat never waits for them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QGuiApplication, QHideEvent, QPalette, QShowEvent
from PySide6.QtWidgets import QLabel, QScrollArea, QVBoxLayout, QWidget

from app.supervisor.sampler import SystemSample
from app.ui.chat.markdown_view import current_theme

WINDOW_S = 30 * 60
POINTS = WINDOW_S  # one a second
GB = 1e9
NOT_AVAILABLE = "not available"
SYSTEM = "System"
# Distinct on light and dark backgrounds; the system series is always the first.
COLOURS = ("#e67e22", "#2980b9", "#27ae60", "#8e44ad", "#c0392b", "#16a085", "#7f8c8d")


@dataclass
class Series:
    """One line of a chart: times and values, at most the last 30 minutes."""

    xs: deque[float] = field(default_factory=lambda: deque(maxlen=POINTS))
    ys: deque[float] = field(default_factory=lambda: deque(maxlen=POINTS))

    def add(self, x: float, y: float) -> None:
        self.xs.append(x)
        self.ys.append(y)


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
        self._dirty: set[str] = set()
        self.samples = 0
        self.requests = 0

        self.note = QLabel(
            "Sampled once a second while this tab is shown. Replies are plotted when they finish.", self
        )
        self.note.setWordWrap(True)
        self.note.setStyleSheet(f"color: {current_theme().muted}; font-size: 11px;")
        self.summary = QLabel("", self)
        self.summary.setWordWrap(True)
        self.body = QWidget(self)
        self.charts_layout = QVBoxLayout(self.body)
        self.charts_layout.setContentsMargins(0, 0, 0, 0)
        self.charts_layout.setSpacing(10)
        scroll = QScrollArea(self)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        scroll.setWidget(self.body)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 6, 8, 8)
        layout.addWidget(self.note)
        layout.addWidget(self.summary)
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
        self.watching_changed.emit(False)

    def built(self) -> bool:
        return bool(self._plots)

    # --- data in ----------------------------------------------------------------------------------

    def add_request(self, when: float, telemetry: dict[str, Any]) -> None:
        """A finished reply's figures."""
        for key, field_name in (("decode", "decode_tps"), ("prompt", "prompt_tps"), ("ttft", "ttft_s")):
            value = telemetry.get(field_name)
            if isinstance(value, int | float) and value > 0:
                self.charts[key].add("Reply", when, float(value))
                self._dirty.add(key)
        self.requests += 1
        if self.isVisible():
            self._redraw(self._dirty)

    def add_requests(self, rows: Iterable[tuple[float, dict[str, Any]]]) -> None:
        for when, telemetry in rows:
            self.add_request(when, telemetry)

    def add_sample(self, sample: SystemSample) -> None:
        at = sample.at
        charts = self.charts
        charts["cpu"].add(SYSTEM, at, sample.cpu_percent * (_cores()))
        charts["ram"].add(SYSTEM, at, sample.memory_used / GB)
        for engine in sample.engines:
            charts["cpu"].add(engine.model, at, engine.cpu_percent)
            charts["ram"].add(engine.model, at, engine.rss_bytes / GB)
            if engine.vram_bytes is not None:
                charts["vram"].add(engine.model, at, engine.vram_bytes / GB)
        if sample.gpu_percent is not None:
            charts["gpu"].add(SYSTEM, at, sample.gpu_percent)
        if sample.vram_used is not None:
            charts["vram"].add(SYSTEM, at, sample.vram_used / GB)
        charts["gpu"].missing = (
            "" if charts["gpu"].points() else f"GPU load: {NOT_AVAILABLE} on this machine."
        )
        charts["vram"].missing = "" if charts["vram"].points() else f"VRAM: {NOT_AVAILABLE} on this machine."
        if sample.unified_memory:
            charts["vram"].title = "Unified memory used by engines"
        self.samples += 1
        self._show_summary(sample)
        self._redraw({"cpu", "ram", "gpu", "vram"})

    def _show_summary(self, s: SystemSample) -> None:
        gpu = f"{s.gpu_percent:.0f}%" if s.gpu_percent is not None else NOT_AVAILABLE
        vram = (
            f"{s.vram_used / GB:.1f} of {s.vram_total / GB:.1f} GB"
            if s.vram_used is not None and s.vram_total
            else NOT_AVAILABLE
        )
        engines = " · ".join(
            f"{e.model}: CPU {e.cpu_percent:.0f}%, {e.rss_bytes / GB:.2f} GB" for e in s.engines
        )
        self.summary.setText(
            f"<b>Now</b> CPU {s.cpu_percent:.0f}% of the machine · RAM {s.memory_used / GB:.1f} of "
            f"{s.memory_total / GB:.1f} GB · GPU {gpu} · VRAM {vram}"
            + (f"<br>{engines}" if engines else "<br>No engine is running.")
        )

    # --- drawing ----------------------------------------------------------------------------------

    def _build(self) -> None:
        import pyqtgraph as pg

        palette = QGuiApplication.palette()
        pg.setConfigOptions(
            antialias=False,
            background=palette.color(QPalette.ColorRole.Base),
            foreground=palette.color(QPalette.ColorRole.Text),
        )
        for key, chart in self.charts.items():
            axis = pg.DateAxisItem(orientation="bottom")
            plot = pg.PlotWidget(axisItems={"bottom": axis})
            plot.setMinimumHeight(150)
            plot.setMouseEnabled(x=False, y=False)
            plot.hideButtons()
            plot.setMenuEnabled(False)
            plot.showGrid(x=False, y=True, alpha=0.25)
            plot.setTitle(f"{chart.title} ({chart.unit})", size="9pt")
            plot.getPlotItem().addLegend(offset=(4, 4), labelTextSize="8pt")
            plot.getPlotItem().vb.setLimits(yMin=0)
            missing = QLabel("", self.body)
            missing.setAlignment(Qt.AlignmentFlag.AlignCenter)
            missing.setStyleSheet(f"color: {current_theme().muted}; padding: 8px;")
            missing.hide()
            self.charts_layout.addWidget(plot)
            self.charts_layout.addWidget(missing)
            self._plots[key] = plot
            self._missing_labels[key] = missing
        self.charts_layout.addStretch(1)

    def _redraw(self, keys: set[str]) -> None:
        if not self._plots or not self.isVisible():
            return
        import pyqtgraph as pg

        for key in keys:
            chart, plot = self.charts[key], self._plots[key]
            if chart.missing:
                plot.hide()
                self._missing_labels[key].setText(chart.missing)
                self._missing_labels[key].show()
                continue
            self._missing_labels[key].hide()
            plot.show()
            plot.setTitle(f"{chart.title} ({chart.unit})", size="9pt")
            for index, (name, series) in enumerate(chart.series.items()):
                curve = self._curves.get((key, name))
                if curve is None:
                    colour = COLOURS[index % len(COLOURS)]
                    per_reply = key in ("decode", "prompt", "ttft")
                    curve = plot.plot(
                        [],
                        [],
                        name=name,
                        pen=pg.mkPen(colour, width=1.5),
                        symbol="o" if per_reply else None,
                        symbolSize=5,
                        symbolBrush=colour,
                        symbolPen=None,
                    )
                    self._curves[(key, name)] = curve
                curve.setData(list(series.xs), list(series.ys))
        self._dirty -= keys


def _cores() -> int:
    """psutil's machine-wide CPU % is of all cores; charts show % of one core, as per engine."""
    import os

    return os.cpu_count() or 1
