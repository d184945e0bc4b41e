"""The conversation as a scrolling column of messages.

A streaming reply repaints what changed, not the whole view (every label on screen was painted two or
three times a frame, about 5 ms in tests/bench/chat_render.py; now the changed label and the strip that
scrolls into view):
- the content, a reply's message and its text are static (``WA_StaticContents``: drawn from the top,
  with no background that depends on their size), so growing, they repaint only the new space;
- the content paints its own opaque background (the viewport's colour): Qt scrolls only an opaque
  widget by moving the pixels already drawn;
- following the end, the view scrolls first and grows after: Qt will not move pixels while anything
  under them waits to be painted (the new space under the reply would), and repaints everything instead;
- while a reply streams, that fit waits for a turn of the loop of its own (``hold_fits``; the pane calls
  ``fit()``): done as soon as the reply's layout asked for it, its paint ran straight after the paint of
  the text that grew, both within one of the loop's turns (4-5 ms of UI-thread CPU with the render);
- the vertical scroll bar is always shown: appearing once a reply outgrew the view, it would narrow the
  view and every message would be laid out and painted again in that frame;
- the scroll bar repaints only when its handle or its arrows change (``ScrollBar``), not each time its
  range grows: Qt fills Fusion's gradient groove in its GUI thread pool and the UI thread waits for
  those threads, which on a busy machine start late (a scroll bar paint of 0.3 ms of CPU took 4-8 ms).
"""

from __future__ import annotations

import contextlib
import html
from collections.abc import Iterator
from typing import Any

from PySide6.QtCore import QEvent, QObject, QSize, Qt, Signal
from PySide6.QtGui import QGuiApplication, QPalette
from PySide6.QtWidgets import (
    QAbstractSlider,
    QFrame,
    QHBoxLayout,
    QLabel,
    QLayout,
    QScrollArea,
    QScrollBar,
    QSizePolicy,
    QStyle,
    QStyleOptionSlider,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.core.attachments import Unreadable
from app.core.chat import ChatMessage, MessageState, format_telemetry
from app.core.runcard import RunCard
from app.core.tools import ToolOutcome
from app.ui.chat.attachments import AttachmentChip, ChipRow
from app.ui.chat.markdown_view import MarkdownView, current_theme
from app.ui.chat.tool_call import ToolCallView

_ROLE_NAMES = {"user": "You", "assistant": "Assistant"}
_STATE_NOTES = {
    MessageState.STREAMING: "Interrupted: the app closed while this reply was arriving.",
    MessageState.STOPPED: "Stopped.",
}


def _action_button(text: str, tip: str, parent: QWidget) -> QToolButton:
    button = QToolButton(parent)
    button.setText(text)
    button.setToolTip(tip)
    button.setAutoRaise(True)
    button.setCursor(Qt.CursorShape.PointingHandCursor)
    return button


class MessageView(QFrame):
    """One message: who said it, its reasoning (collapsible), the tools it called (each collapsible), its
    text, and what can be done with it."""

    edit_clicked = Signal(QObject)  # this view
    regenerate_clicked = Signal()
    tool_answered = Signal(str, object)  # call id, Permission: the user's answer to a tool call's question

    def __init__(self, message: ChatMessage, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.message = message
        self.setObjectName("userMessage" if message.role == "user" else "assistantMessage")
        theme = current_theme()
        if message.role == "user":
            bubble = QGuiApplication.palette().color(QPalette.ColorRole.AlternateBase).name()
            self.setStyleSheet(f"#userMessage {{ background-color: {bubble}; border-radius: 8px; }}")
        else:  # no background of its own: a growing reply repaints only what is new
            self.setAttribute(Qt.WidgetAttribute.WA_StaticContents)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 8, 12, 8)
        layout.setSpacing(4)

        header = QHBoxLayout()
        role = QLabel(_ROLE_NAMES.get(message.role, message.role), self)
        role.setStyleSheet("font-weight: 600;")
        header.addWidget(role)
        self.left_out_note = QLabel("left out of what the model sees: the chat outgrew its context", self)
        self.left_out_note.setStyleSheet(f"color: {theme.muted}; font-style: italic;")
        self.left_out_note.setVisible(message.left_out)
        header.addWidget(self.left_out_note)
        header.addStretch(1)
        self.copy_button = _action_button("Copy", "Copy this message", self)
        self.copy_button.clicked.connect(self._copy)
        self.edit_button = _action_button("Edit", "Edit this message and send it again", self)
        self.edit_button.clicked.connect(self._edit_clicked)
        self.regenerate_button = _action_button("Regenerate", "Ask for this reply again", self)
        self.regenerate_button.clicked.connect(self.regenerate_clicked)
        for button in (self.copy_button, self.edit_button, self.regenerate_button):
            header.addWidget(button)
        self.edit_button.setVisible(message.role == "user")
        self.regenerate_button.hide()
        layout.addLayout(header)

        self.reasoning_toggle = QToolButton(self)
        self.reasoning_toggle.setCheckable(True)
        self.reasoning_toggle.setAutoRaise(True)
        self.reasoning_toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.reasoning_toggle.setText("Reasoning")
        self.reasoning_toggle.setStyleSheet(f"color: {theme.muted};")
        self.reasoning_toggle.toggled.connect(self._show_reasoning)
        self.reasoning = MarkdownView(self)
        muted = self.reasoning.palette()
        muted.setColor(QPalette.ColorRole.WindowText, muted.color(QPalette.ColorRole.PlaceholderText))
        self.reasoning.setPalette(muted)
        self.reasoning.setContentsMargins(14, 0, 0, 4)
        layout.addWidget(self.reasoning_toggle)
        layout.addWidget(self.reasoning)
        self.reasoning_toggle.hide()
        self.reasoning.hide()
        self.tools: dict[str, ToolCallView] = {}  # by call id
        self._tools_layout = QVBoxLayout()
        self._tools_layout.setSpacing(4)
        layout.addLayout(self._tools_layout)
        self.note = QLabel(self)  # a line about this reply, not of it (why it had no tools)
        self.note.setStyleSheet(f"color: {theme.muted}; font-style: italic;")
        self.note.setWordWrap(True)
        self.note.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.note.hide()
        layout.addWidget(self.note)

        if message.role == "user":
            self.body: MarkdownView | QLabel = QLabel(message.content, self)
            self.body.setTextFormat(Qt.TextFormat.PlainText)
            self.body.setWordWrap(True)
            self.body.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            policy = QSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Minimum)
            policy.setHeightForWidth(True)
            self.body.setSizePolicy(policy)
        else:
            self.body = MarkdownView(self)
        layout.addWidget(self.body)
        self.attachments = ChipRow(self)  # their bytes come later (show_attachment_data): no I/O here
        for ref in message.attachments:
            self.attachments.add(AttachmentChip(ref, parent=self.attachments))
        self.attachments.setVisible(bool(message.attachments))
        layout.addWidget(self.attachments)

        self.status = QLabel(self)
        self.status.setStyleSheet(f"color: {theme.muted}; font-size: 11px;")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.status.hide()
        self.status.linkActivated.connect(self.toggle_card)
        layout.addWidget(self.status)
        self.card = QLabel(self)  # the run card, shown when the telemetry footer is clicked
        self.card.setObjectName("runCard")
        self.card.setTextFormat(Qt.TextFormat.RichText)
        self.card.setWordWrap(True)
        self.card.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        frame = f"border: 1px solid {theme.muted}; border-radius: 6px; padding: 6px; font-size: 11px;"
        self.card.setStyleSheet(f"#runCard {{ {frame} }}")
        self.card.hide()
        layout.addWidget(self.card)

        if message.role != "user":
            for call in message.tool_calls:
                self._show_stored_call(call)
            if message.reasoning:
                self.append(message.content, message.reasoning)
                self.reasoning.finish()
                self.reasoning_toggle.setChecked(False)
            else:
                self.append(message.content, "")
            assert isinstance(self.body, MarkdownView)
            self.body.finish()
            self._show_state()

    def tool_view(self, call_id: str, server: str, tool: str, arguments: dict[str, Any]) -> ToolCallView:
        """The block of a tool call, made when first asked for."""
        view = self.tools.get(call_id)
        if view is None:
            view = ToolCallView(call_id, server, tool, arguments, self)
            view.answered.connect(self.tool_answered)
            self._tools_layout.addWidget(view)
            self.tools[call_id] = view
        return view

    def show_note(self, text: str) -> None:
        self.note.setText(text)
        self.note.show()

    def _show_stored_call(self, call: dict[str, Any]) -> None:
        try:
            outcome = ToolOutcome(call.get("outcome"))
        except ValueError:
            outcome = ToolOutcome.ERROR
        arguments = call.get("arguments")
        view = self.tool_view(
            str(call.get("call_id", len(self.tools))),
            str(call.get("server", "")),
            str(call.get("tool", "")),
            arguments if isinstance(arguments, dict) else {},
        )
        elapsed = call.get("elapsed_s")
        view.finished(
            outcome, str(call.get("result", "")), elapsed if isinstance(elapsed, int | float) else 0.0
        )

    def append(self, content: str, reasoning: str) -> None:
        """Queue text for the next ``show_pending``."""
        if reasoning:
            if self.reasoning_toggle.isHidden():
                self.reasoning_toggle.show()
                self.reasoning_toggle.setChecked(True)
                self._show_reasoning(True)
            self.reasoning.append(reasoning)
        if content and isinstance(self.body, MarkdownView):
            self.body.append(content)

    def show_attachment_data(self, sha256: str, data: bytes | Unreadable) -> None:
        self.attachments.show_data(sha256, data)

    def has_pending(self) -> bool:
        body = isinstance(self.body, MarkdownView) and self.body.has_pending()
        return body or self.reasoning.has_pending()

    def show_pending(self, until: float | None = None) -> None:
        """Show what was queued; with ``until``, stop soon after the thread's CPU clock passes it (see
        ``MarkdownView.show_pending``). The reasoning comes first: the text waits until it is shown."""
        self.reasoning.show_pending(until=until)
        if isinstance(self.body, MarkdownView) and not self.reasoning.has_pending():
            self.body.show_pending(until=until)

    def snapshot(self) -> tuple[str, str]:
        """The reply's text and reasoning so far."""
        body = self.body.text() if isinstance(self.body, MarkdownView) else self.message.content
        return body, self.reasoning.text()

    def finish(self, state: MessageState, telemetry: dict[str, Any] | None = None, error: str = "") -> None:
        self.message.content, self.message.reasoning = self.snapshot()
        self.message.state, self.message.error = state, error
        if telemetry is not None:
            self.message.telemetry = telemetry
        self.reasoning.finish()
        if isinstance(self.body, MarkdownView):
            self.body.finish()
        if state is not MessageState.COMPLETE:
            for view in self.tools.values():
                view.stopped()
        self._show_state()

    def show_waiting(self) -> None:
        self.status.setText("Waiting for the model…")
        self.status.show()

    def clear_status(self) -> None:
        self.status.hide()

    def set_left_out(self) -> None:
        """Leave this message out of what is sent from now on; it stays in the transcript, marked."""
        self.message.left_out = True
        self.left_out_note.show()

    def set_regenerate_visible(self, visible: bool) -> None:
        self.regenerate_button.setVisible(visible)

    def _show_state(self) -> None:
        message = self.message
        if message.state is MessageState.FAILED:
            text = f"Failed: {message.error}" if message.error else "Failed."
        else:
            text = " ".join(
                part
                for part in (_STATE_NOTES.get(message.state, ""), format_telemetry(message.telemetry or {}))
                if part
            )
        if message.run_card and text and message.state is not MessageState.FAILED:
            self.status.setTextFormat(Qt.TextFormat.RichText)
            self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)
            self.status.setToolTip("Show the run card: model, engine, options, sampling, hardware, figures")
            muted = current_theme().muted
            text = f'<a href="card" style="color: {muted}; text-decoration: none;">{html.escape(text)} ▸</a>'
        self.status.setText(text)
        self.status.setVisible(bool(text))
        if message.state is MessageState.FAILED:
            self.status.setStyleSheet("color: #c0392b; font-size: 11px;")

    def toggle_card(self, _link: str = "") -> None:
        """Show or hide the reply's run card."""
        if not self.message.run_card:
            return
        if self.card.isHidden():
            rows = "".join(
                f"<tr><td style='padding-right: 10px;'><b>{html.escape(label)}</b></td>"
                f"<td>{html.escape(value)}</td></tr>"
                for label, value in RunCard.from_json(self.message.run_card).lines()
            )
            self.card.setText(f"<table cellspacing='0' cellpadding='1'>{rows}</table>")
        self.card.setVisible(self.card.isHidden())

    def _show_reasoning(self, shown: bool) -> None:
        self.reasoning.setVisible(shown)
        arrow = Qt.ArrowType.DownArrow if shown else Qt.ArrowType.RightArrow
        self.reasoning_toggle.setArrowType(arrow)

    def _edit_clicked(self) -> None:
        # The view travels in the signal: a lambda holding it would be released while Qt destroys
        # the view, which crashes PySide.
        self.edit_clicked.emit(self)

    def _copy(self) -> None:
        QGuiApplication.clipboard().setText(self.snapshot()[0])


class ScrollBar(QScrollBar):
    """A vertical scroll bar that repaints only when what it shows changes: following a streaming reply,
    its range grows every frame while its handle moves by a pixel now and then, and Fusion paints its
    groove with a gradient that Qt fills in its GUI thread pool, the UI thread waiting for those threads
    (which a busy machine runs late)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(Qt.Orientation.Vertical, parent)
        self._shown: tuple[object, ...] = ()
        self._moving = False

    @contextlib.contextmanager
    def moving(self) -> Iterator[None]:
        """Changes of range and value that make one move: what they show is compared once, after."""
        self._moving = True
        try:
            yield
        finally:
            self._moving = False
            self.sliderChange(QAbstractSlider.SliderChange.SliderValueChange)

    def sliderChange(self, change: QAbstractSlider.SliderChange) -> None:
        if self._moving:
            return
        option = QStyleOptionSlider()
        self.initStyleOption(option)
        handle = self.style().subControlRect(
            QStyle.ComplexControl.CC_ScrollBar, option, QStyle.SubControl.SC_ScrollBarSlider, self
        )
        # The arrows look disabled at either end.
        shown = (handle.getRect(), self.value() == self.minimum(), self.value() == self.maximum())
        if shown != self._shown or change is QAbstractSlider.SliderChange.SliderOrientationChange:
            self._shown = shown
            super().sliderChange(change)


class TranscriptView(QScrollArea):
    """Messages top to bottom; follows the end while the user has not scrolled away from it."""

    fit_wanted = Signal()  # fits are held (``hold_fits``) and the messages' height changed

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        # Always there: a bar that appeared once a reply outgrew the view would narrow it, and every
        # message would be wrapped, laid out and painted again in that frame (10 ms into a long reply).
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOn)
        self._bar = ScrollBar(self)
        self.setVerticalScrollBar(self._bar)
        content = QWidget(self)
        content.setObjectName("transcript")
        content.setAttribute(Qt.WidgetAttribute.WA_StaticContents)
        content.setBackgroundRole(QPalette.ColorRole.Base)
        content.setAutoFillBackground(True)
        self._layout = QVBoxLayout(content)
        self._layout.setContentsMargins(16, 12, 16, 12)
        self._layout.setSpacing(10)
        self._layout.setSizeConstraint(QLayout.SizeConstraint.SetNoConstraint)
        self.placeholder = QLabel("Start a conversation: type a message below and press Enter.", content)
        self.placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.placeholder.setStyleSheet(f"color: {current_theme().muted};")
        self._layout.addWidget(self.placeholder, 1)
        self._layout.addStretch(0)
        self.setWidget(content)
        content.installEventFilter(self)
        self.viewport().installEventFilter(self)
        self._views: list[MessageView] = []
        self._follow = True
        self._holding = False  # fits wait for fit(): a reply is streaming
        self._wanted = False  # the messages' height changed while fits were held
        bar = self.verticalScrollBar()
        bar.valueChanged.connect(self._user_scrolled)
        bar.rangeChanged.connect(self._range_changed)

    def views(self) -> list[MessageView]:
        return list(self._views)

    def add(self, message: ChatMessage) -> MessageView:
        view = MessageView(message, self.widget())
        self._layout.insertWidget(self._layout.count() - 1, view)
        self._views.append(view)
        self.placeholder.hide()
        self._follow = True
        return view

    def remove_from(self, index: int) -> None:
        """Drop the messages from ``index`` on."""
        for view in self._views[index:]:
            self._layout.removeWidget(view)
            view.deleteLater()
        del self._views[index:]
        self.placeholder.setVisible(not self._views)

    def clear(self) -> None:
        self.remove_from(0)

    def hold_fits(self, holding: bool) -> None:
        """While a reply streams, a change in the messages' height is fitted (the content resized and
        scrolled) only when ``fit()`` is called, in a turn of the loop of its own (``fit_wanted`` says
        when one is due); a resize of the view is fitted at once all the same."""
        if self._holding and not holding:
            self.fit()
        self._holding = holding

    def is_fit_wanted(self) -> bool:
        return self._wanted

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        kind = event.type()
        if kind == QEvent.Type.Resize and watched is self.viewport():  # (the content only by fit())
            self.fit()
        elif kind == QEvent.Type.LayoutRequest and not self._holding:
            if watched in (self.widget(), self.viewport()):
                self.fit()
        elif kind == QEvent.Type.LayoutRequest and watched is self.widget() and not self._wanted:
            self._wanted = True  # (the view's own layout request follows each fit: no news)
            self.fit_wanted.emit()
        return super().eventFilter(watched, event)

    def fit(self) -> None:
        """The content is exactly as tall as its messages at the viewport's width (QScrollArea's own
        resizing takes the messages' minimum sizes, which leaves blank space under the last one)."""
        self._wanted = False
        content, width = self.widget(), self.viewport().width()
        if content is None:
            return
        height = max(content.heightForWidth(width), self.viewport().height())
        if content.size() == QSize(width, height):
            return
        bar = self._bar
        if self._follow and width == content.width() and height > content.height():
            # Scroll first, then grow: the content moves up while nothing on screen is waiting to be
            # painted, so Qt shifts the pixels already drawn and paints only the strip that comes
            # into view. (Grown first, the new space under the reply would be waiting to be painted
            # and the whole view would be painted again.)
            with bar.moving():
                bar.setMaximum(height - self.viewport().height())
                bar.setValue(bar.maximum())
        content.resize(width, height)

    def _user_scrolled(self, value: int) -> None:
        self._follow = value >= self.verticalScrollBar().maximum() - 8

    def _range_changed(self, _minimum: int, maximum: int) -> None:
        if self._follow:
            self.verticalScrollBar().setValue(maximum)
