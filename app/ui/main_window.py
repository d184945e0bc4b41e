"""The main window: models on the left with the conversations, chat in the middle, options on the right."""

from __future__ import annotations

from PySide6.QtCore import QByteArray, QSettings, Qt, Signal
from PySide6.QtGui import QAction, QCloseEvent, QIcon, QKeySequence
from PySide6.QtWidgets import (
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.core.chat import ChatMessage, MessageState, format_telemetry
from app.ui.chat.markdown_view import current_theme
from app.ui.chat.pane import ChatPane
from app.ui.chat.sidebar import ConversationList

WINDOW_TITLE = "Lemon Desk"
DEFAULT_SIZE = (1280, 820)
DEFAULT_SPLIT = [280, 740, 260]
NAME_ROLE = Qt.ItemDataRole.UserRole


def _panel_title(text: str, parent: QWidget) -> QLabel:
    label = QLabel(text, parent)
    label.setStyleSheet("font-weight: 600; padding: 8px 8px 0 8px;")
    return label


class ModelList(QWidget):
    """The models that can be loaded, with the loaded ones marked. (The Model Manager grows from here.)"""

    model_selected = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.list = QListWidget(self)
        self.list.setStyleSheet("QListWidget::item { padding: 4px 2px; }")
        self.list.currentItemChanged.connect(self._current_changed)
        self.empty = QLabel("No models yet.", self)
        self.empty.setStyleSheet(f"color: {current_theme().muted}; padding: 0 8px;")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(_panel_title("Models", self))
        layout.addWidget(self.empty)
        inset = QVBoxLayout()
        inset.setContentsMargins(8, 0, 8, 4)
        inset.addWidget(self.list, 1)
        layout.addLayout(inset, 1)
        self._names: list[str] = []

    def set_models(self, names: list[str], loaded: set[str]) -> None:
        current = self.selected()
        self._names = list(names)
        self.list.blockSignals(True)
        self.list.clear()
        for name in names:
            item = QListWidgetItem(f"● {name}" if name in loaded else name)
            item.setData(NAME_ROLE, name)
            item.setToolTip(f"{name} (loaded)" if name in loaded else name)
            self.list.addItem(item)
        self.list.blockSignals(False)
        self.empty.setVisible(not names)
        if current:
            self.select(current)

    def selected(self) -> str:
        item = self.list.currentItem()
        return str(item.data(NAME_ROLE)) if item is not None else ""

    def select(self, name: str) -> None:
        for row in range(self.list.count()):
            if self.list.item(row).data(NAME_ROLE) == name:
                self.list.setCurrentRow(row)
                return

    def _current_changed(self, current: QListWidgetItem | None, _previous: QListWidgetItem | None) -> None:
        if current is not None:
            self.model_selected.emit(str(current.data(NAME_ROLE)))


class MainWindow(QMainWindow):
    settings_requested = Signal()
    quit_requested = Signal()
    closed = Signal()  # the window was closed and the app is not kept in the tray

    def __init__(self, icon: QIcon | None = None) -> None:
        super().__init__()
        self.setWindowTitle(WINDOW_TITLE)
        if icon is not None:
            self.setWindowIcon(icon)
        self.resize(*DEFAULT_SIZE)
        self.keep_in_tray = False
        self._last_model = ""

        self.models = ModelList(self)
        self.models.model_selected.connect(self._model_selected)
        self.conversations = ConversationList(self)
        self.chat = ChatPane(self)
        self.options = QWidget(self)
        options_layout = QVBoxLayout(self.options)
        options_layout.setContentsMargins(0, 0, 0, 0)
        options_layout.addWidget(_panel_title("Options", self.options))
        self.options_note = QLabel("Select a model to see how it loads.", self.options)
        self.options_note.setWordWrap(True)
        self.options_note.setStyleSheet(f"color: {current_theme().muted}; padding: 0 8px;")
        options_layout.addWidget(self.options_note)
        options_layout.addStretch(1)

        self.left = QSplitter(Qt.Orientation.Vertical, self)
        self.left.setObjectName("leftSplitter")
        self.left.addWidget(self.models)
        chats = QWidget(self)
        chats_layout = QVBoxLayout(chats)
        chats_layout.setContentsMargins(0, 0, 0, 0)
        chats_layout.addWidget(_panel_title("Chats", chats))
        chats_layout.addWidget(self.conversations, 1)
        self.left.addWidget(chats)
        self.left.setSizes([300, 500])

        self.splitter = QSplitter(Qt.Orientation.Horizontal, self)
        self.splitter.setObjectName("mainSplitter")
        self.splitter.addWidget(self.left)
        self.splitter.addWidget(self.chat)
        self.splitter.addWidget(self.options)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setCollapsible(1, False)
        self.splitter.setSizes(DEFAULT_SPLIT)
        self.setCentralWidget(self.splitter)

        self.model_status = QLabel("No model loaded", self)
        self.engine_status = QLabel("", self)
        self.telemetry_status = QLabel("", self)
        status = self.statusBar()
        status.addWidget(self.model_status)
        status.addWidget(self.engine_status)
        status.addPermanentWidget(self.telemetry_status)
        self.chat.reply_finished.connect(self._reply_finished)

        menu = self.menuBar().addMenu("&File")
        new_chat = menu.addAction("New chat")
        new_chat.setToolTip("Ctrl+N")
        new_chat.triggered.connect(self.chat.new_conversation)
        self.settings_action = QAction("Settings…", self)
        self.settings_action.setShortcut(QKeySequence(QKeySequence.StandardKey.Preferences))
        if self.settings_action.shortcut().isEmpty():
            self.settings_action.setShortcut(QKeySequence("Ctrl+,"))
        self.settings_action.triggered.connect(self.settings_requested)
        menu.addAction(self.settings_action)
        menu.addSeparator()
        self.quit_action = QAction("Quit", self)
        self.quit_action.setShortcut(QKeySequence(QKeySequence.StandardKey.Quit))
        if self.quit_action.shortcut().isEmpty():
            self.quit_action.setShortcut(QKeySequence("Ctrl+Q"))
        self.quit_action.triggered.connect(self.quit_requested)
        menu.addAction(self.quit_action)

    # Fed by the app (and later the bridge)

    def set_models(self, names: list[str], loaded: set[str]) -> None:
        self.models.set_models(names, loaded)
        if self._last_model and not self.models.selected():
            self.models.select(self._last_model)
        self.model_status.setText(", ".join(sorted(loaded)) if loaded else "No model loaded")

    def set_engine_status(self, text: str) -> None:
        self.engine_status.setText(text)

    def show_telemetry(self, telemetry: dict[str, object]) -> None:
        self.telemetry_status.setText(format_telemetry(telemetry))

    # Window state

    def save_state(self, store: QSettings) -> None:
        store.setValue("window/geometry", self.saveGeometry())
        store.setValue("window/main_splitter", self.splitter.saveState())
        store.setValue("window/left_splitter", self.left.saveState())
        store.setValue("window/last_model", self._last_model)

    def restore_state(self, store: QSettings) -> None:
        for key, restore in (
            ("window/geometry", self.restoreGeometry),
            ("window/main_splitter", self.splitter.restoreState),
            ("window/left_splitter", self.left.restoreState),
        ):
            value = store.value(key)
            if isinstance(value, QByteArray):
                restore(value)
        last = store.value("window/last_model", "")
        self._last_model = last if isinstance(last, str) else ""
        if self._last_model:
            self.models.select(self._last_model)

    def last_model(self) -> str:
        return self._last_model

    def _model_selected(self, name: str) -> None:
        self._last_model = name

    def _reply_finished(self, _conversation_id: str, message: ChatMessage) -> None:
        if message.state is MessageState.COMPLETE and message.telemetry:
            self.show_telemetry(message.telemetry)

    def closeEvent(self, event: QCloseEvent) -> None:
        if self.keep_in_tray:
            event.ignore()
            self.hide()
            return
        event.accept()
        self.closed.emit()
