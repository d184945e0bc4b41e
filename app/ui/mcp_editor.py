"""Settings > Tools > MCP servers: each server (enabled, name, command or URL, state: starting, ready with
N tools, restarting, failed with its last words in the tooltip), adding or editing one, removing one,
and importing a Cursor/Claude-style mcp.json. Changes apply at once, not on Save: the router keeps the
servers. The widget validates what is typed (``app.core.mcp.spec_from_fields``) and emits intents; an
HTTP server's bearer token goes from the field to the keychain, never into the list."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.core.errors import ConfigError
from app.core.mcp import McpServerSpec, McpState, McpTransport, describe_target, spec_from_fields
from app.ui.chat.markdown_view import current_theme

if TYPE_CHECKING:
    from app.supervisor.mcp import McpServerView

PROBLEM_STYLE = "color: #c0392b;"
NO_TOKEN = "Bearer token (kept in the keychain)"
DETAIL_LINES = 6  # of a server's message (its last words) under the list
_STATE_WORDS = {
    McpState.OFF: "off",
    McpState.STARTING: "starting…",
    McpState.BACKOFF: "restarting…",
    McpState.FAILED: "failed",
}


def state_text(view: McpServerView) -> str:
    if view.state is McpState.READY:
        return f"ready · {len(view.tools)} tools"
    return _STATE_WORDS[view.state]


class McpEditor(QWidget):
    put_requested = Signal(object, object)  # McpServerSpec, the token typed (None: leave it; "": remove)
    remove_requested = Signal(str)
    enabled_changed = Signal(str, bool)
    import_requested = Signal(str)  # the path of an mcp.json

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.list = QTreeWidget(self)
        self.list.setHeaderLabels(["Name", "Command or URL", "State"])
        self.list.setRootIsDecorated(False)
        self.list.setUniformRowHeights(True)
        self.list.header().setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        self.list.setMinimumHeight(110)
        self.list.currentItemChanged.connect(lambda *_: self._picked())
        self.list.itemChanged.connect(self._checked)
        self.remove_button = QPushButton("Remove", self)
        self.remove_button.setToolTip("Stop the selected server and forget it (and its token)")
        self.remove_button.clicked.connect(self._remove)
        self.import_button = QPushButton("Import mcp.json…", self)
        self.import_button.setToolTip("Add the servers of a Cursor or Claude style mcp.json")
        self.import_button.clicked.connect(self._choose_file)
        side = QVBoxLayout()
        side.addWidget(self.remove_button)
        side.addWidget(self.import_button)
        side.addStretch(1)

        self.name = QLineEdit(self)
        self.name.setPlaceholderText("name")
        self.name.setToolTip("Its tools are offered to models as NAME__TOOL")
        self.target = QLineEdit(self)
        self.target.setPlaceholderText(
            "npx -y @modelcontextprotocol/server-filesystem ~/notes, or https://…/mcp"
        )
        self.target.setToolTip("A command line the app starts (stdio), or a Streamable HTTP URL")
        self.pairs = QLineEdit(self)
        self.pairs.setPlaceholderText("KEY=VALUE … (environment, or headers)")
        self.pairs.setToolTip(
            "For a command: its environment. For a URL: the headers sent with each request."
        )
        self.token = QLineEdit(self)
        self.token.setEchoMode(QLineEdit.EchoMode.Password)
        self.token.setPlaceholderText(NO_TOKEN)
        self.token.setToolTip("For a URL that needs one: sent as Authorization: Bearer, kept in the keychain")
        self.save_button = QPushButton("Add", self)
        self.save_button.clicked.connect(self._save)
        for field in (self.name, self.target, self.pairs):
            field.textChanged.connect(self._typing)
        self.problem = QLabel(self)
        self.problem.setStyleSheet(PROBLEM_STYLE)
        self.problem.setWordWrap(True)
        self.problem.hide()
        self.detail = QLabel(self)  # the selected server's state in words: why it failed, its last words
        self.detail.setWordWrap(True)
        self.detail.setTextFormat(Qt.TextFormat.PlainText)
        self.detail.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.detail.setStyleSheet(f"color: {current_theme().muted};")
        self.detail.hide()
        note = QLabel("Changes here apply at once.", self)
        note.setEnabled(False)

        top = QHBoxLayout()
        top.addWidget(self.list, 1)
        top.addLayout(side)
        row = QHBoxLayout()
        row.addWidget(self.name, 1)
        row.addWidget(self.target, 4)
        second = QHBoxLayout()
        second.addWidget(self.pairs, 3)
        second.addWidget(self.token, 2)
        second.addWidget(self.save_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(top)
        layout.addWidget(self.detail)
        layout.addLayout(row)
        layout.addLayout(second)
        layout.addWidget(self.problem)
        layout.addWidget(note)
        self._specs: dict[str, McpServerSpec] = {}
        self._told = ""  # why the last change did not happen, until the user types again
        self._messages: dict[str, str] = {}
        self.file_dialog: QFileDialog | None = None
        self._update()

    # Fed by the bridge

    def set_servers(self, servers: list[McpServerView]) -> None:
        current = self.selected()
        self.list.blockSignals(True)  # the check boxes set here are no user's
        self.list.clear()
        self._specs = {view.spec.name: view.spec for view in servers}
        self._messages = {view.spec.name: view.message for view in servers}
        for view in servers:
            target, _ = describe_target(view.spec)
            item = QTreeWidgetItem([view.spec.name, target, state_text(view)])
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(0, Qt.CheckState.Checked if view.spec.enabled else Qt.CheckState.Unchecked)
            tip = "\n".join(t for t in (target, view.message) if t)
            for column in range(3):
                item.setToolTip(column, tip)
            if view.state is McpState.FAILED:
                item.setForeground(2, Qt.GlobalColor.red)
            self.list.addTopLevelItem(item)
            if view.spec.name == current:
                self.list.setCurrentItem(item)
        self.list.blockSignals(False)
        self._update()

    def failed(self, why: str) -> None:
        self.token.clear()
        self._told = why
        self._update()

    # Inside

    def selected(self) -> str:
        item = self.list.currentItem()
        return item.text(0) if item is not None else ""

    def _picked(self) -> None:
        """A row picked: its definition in the fields, to edit (the token is never shown)."""
        spec = self._specs.get(self.selected())
        if spec is not None:
            target, pairs = describe_target(spec)
            self.name.setText(spec.name)
            self.target.setText(target)
            self.pairs.setText(pairs)
            self.token.clear()
            self.token.setPlaceholderText(
                "Stored in the keychain (type to replace)" if spec.has_token else NO_TOKEN
            )
        self._update()

    def _typed(self) -> McpServerSpec:
        name = self.name.text().strip()
        old = self._specs.get(name)
        return spec_from_fields(name, self.target.text(), self.pairs.text(), old.enabled if old else True)

    def _update(self) -> None:
        typed = bool(self.name.text().strip() and self.target.text().strip())
        problem = ""
        if typed:
            try:
                self._typed()
            except ConfigError as err:
                problem = str(err)
        self._show(problem or self._told)
        self.save_button.setText("Save changes" if self.name.text().strip() in self._specs else "Add")
        self.save_button.setEnabled(typed and not problem)
        self.remove_button.setEnabled(bool(self.selected()))
        message = self._messages.get(self.selected(), "")
        # The app's own "=== starting/stopped" notes in its output are left out: its words are what tell.
        lines = [line for line in message.splitlines() if line.strip() and not line.startswith("===")]
        shown = lines if len(lines) <= DETAIL_LINES else [lines[0], "…", *lines[-(DETAIL_LINES - 2) :]]
        self.detail.setText("\n".join(shown))
        self.detail.setVisible(bool(lines))

    def _typing(self) -> None:
        self._told = ""
        self._update()

    def _show(self, text: str) -> None:
        self.problem.setText(text)
        self.problem.setVisible(bool(text))

    def _save(self) -> None:
        try:
            spec = self._typed()
        except ConfigError as err:
            self._show(str(err))
            return
        token = self.token.text().strip()
        if token and spec.transport is not McpTransport.HTTP:
            self._show("Only a server reached by URL takes a token.")
            return
        old = self._specs.get(spec.name)
        if old is not None and old.has_token and not token:
            spec = dataclasses.replace(spec, has_token=True)  # kept as it is in the keychain
        self.token.clear()
        self.put_requested.emit(spec, token or None)

    def _remove(self) -> None:
        if name := self.selected():
            self.remove_requested.emit(name)

    def _checked(self, item: QTreeWidgetItem, column: int) -> None:
        if column == 0:
            self.enabled_changed.emit(item.text(0), item.checkState(0) == Qt.CheckState.Checked)

    def _choose_file(self) -> None:
        dialog = QFileDialog(self, "Import mcp.json", "", "MCP servers (*.json)")
        dialog.setFileMode(QFileDialog.FileMode.ExistingFile)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.fileSelected.connect(self.import_requested)
        self.file_dialog = dialog
        dialog.open()
