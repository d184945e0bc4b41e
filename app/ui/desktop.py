"""The desktop app around the window: history, tray, settings, single instance, window state, quitting.

This is the composition root of the UI: it owns the objects, and hands the file and keychain I/O the UI
needs (settings, token, bench runs, window state on quitting) to worker threads, so that the window's
thread only gets results. What is read before the event loop runs (the settings and the window's state,
which the first paint needs) is read then; the chat history is the UI thread's by design
(``store.history``).

Start-up comes in two parts: the constructor makes what the first paint needs (settings, window, tray);
``start()``, called once the window shows, makes the rest (the chat history's database, the bridge, whose
``start()`` makes the router in a worker thread) and imports their modules then, so that none of it
delays the window. Quitting runs in stages (``app.ui.quitting``).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, QSettings, Qt
from PySide6.QtGui import QGuiApplication, QIcon
from PySide6.QtWidgets import QApplication, QMessageBox

from app.core.chat import ChatMessage
from app.core.downloads import DownloadRecord
from app.core.errors import LemonDeskError
from app.core.mcp import McpState
from app.core.remotes import RemoteModelStatus, RemoteState
from app.core.status import Status
from app.desktop_entry import ICON_NAME, PNG_SIZES, packaging_dir
from app.store.model_options import ModelOptions
from app.store.paths import home
from app.store.settings import Settings, load_settings
from app.ui.boxes import Button, open_box
from app.ui.caret import CaretBlink
from app.ui.first_run import FirstRun
from app.ui.main_window import MainWindow
from app.ui.model_manager import BUSY
from app.ui.notices import recovery_notice, remote_notice
from app.ui.settings_flow import SettingsFlow
from app.ui.telemetry_view import WINDOW_S
from app.ui.tool_windows import ToolWindows
from app.ui.tray import Tray

Icon = QMessageBox.Icon

if TYPE_CHECKING:
    import asyncio

    from app.bridge import Bridge
    from app.store.history import History
    from app.supervisor.remote_views import RemoteChanged, RemoteSnapshot
    from app.supervisor.router import EngineUsage, LoadProgress, ModelView, RequestFinished
    from app.supervisor.rpc import WorkerChanged
    from app.supervisor.supervisor import EngineStateChanged
    from app.ui.backends_dialog import BackendsDialog
    from app.ui.bench_view import BenchView
    from app.ui.chat.keeper import HistoryKeeper
    from app.ui.quitting import Quitter
    from app.ui.settings_dialog import SettingsDialog, TokenChange
    from app.ui.single_instance import SingleInstance

STATUS_MESSAGE_MS = 8000
log = logging.getLogger(__name__)


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
    """``start()`` and ``quit()`` need a running asyncio loop (qasync) on the Qt thread: the bridge starts
    tasks on it. Making the app and showing its window do not."""

    def __init__(self, qapp: QApplication, instance: SingleInstance | None = None) -> None:
        super().__init__()
        self.qapp = qapp
        self.instance = instance
        qapp.setQuitOnLastWindowClosed(False)  # the tray keeps the app; quitting is explicit
        loaded = load_settings()
        self.settings: Settings = loaded.settings
        icon = app_icon()
        qapp.setWindowIcon(icon)
        self.caret = CaretBlink(qapp, self)  # a caret that blinks on in a window left alone repaints it
        self.window = MainWindow(icon)
        self.tray = Tray(icon, self)
        self.tray.show()
        self._apply_tray_setting()
        self.window.restore_state(window_state_store())
        self.settings_flow = SettingsFlow(self.window, self._warn, self._settings_saved)
        self.tools = ToolWindows(self.window, self._warn)  # the Backends and Bench windows
        self.quitter: Quitter | None = None
        self.finished = False  # every engine is stopped and the app has quit
        self.exit_app = qapp.quit  # what ends the application once everything is stopped
        self._telemetry_loaded = False  # the Telemetry tab has the history's per-reply figures
        self.first_run = FirstRun(self.window, self.tray, self.show_window)
        self._loading = ""  # the model whose one-click load the status bar follows
        self._loading_since = 0  # the bridge's events_seen at the load's last phase
        self.history: History  # these three are made by start(), once the window shows
        self.keeper: HistoryKeeper
        self.bridge: Bridge
        self.started = False
        self.start_failure: QMessageBox | None = None  # why start() failed, on screen until dismissed

        self.window.settings_requested.connect(self.open_settings)
        self.window.quit_requested.connect(self.quit)
        self.window.closed.connect(self.quit)
        self.tray.open_requested.connect(self.show_window)
        self.tray.quit_requested.connect(self.quit)
        self.tray.notified.connect(self._show_notification)
        if instance is not None:
            instance.activation_requested.connect(self.show_window)
        QGuiApplication.styleHints().colorSchemeChanged.connect(self.scheme_changed)
        if loaded.warning:
            self._warn(loaded.warning)

    @property
    def quitting(self) -> bool:
        return self.quitter is not None

    def start(self) -> None:
        """Open the chat history, make the bridge and start it (the router, the models, the hardware and
        backends), serve the local API: called once the window is shown, so that none of it (imports
        included) holds up its first paint."""
        from app.bridge import Bridge
        from app.store.history import History
        from app.ui.chat.keeper import HistoryKeeper

        self.history = History()
        self.keeper = HistoryKeeper(self.history, self.window.chat, self.window.conversations)
        self.keeper.error.connect(self._warn)
        if self.history.warning:
            self._warn(self.history.warning)
        self.bridge = Bridge(self.settings, self, self.history.attachments)
        self.started = True
        self._connect_bridge()
        self.bridge.spawn(self._start_bridge())

    async def _start_bridge(self) -> None:
        try:
            await self.bridge.start()
        except Exception as err:  # the router could not be made (its folders, say): as start() fails
            self._explain_start_failure(err)
            return
        # Once the router has started (an earlier run's engines stopped), as `lemon-desk serve` does.
        self.bridge.serve(self.settings.api_enabled, self.settings.api_port, self.settings.ollama_port)
        self.bridge.sync_worker()

    def _router_ready(self) -> None:
        for warning in self.bridge.warnings:
            self._warn(warning)
        self._watch_telemetry()  # the Telemetry tab may have been opened before

    def start_or_explain(self) -> None:
        """``start``; when it fails (a home folder that cannot be written, say), say why and quit, rather
        than leave a window that can do nothing."""
        try:
            self.start()
        except Exception as err:  # the top of the app's start: whatever stops it, the user is told
            self._explain_start_failure(err)

    def _explain_start_failure(self, err: Exception) -> None:
        log.error("Lemon Desk could not start", exc_info=err)
        why = str(err) if isinstance(err, LemonDeskError) else f"{err}. Check that {home()} is writable."
        text = f"{why}\n\nLemon Desk will close; start it again once this is fixed."
        self.start_failure = open_box(self.window, Icon.Critical, "Lemon Desk could not start", text)
        self.start_failure.finished.connect(self.quit)

    def _connect_bridge(self) -> None:
        bridge, window, chat, models = self.bridge, self.window, self.window.chat, self.window.models
        bridge.router_ready.connect(self._router_ready)
        bridge.models_changed.connect(self._rows_changed)
        bridge.backends_changed.connect(window.options.set_backends)
        bridge.engine_changed.connect(self._engine_changed)
        bridge.engine_output.connect(window.logs.append)
        bridge.usage_changed.connect(self._usage)
        bridge.load_progress.connect(self._load_progress)
        bridge.api_changed.connect(self._api_changed)
        bridge.worker_changed.connect(self._worker_changed)
        bridge.api_request.connect(self._api_request)
        bridge.remotes_changed.connect(self._remotes_changed)
        bridge.remote_changed.connect(self._remote_changed)
        bridge.recovery.connect(lambda event: self.tray.notify(*recovery_notice(event)))
        bridge.fit_refused.connect(self._confirm_force_load)
        bridge.reply_started.connect(chat.begin_reply)
        bridge.reply_delta.connect(lambda delta: chat.append_reply(delta.content, delta.reasoning))
        bridge.reply_card.connect(lambda card: chat.set_reply_card(card.to_json()))
        bridge.reply_finished.connect(lambda done: chat.finish_reply(done.telemetry.to_json()))
        bridge.reply_failed.connect(chat.fail_reply)
        bridge.reply_tool.connect(chat.show_tool)
        bridge.tool_permission.connect(chat.ask_tool)
        chat.tool_answered.connect(bridge.answer_tool)
        bridge.notify.connect(self.tray.notify)
        bridge.error.connect(self._warn)
        bridge.model_added.connect(models.select)
        # The message is meant for the model the window shows; the router says which one answers.
        chat.send_requested.connect(
            lambda chat_id, messages, params: bridge.send(
                bridge.selected, messages, params, chat_id, chat.chosen_servers()
            )
        )
        bridge.mcp_changed.connect(
            lambda views: chat.set_tool_servers([v.spec.name for v in views if v.state is McpState.READY])
        )
        chat.stop_requested.connect(bridge.stop_reply)
        self._connect_attachments()
        self._connect_context()
        models.model_selected.connect(self._model_selected)
        models.load_requested.connect(lambda name: bridge.load(name))
        models.load_without_requested.connect(lambda name, lost: bridge.load(name, without=lost))
        models.unload_requested.connect(bridge.unload)
        models.download_requested.connect(bridge.download)
        models.cancel_download_requested.connect(window.downloads.ask_cancel)
        models.resume_download_requested.connect(bridge.resume_download)
        models.fit_wanted.connect(bridge.measure_fit)
        self._connect_first_run_and_downloads()
        models.pin_requested.connect(bridge.set_pinned)
        models.delete_requested.connect(self._confirm_delete)
        models.add_requested.connect(bridge.import_model)
        window.options.save_requested.connect(self._save_options)
        window.options.load_requested.connect(self._load_with)
        window.backends_requested.connect(self.open_backends)
        window.bench_requested.connect(self.open_bench)
        window.telemetry.watching_changed.connect(self._watch_telemetry)
        window.minimized_changed.connect(self._watch_telemetry)
        bridge.system_sampled.connect(window.telemetry.add_sample)
        chat.reply_finished.connect(self._reply_for_telemetry)
        self.tray.load_requested.connect(lambda name: bridge.load(name))
        self.tray.unload_requested.connect(bridge.unload)
        self.tray.unload_all_requested.connect(bridge.unload_all)
        self.tray.pin_requested.connect(bridge.set_pinned)

    def _connect_attachments(self) -> None:
        bridge, chat = self.bridge, self.window.chat
        chat.attach_requested.connect(lambda path: bridge.attach(path, bridge.selected))
        chat.attach_data_requested.connect(lambda name, data: bridge.attach_data(name, data, bridge.selected))
        chat.keep_requested.connect(bridge.keep_attachments)
        bridge.models_changed.connect(lambda _rows: chat.set_embedder(bridge.embedder()))
        chat.attachments_shown.connect(bridge.read_attachments)
        chat.context_wanted.connect(self._propose_context)
        bridge.attachment_ready.connect(chat.add_attachment)
        bridge.attachment_refused.connect(chat.refuse_attachment)
        bridge.attachments_kept.connect(chat.attachments_kept)
        bridge.attachment_read.connect(chat.show_attachment_data)
        bridge.attachment_counted.connect(chat.set_attachment_count)
        bridge.models_changed.connect(lambda _rows: chat.set_vision(bridge.vision_refusal()))

    def _propose_context(self, tokens: int) -> None:
        """The message needs a larger context: the options panel proposes one (a power of two) for the
        user to load the model with."""
        context = self.window.options.propose_context(tokens)
        self.window.chat.tray.say(
            f"The model's options now ask for a context of {context:,} tokens: press Load to load it "
            "with that context (its fit is shown there), then send.",
            error=False,
        )

    def _connect_context(self) -> None:
        """The chat's context meter and its ways out, counted and taken by the router."""
        bridge, guard = self.bridge, self.window.chat.guard
        guard.enabled = True
        guard.count_wanted.connect(bridge.count_context)
        bridge.context_counted.connect(guard.show_count)
        guard.reload_wanted.connect(bridge.reload_with_context)
        bridge.context_reloaded.connect(lambda ok: guard.reloaded() if ok else guard.count_now())
        guard.summary_wanted.connect(bridge.summarize)
        bridge.summary_ready.connect(
            lambda summary: guard.start_from_summary(summary) if summary else guard.count_now()
        )
        bridge.engine_changed.connect(guard.changed)
        self.window.models.model_selected.connect(guard.changed)

    def _connect_first_run_and_downloads(self) -> None:
        bridge, window = self.bridge, self.window
        bridge.downloads_changed.connect(self._downloads_changed)
        bridge.download_progress.connect(window.downloads.show_progress)
        window.downloads.pause_requested.connect(bridge.pause_download)
        window.downloads.resume_requested.connect(bridge.resume_download)
        window.downloads.cancel_requested.connect(bridge.cancel_download)
        window.hub_search.search_requested.connect(bridge.search_hub)
        window.hub_search.add_requested.connect(self._add_from_hub)
        bridge.hub_results.connect(window.hub_search.set_results)
        bridge.hub_failed.connect(window.hub_search.set_failed)
        self.first_run.connect(bridge)

    def _remote_changed(self, event: RemoteChanged) -> None:
        notice = remote_notice(event)
        if notice is not None:
            self.tray.notify(*notice)

    def _downloads_changed(self, records: list[DownloadRecord]) -> None:
        self.window.downloads.set_records(records)
        self.window.show_downloads(self.window.downloads.active_count())

    def _add_from_hub(self, ref: str) -> None:
        self.bridge.add_from_hub(ref)
        self.window.side.setCurrentWidget(self.window.downloads)

    def _rows_changed(self, rows: list[ModelView]) -> None:
        self.first_run.rows_changed(rows)
        self._load_ended(rows)
        self.window.set_rows(rows)
        loaded = {r.name for r in rows if r.status.status is Status.LOADED}
        pinned = frozenset(r.name for r in rows if r.status.pinned)
        self.tray.set_models([r.name for r in rows if r.on_disk], loaded, pinned)
        selected = self.window.models.selected()
        if selected and self.window.options.model != selected:
            self._model_selected(selected)

    def _remotes_changed(self, remotes: list[RemoteSnapshot]) -> None:
        self.window.models.set_remotes(remotes)
        usable = [v for r in remotes if r.state is RemoteState.REACHABLE for v in r.views()]
        loaded = {v.name for v in usable if v.status is RemoteModelStatus.LOADED}
        self.tray.set_remote_models([v.name for v in usable], loaded)
        self.first_run.remotes_changed(bool(usable))
        if self.dialog is not None:
            self.dialog.remotes.set_remotes(remotes)

    def _model_selected(self, name: str) -> None:
        if self.window.models.remote_row(name) is not None:
            self.bridge.selected = name  # chat goes to its remote; it has no options here
            self.window.chat.set_vision(self.bridge.vision_refusal())
            return
        row = self.window.models.row(name)
        if row is None:
            return
        self.bridge.selected = name
        self.window.chat.set_vision(self.bridge.vision_refusal())
        options = self.bridge.options(name)
        self.window.options.show_model(row, options)
        self.window.logs.show_engine(name, *self.bridge.engine_log(name))
        self._apply_sampling(options)

    def _engine_changed(self, event: EngineStateChanged) -> None:
        name, message = event.model, event.message
        text = f"Engine {event.state.value}" + (f": {message.splitlines()[0]}" if message else "")
        self.window.set_engine_status(text)
        if event.state.value == "starting" and name == self.window.logs.engine:
            self.window.logs.show_engine(name, *self.bridge.engine_log(name))
        if not self.bridge.loaded():
            self.window.show_usage(0.0, 0)
        if event.state.value == "ready" and name == self.bridge.chat_target() and self.window.chat.tray.items:
            self.bridge.recount([p.taken for p in self.window.chat.tray.items], self.bridge.selected)

    def _usage(self, usage: EngineUsage) -> None:
        if usage.model == self.bridge.chat_target():
            self.window.show_usage(usage.cpu_percent, usage.rss_bytes)

    def _watch_telemetry(self, _changed: bool = False) -> None:
        """Sample once a second only while the Telemetry tab is on screen in a window that is not
        minimized."""
        window = self.window
        on = window.telemetry.isVisible() and not window.isMinimized() and not self.quitting
        if on and not self._telemetry_loaded:
            self._telemetry_loaded = True
            window.telemetry.add_requests(self._recent_telemetry())
        self.bridge.watch_system(on)

    def _recent_telemetry(self) -> list[tuple[float, dict[str, object]]]:
        return self.history.recent_telemetry(time.time() - WINDOW_S)

    def _worker_changed(self, event: WorkerChanged) -> None:
        warning = self.tray.show_worker(event)
        if warning:
            self._warn(warning)

    def _api_changed(self, url: str, problem: str) -> None:
        self.tray.set_api(url)
        if problem:
            self._warn(problem)

    def _api_request(self, finished: RequestFinished) -> None:
        """A reply the local API gave another app: on the charts by its dialect, with its run card."""
        if not self._telemetry_loaded:
            return
        if finished.card is not None:
            self.window.telemetry.add_api_reply(time.time(), finished.card)
        else:
            self.window.telemetry.add_request(time.time(), finished.telemetry.to_json())

    def _reply_for_telemetry(self, _conversation_id: str, message: ChatMessage) -> None:
        if message.telemetry and self._telemetry_loaded:
            self.window.telemetry.add_request(time.time(), message.telemetry)

    def _load_progress(self, progress: LoadProgress) -> None:
        """One line per phase of a one-click load, in the engine status."""
        share = f" {100 * progress.done // progress.total}%" if progress.total else ""
        detail = f" ({progress.detail})" if progress.detail else ""
        self._loading = progress.model
        self._loading_since = self.bridge.events_seen
        self.window.set_engine_status(f"{progress.model}: {progress.phase.value}{share}{detail}")

    def _load_ended(self, rows: list[ModelView]) -> None:
        """The status bar follows a one-click load to its end: a load that failed or was cancelled says
        so there, in place of its last phase ("downloading"); a loaded model keeps the engine's line.
        Rows read before that phase began say nothing of how the load ended."""
        if self.bridge.rows_as_of < self._loading_since:
            return
        row = next((r for r in rows if r.name == self._loading), None)
        if row is None or row.status.status in BUSY:
            return
        self._loading = ""
        if row.status.status is not Status.LOADED:
            why = row.status.message.split("\n", 1)[0]
            self.window.set_engine_status(f"{row.name} {row.status.text}" + (f": {why}" if why else ""))

    def _confirm_force_load(self, name: str, message: str) -> None:
        box = open_box(
            self.window, Icon.Warning, "Not enough memory free", message, Button.Cancel, "Load anyway"
        )
        box.accepted.connect(lambda: self.bridge.load(name, force=True))

    def _apply_sampling(self, options: ModelOptions) -> None:
        chat = self.window.chat
        if options.temperature is not None:
            chat.temperature.setValue(options.temperature)
        if options.top_p is not None:
            chat.top_p.setValue(options.top_p)
        chat.max_tokens.setValue(options.max_tokens or 0)

    def _save_options(self, name: str, options: ModelOptions) -> None:
        self.bridge.save_options(name, options)
        self._apply_sampling(options)
        self.window.statusBar().showMessage(f"Saved the options of {name}.", STATUS_MESSAGE_MS)

    def _load_with(self, name: str, options: ModelOptions) -> None:
        self._apply_sampling(options)
        self.bridge.load(name, options)

    def _confirm_delete(self, name: str) -> None:
        text = (
            f"Delete {name}? Downloaded files are removed from the disk; an imported model is only "
            "taken off the list."
        )
        box = open_box(self.window, Icon.Question, "Delete model", text, Button.Yes | Button.Cancel)
        box.accepted.connect(lambda: self.bridge.delete(name))

    @property
    def backends(self) -> BackendsDialog | None:
        return self.tools.backends

    @property
    def bench(self) -> BenchView | None:
        return self.tools.bench

    def open_backends(self) -> None:
        self.tools.open_backends(self.bridge)

    def open_bench(self) -> None:
        self.tools.open_bench(self.bridge)

    def show_window(self) -> None:
        self.window.show()
        self.window.setWindowState(self.window.windowState() & ~Qt.WindowState.WindowMinimized)
        self.window.raise_()
        self.window.activateWindow()

    @property
    def dialog(self) -> SettingsDialog | None:
        return self.settings_flow.dialog

    def open_settings(self) -> None:
        self.settings_flow.open(self.settings, self.bridge if self.started else None)

    def apply_settings(self, settings: Settings, token: TokenChange) -> asyncio.Task[None]:
        """Save the settings and the token (in worker threads), apply them, close the dialog."""
        return self.bridge.spawn(self.settings_flow.save(settings, token))

    def _settings_saved(self, settings: Settings) -> None:
        self.settings = settings
        self.bridge.apply_settings(settings)
        self.bridge.serve(settings.api_enabled, settings.api_port, settings.ollama_port)
        self.bridge.sync_worker()
        self._apply_tray_setting()

    def quit(self) -> None:
        """Quit in stages (``app.ui.quitting``): the window goes at once, the app once every engine is
        stopped and reaped."""
        if self.quitter is None:
            from app.ui.quitting import desktop_quitter

            self.quitter = desktop_quitter(self)
            self.quitter.quit()

    def _apply_tray_setting(self) -> None:
        # Without a tray there would be no way back to a hidden window: then closing quits.
        self.window.keep_in_tray = self.settings.keep_in_tray and self.tray.available()

    def _show_notification(self, title: str, message: str) -> None:
        self.window.show_message(f"{title}: {message}", STATUS_MESSAGE_MS)

    def _warn(self, message: str) -> None:
        open_box(self.window, Icon.Warning, "Lemon Desk", message)

    def scheme_changed(self) -> None:
        self.window.chat.refresh_theme()
