"""The main window: models on the left with the conversations, chat in the middle, options on the right."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import QByteArray, QEvent, QSettings, Qt, Signal
from PySide6.QtGui import QAction, QCloseEvent, QIcon, QKeySequence
from PySide6.QtWidgets import (
    QLabel,
    QMainWindow,
    QSplitter,
    QStackedWidget,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.core.chat import ChatMessage, MessageState, format_telemetry
from app.core.status import Status
from app.ui.chat.pane import ChatPane
from app.ui.chat.sidebar import ConversationList
from app.ui.downloads_panel import DownloadsPanel
from app.ui.hub_search import HubSearch
from app.ui.logs_view import LogsView
from app.ui.look import SPACING, ElidedLabel
from app.ui.model_manager import ModelManager
from app.ui.options_panel import OptionsPanel
from app.ui.telemetry_view import TelemetryView
from app.ui.welcome import Welcome

if TYPE_CHECKING:
    from app.supervisor.router import ModelView

WINDOW_TITLE = "Lemon Desk"
DEFAULT_SIZE = (1280, 820)
DEFAULT_SPLIT = [480, 500, 300]
MB = 1024 * 1024


def _panel_title(text: str, parent: QWidget) -> QLabel:
    label = QLabel(text, parent)
    label.setStyleSheet("font-weight: 600; padding: 8px 8px 0 8px;")
    return label


class MainWindow(QMainWindow):
    settings_requested = Signal()
    backends_requested = Signal()
    bench_requested = Signal()
    quit_requested = Signal()
    closed = Signal()  # the window was closed and the app is not kept in the tray
    minimized_changed = Signal(bool)

    def __init__(self, icon: QIcon | None = None) -> None:
        super().__init__()
        self.setWindowTitle(WINDOW_TITLE)
        if icon is not None:
            self.setWindowIcon(icon)
        self.resize(*DEFAULT_SIZE)
        self.keep_in_tray = False
        self._last_model = ""

        self.models = ModelManager(self)
        self.models.model_selected.connect(self._model_selected)
        self.conversations = ConversationList(self)
        self.chat = ChatPane(self)
        self.options = OptionsPanel(self)
        self.options.backends_requested.connect(self.backends_requested)
        self.logs = LogsView(self)
        self.side = QTabWidget(self)
        self.side.setDocumentMode(True)
        self.side.addTab(self.options, "Options")
        self.side.addTab(self.logs, "Logs")
        self.telemetry = TelemetryView(self)
        self.minimized_changed.connect(self.telemetry.set_minimized)
        self.side.addTab(self.telemetry, "Telemetry")
        self.downloads = DownloadsPanel(self)
        self.side.addTab(self.downloads, "Downloads")
        self.hub_search = HubSearch(self)
        self.welcome = Welcome(self)
        self.center = QStackedWidget(self)  # the chat, or the first-run welcome in its place
        self.center.addWidget(self.chat)
        self.center.addWidget(self.welcome)
        self.models.options_requested.connect(self.show_options)

        self.left = QSplitter(Qt.Orientation.Vertical, self)
        self.left.setObjectName("leftSplitter")
        models = QWidget(self)
        models_layout = QVBoxLayout(models)
        models_layout.setContentsMargins(0, 0, 0, 0)
        models_layout.addWidget(_panel_title("Models", models))
        self.model_tabs = QTabWidget(models)
        self.model_tabs.setDocumentMode(True)
        self.model_tabs.addTab(self.models, "Your models")
        self.model_tabs.addTab(self.hub_search, "Hugging Face")
        models_layout.addWidget(self.model_tabs, 1)
        self.left.addWidget(models)
        chats = QWidget(self)
        chats_layout = QVBoxLayout(chats)
        chats_layout.setContentsMargins(0, 0, 0, 0)
        chats_layout.addWidget(_panel_title("Chats", chats))
        chats_layout.addWidget(self.conversations, 1)
        self.left.addWidget(chats)
        self.left.setSizes([560, 240])

        self.splitter = QSplitter(Qt.Orientation.Horizontal, self)
        self.splitter.setObjectName("mainSplitter")
        self.splitter.addWidget(self.left)
        self.splitter.addWidget(self.center)
        self.splitter.addWidget(self.side)
        for panel in (self.left, self.side):  # narrow windows squeeze the panels, not the chat
            panel.setMinimumWidth(120)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setCollapsible(1, False)
        self.splitter.setSizes(DEFAULT_SPLIT)
        self.setCentralWidget(self.splitter)

        # Elided: a long line (an engine's error) never widens the window or runs into the figures.
        self.model_status = ElidedLabel("No model loaded", self)
        self.engine_status = ElidedLabel("", self)
        self.telemetry_status = QLabel("", self)
        self.usage_status = QLabel("", self)
        self.usage_status.setToolTip("The engine's CPU use and resident memory")
        status = self.statusBar()
        status.addWidget(self.model_status)
        status.addWidget(self.engine_status, 1)
        status.addPermanentWidget(self.telemetry_status)
        status.addPermanentWidget(self.usage_status)
        self.chat.reply_finished.connect(self._reply_finished)

        menu = self.menuBar().addMenu("&File")
        menu.addAction(self.chat.new_chat_action)
        self.settings_action = QAction("Settings…", self)
        self.settings_action.setShortcut(QKeySequence(QKeySequence.StandardKey.Preferences))
        if self.settings_action.shortcut().isEmpty():
            self.settings_action.setShortcut(QKeySequence("Ctrl+,"))
        self.settings_action.triggered.connect(self.settings_requested)
        menu.addAction(self.settings_action)
        self.backends_action = QAction("Backends…", self)
        self.backends_action.triggered.connect(self.backends_requested)
        menu.addAction(self.backends_action)
        self.bench_action = QAction("Bench…", self)
        self.bench_action.setToolTip("Measure prompt and generation speed per model and backend")
        self.bench_action.triggered.connect(self.bench_requested)
        menu.addAction(self.bench_action)
        menu.addSeparator()
        self.quit_action = QAction("Quit", self)
        self.quit_action.setShortcut(QKeySequence(QKeySequence.StandardKey.Quit))
        if self.quit_action.shortcut().isEmpty():
            self.quit_action.setShortcut(QKeySequence("Ctrl+Q"))
        self.quit_action.triggered.connect(self.quit_requested)
        menu.addAction(self.quit_action)

    # Fed by the bridge

    def set_rows(self, rows: list[ModelView]) -> None:
        self.models.set_rows(rows)
        if self._last_model and not self.models.selected():
            self.models.select(self._last_model)
        loaded = sorted(r.name for r in rows if r.status.status is Status.LOADED)
        self.model_status.setText(f"Loaded: {', '.join(loaded)}" if loaded else "No model loaded")
        selected = self.models.row(self.models.selected())
        if selected is not None:
            self.options.set_row(selected)

    def show_welcome(self, shown: bool) -> None:
        self.center.setCurrentWidget(self.welcome if shown else self.chat)

    def show_downloads(self, active: int) -> None:
        """The Downloads tab, titled with how many run."""
        index = self.side.indexOf(self.downloads)
        self.side.setTabText(index, f"Downloads ({active})" if active else "Downloads")

    def set_engine_status(self, text: str) -> None:
        self.engine_status.setText(text)

    def show_message(self, text: str, timeout_ms: int) -> None:
        """A passing message in the status bar: its first line, ending in "…" where the figures on the
        right begin (QStatusBar draws a message whole, cut off mid-word where they start)."""
        status = self.statusBar()
        figures = [w.x() for w in (self.telemetry_status, self.usage_status) if w.isVisible() and w.width()]
        room = min(figures, default=status.width()) - 2 * SPACING
        line = status.fontMetrics().elidedText(text.split("\n", 1)[0], Qt.TextElideMode.ElideRight, room)
        status.showMessage(line, timeout_ms)

    def show_usage(self, cpu_percent: float, rss: int) -> None:
        """The chat's engine's CPU and memory (not the app's: the engine is a process of its own)."""
        self.usage_status.setText(f"engine: CPU {cpu_percent:.0f}% · {rss / MB:,.0f} MB" if rss else "")
        tip = (
            "The CPU and memory of the engine the chat talks to (a process of its own); "
            "the Telemetry tab charts them over time."
            if rss
            else ""
        )
        if self.usage_status.toolTip() != tip:  # set again, it would post an event every sample
            self.usage_status.setToolTip(tip)

    def show_options(self, name: str) -> None:
        self.models.select(name)
        self.side.setCurrentWidget(self.options)

    def show_telemetry(self, telemetry: dict[str, object]) -> None:
        self.telemetry_status.setText(format_telemetry(telemetry))

    # Window state

    def state(self) -> dict[str, object]:
        """What ``restore_state`` restores, by its key in the store: taken here, written elsewhere."""
        return {
            "window/geometry": self.saveGeometry(),
            "window/main_splitter": self.splitter.saveState(),
            "window/left_splitter": self.left.saveState(),
            "window/last_model": self._last_model,
        }

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

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.WindowStateChange:
            self.minimized_changed.emit(self.isMinimized())

    def closeEvent(self, event: QCloseEvent) -> None:
        if self.keep_in_tray:
            event.ignore()
            self.hide()
            return
        event.accept()
        self.closed.emit()
