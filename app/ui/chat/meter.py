"""The context meter under the chat: what the chat and the message being written take of the model's
context (``about`` one assumed, when the model does not say it), the share kept for the reply, and a
warning when a send would not fit. It shows counts it is given (``app.core.context.ContextCount``);
counting is the router's, off the UI thread."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHBoxLayout, QProgressBar, QWidget

from app.core.context import ContextCount, CountSource
from app.core.fit import Verdict
from app.ui.look import ElidedLabel, fit_colour, muted_colour

NEAR_FULL = 0.85  # from this share on the meter warns
BAR_STEPS = 1000


class ContextMeter(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.count: ContextCount | None = None
        self.bar = QProgressBar(self)
        self.bar.setRange(0, BAR_STEPS)
        self.bar.setTextVisible(False)
        self.bar.setFixedSize(120, 6)
        self.label = ElidedLabel("", self)  # never wider than the row: the tooltip has the rest
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(8)
        layout.addWidget(self.bar, 0, Qt.AlignmentFlag.AlignVCenter)
        layout.addWidget(self.label, 1)
        self.hide()

    def show_count(self, count: ContextCount | None) -> None:
        """Show ``count`` (None: nothing is known of this model's context; the meter hides)."""
        self.count = count
        if count is None:
            self.hide()
            return
        share = count.share
        self.bar.setValue(min(round(share * BAR_STEPS), BAR_STEPS))
        if not count.fits:
            verdict: Verdict | None = Verdict.WONT_FIT
            said = f"{count.describe()}: over by {count.needed - count.context:,}"
        elif share >= NEAR_FULL:
            verdict, said = Verdict.TIGHT, f"{count.describe()}: {share:.0%} full"
        else:
            verdict, said = None, count.describe()
        colour = fit_colour(verdict) if verdict is not None else muted_colour()
        self.label.setText(f"Context: {said}")
        self.label.setStyleSheet(f"color: {colour}; font-size: 11px;")
        chunk = colour if verdict is not None else fit_colour(Verdict.FITS)
        self.bar.setStyleSheet(
            f"QProgressBar {{ border: none; border-radius: 3px; background: {muted_colour()}40; }}"
            f"QProgressBar::chunk {{ border-radius: 3px; background: {chunk}; }}"
        )
        how = (
            "Counted by the engine's own tokenizer."
            if count.source is CountSource.TOKENIZER
            else "An estimate from the text's length: this engine has no tokenizer to ask, or the model "
            "is not loaded yet."
        )
        reply = f" {count.reply:,} tokens are kept for the reply (Max tokens)." if count.reply else ""
        if count.assumed:
            how += f" The model does not say its context: {count.context:,} tokens is assumed."
        self.setToolTip(f"The chat and the message being written take {count.used:,} tokens.{reply} {how}")
        self.show()

    def counting(self) -> None:
        """A count was asked for before a send: say so until it comes."""
        self.label.setText("Context: counting…")
        self.show()
