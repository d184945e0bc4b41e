"""The Backends view: every recipe's backends with state and version, and install / update / uninstall,
each with a progress bar and Cancel; under a backend, why it is unsupported here, and how its last
install went. It only emits intents; the bridge reports progress back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from PySide6.QtCore import Signal
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QGridLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.core.backends import BackendKey, BackendState
from app.ui.look import SPACING, muted_colour
from app.ui.options_panel import STATE_WORDS

if TYPE_CHECKING:
    from app.supervisor.supervisor import InstallProgress
    from app.supervisor.system_info import SystemInfo


@dataclass
class BackendRow:
    state: QLabel
    version: QLabel
    install: QPushButton
    uninstall: QPushButton
    progress: QProgressBar
    cancel: QPushButton
    reason: QLabel  # why it is unsupported here
    message: QLabel  # how the last install went


class BackendsDialog(QDialog):
    install_requested = Signal(str, str)  # recipe, backend
    cancel_requested = Signal(str, str)
    uninstall_requested = Signal(str, str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Backends")
        self.grid = QGridLayout()
        self.grid.setHorizontalSpacing(12)
        for column, title in enumerate(("Backend", "State", "Version")):
            label = QLabel(f"<b>{title}</b>", self)
            self.grid.addWidget(label, 0, column)
        self.rows: dict[BackendKey, BackendRow] = {}
        close = QDialogButtonBox(QDialogButtonBox.StandardButton.Close, self)
        close.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(self.grid)
        layout.addStretch(1)
        layout.addWidget(close)

    def set_info(self, info: SystemInfo) -> None:
        for recipe, support in info.recipes.items():
            for name, status in support.backends.items():
                row = self.rows.get(BackendKey(recipe, name)) or self._add_row(recipe, name)
                row.state.setText(STATE_WORDS[status.state])
                row.state.setToolTip(status.message)
                unsupported = status.state is BackendState.UNSUPPORTED
                row.reason.setText(status.message if unsupported else "")
                row.reason.setVisible(unsupported and bool(status.message))
                installed = status.installed_version or ""
                row.version.setText(
                    f"{installed} → {status.version}"
                    if installed and installed != status.version
                    else installed or status.version
                )
                busy = not row.progress.isHidden()
                row.install.setText("Update" if status.state is BackendState.UPDATE_REQUIRED else "Install")
                row.install.setEnabled(
                    not busy and status.state in (BackendState.INSTALLABLE, BackendState.UPDATE_REQUIRED)
                )
                row.uninstall.setEnabled(
                    not busy and status.state in (BackendState.INSTALLED, BackendState.UPDATE_REQUIRED)
                )
                if unsupported:
                    row.install.setToolTip(status.message)
        self._fit_text()

    def set_progress(self, event: InstallProgress) -> None:
        row = self.rows.get(event.key)
        if row is None:
            return
        phase, done, total = event.phase.value, event.done, event.total or 0
        self._busy(row, True)
        if total:
            row.progress.setRange(0, 1000)
            row.progress.setValue(int(1000 * done / total))
        else:
            row.progress.setRange(0, 0)  # busy: no size known
        row.progress.setFormat(f"{phase} %p%" if total else phase)
        row.message.setText("")

    def set_done(self, key: BackendKey, message: str) -> None:
        row = self.rows.get(key)
        if row is None:
            return
        self._busy(row, False)
        row.message.setText(message or "Installed.")
        row.message.setVisible(True)
        self._fit_text()

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._fit_text()

    def _fit_text(self) -> None:
        """Each wrapped line under a row gets the height its text needs across the rows' width: a grid
        gives a wrapped label only its minimum height, which cut an install's error short and drew it
        over the row above. A label's height for a width is never below its minimum: unset it first.
        Not before the dialog shows: its width is not known until then (showing it fits them)."""
        layout = self.layout()
        if layout is None or not self.isVisible():
            return
        margins = layout.contentsMargins()
        width = max(1, self.width() - margins.left() - margins.right())
        for row in self.rows.values():
            for label in (row.reason, row.message):
                label.setMinimumHeight(0)
                label.setMinimumHeight(label.heightForWidth(width) if label.text() else 0)

    def _busy(self, row: BackendRow, busy: bool) -> None:
        row.progress.setVisible(busy)
        row.cancel.setVisible(busy)
        row.install.setEnabled(not busy and row.install.isEnabled())
        row.uninstall.setEnabled(not busy and row.uninstall.isEnabled())

    def _add_row(self, recipe: str, backend: str) -> BackendRow:
        r = self.grid.rowCount()
        row = BackendRow(
            QLabel(self),
            QLabel(self),
            QPushButton("Install", self),
            QPushButton("Uninstall", self),
            QProgressBar(self),
            QPushButton("Cancel", self),
            QLabel(self),
            QLabel(self),
        )
        for note in (row.reason, row.message):  # under the row, set in from its name
            note.setWordWrap(True)
            note.setIndent(2 * SPACING)
        row.reason.setStyleSheet(f"color: {muted_colour()};")
        row.install.clicked.connect(lambda: self._start(recipe, backend))
        row.uninstall.clicked.connect(lambda: self.uninstall_requested.emit(recipe, backend))
        row.cancel.clicked.connect(lambda: self.cancel_requested.emit(recipe, backend))
        for column, widget in enumerate(
            (
                QLabel(str(BackendKey(recipe, backend)), self),
                row.state,
                row.version,
                row.install,
                row.uninstall,
                row.progress,
                row.cancel,
            )
        ):
            self.grid.addWidget(widget, r, column)
        self.grid.addWidget(row.reason, r + 1, 0, 1, 7)
        self.grid.addWidget(row.message, r + 2, 0, 1, 7)
        row.progress.hide()
        row.cancel.hide()
        row.reason.hide()
        row.message.hide()
        self.rows[BackendKey(recipe, backend)] = row
        return row

    def _start(self, recipe: str, backend: str) -> None:
        row = self.rows[BackendKey(recipe, backend)]
        self._busy(row, True)
        row.progress.setRange(0, 0)
        self.install_requested.emit(recipe, backend)
