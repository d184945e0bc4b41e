"""Settings > Connections > Remotes: the remote servers (name, address, state), adding one (with its
key, which goes straight to the keychain) and removing one. Changes apply at once, not on Save: a remote
is kept, or forgotten with its key, by the router. The widget only validates what is typed and emits
intents; it never holds a stored key, only the one being typed until it is handed on."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import QEvent, QObject, Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import (
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
from app.core.remotes import check_remote_name, normalise_url

if TYPE_CHECKING:
    from app.supervisor.remote_views import RemoteSnapshot

PROBLEM_STYLE = "color: #c0392b;"


class RemotesEditor(QWidget):
    add_requested = Signal(str, str, str)  # name, address, key ("" for none)
    remove_requested = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.list = QTreeWidget(self)
        self.list.setHeaderLabels(["Name", "Address", "State"])
        self.list.setRootIsDecorated(False)
        self.list.setUniformRowHeights(True)
        self.list.header().setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        self.list.setMaximumHeight(120)
        self.list.currentItemChanged.connect(lambda *_: self._update())
        self.remove_button = QPushButton("Remove", self)
        self.remove_button.setToolTip("Forget the selected remote and delete its key from the keychain")
        self.remove_button.clicked.connect(self._remove)

        self.name = QLineEdit(self)
        self.name.setPlaceholderText("name")
        self.name.setToolTip("Its models are named @NAME/MODEL")
        self.url = QLineEdit(self)
        self.url.setPlaceholderText("http://192.168.1.20:13305")
        self.url.setToolTip("Another Lemon Desk, a Lemonade Server or any OpenAI-compatible server")
        self.key = QLineEdit(self)
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        self.key.setPlaceholderText("API key, if it needs one (kept in the keychain)")
        self.add_button = QPushButton("Add", self)
        self.add_button.clicked.connect(self._add)
        for field in (self.name, self.url):
            field.textChanged.connect(self._update)
        for field in (self.name, self.url, self.key):
            field.installEventFilter(self)  # Enter adds here; it must not also Save the dialog
        self.problem = QLabel(self)
        self.problem.setStyleSheet(PROBLEM_STYLE)
        self.problem.setWordWrap(True)
        self.problem.hide()
        note = QLabel("Changes here apply at once.", self)
        note.setEnabled(False)

        fields = QHBoxLayout()
        fields.addWidget(self.name, 1)
        fields.addWidget(self.url, 3)
        fields.addWidget(self.key, 2)
        fields.addWidget(self.add_button)
        top = QHBoxLayout()
        top.addWidget(self.list, 1)
        top.addWidget(self.remove_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(top)
        layout.addLayout(fields)
        layout.addWidget(self.problem)
        layout.addWidget(note)
        self._pending = ""  # the name whose addition is under way
        self._update()

    # Fed by the bridge

    def set_remotes(self, remotes: list[RemoteSnapshot]) -> None:
        current = self.selected()
        self.list.clear()
        for remote in remotes:
            item = QTreeWidgetItem([remote.name, remote.url, remote.text])
            tip = "\n".join(t for t in (remote.url, remote.text, remote.message) if t)
            for column in range(3):
                item.setToolTip(column, tip)
            self.list.addTopLevelItem(item)
            if remote.name == current:
                self.list.setCurrentItem(item)
        self._update()

    def added(self, name: str) -> None:
        """The remote ``name`` was kept: the fields are cleared for the next one."""
        if name == self._pending:
            self._pending = ""
            for field in (self.name, self.url, self.key):
                field.clear()
            self._update()

    def failed(self, why: str) -> None:
        """Adding or removing did not happen: say why, keep what was typed (but the key)."""
        self._pending = ""
        self.key.clear()
        self._show(why)
        self.add_button.setEnabled(True)

    # Inside

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        enter = (Qt.Key.Key_Return, Qt.Key.Key_Enter)
        if event.type() == QEvent.Type.KeyPress and isinstance(event, QKeyEvent) and event.key() in enter:
            self._add()
            return True
        return super().eventFilter(watched, event)

    def selected(self) -> str:
        item = self.list.currentItem()
        return item.text(0) if item is not None else ""

    def names(self) -> list[str]:
        items = (self.list.topLevelItem(i) for i in range(self.list.topLevelItemCount()))
        return [item.text(0) for item in items if item is not None]

    def _problem(self) -> str:
        """What is wrong with what is typed so far (a field left empty is not wrong yet)."""
        name, url = self.name.text().strip(), self.url.text().strip()
        if name in self.names():
            return f"There is already a remote named {name}."
        try:
            if name:
                check_remote_name(name)
            if url:
                normalise_url(url)
        except ConfigError as err:
            return str(err)
        return ""

    def _show(self, text: str) -> None:
        self.problem.setText(text)
        self.problem.setVisible(bool(text))

    def _update(self) -> None:
        problem = self._problem()
        self._show(problem)
        typed = bool(self.name.text().strip() and self.url.text().strip())
        self.add_button.setEnabled(typed and not problem and not self._pending)
        self.remove_button.setEnabled(bool(self.selected()))

    def _add(self) -> None:
        if not self.add_button.isEnabled():
            return
        self._pending = self.name.text().strip()
        self.add_button.setEnabled(False)
        self.add_requested.emit(self._pending, self.url.text().strip(), self.key.text().strip())

    def _remove(self) -> None:
        if name := self.selected():
            self.remove_requested.emit(name)
