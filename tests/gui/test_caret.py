"""The caret stops blinking once nothing is typed for a while (its field is then repainted no more) and
blinks again at the next key press."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtWidgets import QApplication, QLineEdit, QMainWindow
from pytestqt.qtbot import QtBot

from app.ui.caret import CaretBlink


class Paints(QObject):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.Paint:
            self.count += 1
        return False


def test_the_caret_stops_blinking_without_input_and_blinks_again_at_a_key(qtbot: QtBot) -> None:
    window = QMainWindow()
    qtbot.addWidget(window)
    field = QLineEdit(window)
    window.setCentralWidget(field)
    caret = CaretBlink(QApplication.instance(), window, blink_s=0.5)
    window.show()
    qtbot.waitExposed(window)
    window.activateWindow()
    field.setFocus()
    qtbot.waitUntil(field.hasFocus)
    paints = Paints()
    field.installEventFilter(paints)
    assert caret.blinking()
    qtbot.waitUntil(lambda: paints.count >= 2)  # it blinks
    qtbot.waitUntil(lambda: not caret.blinking())
    qtbot.wait(100)  # the repaint that leaves the caret shown
    paints.count = 0
    qtbot.wait(1200)  # more than a blink's on and off
    assert paints.count == 0, "a steady caret is not repainted"
    qtbot.keyClick(field, Qt.Key.Key_A)
    assert caret.blinking() and field.text() == "a"
    paints.count = 0
    qtbot.waitUntil(lambda: paints.count >= 2)  # it blinks again
    assert caret.flash_ms == CaretBlink.platform_flash_ms and caret.flash_ms > 0
