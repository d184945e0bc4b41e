"""The list of conversations: search, select, rename, delete, export."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QPoint, Qt, Signal
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QAbstractButton,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QMessageBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.ui.chat.markdown_view import current_theme

if TYPE_CHECKING:
    from app.store.history import ConversationSummary  # the history (and SQLite) loads after the window

EXPORT_FORMATS = {"markdown": ("Markdown", ".md"), "json": ("JSON", ".json")}
ID_ROLE = Qt.ItemDataRole.UserRole


def _when(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(timestamp))


class ConversationList(QWidget):
    conversation_selected = Signal(str)
    new_chat_requested = Signal()
    search_changed = Signal(str)
    rename_requested = Signal(str, str)  # id, new title
    delete_requested = Signal(str)
    export_requested = Signal(str, str, str)  # id, "markdown" | "json", path

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._filling = False
        self._deleting = ""  # the conversation the open delete question is about
        self.search = QLineEdit(self)
        self.search.setPlaceholderText("Search chats")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(self.search_changed)
        self.new_button = QToolButton(self)
        self.new_button.setText("New")
        self.new_button.setToolTip("Start a new conversation (Ctrl+N)")
        self.new_button.clicked.connect(self.new_chat_requested)
        top = QHBoxLayout()
        top.addWidget(self.search, 1)
        top.addWidget(self.new_button)

        self.list = QListWidget(self)
        # A long title ends in "…" (the whole of it in the tooltip), rather than widen the list.
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setEditTriggers(
            QListWidget.EditTrigger.EditKeyPressed | QListWidget.EditTrigger.DoubleClicked
        )
        self.list.currentItemChanged.connect(self._current_changed)
        self.list.itemChanged.connect(self._item_renamed)
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._context_menu)

        self.rename_action = QAction("Rename", self)
        self.rename_action.setShortcut(QKeySequence(Qt.Key.Key_F2))
        self.rename_action.triggered.connect(self._rename_current)
        self.delete_action = QAction("Delete…", self)
        self.delete_action.setShortcut(QKeySequence(QKeySequence.StandardKey.Delete))
        self.delete_action.triggered.connect(self._confirm_delete)
        self.export_markdown_action = QAction("Export as Markdown…", self)
        self.export_markdown_action.triggered.connect(lambda: self._ask_export("markdown"))
        self.export_json_action = QAction("Export as JSON…", self)
        self.export_json_action.triggered.connect(lambda: self._ask_export("json"))
        for action in (self.rename_action, self.delete_action):
            action.setShortcutContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
            self.list.addAction(action)
        self.menu = QMenu(self)
        self.menu.addActions([self.rename_action, self.delete_action])
        self.menu.addSeparator()
        self.menu.addActions([self.export_markdown_action, self.export_json_action])
        self.more_button = QToolButton(self)
        self.more_button.setText("⋯")
        self.more_button.setToolTip("Rename, delete or export the selected conversation")
        self.more_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.more_button.setMenu(self.menu)
        top.addWidget(self.more_button)
        self.list.setStyleSheet("QListWidget::item { padding: 4px 2px; }")

        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 4, 8, 8)
        layout.addLayout(top)
        layout.addWidget(self.list, 1)
        self.empty = QLabel("", self)  # in the list's place while it is empty: what to do
        self.empty.setWordWrap(True)
        self.empty.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.empty.setStyleSheet(f"color: {current_theme().muted}; padding: 8px 2px;")
        layout.addWidget(self.empty, 1)
        self._show_empty()
        self._update_actions()
        self.dialog: QMessageBox | QFileDialog | None = None  # the question open now, for tests and focus

    def set_conversations(self, conversations: list[ConversationSummary], current: str | None) -> None:
        """Show ``conversations`` (already in order) and select ``current`` if it is among them."""
        self._filling = True
        try:
            self.list.clear()
            for summary in conversations:
                item = QListWidgetItem(summary.title)
                item.setData(ID_ROLE, summary.id)
                item.setToolTip(f"{summary.title}\nlast changed {_when(summary.updated_at)}")
                item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)
                self.list.addItem(item)
                if summary.id == current:
                    self.list.setCurrentItem(item)
        finally:
            self._filling = False
        self._show_empty()
        self._update_actions()

    def _show_empty(self) -> None:
        empty = self.list.count() == 0
        searching = bool(self.search.text().strip())
        self.empty.setText(
            "No chat matches the search. Clear it to see every chat."
            if searching
            else "No chats yet. Each conversation is kept here as you chat, and can be searched."
        )
        self.empty.setVisible(empty)
        self.list.setVisible(not empty)

    def _current_changed(self, current: QListWidgetItem | None, _previous: QListWidgetItem | None) -> None:
        self._update_actions()
        if current is not None and not self._filling:
            self.conversation_selected.emit(str(current.data(ID_ROLE)))

    def _update_actions(self) -> None:
        has = self.list.currentItem() is not None
        for action in (
            self.rename_action,
            self.delete_action,
            self.export_markdown_action,
            self.export_json_action,
        ):
            action.setEnabled(has)

    def _rename_current(self) -> None:
        item = self.list.currentItem()
        if item is not None:
            self.list.editItem(item)

    def _item_renamed(self, item: QListWidgetItem) -> None:
        if self._filling:
            return
        title = item.text().strip()
        if title:
            self.rename_requested.emit(str(item.data(ID_ROLE)), title)

    def _confirm_delete(self) -> None:
        item = self.list.currentItem()
        if item is None:
            return
        conversation_id = str(item.data(ID_ROLE))
        box = QMessageBox(
            QMessageBox.Icon.Question,
            "Delete conversation",
            f"Delete “{item.text()}”? This cannot be undone.",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel,
            self,
        )
        box.setDefaultButton(QMessageBox.StandardButton.Cancel)
        self._deleting = conversation_id
        box.buttonClicked.connect(self._delete_answered)
        self._open(box)

    def _delete_answered(self, button: QAbstractButton) -> None:
        box = self.sender()
        if isinstance(box, QMessageBox) and box.standardButton(button) == QMessageBox.StandardButton.Yes:
            self.delete_requested.emit(self._deleting)

    def _ask_export(self, fmt: str) -> None:
        item = self.list.currentItem()
        if item is None:
            return
        conversation_id = str(item.data(ID_ROLE))
        name, suffix = EXPORT_FORMATS[fmt]
        safe = "".join(c if c.isalnum() or c in " -_" else "_" for c in item.text()).strip() or "conversation"
        dialog = QFileDialog(self, f"Export as {name}", str(Path.home() / f"{safe}{suffix}"))
        dialog.setAcceptMode(QFileDialog.AcceptMode.AcceptSave)
        dialog.setNameFilter(f"{name} (*{suffix})")
        dialog.setDefaultSuffix(suffix.lstrip("."))
        dialog.fileSelected.connect(lambda path: self.export_requested.emit(conversation_id, fmt, path))
        self._open(dialog)

    def _open(self, dialog: QMessageBox | QFileDialog) -> None:
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.finished.connect(self._closed)
        self.dialog = dialog
        dialog.open()

    def _closed(self) -> None:
        self.dialog = None

    def _context_menu(self, pos: QPoint) -> None:
        if self.list.itemAt(pos) is not None:
            self.menu.popup(self.list.viewport().mapToGlobal(pos))
