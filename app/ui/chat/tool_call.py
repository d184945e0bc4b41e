"""One tool call in a reply: a collapsible block (server and tool, how it ended, how long it took; opened:
its arguments and its result) that asks first when the call needs the user's permission (allow once,
always for this tool, deny). The widget shows what the bridge says and emits the user's answer; the
tool loop is the router's."""

from __future__ import annotations

import json
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QToolButton, QVBoxLayout, QWidget

from app.core.tools import Permission, ToolOutcome
from app.ui.chat.markdown_view import current_theme

SHOWN_RESULT_CHARS = 4000  # of a result, in the block (the whole of what was kept is in the history)
_OUTCOME_WORDS = {
    ToolOutcome.OK: "done",
    ToolOutcome.ERROR: "failed",
    ToolOutcome.DENIED: "denied",
    ToolOutcome.TIMED_OUT: "timed out",
    ToolOutcome.NOT_RUN: "not run",
}
_ERROR_COLOUR = "#c0392b"


def _mono(label: QLabel) -> None:
    label.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
    label.setWordWrap(True)
    label.setTextFormat(Qt.TextFormat.PlainText)
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)


class ToolCallView(QFrame):
    answered = Signal(str, object)  # call id, Permission

    def __init__(
        self, call_id: str, server: str, tool: str, arguments: dict[str, Any], parent: QWidget
    ) -> None:
        super().__init__(parent)
        self.call_id = call_id
        self.setObjectName("toolCall")
        theme = current_theme()
        self.setStyleSheet(f"#toolCall {{ border: 1px solid {theme.muted}; border-radius: 6px; }}")
        self.toggle = QToolButton(self)
        self.toggle.setCheckable(True)
        self.toggle.setAutoRaise(True)
        self.toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.toggle.setArrowType(Qt.ArrowType.RightArrow)
        self.toggle.toggled.connect(self._open)
        self._name = f"{server} / {tool}" if server else tool
        self.state = QLabel(self)
        self.state.setStyleSheet(f"color: {theme.muted};")
        header = QHBoxLayout()
        header.setContentsMargins(0, 0, 0, 0)
        header.addWidget(self.toggle)
        header.addWidget(self.state, 1)

        self.details = QWidget(self)
        self.arguments = QLabel(json.dumps(arguments, indent=2, ensure_ascii=False), self.details)
        _mono(self.arguments)
        self.result = QLabel(self.details)
        _mono(self.result)
        self.result.hide()
        details = QVBoxLayout(self.details)
        details.setContentsMargins(22, 0, 4, 4)
        details.addWidget(QLabel("Arguments", self.details))
        details.addWidget(self.arguments)
        self.result_title = QLabel("Result", self.details)
        self.result_title.hide()
        details.addWidget(self.result_title)
        details.addWidget(self.result)
        self.details.hide()

        self.question = QWidget(self)
        self.allow_once = QPushButton("Allow once", self.question)
        self.allow_always = QPushButton("Always allow this tool", self.question)
        self.deny = QPushButton("Deny", self.question)
        self.allow_always.setToolTip(f"Run {tool} of {server} from now on without asking (kept)")
        self.deny.setToolTip("Do not run it: the model is told it was denied")
        buttons = QHBoxLayout()
        for button, answer in (
            (self.allow_once, Permission.ALLOW_ONCE),
            (self.allow_always, Permission.ALWAYS),
            (self.deny, Permission.DENY),
        ):
            button.clicked.connect(lambda _=False, a=answer: self._answer(a))
            buttons.addWidget(button)
        buttons.addStretch(1)
        ask = QVBoxLayout(self.question)
        ask.setContentsMargins(22, 2, 4, 4)
        prompt = QLabel(f"The model asks to run {tool} of the MCP server {server}.", self.question)
        prompt.setWordWrap(True)
        ask.addWidget(prompt)
        ask.addLayout(buttons)
        self.question.hide()

        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 2, 4, 2)
        layout.setSpacing(2)
        layout.addLayout(header)
        layout.addWidget(self.question)
        layout.addWidget(self.details)
        self._live = False  # asking or running
        self._set_title("")

    def _set_title(self, state: str) -> None:
        self.toggle.setText(f"Tool: {self._name}")
        self.state.setText(state)

    def _open(self, shown: bool) -> None:
        self.details.setVisible(shown)
        self.toggle.setArrowType(Qt.ArrowType.DownArrow if shown else Qt.ArrowType.RightArrow)

    # What the pane tells it

    def ask(self) -> None:
        self._live = True
        self._set_title("asks to run")
        self.question.show()
        self.toggle.setChecked(True)
        self.allow_once.setFocus()

    def running(self) -> None:
        self._live = True
        self.question.hide()
        self._set_title("running…")

    def finished(self, outcome: ToolOutcome, result: str, elapsed_s: float) -> None:
        self._live = False
        self.question.hide()
        took = f" · {elapsed_s:.1f} s" if elapsed_s >= 0.1 else " · under 0.1 s" if elapsed_s else ""
        self._set_title(f"{_OUTCOME_WORDS[outcome]}{took}")
        if outcome is not ToolOutcome.OK:
            self.state.setStyleSheet(f"color: {_ERROR_COLOUR};")
        cut = result if len(result) <= SHOWN_RESULT_CHARS else result[:SHOWN_RESULT_CHARS] + "\n…"
        self.result.setText(cut)
        self.result.show()
        self.result_title.show()
        self.toggle.setChecked(False)

    def stopped(self) -> None:
        """The reply was stopped while this call asked or ran."""
        if self._live:
            self._live = False
            self.question.hide()
            self._set_title("stopped")

    def _answer(self, answer: Permission) -> None:
        self.question.hide()
        self._set_title("allowed" if answer is not Permission.DENY else "denied")
        self.answered.emit(self.call_id, answer)
