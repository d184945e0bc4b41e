"""Nothing cut silently: the chat pane's guard over its model's context.

``ContextGuard`` asks for a count of the chat and the message being written (``count_wanted``: the
messages with their attachments' references, which the bridge reads as a send does, and the MCP servers
whose tools are offered; it counts them off the UI thread and answers with ``show_count``) a moment after
the typing stops, and shows it in the meter. The composer's attachments are the tray's to count and
check; the rest of the send is this count (``used``). A send that would not fit is held and
``OverflowChoices`` offers the ways out the count allows: reload with a larger context
(``reload_wanted``), go on in a new chat that starts with a summary the model writes (``summary_wanted``;
its first message says what the summary left out), or leave out the oldest turns (done here: they stay
in the transcript and the history, marked). The held message is sent once the way out is taken.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any, cast

from PySide6.QtCore import QObject, Qt, QTimer, Signal
from PySide6.QtWidgets import QFrame, QGridLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from app.core.chat import ChatMessage
from app.core.context import ContextCount, Overflow, Summary, estimate_tokens, reply_share
from app.core.fit import Verdict
from app.ui.chat.meter import ContextMeter
from app.ui.look import fit_colour

if TYPE_CHECKING:
    from app.ui.chat.pane import ChatPane

COUNT_DELAY_MS = 400  # after the last key: a long message is counted once the typing pauses
CLEAR_SHARE = 0.5  # a send estimated at no more than this share of the context goes without a count


class OverflowChoices(QFrame):
    """Why the message was not sent, and a button for each way out."""

    chosen = Signal(object)  # Overflow
    cancelled = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("overflowChoices")
        self.setStyleSheet(
            f"#overflowChoices {{ border: 1px solid {fit_colour(Verdict.WONT_FIT)}; border-radius: 6px; }}"
        )
        self.problem = QLabel(self)
        self.problem.setWordWrap(True)
        self.problem.setTextFormat(Qt.TextFormat.PlainText)
        self.buttons = {
            Overflow.RELOAD: QPushButton(self),
            Overflow.SUMMARY: QPushButton("Summarize into a new chat", self),
            Overflow.LEAVE_OUT: QPushButton(self),
        }
        self.buttons[Overflow.SUMMARY].setToolTip(
            "The model writes a summary of this chat; a new chat starts with it and your message"
        )
        self.cancel = QPushButton("Keep editing", self)
        # Two columns: a narrow chat pane holds them without widening the window.
        grid = QGridLayout()
        for n, button in enumerate(self.buttons.values()):
            button.clicked.connect(self._clicked)
            grid.addWidget(button, n // 2, n % 2)
        grid.addWidget(self.cancel, 1, 1)
        grid.setColumnStretch(2, 1)
        self.cancel.clicked.connect(self.cancelled)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 8, 10, 8)
        layout.addWidget(self.problem)
        layout.addLayout(grid)
        self.hide()

    def _clicked(self) -> None:
        self.chosen.emit(next(way for way, button in self.buttons.items() if button is self.sender()))

    def offer(self, count: ContextCount) -> None:
        ways = count.ways_out()
        self.problem.setText(f"{count.problem()} Choose how to go on:")
        reload = self.buttons[Overflow.RELOAD]
        reload.setText(f"Reload with {count.larger:,} tokens" if count.larger else "")
        reload.setToolTip(
            f"Load the model again with a context of {count.larger or 0:,} tokens (kept for later loads); "
            "it fits in the memory free now"
        )
        leave = self.buttons[Overflow.LEAVE_OUT]
        leave.setText(f"Leave out {count.leave_out} oldest messages")
        leave.setToolTip("They stay in the transcript and the history, marked; the model no longer sees them")
        for way, button in self.buttons.items():
            button.setVisible(way in ways)
        self.show()


class ContextGuard(QObject):
    # ask id, the OpenAI messages a send would make (with ``attachments``), sampling params, MCP servers
    count_wanted = Signal(int, list, dict, list)
    reload_wanted = Signal(int)  # the context size to load the model again with
    summary_wanted = Signal(list, dict)  # the chat's OpenAI messages, sampling params

    def __init__(self, pane: ChatPane) -> None:
        super().__init__(pane)
        self.enabled = False  # a counter answers count_wanted (the window's bridge)
        self.meter = ContextMeter(pane)
        self.choices = OverflowChoices(pane)
        self.choices.chosen.connect(self._choose)
        self.choices.cancelled.connect(self._cancel)
        self._asked = 0  # the id of the last count asked for
        self._asked_for = ""  # what it was asked for (messages and params, as JSON)
        self._count: ContextCount | None = None
        self._counted_for: str | None = None
        self._held = False  # a send waits for a count or a way out
        self._chat = ""  # the conversation a held send or an asked summary is for
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(COUNT_DELAY_MS)
        self._timer.timeout.connect(self.count_now)

    @property
    def _pane(self) -> ChatPane:
        """The pane this guards (its parent: no reference of its own, which would make a cycle that
        keeps a closed pane alive until the garbage collector runs)."""
        return cast("ChatPane", self.parent())

    def changed(self) -> None:
        """The chat, the message being written or the reply's share changed: count again soon."""
        if self.enabled:
            self._counted_for = None  # the model or its engine may have changed: no count decides a send
            self._timer.start()

    def reset(self) -> None:
        """Another chat is shown: what was held or offered for the last one is dropped."""
        self._held = False
        self._counted_for = None
        self.choices.hide()

    def stop(self) -> None:
        """Count no more (the window is going)."""
        self.enabled = False
        self._timer.stop()

    def count_now(self) -> None:
        self._timer.stop()
        self._counted_for = None
        pane = self._pane
        messages, params, servers = pane.prospective(), pane.params(), pane.chosen_servers()
        self._asked += 1
        self._asked_for = _key(messages, params, servers)
        self.count_wanted.emit(self._asked, messages, params, servers)

    def show_count(self, asked: int, count: ContextCount | None) -> None:
        """The answer to ``count_wanted`` number ``asked`` (None: the model's context is not known)."""
        if asked != self._asked:
            return  # an older question's answer
        self._count, self._counted_for = count, self._asked_for
        self.meter.show_count(count)
        if self._held:
            self._held = False
            if self._chat == self._pane.conversation_id:  # not sent into a chat shown since
                self._pane.submit()

    def allows_send(self) -> bool:
        """Whether the message in the composer may go now: its count is known and it fits, or nothing
        is known of the model's context yet (the engine says so if it does not fit), or it clearly fits
        (estimated at half the context or less). Otherwise it is held: counted first, or the ways out
        are offered."""
        if not self.enabled:
            return True
        if not self.is_current():
            known = self._count
            if known is None:
                return True
            estimate = estimate_tokens(self._pane.prospective()) + reply_share(self._pane.params())
            if estimate <= known.context * CLEAR_SHARE:
                return True
            self._held, self._chat = True, self._pane.conversation_id
            self.meter.counting()
            self.count_now()
            return False
        if self._count is None or self._count.fits:
            self.choices.hide()
            return True
        self.choices.offer(self._count)
        return False

    def is_current(self) -> bool:
        """Whether the count shown is of what a send would make now."""
        pane = self._pane
        return self._counted_for == _key(pane.prospective(), pane.params(), pane.chosen_servers())

    def used(self) -> int:
        """The tokens a send takes besides the composer's attachments: the count when it is of this send,
        else an estimate."""
        if self._count is not None and self.is_current():
            return self._count.used
        return estimate_tokens(self._pane.prospective())

    def _choose(self, way: Overflow) -> None:
        count = self._count
        self.choices.hide()
        if count is None:
            return
        if way is Overflow.LEAVE_OUT:
            views = self._pane.transcript.views()
            sent = [n for n, view in enumerate(views) if self._pane.sends(view)]
            # The count is of messages sent: replies with no text (not sent) among them go out with them.
            last = sent[min(count.leave_out, len(sent)) - 1] if sent and count.leave_out else -1
            for view in views[: last + 1]:
                if not view.message.left_out:
                    view.set_left_out()  # kept, and marked
            self._pane.submit()  # counted again first, then sent
        elif way is Overflow.RELOAD and count.larger:
            self.meter.counting()
            self.reload_wanted.emit(count.larger)
        elif way is Overflow.SUMMARY:
            self.meter.counting()
            self._chat = self._pane.conversation_id
            self.summary_wanted.emit(self._pane.sent_messages(), self._pane.params())

    def start_from_summary(self, summary: Summary) -> None:
        """Go on in a new chat that starts with ``summary`` (the model's, of this one; it says what it
        left out), with the same system prompt, and send the message in the composer there."""
        pane = self._pane
        if self._chat != pane.conversation_id:
            return  # the user went to another chat meanwhile: this one's summary is not for it
        attached = list(pane.tray.items)  # the message's attachments go with it to the new chat
        opening = ChatMessage("assistant", summary.opening())
        pane.show_conversation(uuid.uuid4().hex, "New chat", pane.system_prompt.toPlainText(), [opening])
        for pending in attached:
            pane.tray.add(pending.taken, pending.count)
        pane.submit()

    def reloaded(self) -> None:
        """The model runs with its larger context: count again, and send when it fits."""
        self._counted_for = None
        self._pane.submit()

    def _cancel(self) -> None:
        self.choices.hide()
        self._pane.composer.setFocus()


def _key(messages: list[dict[str, Any]], params: dict[str, Any], servers: list[str]) -> str:
    # An attachment's reference (a frozen dataclass) by its fields.
    return json.dumps([messages, params.get("max_tokens"), servers], sort_keys=True, default=repr)
