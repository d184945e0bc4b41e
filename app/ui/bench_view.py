"""The Bench window: choose models and backends, run ``bench`` with progress and Cancel, see a bar chart
and the table, compare with earlier runs, export as Markdown (llama-bench's table) or JSON.

A widget only: it asks for runs with ``run_requested`` / ``cancel_requested`` and is told about them
through ``set_progress`` / ``set_finished`` / ``set_failed``; the desktop gives it the models, the
backends and the saved runs, and writes the exports it asks for.
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QGuiApplication, QPalette
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.core.bench import (
    DEFAULT_GEN_TOKENS,
    DEFAULT_PROMPT_TOKENS,
    DEFAULT_REPETITIONS,
    BenchResult,
    BenchRun,
    BenchSpec,
    figure,
    hardware_summary,
)
from app.ui.chat.markdown_view import current_theme

if TYPE_CHECKING:
    from app.supervisor.bench import BenchProgress

PP_COLOUR, TG_COLOUR = "#2980b9", "#e67e22"
COLUMNS = ["Model", "Backend", "Engine", "pp t/s", "tg t/s", "TTFT s", "Run"]


def _when(run: BenchRun) -> str:
    return datetime.datetime.fromtimestamp(run.created_at).strftime("%Y-%m-%d %H:%M")


class BenchView(QWidget):
    run_requested = Signal(object)  # BenchSpec
    cancel_requested = Signal()
    export_requested = Signal(object, str, str)  # BenchRun, "markdown" | "json", path

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent, Qt.WindowType.Window)
        self.setWindowTitle("Bench — Lemon Desk")
        self.resize(1000, 680)
        self.runs: list[BenchRun] = []  # saved, oldest first
        self.current: BenchRun | None = None  # the run shown
        self.running = False
        self.dialog: QFileDialog | None = None
        self._charts: list[Any] = []  # pyqtgraph PlotWidgets: pp and tg, made when first needed

        self.models = QListWidget(self)
        self.models.setToolTip("Downloaded models; check the ones to measure")
        self.backends = QListWidget(self)
        self.backends.setToolTip("None checked: each model's default backend")
        self.prompt_tokens = self._spin(1, 32768, DEFAULT_PROMPT_TOKENS, "Prompt tokens processed (pp)")
        self.gen_tokens = self._spin(1, 8192, DEFAULT_GEN_TOKENS, "Tokens generated (tg)")
        self.repetitions = self._spin(1, 20, DEFAULT_REPETITIONS, "Repetitions: the median and spread")
        form = QFormLayout()
        form.addRow("Prompt tokens", self.prompt_tokens)
        form.addRow("Generated tokens", self.gen_tokens)
        form.addRow("Repetitions", self.repetitions)
        self.run_button = QPushButton("Run", self)
        self.run_button.setDefault(True)
        self.run_button.clicked.connect(self._run)
        self.cancel_button = QPushButton("Cancel", self)
        self.cancel_button.setEnabled(False)
        self.cancel_button.clicked.connect(self.cancel_requested)
        buttons = QHBoxLayout()
        buttons.addWidget(self.run_button)
        buttons.addWidget(self.cancel_button)
        choose = QGroupBox("Measure", self)
        left = QVBoxLayout(choose)
        left.addWidget(QLabel("Models", choose))
        left.addWidget(self.models, 2)
        left.addWidget(QLabel("Backends", choose))
        left.addWidget(self.backends, 1)
        left.addLayout(form)
        left.addLayout(buttons)

        self.progress = QProgressBar(self)
        self.progress.setTextVisible(True)
        self.progress.setFormat("%v of %m repetitions done")
        self.progress.hide()
        self.status = QLabel("Choose models (and backends), then Run.", self)
        self.status.setWordWrap(True)
        self.hardware = QLabel("", self)
        self.hardware.setWordWrap(True)
        self.compare = QComboBox(self)
        self.compare.setToolTip("Show an earlier run beside this one (paler bars)")
        self.compare.currentIndexChanged.connect(self._show)
        self.export_md = QPushButton("Export Markdown…", self)
        self.export_md.clicked.connect(lambda: self._export("markdown"))
        self.export_json = QPushButton("Export JSON…", self)
        self.export_json.clicked.connect(lambda: self._export("json"))
        tools = QHBoxLayout()
        tools.addWidget(QLabel("Compare with", self))
        tools.addWidget(self.compare, 1)
        tools.addWidget(self.export_md)
        tools.addWidget(self.export_json)
        self.chart_row = QHBoxLayout()
        self.chart_note = QLabel("", self)
        self.chart_note.setStyleSheet(f"color: {current_theme().muted}; font-size: 11px;")
        self.placeholder = QLabel(
            "Results appear here when a run finishes, beside any earlier run you pick.", self
        )
        self.placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.placeholder.setMinimumHeight(220)
        self.placeholder.setStyleSheet(f"color: {current_theme().muted};")
        self.chart_row.addWidget(self.placeholder)
        self.table = QTableWidget(0, len(COLUMNS), self)
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().hide()
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.table.setWordWrap(False)
        results = QWidget(self)
        right = QVBoxLayout(results)
        right.setContentsMargins(0, 0, 0, 0)
        right.addWidget(self.status)
        right.addWidget(self.progress)
        right.addWidget(self.hardware)
        right.addLayout(tools)
        right.addLayout(self.chart_row, 3)
        right.addWidget(self.chart_note)
        right.addWidget(self.table, 2)
        splitter = QSplitter(Qt.Orientation.Horizontal, self)
        splitter.addWidget(choose)
        splitter.addWidget(results)
        splitter.setSizes([280, 720])
        layout = QVBoxLayout(self)
        layout.addWidget(splitter)
        self._update_actions()

    def _spin(self, low: int, high: int, value: int, tip: str) -> QSpinBox:
        box = QSpinBox(self)
        box.setRange(low, high)
        box.setValue(value)
        box.setToolTip(tip)
        return box

    # --- fed by the desktop -----------------------------------------------------------------------

    def set_choices(self, models: list[str], backends: list[str]) -> None:
        """Downloaded models and the backends that can run here (checked ones stay checked)."""
        for widget, names in ((self.models, models), (self.backends, backends)):
            checked = set(self._checked(widget))
            widget.clear()
            for name in names:
                item = QListWidgetItem(name, widget)
                item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
                item.setCheckState(Qt.CheckState.Checked if name in checked else Qt.CheckState.Unchecked)
        self._update_actions()

    def set_runs(self, runs: list[BenchRun]) -> None:
        self.runs = list(runs)
        if self.current is None and self.runs:
            self.current = self.runs[-1]
        self._fill_compare()
        self._show()

    def set_progress(self, event: BenchProgress) -> None:
        self.progress.setMaximum(max(event.total, 1))
        self.progress.setValue(event.done)
        where = f" on {event.backend}" if event.backend else ""
        self.status.setText(f"Measuring {event.model}{where}: {event.detail}")

    def set_finished(self, run: BenchRun) -> None:
        self.running = False
        self.runs = [r for r in self.runs if r.id != run.id] + [run]
        self.current = run
        self.progress.hide()
        count = len(run.results)
        self.status.setText(f"Finished {_when(run)}: {count} result{'s' if count != 1 else ''}, saved.")
        self._fill_compare()
        self._show()
        self._update_actions()

    def set_failed(self, message: str) -> None:
        self.running = False
        self.progress.hide()
        self.status.setText(message)
        self._update_actions()

    # --- the user's side --------------------------------------------------------------------------

    def select(self, models: list[str], backends: list[str] | None = None) -> None:
        for widget, names in ((self.models, models), (self.backends, backends or [])):
            for i in range(widget.count()):
                item = widget.item(i)
                item.setCheckState(Qt.CheckState.Checked if item.text() in names else Qt.CheckState.Unchecked)
        self._update_actions()

    def _checked(self, widget: QListWidget) -> list[str]:
        return [
            widget.item(i).text()
            for i in range(widget.count())
            if widget.item(i).checkState() is Qt.CheckState.Checked
        ]

    def _run(self) -> None:
        models = self._checked(self.models)
        if not models or self.running:
            self.status.setText("Check at least one model to measure.")
            return
        spec = BenchSpec(
            tuple(models),
            tuple(self._checked(self.backends)),
            self.prompt_tokens.value(),
            self.gen_tokens.value(),
            self.repetitions.value(),
        )
        self.running = True
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.progress.show()
        self.status.setText("Starting…")
        self._update_actions()
        self.run_requested.emit(spec)

    def _update_actions(self) -> None:
        self.run_button.setEnabled(not self.running)
        self.cancel_button.setEnabled(self.running)
        has_run = self.current is not None
        self.export_md.setEnabled(has_run)
        self.export_json.setEnabled(has_run)

    def _export(self, fmt: str) -> None:
        run = self.current
        if run is None:
            return
        suffix = "md" if fmt == "markdown" else "json"
        self.dialog = QFileDialog(
            self, "Export bench results", f"bench-{_when(run).replace(' ', '_')}.{suffix}"
        )
        self.dialog.setAcceptMode(QFileDialog.AcceptMode.AcceptSave)
        self.dialog.setOption(QFileDialog.Option.DontUseNativeDialog, True)
        self.dialog.fileSelected.connect(lambda path: self.export_requested.emit(run, fmt, path))
        self.dialog.open()

    # --- showing results --------------------------------------------------------------------------

    def _fill_compare(self) -> None:
        self.compare.blockSignals(True)
        self.compare.clear()
        self.compare.addItem("nothing earlier", None)
        for run in reversed(self.runs):
            if run is not self.current:
                models = ", ".join(sorted({r.model for r in run.results}))
                self.compare.addItem(f"{_when(run)}: {models}", run.id)
        self.compare.blockSignals(False)

    def earlier(self) -> BenchRun | None:
        run_id = self.compare.currentData()
        return next((r for r in self.runs if r.id == run_id), None)

    def _rows(self) -> list[tuple[BenchRun, BenchResult]]:
        rows = [(self.current, r) for r in self.current.results] if self.current else []
        earlier = self.earlier()
        return rows + ([(earlier, r) for r in earlier.results] if earlier else [])

    def _show(self) -> None:
        rows = self._rows()
        if self.current is not None:
            self.hardware.setText(f"Hardware: {hardware_summary(self.current.hardware)}")
        self.table.setRowCount(len(rows))
        for i, (run, r) in enumerate(rows):
            cells = [
                r.model,
                f"{r.recipe}:{r.backend}",
                r.engine_version,
                figure(r.pp_tps, r.pp_tps_stdev),
                figure(r.tg_tps, r.tg_tps_stdev),
                f"{r.ttft_s:.3f}",
                _when(run),
            ]
            for j, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if j in (3, 4, 5):
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                self.table.setItem(i, j, item)
        self._draw(rows)

    def _draw(self, rows: list[tuple[BenchRun, BenchResult]]) -> None:
        self.placeholder.setVisible(not rows)
        if not rows and not self._charts:
            return
        import numpy as np
        import pyqtgraph as pg

        if not self._charts:
            palette = QGuiApplication.palette()
            pg.setConfigOptions(
                background=palette.color(QPalette.ColorRole.Base),
                foreground=palette.color(QPalette.ColorRole.Text),
            )
            for _ in range(2):  # prompt processing and generation: each on its own scale
                chart = pg.PlotWidget()
                chart.setMinimumHeight(220)
                chart.setMouseEnabled(x=False, y=False)
                chart.hideButtons()
                chart.setMenuEnabled(False)
                chart.showGrid(x=False, y=True, alpha=0.25)
                chart.setLabel("left", "tokens per second")
                chart.getAxis("bottom").setHeight(46)
                self.chart_row.addWidget(chart)
                self._charts.append(chart)
        for chart in self._charts:
            chart.setVisible(bool(rows))
        if not rows:
            return
        xs = list(range(len(rows)))
        one_model = len({r.model for _, r in rows}) == 1
        labels = [[(x, _tick(run is self.current, r, one_model)) for x, (run, r) in enumerate(rows)]]
        tests = {f"pp{r.prompt_tokens}" for _, r in rows}, {f"tg{r.gen_tokens}" for _, r in rows}
        for chart, colour, name, test, pairs in (
            (
                self._charts[0],
                PP_COLOUR,
                "Prompt processing",
                tests[0],
                [(r.pp_tps, r.pp_tps_stdev) for _, r in rows],
            ),
            (
                self._charts[1],
                TG_COLOUR,
                "Generation",
                tests[1],
                [(r.tg_tps, r.tg_tps_stdev) for _, r in rows],
            ),
        ):
            chart.clear()
            brushes = [
                pg.mkBrush(colour) if run is self.current else pg.mkBrush(pg.mkColor(colour).lighter(150))
                for run, _ in rows
            ]
            heights = [m for m, _ in pairs]
            chart.addItem(pg.BarGraphItem(x=xs, height=heights, width=0.6, brushes=brushes, pen=None))
            chart.addItem(
                pg.ErrorBarItem(
                    x=np.array(xs, dtype=float),
                    y=np.array(heights),
                    height=np.array([2 * sd for _, sd in pairs]),
                    beam=0.15,
                    pen=pg.mkPen(width=1.5),
                )
            )
            chart.getAxis("bottom").setTicks(labels)
            chart.setXRange(-0.6, len(rows) - 0.4, padding=0)
            chart.setYRange(0, max(m + sd for m, sd in pairs) * 1.15 or 1, padding=0)
            chart.setTitle(f"<b>{name}</b> {', '.join(sorted(test))}", size="9pt")
        earlier = "; paler bars: the earlier run" if any(run is not self.current for run, _ in rows) else ""
        self.chart_note.setText(f"Bars: median tokens per second; whiskers: ± 1 standard deviation{earlier}.")


def _tick(current: bool, r: BenchResult, one_model: bool) -> str:
    """The bar's label: its backend, and its model when the chart has more than one."""
    model = r.model.removeprefix("user.")
    model = model if len(model) <= 16 else model[:15] + "…"
    label = f"{r.recipe}:{r.backend}" if one_model else f"{model}\n{r.recipe}:{r.backend}"
    return label + ("" if current else "\nearlier")
