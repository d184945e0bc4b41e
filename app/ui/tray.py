"""The tray icon: Open, Load ▸ (this machine's models, then the remotes' ``@NAME/MODEL``), Unload ▸, Quit,
and notifications. Driven by data, it emits intents."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QAction, QGuiApplication, QIcon
from PySide6.QtWidgets import QMenu, QSystemTrayIcon

from app.core.engine_state import EngineState

if TYPE_CHECKING:
    from app.supervisor.rpc import WorkerChanged

NOTIFY_MS = 6000


class Tray(QObject):
    open_requested = Signal()
    load_requested = Signal(str)
    unload_requested = Signal(str)
    unload_all_requested = Signal()
    pin_requested = Signal(str, bool)  # model, pinned
    quit_requested = Signal()
    welcome_requested = Signal(str)  # first run: download this model, load it and open the chat
    notified = Signal(str, str)  # title, message: also shown in the window, where a tray may be missing

    def __init__(self, icon: QIcon, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.menu = QMenu()
        self.open_action = self.menu.addAction("Open Lemon Desk")
        self.open_action.triggered.connect(self.open_requested)
        self.welcome_action = self.menu.addAction("Download and chat")
        self.welcome_action.setVisible(False)
        self.welcome_action.triggered.connect(self._welcome)
        self._welcome_model = ""
        self.load_menu = self.menu.addMenu("Load")
        self.unload_menu = self.menu.addMenu("Unload")
        self.pin_menu = self.menu.addMenu("Pin")
        self.pin_menu.setToolTip("A pinned model is never unloaded to make room or when idle")
        self.menu.addSeparator()
        self.api_action = self.menu.addAction("Local API: off")
        self.api_action.setToolTip(
            "Click to copy the address other apps use (OpenAI: /v1, Lemonade: /api/v1)"
        )
        self.api_action.triggered.connect(self._copy_api_url)
        self.api_url = ""
        self.set_api("")
        self.worker_action = self.menu.addAction("RPC worker")
        self.worker_action.setToolTip("Click to copy the --rpc argument other machines use to reach it")
        self.worker_action.triggered.connect(self._copy_worker)
        self.worker_address = ""
        self.set_worker("", "")
        self.menu.addSeparator()
        self.quit_action = self.menu.addAction("Quit")
        self.quit_action.triggered.connect(self.quit_requested)
        self.icon = QSystemTrayIcon(icon, self)
        self.icon.setToolTip("Lemon Desk")
        self.icon.setContextMenu(self.menu)
        self.icon.activated.connect(self._activated)
        self._models: list[str] = []
        self._loaded: set[str] = set()
        self._pinned: frozenset[str] = frozenset()
        self._remote: list[str] = []  # remote models a load can go to, @NAME/MODEL
        self._remote_loaded: set[str] = set()
        self._menus_show: tuple[object, ...] = ()  # what the Load, Unload and Pin menus were built for
        self.set_models([], set())

    @staticmethod
    def available() -> bool:
        return QSystemTrayIcon.isSystemTrayAvailable()

    def show(self) -> None:
        if self.available():
            self.icon.show()

    def hide(self) -> None:
        self.icon.hide()

    def set_api(self, url: str) -> None:
        """The local API's address ("" when it is off), shown with a copy action."""
        self.api_url = url
        self.api_action.setText(f"Local API: {url}/v1 (copy)" if url else "Local API: off")
        self.api_action.setEnabled(bool(url))

    def _copy_api_url(self) -> None:
        if self.api_url:
            QGuiApplication.clipboard().setText(f"{self.api_url}/v1")
            self.notified.emit("Copied", f"{self.api_url}/v1 is on the clipboard.")

    def show_worker(self, event: WorkerChanged) -> str:
        """This machine's RPC worker: its address and free memory, or why it is down (returned, for the
        user to be told; "" when there is nothing to tell)."""
        if event.state is EngineState.READY and event.info is not None:
            free = event.info.free_bytes / (1 << 30)
            self.set_worker(f"RPC worker: {event.endpoint} · {free:.1f} GiB free (copy)", event.endpoint)
        elif event.state is EngineState.STOPPED:
            self.set_worker("", "")
        elif event.final:
            self.set_worker("RPC worker: stopped", "")
            return event.message
        elif event.state is EngineState.CRASHED:
            self.set_worker("RPC worker: restarting…", "")
            return event.message
        return ""

    def set_worker(self, text: str, address: str) -> None:
        """This machine's RPC worker: what it is doing ("" hides it) and its address when it listens."""
        self.worker_address = address
        self.worker_action.setText(text)
        self.worker_action.setVisible(bool(text))
        self.worker_action.setEnabled(bool(address))

    def _copy_worker(self) -> None:
        if self.worker_address:
            QGuiApplication.clipboard().setText(f"--rpc {self.worker_address}")
            self.notified.emit("Copied", f"--rpc {self.worker_address} is on the clipboard.")

    def set_welcome(self, name: str) -> None:
        """First run: offer "Download and chat with ``name``"; an empty name takes the offer away."""
        self._welcome_model = name
        self.welcome_action.setText(f"Download and chat with {name}")
        self.welcome_action.setVisible(bool(name))

    def _welcome(self) -> None:
        if self._welcome_model:
            self.welcome_requested.emit(self._welcome_model)

    def set_models(self, names: list[str], loaded: set[str], pinned: frozenset[str] = frozenset()) -> None:
        """The models that can be loaded (downloaded ones), those loaded now and those pinned (checked).
        The menus are built again only when what they show changed: the window passes its rows on every
        change of any model's status, most of which the tray does not show."""
        shown = (list(names), set(loaded), frozenset(pinned), list(self._remote), set(self._remote_loaded))
        if shown == self._menus_show:
            # A click checks a pin at once; a pin that then failed changed nothing else.
            for action in self.pin_menu.actions():
                action.setChecked(action.text() in pinned)
            return
        self._menus_show = shown
        self.pin_menu.clear()
        for name in names:
            pin = self.pin_menu.addAction(name)
            pin.setCheckable(True)
            pin.setChecked(name in pinned)
            pin.triggered.connect(lambda checked, n=name: self.pin_requested.emit(n, checked))
        self.pin_menu.setEnabled(bool(names))
        self._models, self._loaded, self._pinned = list(names), set(loaded), pinned
        self.load_menu.clear()
        for name in names:
            action = self.load_menu.addAction(name)
            action.setCheckable(True)
            action.setChecked(name in loaded)
            action.triggered.connect(lambda _checked=False, n=name: self._load(n))
        if names and self._remote:
            self.load_menu.addSeparator()
        for name in self._remote:
            action = self.load_menu.addAction(name)
            action.setCheckable(True)
            action.setChecked(name in self._remote_loaded)
            action.setToolTip("On a remote server: it loads there")
            action.triggered.connect(lambda _checked=False, n=name: self._load(n))
        if not names and not self._remote:
            self.load_menu.addAction("No downloaded models").setEnabled(False)
        self.unload_menu.clear()
        for name in sorted(loaded):
            action = self.unload_menu.addAction(name)
            action.triggered.connect(lambda _checked=False, n=name: self.unload_requested.emit(n))
        if loaded:
            self.unload_menu.addSeparator()
        self.unload_all_action: QAction = self.unload_menu.addAction("Unload all")
        self.unload_all_action.setEnabled(bool(loaded))
        self.unload_all_action.triggered.connect(self.unload_all_requested)

    def set_remote_models(self, names: list[str], loaded: set[str]) -> None:
        """The remotes' models that can be used (their remote answers) and those loaded there."""
        self._remote, self._remote_loaded = list(names), set(loaded)
        self.set_models(self._models, self._loaded, self._pinned)

    def load_actions(self) -> dict[str, QAction]:
        return {a.text(): a for a in self.load_menu.actions() if a.isCheckable()}

    def unload_actions(self) -> dict[str, QAction]:
        return {a.text(): a for a in self.unload_menu.actions() if not a.isSeparator()}

    def notify(self, title: str, message: str, error: bool = False) -> None:
        if self.icon.isVisible():
            kind = QSystemTrayIcon.MessageIcon.Critical if error else QSystemTrayIcon.MessageIcon.Information
            self.icon.showMessage(title, message, kind, NOTIFY_MS)
        self.notified.emit(title, message)

    def _load(self, name: str) -> None:
        # The check mark shows what is loaded, not what was clicked: the caller's set_models moves it.
        loaded = self._loaded | self._remote_loaded
        self.load_actions()[name].setChecked(name in loaded)
        if name not in loaded:
            self.load_requested.emit(name)

    def _activated(self, reason: QSystemTrayIcon.ActivationReason) -> None:
        if reason == QSystemTrayIcon.ActivationReason.Trigger:
            self.open_requested.emit()
