"""The downloads panel: every download the router remembers, with progress, speed and ETA, and Pause,
Resume and Cancel (which asks whether to keep the partial file). Fed ``DownloadRecord``s and
``DownloadProgress`` events by the bridge; it only emits intents."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QMessageBox,
    QProgressBar,
    QScrollArea,
    QStyle,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.core.downloads import DownloadRecord, DownloadState
from app.ui.look import SPACING, fit_colour, human_size, icon, muted_colour

if TYPE_CHECKING:
    from app.supervisor.downloads import DownloadProgress

EMPTY_TEXT = (
    "No downloads yet.\n\nPick a model in the Models list and press Download or Load, or search Hugging "
    "Face there and press Add. Downloads show here, with Pause and Resume; one the app was closed "
    "during goes on when it starts again."
)


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return "--:--"
    seconds = int(seconds)
    return (
        f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        if seconds >= 3600
        else (f"{seconds // 60}:{seconds % 60:02d}")
    )


class DownloadRow(QFrame):
    def __init__(self, record: DownloadRecord, parent: QWidget) -> None:
        super().__init__(parent)
        self.setObjectName("downloadRow")
        self.record = record
        self.name = QLabel(record.model, self)
        self.name.setStyleSheet("font-weight: 600;")
        self.name.setToolTip(f"{record.files.repo_id} ({record.files.label})")
        self.bar = QProgressBar(self)
        self.bar.setRange(0, 1000)
        self.bar.setTextVisible(False)
        self.bar.setFixedHeight(6)
        self.detail = QLabel("", self)
        self.detail.setWordWrap(True)
        self.pause = QToolButton(self)
        self.pause.setAutoRaise(True)
        self.cancel = QToolButton(self)
        self.cancel.setAutoRaise(True)
        self.cancel.setIcon(icon("process-stop", QStyle.StandardPixmap.SP_DialogCancelButton, tint=False))
        self.cancel.setToolTip("Cancel the download")
        head = QHBoxLayout()
        head.setSpacing(SPACING // 2)
        head.addWidget(self.name, 1)
        head.addWidget(self.pause)
        head.addWidget(self.cancel)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(SPACING, SPACING, SPACING, SPACING)
        layout.setSpacing(SPACING // 2)
        layout.addLayout(head)
        layout.addWidget(self.bar)
        layout.addWidget(self.detail)
        self.show_record(record)

    @property
    def running(self) -> bool:
        return self.record.state.active

    def show_record(self, record: DownloadRecord) -> None:
        self.record = record
        self._show_done(record.done_bytes)
        state = record.state
        words = {
            DownloadState.QUEUED: "Waiting for a free slot",
            DownloadState.RUNNING: "Downloading",
            DownloadState.PAUSED: "Paused",
            DownloadState.DONE: "Done",
            DownloadState.FAILED: "Failed",
            DownloadState.CANCELLED: "Cancelled",
        }[state]
        total = record.files.size
        text = f"{words} · {human_size(record.done_bytes)} of {human_size(total)}"
        if state is not DownloadState.DONE and total:
            text += f" ({100 * record.done_bytes // total}%)"
        if record.message:
            text += f"\n{record.message}"
        self.detail.setText(text)
        colour = fit_colour(None) if state is DownloadState.FAILED else muted_colour()
        self.detail.setStyleSheet(f"color: {colour};")
        self.pause.setVisible(state is not DownloadState.DONE)
        self.cancel.setVisible(state not in (DownloadState.DONE, DownloadState.CANCELLED))
        if state.active:
            self.pause.setIcon(icon("media-playback-pause", QStyle.StandardPixmap.SP_MediaPause))
            self.pause.setToolTip("Pause: the partial file is kept")
        else:
            self.pause.setIcon(icon("media-playback-start", QStyle.StandardPixmap.SP_MediaPlay))
            self.pause.setToolTip("Resume from where it stopped")

    def show_progress(self, progress: DownloadProgress) -> None:
        if not self.running:
            return
        self._show_done(progress.done)
        speed = f"{progress.speed_bps / 1e6:.1f} MB/s" if progress.speed_bps else "starting"
        share = f"{100 * progress.done // progress.total}%" if progress.total else ""
        self.detail.setText(
            f"{share} · {human_size(progress.done)} of {human_size(progress.total)} · {speed} · "
            f"{_eta(progress.eta_s)} left"
        )

    def _show_done(self, done: int) -> None:
        total = self.record.files.size
        self.bar.setValue(int(1000 * done / total) if total else 0)


class DownloadsPanel(QWidget):
    pause_requested = Signal(str)  # model name
    resume_requested = Signal(str)
    cancel_requested = Signal(str, bool)  # model name, keep the partial file

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.rows: dict[str, DownloadRow] = {}  # by download id
        self.question: QMessageBox | None = None  # the Cancel question while it is open
        self.empty = QLabel(EMPTY_TEXT, self)
        self.empty.setWordWrap(True)
        self.empty.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.empty.setStyleSheet(f"color: {muted_colour()}; padding: {2 * SPACING}px;")
        self.list = QWidget(self)
        self.list_layout = QVBoxLayout(self.list)
        self.list_layout.setContentsMargins(SPACING, SPACING, SPACING, SPACING)
        self.list_layout.setSpacing(SPACING)
        self.list_layout.addStretch(1)
        scroll = QScrollArea(self)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setWidget(self.list)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.empty)
        layout.addWidget(scroll, 1)
        self._scroll = scroll
        self.set_records([])

    # Fed by the bridge

    def set_records(self, records: list[DownloadRecord]) -> None:
        """Newest state of every download; finished ones and the cancelled stay listed until restart."""
        for record in records:
            row = self.rows.get(record.id)
            if row is None:
                row = DownloadRow(record, self.list)
                name = record.model
                row.pause.clicked.connect(lambda _=False, r=row: self._pause_or_resume(r))
                row.cancel.clicked.connect(lambda _=False, n=name: self.ask_cancel(n))
                self.list_layout.insertWidget(self.list_layout.count() - 1, row)
                self.rows[record.id] = row
            else:
                row.show_record(record)
        self.empty.setVisible(not self.rows)
        self._scroll.setVisible(bool(self.rows))

    def show_progress(self, progress: DownloadProgress) -> None:
        row = self.rows.get(progress.id)
        if row is not None:
            row.show_progress(progress)

    def row(self, model: str) -> DownloadRow | None:
        return next((r for r in self.rows.values() if r.record.model == model), None)

    def active_count(self) -> int:
        return sum(1 for r in self.rows.values() if r.running)

    # Inside

    def _pause_or_resume(self, row: DownloadRow) -> None:
        if row.running:
            self.pause_requested.emit(row.record.model)
        else:
            self.resume_requested.emit(row.record.model)

    def ask_cancel(self, name: str) -> None:
        box = QMessageBox(
            QMessageBox.Icon.Question,
            "Cancel download",
            f"Cancel the download of {name}?\n\nKeep the partial file to go on from it if you download "
            "the model again, or delete it to free the space now.",
            QMessageBox.StandardButton.NoButton,
            self,
        )
        keep = box.addButton("Keep partial file", QMessageBox.ButtonRole.AcceptRole)
        delete = box.addButton("Delete partial file", QMessageBox.ButtonRole.DestructiveRole)
        box.addButton("Don't cancel", QMessageBox.ButtonRole.RejectRole)
        box.setDefaultButton(keep)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        keep.clicked.connect(lambda: self.cancel_requested.emit(name, True))
        delete.clicked.connect(lambda: self.cancel_requested.emit(name, False))
        box.finished.connect(self._question_closed)
        self.question = box
        box.open()

    def _question_closed(self) -> None:
        self.question = None
