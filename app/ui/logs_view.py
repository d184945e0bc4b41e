"""The selected engine's output, live, with a filter and a button that opens the whole log file."""

from __future__ import annotations

from collections import deque
from pathlib import Path

from PySide6.QtCore import QUrl
from PySide6.QtGui import QDesktopServices, QFontDatabase
from PySide6.QtWidgets import QHBoxLayout, QLineEdit, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget

MAX_LINES = 2000  # as many as the engine's own buffer keeps


class LogsView(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.engine = ""
        self.log_path: Path | None = None
        self._lines: deque[str] = deque(maxlen=MAX_LINES)
        self.filter = QLineEdit(self)
        self.filter.setPlaceholderText("Filter lines")
        self.filter.setClearButtonEnabled(True)
        self.filter.textChanged.connect(self._render)
        self.open_button = QPushButton("Open log file", self)
        self.open_button.setEnabled(False)
        self.open_button.clicked.connect(self._open)
        self.text = QPlainTextEdit(self)
        self.text.setReadOnly(True)
        self.text.setMaximumBlockCount(MAX_LINES)
        self.text.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.text.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.text.setPlaceholderText("The output of the selected model's engine shows here once it loads.")
        top = QHBoxLayout()
        top.addWidget(self.filter, 1)
        top.addWidget(self.open_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 4, 8, 8)
        layout.addLayout(top)
        layout.addWidget(self.text, 1)

    def show_engine(self, name: str, lines: list[str], log_path: Path | None) -> None:
        self.engine, self.log_path = name, log_path
        self._lines = deque(lines, maxlen=MAX_LINES)
        self.open_button.setEnabled(log_path is not None)
        self._render()

    def append(self, name: str, line: str) -> None:
        if name != self.engine:
            return
        self._lines.append(line)
        if self._matches(line):
            self.text.appendPlainText(line)

    def shown_lines(self) -> list[str]:
        text = self.text.toPlainText()
        return text.split("\n") if text else []

    def _matches(self, line: str) -> bool:
        return self.filter.text().lower() in line.lower()

    def _render(self) -> None:
        self.text.setPlainText("\n".join(line for line in self._lines if self._matches(line)))
        self.text.moveCursor(self.text.textCursor().MoveOperation.End)

    def _open(self) -> None:
        if self.log_path is not None:
            QDesktopServices.openUrl(QUrl.fromLocalFile(str(self.log_path)))
