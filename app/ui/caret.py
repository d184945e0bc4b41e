"""The text caret stops blinking after ``BLINK_S`` seconds without input, and blinks again at the next
key press or click, as GTK (10 s) and Windows (5 s) do.

A blinking caret repaints its field twice a second, and with it the part of every widget under the
field, the window's included: in a window left open with nothing happening, that was most of what the
app did. Qt has no timeout of its own, so this turns the application's cursor flash time to 0 (a
steady caret, still shown) and back to what it was. Input is watched on the widget with the focus
only, the one a caret blinks in (an event filter on the whole application would run Python for every
event the app handles, a streaming reply's paints included), and the blink's own repaints of it are the
clock: no timer runs, and once the caret is steady nothing wakes at all.
"""

from __future__ import annotations

import time

import shiboken6
from PySide6.QtCore import QEvent, QObject
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QAbstractScrollArea, QApplication, QWidget

BLINK_S = 10.0
INPUT = frozenset(
    {
        QEvent.Type.KeyPress,
        QEvent.Type.InputMethod,
        QEvent.Type.MouseButtonPress,
        QEvent.Type.MouseButtonDblClick,
        QEvent.Type.FocusIn,
    }
)


class CaretBlink(QObject):
    """Stops the caret's blinking ``blink_s`` after the last input to the focused widget."""

    platform_flash_ms: int | None = None  # the platform's, taken before any of these changed it

    def __init__(self, qapp: QApplication, parent: QObject, blink_s: float = BLINK_S) -> None:
        super().__init__(parent)
        self._hints = QGuiApplication.styleHints()
        if CaretBlink.platform_flash_ms is None:
            CaretBlink.platform_flash_ms = self._hints.cursorFlashTime()
        self.flash_ms = CaretBlink.platform_flash_ms  # restored at each input
        self.blink_s = blink_s
        self._input_at = time.monotonic()
        self._watched: list[QWidget] = []
        qapp.focusChanged.connect(self._focus_changed)
        self._focus_changed(None, qapp.focusWidget())

    def blinking(self) -> bool:
        return self._hints.cursorFlashTime() != 0

    def _focus_changed(self, _old: QWidget | None, new: QWidget | None) -> None:
        for widget in self._watched:
            if shiboken6.isValid(widget):  # a widget deleted while it had the focus is gone already
                widget.removeEventFilter(self)
        # A text edit's caret is painted on its viewport, and its input comes to the edit itself.
        viewport = new.viewport() if isinstance(new, QAbstractScrollArea) else None
        self._watched = [w for w in (new, viewport) if w is not None]
        for widget in self._watched:
            widget.installEventFilter(self)
        self._input()

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        kind = event.type()
        if kind in INPUT:
            self._input()
        elif (
            kind == QEvent.Type.Paint
            and self.blinking()
            and time.monotonic() - self._input_at >= self.blink_s
        ):
            self._hints.setCursorFlashTime(0)
        return False

    def _input(self) -> None:
        self._input_at = time.monotonic()
        if self.flash_ms and not self.blinking():
            self._hints.setCursorFlashTime(self.flash_ms)
