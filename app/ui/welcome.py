"""The first-run welcome: while no model is on this machine, the chat area offers the suggested model
(name, size, how long its download should take, why it was chosen) and one button that downloads it,
installs its engine, loads it and opens the chat. Fed by the bridge; it only emits intents."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from app.core.status import LoadState
from app.core.units import GB
from app.ui.look import fit_colour, human_size, muted_colour

if TYPE_CHECKING:
    from app.supervisor.router import LoadProgress, Suggestion

PHASE_TEXT = {
    LoadState.DOWNLOADING: "Downloading the model",
    LoadState.INSTALLING: "Installing its engine",
    LoadState.LOADING: "Starting the engine",
}
CARD_WIDTH = 520
# The one action of the page, in the palette's accent colour (light and dark alike).
PRIMARY_BUTTON = (
    "QPushButton { background: palette(highlight); color: palette(highlighted-text); border: none;"
    " border-radius: 6px; padding: 8px 16px; font-weight: 600; }"
    " QPushButton:hover { background: palette(link); }"
    " QPushButton:disabled { background: palette(mid); color: palette(window); }"
)


def duration(seconds: float) -> str:
    if seconds < 60:
        return f"{max(1, round(seconds))} s"
    if seconds < 3600:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


class Welcome(QWidget):
    start_requested = Signal(str)  # the model to download, load and chat with

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model = ""
        self._why = ""  # why this model: the suggestion's reason
        self._note = ""  # why the Hub could not be asked, when it could not
        self.title = QLabel("Welcome to Lemon Desk", self)
        self.title.setStyleSheet("font-size: 22px; font-weight: 600;")
        self.title.setWordWrap(True)
        self.lead = QLabel(
            "Chat with a language model that runs on this machine. Nothing you type leaves it.", self
        )
        self.lead.setWordWrap(True)
        self.card = QFrame(self)
        self.card.setObjectName("welcomeCard")
        self.card.setStyleSheet(
            "#welcomeCard { background: palette(base); border: 1px solid palette(mid); border-radius: 8px; }"
        )
        self.name = QLabel("Finding the model that suits this machine…", self.card)
        self.name.setStyleSheet("font-size: 16px; font-weight: 600;")
        self.name.setWordWrap(True)
        self.name.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.facts = QLabel("", self.card)
        self.facts.setWordWrap(True)
        self.reason = QLabel("", self.card)
        self.reason.setWordWrap(True)
        self.reason.setStyleSheet(f"color: {muted_colour()};")
        self.button = QPushButton("Download and chat", self.card)
        self.button.setDefault(True)
        self.button.setMinimumHeight(36)
        self.button.setStyleSheet(PRIMARY_BUTTON)
        self.button.setEnabled(False)
        self.button.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.button.clicked.connect(self._start)
        self.progress = QProgressBar(self.card)
        self.progress.setTextVisible(False)
        self.progress.setFixedHeight(6)
        self.progress.hide()
        self.line = QLabel("", self.card)  # the one progress line, or what went wrong
        self.line.setWordWrap(True)
        self.line.hide()
        card = self._card_layout = QVBoxLayout(self.card)
        card.setContentsMargins(20, 18, 20, 18)
        card.setSpacing(8)
        for widget in (self.name, self.facts, self.reason):
            card.addWidget(widget)
        card.addSpacing(6)
        card.addWidget(self.button)
        card.addWidget(self.progress)
        card.addWidget(self.line)
        self.other = QLabel("Or choose another model in the Models list, or search Hugging Face there.", self)
        self.other.setWordWrap(True)
        self.other.setStyleSheet(f"color: {muted_colour()};")

        column = QWidget(self)
        column.setMaximumWidth(CARD_WIDTH)  # as wide as that, centred; narrower in a narrow window
        inner = QVBoxLayout(column)
        inner.setContentsMargins(0, 0, 0, 0)
        inner.setSpacing(12)
        inner.addWidget(self.title)
        inner.addWidget(self.lead)
        inner.addSpacing(8)
        inner.addWidget(self.card)
        inner.addWidget(self.other)
        # Stretches, not an alignment, centre the column: an aligned widget gets its size hint's width,
        # and its wrapped labels then too little height.
        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(column, 100)
        row.addStretch(1)
        layout = self._outer = QVBoxLayout(self)
        layout.setContentsMargins(24, 24, 24, 24)
        layout.addStretch(1)
        layout.addLayout(row)
        layout.addStretch(2)

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._fit_text()

    def _fit_text(self) -> None:
        """Wrapped labels get the height their text needs at the column's width: the layouts above them
        give a wrapped label only its minimum height when space is shared out, which cut the text short.
        The width comes from the welcome's own (labels' widths lag behind while layouts settle), and the
        layout is run again at once: one laid out while the welcome was hidden kept the old heights."""
        margins = self._outer.contentsMargins()
        column = max(1, min(CARD_WIDTH, self.width() - margins.left() - margins.right()))
        card = self._card_layout.contentsMargins()
        inside = max(1, column - card.left() - card.right() - 2 * self.card.frameWidth())
        for label, width in (
            (self.title, column),
            (self.lead, column),
            (self.other, column),
            (self.name, inside),
            (self.facts, inside),
            (self.reason, inside),
            (self.line, inside),
        ):
            label.setMinimumHeight(0)  # a label's height for a width is never below its minimum: unset it
            label.setMinimumHeight(label.heightForWidth(width) if label.text() else 0)
        self._outer.invalidate()
        self._outer.activate()

    # Fed by the bridge

    def set_suggestion(self, suggestion: Suggestion | None) -> None:
        if suggestion is None:
            self.model = ""
            self.name.setText("No suggested model fits this machine")
            self.facts.setText("")
            self.reason.setText(
                "Search Hugging Face in the Models list for a smaller model, or import a GGUF file or an "
                "MLX folder you already have (Add model…)."
            )
            self.button.setEnabled(False)
            return
        self.model = suggestion.model.name
        self.name.setText(suggestion.model.name)
        fit = suggestion.fit
        facts = [f"{human_size(suggestion.size_bytes)} download"]
        if suggestion.download_s is not None and suggestion.speed_bps:
            facts.append(f"about {duration(suggestion.download_s)} at {suggestion.speed_bps / 1e6:.0f} MB/s")
        colour = fit_colour(fit.verdict)
        facts.append(
            f"<span style='color:{colour}'>●</span> {fit.verdict.value}: needs {fit.need / GB:.1f} GB of "
            f"{fit.budget.usable / GB:.0f} GB {fit.budget.kind.value}"
        )
        self.facts.setText(" · ".join(facts))
        self.facts.setToolTip(fit.summary())
        self._why, self._note = suggestion.reason, suggestion.note
        self.reason.setText(self._why + (f"\n{self._note}" if self._note else ""))
        self.button.setEnabled(True)
        self._fit_text()

    def set_progress(self, progress: LoadProgress) -> None:
        if progress.model != self.model:
            return
        self.progress.show()
        self.line.show()
        if progress.total:
            self.progress.setRange(0, 1000)
            self.progress.setValue(int(1000 * progress.done / progress.total))
        else:
            self.progress.setRange(0, 0)  # busy, no share known
        share = f" {100 * progress.done // progress.total}%" if progress.total else ""
        self.line.setStyleSheet("")
        self.line.setText(f"{PHASE_TEXT[progress.phase]}…{share}")
        self._fit_text()

    def set_failed(self, message: str) -> None:
        """Why the one click failed, below the button; a note above that says the same goes (the Hub
        that could not be reached for the suggestion could not be for the download either)."""
        if self._note and self._note in message:
            self.reason.setText(self._why)
        self.progress.hide()
        self.line.show()
        self.line.setStyleSheet(f"color: {fit_colour(None)};")
        self.line.setText(message)
        self.button.setEnabled(True)
        self.button.setText("Try again")
        self._fit_text()

    def show_starting(self) -> None:
        """The one-click load was asked for (here or from the tray): no second click, a first line."""
        self.button.setEnabled(False)
        self.line.setStyleSheet("")
        self.line.show()
        self.line.setText("Starting…")
        self._fit_text()

    def _start(self) -> None:
        if self.model:
            self.show_starting()
            self.start_requested.emit(self.model)
