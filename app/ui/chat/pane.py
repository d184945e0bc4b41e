"""The chat pane: transcript, composer and sampling controls. It knows nothing of engines.

It asks for replies with ``send_requested`` / ``stop_requested`` and is told about them through
``begin_reply`` / ``append_reply`` / ``finish_reply`` / ``fail_reply`` (the bridge drives both ends).
Text that arrives is queued and shown in frames, so a fast stream costs one render per frame whatever
its token rate. A frame spends at most ``TICK_CPU_S`` of UI-thread CPU time rendering; what is left is
shown by further turns, each started ``CATCH_UP_MS`` after the previous one's layout and paint have run
(``AfterPaint``). Fitting the transcript to the grown reply (and scrolling to its end) is a turn of its
own in the same way (``TranscriptView.hold_fits``). The asyncio tasks on the same loop (the reply's
stream among them) get their turns in between: the loop (``DesktopLoop``) wakes a task in one turn of
Qt's loop and runs it in the next, and a render turn due at once after the paint used to run between the
two, holding the task up for two turns and two paints.
"""

from __future__ import annotations

import enum
import time
import uuid
from pathlib import Path
from typing import Any

from PySide6.QtCore import (
    QBuffer,
    QByteArray,
    QCoreApplication,
    QEvent,
    QIODevice,
    QMimeData,
    QObject,
    Qt,
    QTimer,
    Signal,
)
from PySide6.QtGui import QAction, QDragEnterEvent, QDropEvent, QImage, QKeyEvent, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QMenu,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.core.attachments import REPLY_RESERVE, AttachmentKind, AttachmentRef, TokenCount, Unreadable, kind_of
from app.core.chat import ChatMessage, MessageState
from app.core.tools import ToolCallStarted, ToolEvent, ToolRequest, ToolsWithheld
from app.store.attachments import Ingested
from app.ui.chat.attachments import AttachmentTray
from app.ui.chat.markdown_view import current_theme
from app.ui.chat.overflow import ContextGuard
from app.ui.chat.transcript import MessageView, TranscriptView
from app.ui.look import ElidedLabel

FRAME_MS = 16
TICK_CPU_S = 0.0015  # the UI-thread CPU time one turn of the loop spends rendering before it yields
# Between two turns that render a backlog. With 2 ms the pane fell behind a 5,000 tok/s stream (3,600-4,960
# tok/s shown: a turn takes one 1.5-2.5 ms step, so the wait was a third of each cycle); with 0 the next
# turn ran before the loop's other work and two turns made one stall (12-16 ms) (tests/bench/chat_render.py).
CATCH_UP_MS = 1
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
    KEEPING = "keeping"  # the message's attachments are being checked and kept; then it goes
    WAITING = "waiting"  # a reply was asked for; no text yet
    STREAMING = "streaming"  # a reply is arriving


def _local_files(source: QMimeData) -> list[str]:
    return [url.toLocalFile() for url in source.urls() if url.isLocalFile()] if source.hasUrls() else []


class Composer(QPlainTextEdit):
    """The message box: Enter sends, Shift+Enter starts a new line; grows up to a few lines (as laid
    out: a long line that wraps counts for each line it takes). Files dropped or pasted on it, and pasted
    images, are attachments, not text."""

    submitted = Signal()
    files_given = Signal(list)  # local paths dropped or pasted
    image_pasted = Signal(object)  # a QImage from the clipboard

    def canInsertFromMimeData(self, source: QMimeData) -> bool:
        return bool(_local_files(source)) or source.hasImage() or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QMimeData) -> None:
        if files := _local_files(source):
            self.files_given.emit(files)
        elif source.hasImage():
            self.image_pasted.emit(source.imageData())
        else:
            super().insertFromMimeData(source)

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
    attach_requested = Signal(str)  # a file's path: to be read and counted (``add_attachment``)
    attach_data_requested = Signal(str, bytes)  # a pasted image: its name and PNG bytes
    # [(Ingested, its AttachmentRef, a budget or None)], the question, the embeddings model: keep them
    # (one with a budget as its parts related to the question); the message goes on ``attachments_kept``
    keep_requested = Signal(list, str, str)
    keep_dropped = Signal(list)  # [sha256]: files kept (or being kept) for a message that did not go
    attachments_shown = Signal(list)  # [AttachmentRef] in the transcript: their bytes are wanted
    context_wanted = Signal(int)  # tokens of context the message with its attachments needs
    stop_requested = Signal()
    reply_finished = Signal(str, object)  # conversation id, the ChatMessage as it ended
    reply_tools_done = Signal(list)  # the reply in flight's tool calls so far, one more just ended
    tool_answered = Signal(str, object)  # call id, Permission: the user's answer to ``ask_tool``
    conversation_changed = Signal(str)  # a new or another conversation is shown

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.conversation_id = uuid.uuid4().hex
        self.state = PaneState.IDLE
        self._reply: MessageView | None = None
        self._after_tools = False  # a tool call of the reply ended since its last text
        self._text_seen = False  # the reply has text
        self._editing: int | None = None  # index of the user message being edited
        self._vision_refusal = ""  # why the model the message goes to takes no images ("" it does)
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
        # The MCP servers whose tools this chat offers the model: every ready one unless unticked here.
        self.tools_button = QToolButton(self)
        self.tools_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.tools_button.setToolTip("The MCP servers whose tools the model may call in this chat")
        self.tools_menu = QMenu(self.tools_button)
        self.tools_button.setMenu(self.tools_menu)
        self.tools_button.hide()
        self._tool_servers: list[str] = []  # the ready servers, as the bridge last said
        self._tools_off: dict[str, set[str]] = {}  # by conversation: the servers unticked in it
        self.guard = ContextGuard(self)  # the context meter, and the ways out of a send that would not fit
        self.max_tokens.valueChanged.connect(self.guard.changed)
        options = QHBoxLayout()
        options.addWidget(self.tools_button)
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
        self.composer.files_given.connect(self.attach_files)
        self.composer.image_pasted.connect(self.attach_image)
        self.setAcceptDrops(True)
        self.tray = AttachmentTray(self)
        self.tray.larger_context_wanted.connect(self.context_wanted)
        self.attach_button = QToolButton(self)
        self.attach_button.setText("Attach…")
        self.attach_button.setToolTip("Attach files or images (or drop them here, or paste)")
        self.attach_button.clicked.connect(self.choose_files)
        self.file_dialog: QFileDialog | None = None
        self.composer.textChanged.connect(self.guard.changed)
        self.send_button = QPushButton("Send", self)
        self.send_button.setDefault(True)
        self.send_button.clicked.connect(self._send_or_stop)
        compose = QHBoxLayout()
        compose.addWidget(self.attach_button, 0, Qt.AlignmentFlag.AlignBottom)
        compose.addWidget(self.composer, 1)
        compose.addWidget(self.send_button, 0, Qt.AlignmentFlag.AlignBottom)

        bottom = QVBoxLayout()
        bottom.setContentsMargins(16, 4, 16, 12)
        bottom.setSpacing(6)
        bottom.addWidget(self.edit_banner)
        bottom.addLayout(options)
        bottom.addWidget(self.tray)
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

    def chosen_servers(self) -> list[str]:
        """The MCP servers whose tools this chat offers (none ticked: no tools)."""
        off = self._tools_off.get(self.conversation_id, set())
        return [name for name in self._tool_servers if name not in off]

    def set_tool_servers(self, names: list[str]) -> None:
        """The MCP servers that are ready now (the bridge's word)."""
        self._tool_servers = list(names)
        self._show_tools()
        self.guard.changed()  # the tools offered are counted

    def _show_tools(self) -> None:
        self.tools_menu.clear()
        chosen = self.chosen_servers()
        for name in self._tool_servers:
            action = self.tools_menu.addAction(name)
            action.setCheckable(True)
            action.setChecked(name in chosen)
            action.toggled.connect(lambda on, n=name: self._tick(n, on))
        self.tools_button.setText(f"Tools: {len(chosen)} of {len(self._tool_servers)}")
        self.tools_button.setVisible(bool(self._tool_servers))

    def _tick(self, name: str, on: bool) -> None:
        off = self._tools_off.setdefault(self.conversation_id, set())
        (off.discard if on else off.add)(name)
        chosen = self.chosen_servers()
        self.tools_button.setText(f"Tools: {len(chosen)} of {len(self._tool_servers)}")
        self.guard.changed()

    def sent_messages(self) -> list[dict[str, Any]]:
        """The chat as it sends it (without the message being written), for a summary."""
        return self._api_messages()

    def prospective(self) -> list[dict[str, Any]]:
        """What a send of the composer's text would send (an edit replacing its tail, its attachments
        going with it), for the context guard; the composer's attachments are the tray's to count."""
        sent = self._api_messages(until=self._editing)
        text = self.composer.toPlainText().strip()
        editing = self._editing
        carried = self.transcript.views()[editing].message.attachments if editing is not None else []
        if not text and not carried:
            return sent
        return [*sent, {"role": "user", "content": text, **({"attachments": carried} if carried else {})}]

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
        self.tray.clear()
        self.guard.reset()
        for message in messages:
            self._add(message)
        self._show_tools()  # this chat's choice of servers
        self._update_actions()
        self.guard.choices.hide()
        self.guard.changed()
        self.conversation_changed.emit(conversation_id)
        if refs := [ref for message in messages for ref in message.attachments]:
            self.attachments_shown.emit(refs)

    def refresh_theme(self) -> None:
        """Colours follow the system's scheme: show the conversation again in the new palette (when idle)."""
        if self.state is PaneState.IDLE:
            title, system = self.title.text(), self.system_prompt.toPlainText()
            self.show_conversation(self.conversation_id, title, system, self.messages())

    def set_title(self, title: str) -> None:
        self.title.setText(title)

    # The user's side

    def submit(self) -> None:
        """Send what is in the composer (replacing the edited message and what followed it). With
        attachments, they are checked (the model takes images, they fit) and kept first."""
        text = self.composer.toPlainText().strip()
        if (
            (not text and not self.tray.items)
            or self.state is not PaneState.IDLE
            or not self.guard.allows_send()
        ):
            return
        if self._images_refused():
            return
        if not self.tray.items:
            self._send(text)
            return
        images = any(p.ref.kind is AttachmentKind.IMAGE for p in self.tray.items)
        if images and self._vision_refusal:
            self.tray.say(self._vision_refusal)
            return
        if self.tray.overflow(self._tokens_used()):
            return
        self.state = PaneState.KEEPING
        self._update_actions()
        items = [(p.taken, p.ref, p.budget) for p in self.tray.items]
        self.keep_requested.emit(items, text, self.tray.embedder)

    def _send(
        self, text: str, refs: list[AttachmentRef] | None = None, data: dict[str, bytes] | None = None
    ) -> None:
        carried: list[AttachmentRef] = []  # an edited message's attachments go with it (kept already)
        if self._editing is not None:
            carried = self.transcript.views()[self._editing].message.attachments
            self.transcript.remove_from(self._editing)
            self._cancel_edit()
        self.composer.clear()
        new = [ref for ref in refs or [] if ref.sha256 not in {c.sha256 for c in carried}]
        view = self._add(ChatMessage("user", text, attachments=[*carried, *new]))
        for sha, kept in (data or {}).items():
            view.show_attachment_data(sha, kept)
        if carried:
            self.attachments_shown.emit(carried)
        self._request_reply()

    def _tokens_used(self) -> int:
        """What the send takes of the context besides the composer's attachments (the context guard's
        count), with room for the reply."""
        return self.guard.used() + (self.max_tokens.value() or REPLY_RESERVE)

    # Attachments

    def choose_files(self) -> None:
        """The file dialog (not modal to the app: the chat goes on); chosen files are attached."""
        dialog = QFileDialog(self, "Attach files or images")
        dialog.setFileMode(QFileDialog.FileMode.ExistingFiles)
        dialog.setNameFilters(
            [
                "Documents, code and images (*)",
                "Images (*.png *.jpg *.jpeg *.webp *.gif *.bmp)",
                "PDF (*.pdf)",
            ]
        )
        dialog.filesSelected.connect(self.attach_files)
        dialog.finished.connect(dialog.deleteLater)
        self.file_dialog = dialog
        dialog.open()

    def attach_files(self, paths: list[str]) -> None:
        for path in paths:
            name = Path(path).name
            if kind_of(name) is AttachmentKind.IMAGE and self._vision_refusal:
                self.tray.say(f"{name} was not attached: {self._vision_refusal}")
            else:
                self.attach_requested.emit(path)

    def attach_image(self, image: QImage) -> None:
        """A pasted image, as PNG bytes (made in memory: no file)."""
        if self._vision_refusal:
            self.tray.say(f"The pasted image was not attached: {self._vision_refusal}")
            return
        data = QByteArray()
        buffer = QBuffer(data)
        buffer.open(QIODevice.OpenModeFlag.WriteOnly)
        image.save(buffer, "PNG")  # type: ignore[call-overload]  # (the stubs say bytes; it takes str)
        self.attach_data_requested.emit(f"pasted-{time.strftime('%H%M%S')}.png", bytes(data.data()))

    def set_vision(self, refusal: str) -> None:
        """Why the model messages go to takes no images ("": it does)."""
        self._vision_refusal = refusal

    def add_attachment(self, taken: Ingested, count: TokenCount) -> None:
        """A file read and counted (``attach_requested``) joins the message being written."""
        if taken.ref.kind is AttachmentKind.IMAGE and self._vision_refusal:
            self.tray.say(f"{taken.ref.name} was not attached: {self._vision_refusal}")
            return
        self.tray.add(taken, count)
        self.tray.overflow(self._tokens_used())

    def set_attachment_count(self, sha256: str, count: TokenCount) -> None:
        """An attachment counted again (the model loaded): its chip and the fit check follow."""
        if self.tray.set_count(sha256, count):
            self.tray.overflow(self._tokens_used())

    def refuse_attachment(self, why: str) -> None:
        """A file could not be attached, or the message's attachments not kept (it did not go)."""
        if self.state is PaneState.KEEPING:
            self.state = PaneState.IDLE
            self._update_actions()
            self.keep_dropped.emit([p.ref.sha256 for p in self.tray.items])
        self.tray.say(why)

    def set_embedder(self, name: str) -> None:
        """The embeddings model a file's parts related to the question can be found with ("": none)."""
        self.tray.embedder = name

    def attachments_kept(self, refs: list[AttachmentRef]) -> None:
        """The attachments are kept (``refs``: the tray's, as they go): the message goes with them."""
        if self.state is not PaneState.KEEPING:  # stopped meanwhile: what was kept for it goes
            self.keep_dropped.emit([ref.sha256 for ref in refs])
            return
        self.state = PaneState.IDLE
        data = {p.ref.sha256: p.taken.data for p in self.tray.items}
        self.tray.clear()
        self._send(self.composer.toPlainText().strip(), refs, data)

    def show_attachment_data(self, sha256: str, data: bytes | Unreadable) -> None:
        """A kept attachment's bytes (``attachments_shown``), or why they cannot be read: said in place."""
        for view in self.transcript.views():
            view.show_attachment_data(sha256, data)

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if _local_files(event.mimeData()):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        if files := _local_files(event.mimeData()):
            event.acceptProposedAction()
            self.attach_files(files)

    def regenerate(self) -> None:
        views = self.transcript.views()
        if self.state is not PaneState.IDLE or not views or views[-1].message.role != "assistant":
            return
        if self._images_refused():
            return
        self.transcript.remove_from(len(views) - 1)
        self._request_reply()

    def _images_refused(self) -> bool:
        """The chat so far holds images and the model it goes to takes none: said, and nothing goes
        (the engine would refuse the whole request)."""
        views = self.transcript.views()
        if self._vision_refusal and any(
            ref.kind is AttachmentKind.IMAGE for view in views for ref in view.message.attachments
        ):
            self.tray.say(f"This chat holds images. {self._vision_refusal} Or start a new chat.")
            return True
        return False

    def edit(self, index: int) -> None:
        if self.state is not PaneState.IDLE:
            return
        self._editing = index
        message = self.transcript.views()[index].message
        self.composer.setPlainText(message.content)
        count = len(message.attachments)
        carried = f" (its {count} attachments go with it)" if count > 1 else " (its attachment goes with it)"
        carried = carried if count else ""
        self.edit_banner.setText(f"Editing a message{carried}: Enter sends it again, Esc cancels.")
        self.edit_banner.show()
        self.composer.setFocus()
        self.composer.moveCursor(self.composer.textCursor().MoveOperation.End)

    def stop(self) -> None:
        """Stop the reply in flight; what arrived so far is kept. A message whose attachments are being
        kept does not go (what the bridge says of them later is not waited for)."""
        if self.state is PaneState.IDLE:
            return
        if self.state is PaneState.KEEPING:
            self.state = PaneState.IDLE
            self._update_actions()
            self.keep_dropped.emit([p.ref.sha256 for p in self.tray.items])
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
        if content:
            if self._after_tools and self._text_seen:  # going on after its tools: a paragraph of its own
                content = "\n\n" + content
            self._after_tools, self._text_seen = False, True
        self._reply.append(content, reasoning)
        if not self._frame.isActive():
            self._frame.start(FRAME_MS)

    def set_reply_card(self, card: dict[str, Any]) -> None:
        """The run card of the reply in flight (its model, engine, options and figures)."""
        if self._reply is not None:
            self._reply.message.run_card = card

    def ask_tool(self, request: ToolRequest) -> None:
        """A tool call of the reply in flight waits for the user's permission (``tool_answered``)."""
        if self._reply is None:
            return
        view = self._reply.tool_view(request.call_id, request.server, request.tool, request.arguments)
        view.ask()

    def show_tool(self, event: ToolEvent) -> None:
        """A tool call of the reply in flight started or ended (an ended one is kept with the reply), or
        the model was offered no tools: the reply says why."""
        if self._reply is None:
            return
        if isinstance(event, ToolsWithheld):
            self._reply.show_note(event.why)
            return
        r = event.request
        view = self._reply.tool_view(r.call_id, r.server, r.tool, r.arguments)
        if isinstance(event, ToolCallStarted):
            view.running()
        else:
            view.finished(event.outcome, event.result, event.elapsed_s)
            self._reply.message.tool_calls.append(event.to_json())
            self._after_tools = True
            self.reply_tools_done.emit(list(self._reply.message.tool_calls))

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
            view.tool_answered.connect(self.tool_answered)
        return view

    def _edit_view(self, view: QObject) -> None:
        views = self.transcript.views()
        if view in views:
            self.edit(views.index(view))

    def _request_reply(self) -> None:
        self._after_tools = self._text_seen = False
        self._reply = self._add(ChatMessage("assistant", "", state=MessageState.STREAMING))
        self._reply.show_waiting()
        self.state = PaneState.WAITING
        self._update_actions()
        self.send_requested.emit(self.conversation_id, self._api_messages(), self.params())

    def _api_messages(self, until: int | None = None) -> list[dict[str, Any]]:
        """What is sent: the system prompt, then each message not left out (those before ``until``); one
        with attachments carries their references (``attachments``), which the bridge reads into its
        content."""
        system = self.system_prompt.toPlainText().strip()
        sent: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        for view in self.transcript.views()[:until]:
            message = view.message
            if not self.sends(view):
                continue
            sent.append({"role": message.role, "content": message.content})
            if message.attachments:
                sent[-1]["attachments"] = list(message.attachments)
        return sent

    def sends(self, view: MessageView) -> bool:
        """Whether a send carries this message: not the reply in flight, one left out or a reply with
        no text."""
        message = view.message
        empty = message.role == "assistant" and not message.content
        return view is not self._reply and not message.left_out and not empty

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

    def stop_timers(self) -> None:
        """The window is going: nothing more is counted or drawn (the reply in flight stays as shown)."""
        self.guard.stop()
        self._after_paint.reached.disconnect(self._catch_up)
        self._frame.stop()

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
