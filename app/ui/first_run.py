"""The first run: while no model is on this machine (and no remote offers one), the chat area shows the
welcome with the suggested model; its one button downloads, installs and loads it, then opens the chat."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TYPE_CHECKING

from app.core.status import Status

if TYPE_CHECKING:
    from app.bridge import Bridge
    from app.supervisor.router import ModelView, Suggestion
    from app.ui.main_window import MainWindow
    from app.ui.tray import Tray


class WelcomeState(enum.Enum):
    UNKNOWN = "unknown"  # the models are not read yet
    OFFERED = "offered"  # no model is on this machine: the welcome is shown
    RUNNING = "running"  # its button was pressed: download, install and load under way
    DONE = "done"  # a model is here (or was loaded from the welcome): the chat is shown


class FirstRun:
    def __init__(self, window: MainWindow, tray: Tray, show_window: Callable[[], None]) -> None:
        self.window = window
        self.tray = tray
        self.show_window = show_window
        self.state = WelcomeState.UNKNOWN
        self.remote_usable = False  # a remote answers with models: there is something to chat with
        self._bridge: Bridge | None = None

    def connect(self, bridge: Bridge) -> None:
        self._bridge = bridge
        bridge.suggestion_ready.connect(self._suggestion_ready)
        bridge.load_progress.connect(self.window.welcome.set_progress)
        self.window.welcome.start_requested.connect(self.download_and_chat)
        self.tray.welcome_requested.connect(self.download_and_chat)

    def rows_changed(self, rows: list[ModelView]) -> None:
        state = self.state
        if state is WelcomeState.UNKNOWN and rows:
            if any(r.on_disk for r in rows) or self.remote_usable:
                self.state = WelcomeState.DONE
                return
            self.state = WelcomeState.OFFERED
            self.window.show_welcome(True)
            if self._bridge is not None:
                self._bridge.suggest()
        elif state is WelcomeState.OFFERED and any(r.on_disk for r in rows):
            self._end()  # a model arrived another way (a download, an import)
        elif state is WelcomeState.RUNNING:
            row = next((r for r in rows if r.name == self.window.welcome.model), None)
            if row is None:
                return
            if row.status.status is Status.LOADED:
                self._end()
                self.window.models.select(row.name)
                self.window.chat.composer.setFocus()
            elif row.status.status in (Status.FAILED, Status.DOWNLOAD_FAILED, Status.CRASHED):
                self.state = WelcomeState.OFFERED
                self.window.welcome.set_failed(row.status.message or f"{row.name} did not load.")

    def remotes_changed(self, usable: bool) -> None:
        self.remote_usable = usable
        if usable and self.state is WelcomeState.OFFERED:
            self._end()  # a remote's model can be chatted with: no download is needed first

    def _suggestion_ready(self, suggestion: Suggestion | None) -> None:
        self.window.welcome.set_suggestion(suggestion)
        if self.state is WelcomeState.OFFERED:
            self.tray.set_welcome(suggestion.model.name if suggestion else "")

    def download_and_chat(self, name: str) -> None:
        """The welcome's one button: the one-click load (download, install, load), then the chat."""
        if self.state is not WelcomeState.OFFERED or self._bridge is None:
            return
        self.state = WelcomeState.RUNNING
        self.window.welcome.show_starting()
        self.show_window()
        self.window.models.select(name)
        self._bridge.selected = name
        self._bridge.load(name)

    def _end(self) -> None:
        self.state = WelcomeState.DONE
        self.window.show_welcome(False)
        self.tray.set_welcome("")
