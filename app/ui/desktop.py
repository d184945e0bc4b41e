"""The desktop app around the window: history, tray, settings, single instance, window state, quitting.

This is the composition root of the UI: it owns the objects and does the little file and keychain I/O
the UI needs (settings, window state, token), so that the widgets themselves do none.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, QSettings, Qt
from PySide6.QtGui import QGuiApplication, QIcon
from PySide6.QtWidgets import QApplication, QMessageBox

from app.core.errors import LemonDeskError
from app.desktop_entry import ICON_NAME, PNG_SIZES, packaging_dir
from app.store import secrets
from app.store.history import History
from app.store.paths import home
from app.store.settings import Settings, load_settings, save_settings
from app.ui.chat.keeper import HistoryKeeper
from app.ui.main_window import MainWindow
from app.ui.settings_dialog import SettingsDialog, TokenAction, TokenChange
from app.ui.single_instance import SingleInstance
from app.ui.tray import Tray

STATUS_MESSAGE_MS = 8000


def app_icon() -> QIcon:
    icons = packaging_dir() / "icons"
    icon = QIcon(str(icons / f"{ICON_NAME}.svg"))
    for size in PNG_SIZES:
        icon.addFile(str(icons / f"{ICON_NAME}-{size}.png"))
    return icon


def window_state_store() -> QSettings:
    """Window size, splitters and last model, in LEMON_DESK_HOME (Qt writes the file atomically)."""
    return QSettings(str(home() / "window.ini"), QSettings.Format.IniFormat)


class DesktopApp(QObject):
    def __init__(self, qapp: QApplication, instance: SingleInstance | None = None) -> None:
        super().__init__()
        self.qapp = qapp
        self.instance = instance
        qapp.setQuitOnLastWindowClosed(False)  # the tray keeps the app; quitting is explicit
        loaded = load_settings()
        self.settings: Settings = loaded.settings
        self.history = History()
        icon = app_icon()
        qapp.setWindowIcon(icon)
        self.window = MainWindow(icon)
        self.keeper = HistoryKeeper(self.history, self.window.chat, self.window.conversations)
        self.tray = Tray(icon, self)
        self.tray.show()
        self._apply_tray_setting()
        self.window.restore_state(window_state_store())
        self.dialog: SettingsDialog | None = None
        self.quitting = False

        self.window.settings_requested.connect(self.open_settings)
        self.window.quit_requested.connect(self.quit)
        self.window.closed.connect(self.quit)
        self.tray.open_requested.connect(self.show_window)
        self.tray.quit_requested.connect(self.quit)
        self.tray.notified.connect(self._show_notification)
        self.keeper.error.connect(self._warn)
        if instance is not None:
            instance.activation_requested.connect(self.show_window)
        QGuiApplication.styleHints().colorSchemeChanged.connect(self._scheme_changed)
        for warning in (loaded.warning, self.history.warning):
            if warning:
                self._warn(warning)

    def show_window(self) -> None:
        self.window.show()
        self.window.setWindowState(self.window.windowState() & ~Qt.WindowState.WindowMinimized)
        self.window.raise_()
        self.window.activateWindow()

    def open_settings(self) -> None:
        if self.dialog is not None:
            self.dialog.raise_()
            return
        self.dialog = SettingsDialog(self.settings, secrets.get_hf_token() is not None, self.window)
        self.dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.dialog.applied.connect(self.apply_settings)
        self.dialog.finished.connect(self._settings_closed)
        self.dialog.open()

    def apply_settings(self, settings: Settings, token: TokenChange) -> None:
        try:
            save_settings(settings)
        except OSError as err:
            self._warn(f"Could not save the settings: {err.strerror}. Check that {home()} is writable.")
            return
        self.settings = settings
        self._apply_tray_setting()
        try:
            if token.action is TokenAction.SET:
                secrets.set_hf_token(token.token)
            elif token.action is TokenAction.DELETE:
                secrets.delete_hf_token()
        except LemonDeskError as err:
            self._warn(str(err))

    def quit(self) -> None:
        if self.quitting:
            return
        self.quitting = True
        store = window_state_store()
        self.window.save_state(store)
        store.sync()
        self.tray.hide()
        self.history.close()
        if self.instance is not None:
            self.instance.close()
        self.qapp.quit()

    def _apply_tray_setting(self) -> None:
        # Without a tray there would be no way back to a hidden window: then closing quits.
        self.window.keep_in_tray = self.settings.keep_in_tray and self.tray.available()

    def _settings_closed(self) -> None:
        self.dialog = None

    def _show_notification(self, title: str, message: str) -> None:
        self.window.statusBar().showMessage(f"{title}: {message}", STATUS_MESSAGE_MS)

    def _warn(self, message: str) -> None:
        box = QMessageBox(
            QMessageBox.Icon.Warning, "Lemon Desk", message, QMessageBox.StandardButton.Ok, self.window
        )
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()

    def _scheme_changed(self) -> None:
        self.window.chat.refresh_theme()
