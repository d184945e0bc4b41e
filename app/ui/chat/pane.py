"""The chat pane: transcript, composer and sampling controls. It knows nothing of engines.

It asks for replies with ``send_requested`` / ``stop_requested`` and is told about them through
``begin_reply`` / ``append_reply`` / ``finish_reply`` / ``fail_reply`` (the bridge drives both ends).
Text that arrives is queued and shown in frames, so a fast stream costs one render per frame whatever
its token rate. A frame spends at most ``TICK_CPU_S`` of UI-thread CPU time rendering; what is left is
shown by further turns, each started ``CATCH_UP_MS`` after the previous one's layout and paint have run
(``AfterPaint``). Fitting the transcript to the grown reply (and scrolling to its end) is a turn of its
own in the same way (``TranscriptView.hold_fits``). The asyncio tasks on the same loop (the reply's
stream among them) get their turns in between: qasync wakes a task with a timer and then runs it with
another, and a render turn due at once after the paint used to run between the two, holding the task up
for two turns and two paints.
"""

from __future__ import annotations

import enum
import time
import uuid
from typing import Any

from PySide6.QtCore import QCoreApplication, QEvent, QObject, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QKeyEvent, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.core.chat import ChatMessage, MessageState
from app.ui.chat.markdown_view import current_theme
from app.ui.chat.overflow import ContextGuard
from app.ui.chat.transcript import MessageView, TranscriptView
from app.ui.look import ElidedLabel

FRAME_MS = 16
TICK_CPU_S = 0.0015  # the UI-thread CPU time one turn of the loop spends rendering before it yields
CATCH_UP_MS = 2  # between two turns that render a backlog
COMPOSER_MAX_LINES = 8
DEFAULT_TEMPERATURE = 0.7
DEFAULT_TOP_P = 0.95


class AfterPaint(QObject):
    """Emits ``reached`` once the events queued before ``post()``, a frame's layout and paint among
    them, have run: Qt delivers a posted event of low priority after those."""

    reached = Signal()
    _TYPE = QEvent.Type(QEvent.registerEventType())

    def post(self) -> None:
        QCoreApplication.postEvent(self, QEvent(self._TYPE), Qt.EventPriority.LowEventPriority.value)

    def event(self, event: QEvent) -> bool:
        if event.type() == self._TYPE:
            self.reached.emit()
            return True
        return super().event(event)


class PaneState(enum.Enum):
    IDLE = "idle"  # ready to send
    WAITING = "waiting"  # a reply was asked for; no text yet
    STREAMING = "streaming"  # a reply is arriving


class Composer(QPlainTextEdit):
    """The message box: Enter sends, Shift+Enter starts a new line; grows up to a few lines (as laid
    out: a long line that wraps counts for each line it takes)."""

    submitted = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setPlaceholderText("Message  (Enter to send, Shift+Enter for a new line)")
        self.setTabChangesFocus(True)
        self.document().documentLayout().documentSizeChanged.connect(self._fit_height)
        self._fit_height()

    def keyPressEvent(self, event: QKeyEvent) -> None:
        enter = event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
        if enter and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            self.submitted.emit()
            return
        if enter:  # Shift+Enter: a plain new line, not a line separator
            self.insertPlainText("\n")
            return
        super().keyPressEvent(event)

    def _fit_height(self) -> None:
        lines = min(max(round(self.document().size().height()), 1), COMPOSER_MAX_LINES)
        line_height = self.fontMetrics().lineSpacing()
        margins = self.contentsMargins().top() + self.contentsMargins().bottom()
        self.setFixedHeight(int(lines * line_height + 2 * self.document().documentMargin() + margins + 2))


class ChatPane(QWidget):
    send_requested = Signal(str, list, dict)  # conversation id, OpenAI messages, sampling params
    stop_requested = Signal()
    reply_finished = Signal(str, object)  # conversation id, the ChatMessage as it ended
    conversation_changed = Signal(str)  # a new or another conversation is shown

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.conversation_id = uuid.uuid4().hex
        self.state = PaneState.IDLE
        self._reply: MessageView | None = None
        self._editing: int | None = None  # index of the user message being edited
        self._frame = QTimer(self)
        self._frame.setSingleShot(True)
        self._frame.timeout.connect(self._render_frame)
        self._after_paint = AfterPaint(self)
        self._after_paint.reached.connect(self._catch_up)
        muted = current_theme().muted

        self.title = ElidedLabel("New chat", self)
        self.title.setStyleSheet("font-weight: 600; font-size: 14px;")
        self.new_chat_button = QToolButton(self)
        self.new_chat_button.setText("New chat")
        self.new_chat_button.setToolTip("Start a new conversation (Ctrl+N)")
        self.new_chat_button.clicked.connect(self.new_conversation)

        self.edit_banner = QLabel("Editing a message: Enter sends it again, Esc cancels.", self)
        self.edit_banner.setStyleSheet(f"color: {muted};")
        self.edit_banner.hide()

        self.system_toggle = QToolButton(self)
        self.system_toggle.setText("System prompt")
        self.system_toggle.setCheckable(True)
        self.system_toggle.setArrowType(Qt.ArrowType.RightArrow)
        self.system_toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.system_toggle.setAutoRaise(True)
        self.system_prompt = QPlainTextEdit(self)
        self.system_prompt.setPlaceholderText("Instructions the model sees before the conversation")
        self.system_prompt.setFixedHeight(self.fontMetrics().lineSpacing() * 3 + 12)
        self.system_prompt.hide()
        self.system_toggle.toggled.connect(self._toggle_system_prompt)
        top = QHBoxLayout()
        top.setContentsMargins(16, 8, 12, 0)
        top.addWidget(self.title, 1)
        top.addWidget(self.system_toggle)
        top.addWidget(self.new_chat_button)
        system_row = QHBoxLayout()
        system_row.setContentsMargins(16, 4, 16, 0)
        system_row.addWidget(self.system_prompt)

        self.transcript = TranscriptView(self)
        self.transcript.fit_wanted.connect(self._after_paint.post)

        self.temperature = QDoubleSpinBox(self)
        self.temperature.setRange(0.0, 2.0)
        self.temperature.setSingleStep(0.05)
        self.temperature.setValue(DEFAULT_TEMPERATURE)
        self.top_p = QDoubleSpinBox(self)
        self.top_p.setRange(0.0, 1.0)
        self.top_p.setSingleStep(0.05)
        self.top_p.setValue(DEFAULT_TOP_P)
        self.max_tokens = QSpinBox(self)
        self.max_tokens.setRange(0, 262_144)
        self.max_tokens.setSingleStep(256)
        self.max_tokens.setSpecialValueText("no limit")
        self.max_tokens.setValue(0)
        self.guard = ContextGuard(self)  # the context meter, and the ways out of a send that would not fit
        self.max_tokens.valueChanged.connect(self.guard.changed)
        options = QHBoxLayout()
        options.addStretch(1)
        for label, box, tip in (
            ("Temperature", self.temperature, "Higher is more varied, lower more focused"),
            ("Top-p", self.top_p, "Sample only from the most likely tokens that add up to this share"),
            ("Max tokens", self.max_tokens, "Longest reply; 0 lets the model decide"),
        ):
            form = QFormLayout()
            form.setContentsMargins(8, 0, 0, 0)
            box.setToolTip(tip)
            form.addRow(label, box)
            options.addLayout(form)

        self.composer = Composer(self)
        self.composer.submitted.connect(self.submit)
        self.composer.textChanged.connect(self.guard.changed)
        self.send_button = QPushButton("Send", self)
        self.send_button.setDefault(True)
        self.send_button.clicked.connect(self._send_or_stop)
        compose = QHBoxLayout()
        compose.addWidget(self.composer, 1)
        compose.addWidget(self.send_button, 0, Qt.AlignmentFlag.AlignBottom)

        bottom = QVBoxLayout()
        bottom.setContentsMargins(16, 4, 16, 12)
        bottom.setSpacing(6)
        bottom.addWidget(self.edit_banner)
        bottom.addLayout(options)
        bottom.addWidget(self.guard.meter)
        bottom.addWidget(self.guard.choices)
        bottom.addLayout(compose)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addLayout(top)
        layout.addLayout(system_row)
        layout.addWidget(self.transcript, 1)
        layout.addLayout(bottom)

        stop = QShortcut(QKeySequence(Qt.Key.Key_Escape), self)
        stop.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
        stop.activated.connect(self._escape)
        # One action for Ctrl+N: the window's File menu shows this one (a second shortcut would make
        # the key ambiguous, and neither would fire).
        self.new_chat_action = QAction("New chat", self)
        self.new_chat_action.setShortcut(QKeySequence(QKeySequence.StandardKey.New))
        self.new_chat_action.triggered.connect(self.new_conversation)
        self.addAction(self.new_chat_action)
        self.composer.setFocus()

    # What the bridge and the history read

    def messages(self) -> list[ChatMessage]:
        return [view.message for view in self.transcript.views()]

    def params(self) -> dict[str, Any]:
        params: dict[str, Any] = {"temperature": self.temperature.value(), "top_p": self.top_p.value()}
        if self.max_tokens.value():
            params["max_tokens"] = self.max_tokens.value()
        return params

    def sent_messages(self) -> list[dict[str, str]]:
        """The OpenAI messages the chat sends as it is (without the message being written)."""
        return self._api_messages()

    def prospective(self) -> list[dict[str, str]]:
        """The OpenAI messages a send of the composer's text would make (an edit replacing its tail)."""
        sent = self._api_messages(until=self._editing)
        text = self.composer.toPlainText().strip()
        return [*sent, {"role": "user", "content": text}] if text else sent

    def reply_snapshot(self) -> tuple[str, str] | None:
        """The reply in flight (text, reasoning), or None."""
        return self._reply.snapshot() if self._reply is not None else None

    # Conversations

    def new_conversation(self) -> None:
        if self.state is not PaneState.IDLE:
            self.stop()
        self.show_conversation(uuid.uuid4().hex, "New chat", "", [])
        self.composer.setFocus()

    def show_conversation(
        self, conversation_id: str, title: str, system_prompt: str, messages: list[ChatMessage]
    ) -> None:
        """Focus stays where it is: a chat picked in the list keeps the list's keys (arrows, F2, Delete)."""
        if self.state is not PaneState.IDLE:
            self.stop()
        self._cancel_edit()
        self.conversation_id = conversation_id
        self.title.setText(title)
        self.system_prompt.setPlainText(system_prompt)
        self.system_toggle.setChecked(bool(system_prompt))
        self.transcript.clear()
        for message in messages:
            self._add(message)
        self._update_actions()
        self.guard.choices.hide()
        self.guard.changed()
        self.conversation_changed.emit(conversation_id)

    def refresh_theme(self) -> None:
        """Colours follow the system's scheme: show the conversation again in the new palette (when idle)."""
        if self.state is PaneState.IDLE:
            title, system = self.title.text(), self.system_prompt.toPlainText()
            self.show_conversation(self.conversation_id, title, system, self.messages())

    def set_title(self, title: str) -> None:
        self.title.setText(title)

    # The user's side

    def submit(self) -> None:
        """Send what is in the composer (replacing the edited message and what followed it)."""
        text = self.composer.toPlainText().strip()
        if not text or self.state is not PaneState.IDLE or not self.guard.allows_send():
            return
        if self._editing is not None:
            self.transcript.remove_from(self._editing)
            self._cancel_edit()
        self.composer.clear()
        self._add(ChatMessage("user", text))
        self._request_reply()

    def regenerate(self) -> None:
        views = self.transcript.views()
        if self.state is not PaneState.IDLE or not views or views[-1].message.role != "assistant":
            return
        self.transcript.remove_from(len(views) - 1)
        self._request_reply()

    def edit(self, index: int) -> None:
        if self.state is not PaneState.IDLE:
            return
        self._editing = index
        self.composer.setPlainText(self.transcript.views()[index].message.content)
        self.edit_banner.show()
        self.composer.setFocus()
        self.composer.moveCursor(self.composer.textCursor().MoveOperation.End)

    def stop(self) -> None:
        """Stop the reply in flight; what arrived so far is kept."""
        if self.state is PaneState.IDLE:
            return
        self.stop_requested.emit()
        self._end_reply(MessageState.STOPPED)

    # The bridge's side

    def begin_reply(self) -> None:
        """The reply asked for with ``send_requested`` has started (ignored once it was stopped)."""
        if self._reply is None:
            return
        self.state = PaneState.STREAMING
        self._reply.clear_status()

    def append_reply(self, content: str, reasoning: str = "") -> None:
        """Text of the reply in flight; cheap: it is shown with the next frame."""
        if self._reply is None:
            return
        if self.state is PaneState.WAITING:
            self.state = PaneState.STREAMING
            self._reply.clear_status()
        self._reply.append(content, reasoning)
        if not self._frame.isActive():
            self._frame.start(FRAME_MS)

    def set_reply_card(self, card: dict[str, Any]) -> None:
        """The run card of the reply in flight (its model, engine, options and figures)."""
        if self._reply is not None:
            self._reply.message.run_card = card

    def finish_reply(self, telemetry: dict[str, Any] | None = None) -> None:
        if self._reply is not None:
            self._end_reply(MessageState.COMPLETE, telemetry)

    def fail_reply(self, message: str) -> None:
        if self._reply is not None:
            self._end_reply(MessageState.FAILED, error=message)

    # Inside

    def _add(self, message: ChatMessage) -> MessageView:
        view = self.transcript.add(message)
        if message.role == "user":
            view.edit_clicked.connect(self._edit_view)
        else:
            view.regenerate_clicked.connect(self.regenerate)
        return view

    def _edit_view(self, view: QObject) -> None:
        views = self.transcript.views()
        if view in views:
            self.edit(views.index(view))

    def _request_reply(self) -> None:
        self._reply = self._add(ChatMessage("assistant", "", state=MessageState.STREAMING))
        self._reply.show_waiting()
        self.state = PaneState.WAITING
        self._update_actions()
        self.send_requested.emit(self.conversation_id, self._api_messages(), self.params())

    def _api_messages(self, until: int | None = None) -> list[dict[str, str]]:
        """What is sent: the system prompt, then each message not left out (those before ``until``)."""
        system = self.system_prompt.toPlainText().strip()
        sent = [{"role": "system", "content": system}] if system else []
        for view in self.transcript.views()[:until]:
            message = view.message
            if (
                view is self._reply
                or message.left_out
                or (message.role == "assistant" and not message.content)
            ):
                continue
            sent.append({"role": message.role, "content": message.content})
        return sent

    def _render_frame(self) -> None:
        if self._reply is None:
            return
        self.transcript.hold_fits(True)  # released when the reply ends
        if self.transcript.is_fit_wanted():  # a turn of its own, after the paint of what grew
            self.transcript.fit()
        else:
            self._reply.show_pending(until=time.thread_time() + TICK_CPU_S)
        if self._reply.has_pending():  # the rest after this paint, and a gap for the loop
            self._after_paint.post()

    def _catch_up(self) -> None:
        wanted = self.transcript.is_fit_wanted()
        if self._reply is not None and (wanted or self._reply.has_pending()):
            self._frame.start(CATCH_UP_MS)

    def _end_reply(
        self, state: MessageState, telemetry: dict[str, Any] | None = None, error: str = ""
    ) -> None:
        reply = self._reply
        assert reply is not None
        self._frame.stop()
        self._reply = None
        reply.finish(state, telemetry, error)
        self.transcript.hold_fits(False)
        self.state = PaneState.IDLE
        self._update_actions()
        self.guard.changed()
        self.reply_finished.emit(self.conversation_id, reply.message)

    def _update_actions(self) -> None:
        busy = self.state is not PaneState.IDLE
        self.send_button.setText("Stop" if busy else "Send")
        self.send_button.setToolTip("Stop the reply (Esc)" if busy else "Send (Enter)")
        views = self.transcript.views()
        for i, view in enumerate(views):
            last_reply = i == len(views) - 1 and view.message.role == "assistant"
            view.set_regenerate_visible(last_reply and not busy)
            view.edit_button.setEnabled(not busy)

    def _send_or_stop(self) -> None:
        if self.state is PaneState.IDLE:
            self.submit()
        else:
            self.stop()

    def _escape(self) -> None:
        if self.state is not PaneState.IDLE:
            self.stop()
        elif self._editing is not None:
            self._cancel_edit()
            self.composer.clear()

    def _cancel_edit(self) -> None:
        self._editing = None
        self.edit_banner.hide()

    def _toggle_system_prompt(self, shown: bool) -> None:
        self.system_prompt.setVisible(shown)
        self.system_toggle.setArrowType(Qt.ArrowType.DownArrow if shown else Qt.ArrowType.RightArrow)
