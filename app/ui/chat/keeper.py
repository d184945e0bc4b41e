"""Keeps the chat pane and the conversation list in step with the history store.

It is the one place the chat UI touches ``History``; it is not a widget. Each call is a short SQLite
write on the UI thread (WAL mode: well under a millisecond). A reply in flight is written when it starts,
then at most every ``SAVE_INTERVAL_MS`` while it streams, and at once when one of its tool calls ends
(a call may have changed something: a crash must not lose that it ran), then once more when it ends, so
a crash loses at most that much of the reply and nothing before it.

The files kept for a message on its way are held from the moment it asks to keep them until it is saved
or does not go (``AttachmentStore.hold``): deleting another chat meanwhile does not take them, and those
of a message that did not go are deleted then. Files an earlier run kept for a message it never saved
are deleted when the keeper starts.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from app.core.chat import ChatMessage, MessageState, title_from
from app.core.errors import StorageError
from app.store.history import DEFAULT_TITLE, History
from app.ui.chat.pane import ChatPane
from app.ui.chat.sidebar import ConversationList

SAVE_INTERVAL_MS = 250


class HistoryKeeper(QObject):
    error = Signal(str)  # something the user should be told (an export that failed)

    def __init__(self, history: History, pane: ChatPane, sidebar: ConversationList) -> None:
        super().__init__(pane)
        self.history, self.pane, self.sidebar = history, pane, sidebar
        self._reply_id: int | None = None
        self._saved: tuple[str, str] = ("", "")
        self._query = ""
        self._saver = QTimer(self)
        self._saver.setInterval(SAVE_INTERVAL_MS)
        self._failing = False  # the last write failed: the user was told once, not at every save
        self._held: list[str] = []  # the attachments held for the message on its way
        self._saver.timeout.connect(self._saving(self._save_reply))
        pane.send_requested.connect(self._saving(self._sent))
        pane.reply_finished.connect(self._saving(self._finished))
        pane.reply_tools_done.connect(self._saving(self._save_tools))
        pane.keep_requested.connect(self._hold)  # before the bridge keeps them (connected later)
        pane.keep_dropped.connect(self._dropped)
        pane.conversation_changed.connect(self._shown)
        sidebar.conversation_selected.connect(self.open)
        sidebar.new_chat_requested.connect(pane.new_conversation)
        sidebar.search_changed.connect(self._search)
        sidebar.rename_requested.connect(self._saving(self._rename))
        sidebar.delete_requested.connect(self._saving(self._delete))
        sidebar.export_requested.connect(self._export)
        history.collect_unused()
        self.refresh()

    def _saving(self, write: Callable[..., None]) -> Callable[..., None]:
        """``write`` as a slot: a disk that refuses it (full, read-only) is told once until a write works
        again; the chat goes on in the window."""

        def slot(*args: Any) -> None:
            try:
                write(*args)
            except StorageError as err:
                if not self._failing:
                    self.error.emit(str(err))
                self._failing = True
            else:
                self._failing = False

        return slot

    def refresh(self) -> None:
        found = self.history.search(self._query) if self._query.strip() else self.history.list_conversations()
        self.sidebar.set_conversations(found, self.pane.conversation_id)

    def open(self, conversation_id: str) -> None:
        if conversation_id == self.pane.conversation_id:
            return
        conversation = self.history.conversation(conversation_id)
        if conversation is None:
            self.refresh()
            return
        messages = [
            ChatMessage(
                m.role,
                m.content,
                m.reasoning,
                m.state,
                m.telemetry,
                m.error,
                m.run_card,
                list(m.tool_calls),
                list(m.attachments),
                m.left_out,
            )
            for m in conversation.messages
        ]
        self.pane.show_conversation(conversation.id, conversation.title, conversation.system_prompt, messages)

    def _sent(self, conversation_id: str, _messages: list[dict[str, Any]], _params: dict[str, Any]) -> None:
        shown = self.pane.messages()
        before, system = shown[:-1], self.pane.system_prompt.toPlainText().strip()
        if not self.history.exists(conversation_id):
            first = next((m.content for m in before if m.role == "user"), "")
            title = title_from(first) if first else DEFAULT_TITLE
            self.history.create_conversation(conversation_id, title, system)
            self.pane.set_title(title)
        else:
            self.history.set_system_prompt(conversation_id, system)
        self.history.sync_messages(
            conversation_id, [(m.role, m.content) for m in before], [m.attachments for m in before]
        )
        self.history.set_left_out(conversation_id, sum(m.left_out for m in before))
        self._release()  # saved: its references keep them now
        self._reply_id = self.history.append_message(
            conversation_id, "assistant", state=MessageState.STREAMING
        )
        self._saved = ("", "")
        self._saver.start()
        self.refresh()

    def _hold(self, items: list[tuple[Any, ...]], _question: str, _embedder: str) -> None:
        self._release()
        self._held = [taken.ref.sha256 for taken, *_rest in items]
        self.history.attachments.hold(self._held)

    def _release(self) -> None:
        held, self._held = self._held, []
        if held:
            self.history.release_attachments(held)

    def _dropped(self, hashes: list[str]) -> None:
        """A message's files were (or are being) kept, and it did not go."""
        held, self._held = self._held, []
        self.history.release_attachments(held, hashes)

    def _save_reply(self) -> None:
        snapshot = self.pane.reply_snapshot()
        if self._reply_id is None or snapshot is None or snapshot == self._saved:
            return
        self.history.update_message(self._reply_id, *snapshot)
        self._saved = snapshot

    def _save_tools(self, calls: list[dict[str, Any]]) -> None:
        snapshot = self.pane.reply_snapshot()
        if self._reply_id is None or snapshot is None:
            return
        self.history.update_message(self._reply_id, *snapshot, tool_calls=calls)
        self._saved = snapshot

    def flush(self) -> None:
        """Write the reply in flight as it is now and stop saving it: the app is quitting (the reply
        stays as streaming in the history, which is how an interrupted reply reads)."""
        self._saver.stop()
        self._saving(self._save_reply)()

    def _finished(self, _conversation_id: str, message: ChatMessage) -> None:
        self._saver.stop()
        if self._reply_id is None:
            return
        self.history.update_message(
            self._reply_id,
            message.content,
            message.reasoning,
            message.state,
            message.telemetry,
            message.error,
            message.run_card,
            message.tool_calls or None,
        )
        self._reply_id = None
        self.refresh()

    def _shown(self, _conversation_id: str) -> None:
        self.refresh()

    def _search(self, query: str) -> None:
        self._query = query
        self.refresh()

    def _rename(self, conversation_id: str, title: str) -> None:
        self.history.rename(conversation_id, title)
        if conversation_id == self.pane.conversation_id:
            self.pane.set_title(title)
        self.refresh()

    def _delete(self, conversation_id: str) -> None:
        self.history.delete(conversation_id)
        if conversation_id == self.pane.conversation_id:
            self.pane.new_conversation()
        self.refresh()

    def _export(self, conversation_id: str, fmt: str, path: str) -> None:
        try:
            if fmt == "json":
                self.history.export_json(conversation_id, Path(path))
            else:
                self.history.export_markdown(conversation_id, Path(path))
        except OSError as err:
            self.error.emit(
                f"Could not export the conversation to {path}: {err.strerror}. Choose another folder."
            )
