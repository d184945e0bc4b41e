"""The Settings dialog's life around the app: opened on the settings in use, whether the keychain holds a
Hub token read in a worker thread (the dialog learns it then); on Save the settings file and the keychain
are written in worker threads, the app applies the settings, and only then does the dialog close."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt

from app.core.errors import LemonDeskError
from app.store import secrets
from app.store.paths import home
from app.store.settings import Settings, save_settings
from app.ui.settings_dialog import SettingsDialog, TokenAction, TokenChange

if TYPE_CHECKING:
    from PySide6.QtWidgets import QWidget

    from app.bridge import Bridge


class SettingsFlow:
    def __init__(
        self, parent: QWidget, warn: Callable[[str], None], applied: Callable[[Settings], None]
    ) -> None:
        self._parent = parent
        self._warn = warn
        self._applied = applied  # the app takes saved settings at once
        self.dialog: SettingsDialog | None = None
        self.has_token: bool | None = None  # whether the keychain holds a Hub token; None: not read yet

    def open(self, settings: Settings, bridge: Bridge | None) -> None:
        """``bridge``: None before the app has started (then no remotes, and the token is not looked for)."""
        if self.dialog is not None:
            self.dialog.raise_()
            return
        dialog = self.dialog = SettingsDialog(settings, bool(self.has_token), self._parent)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.finished.connect(self._closed)
        if bridge is None:  # the app did not start (it is quitting): there is nothing to apply them to
            dialog.applied.connect(dialog.reject)
        else:
            dialog.applied.connect(lambda new, token: bridge.spawn(self.save(new, token)))
            editor = dialog.remotes
            editor.set_remotes(bridge.remotes())
            editor.add_requested.connect(bridge.add_remote)
            editor.remove_requested.connect(bridge.remove_remote)
            bridge.remote_added.connect(editor.added)
            bridge.remote_failed.connect(editor.failed)
            mcp = dialog.mcp
            mcp.set_servers(bridge.mcp_servers())
            mcp.put_requested.connect(bridge.put_mcp_server)
            mcp.remove_requested.connect(bridge.remove_mcp_server)
            mcp.enabled_changed.connect(bridge.enable_mcp_server)
            mcp.import_requested.connect(bridge.import_mcp_json)
            bridge.mcp_changed.connect(mcp.set_servers)
            bridge.mcp_failed.connect(mcp.failed)
            if self.has_token is None:
                bridge.spawn(self._read_has_token(dialog))
        dialog.open()

    async def _read_has_token(self, dialog: SettingsDialog) -> None:
        import asyncio

        self.has_token = await asyncio.to_thread(secrets.get_hf_token) is not None
        if dialog is self.dialog:
            dialog.set_has_token(self.has_token)

    async def save(self, settings: Settings, token: TokenChange) -> None:
        """Write the settings and the token, apply the settings, close the dialog (also when saving
        failed: the user is told why)."""
        import asyncio

        try:
            try:
                await asyncio.to_thread(save_settings, settings)
            except OSError as err:
                self._warn(f"Could not save the settings: {err.strerror}. Check that {home()} is writable.")
                return
            self._applied(settings)
            try:
                if token.action is TokenAction.SET:
                    await asyncio.to_thread(secrets.set_hf_token, token.token)
                    self.has_token = True
                elif token.action is TokenAction.DELETE:
                    await asyncio.to_thread(secrets.delete_hf_token)
                    self.has_token = None  # HF_TOKEN in the environment may still give one
            except LemonDeskError as err:
                self._warn(str(err))
        finally:
            if self.dialog is not None:
                self.dialog.accept()

    def _closed(self) -> None:
        self.dialog = None
