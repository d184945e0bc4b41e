"""The one place where the window meets the router: router events become Qt signals carrying the event
dataclasses, and the window's intents (load, unload, pin, download, send, install...) become router calls.

A translator, not an owner: what runs, the loading policy, which model a message goes to, downloads and
each model's status live in the router (``app.supervisor.router``), which the CLI and the local API share.
Like qutebrowser's message bridge, each signal carries the one value it is about (an event dataclass, a
snapshot, a run card) and the widgets read what they show from it. Everything here runs on the Qt thread,
which is also the asyncio loop's thread (qasync). Every task the bridge starts is kept until it ends.

``start()`` makes the router (its constructor reads the model catalog and the saved options: in a worker
thread, not the window's) and does what a window's start needs. Quitting calls ``stop_accepting``,
``stop_api``, ``cancel_tasks`` and ``stop_router`` as its stages (``app.ui.quitting``), so it leaves no
engine behind.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, QTimer, Signal

from app.client.events import ChatDelta
from app.core.attachments import (
    IMAGE_TOKENS_ESTIMATE,
    AttachmentKind,
    AttachmentRef,
    TokenCount,
    estimate_tokens,
    vision_refusal,
)
from app.core.backends import BackendKey
from app.core.bench import BenchSpec
from app.core.context import Summary
from app.core.engine_state import EngineState
from app.core.errors import AttachmentError, FitError, LemonDeskError
from app.core.mcp import McpServerSpec
from app.core.remotes import RemoteModelStatus, is_remote_model
from app.core.tools import TOOL_EVENTS, Permission, ToolRequest
from app.store.attachments import AttachmentStore, Ingested, expand_messages, ingest, ingest_data, still_there
from app.store.history import attachment_store
from app.store.mcp_servers import read_mcp_json
from app.store.model_options import ModelOptions
from app.store.settings import Settings
from app.supervisor.bench import bench
from app.supervisor.downloads import DownloadChanged, DownloadProgress
from app.supervisor.mcp import McpServerChanged, McpServerView
from app.supervisor.remote_views import RemoteChanged, RemoteSnapshot
from app.supervisor.router import (
    EngineRecovery,
    EngineUsage,
    LoadProgress,
    ModelsChanged,
    ModelView,
    RequestFinished,
    RequestSource,
    Router,
    RouterEvent,
)
from app.supervisor.rpc import WorkerChanged
from app.supervisor.sampler import SystemSample
from app.supervisor.supervisor import EngineStateChanged, InstallFinished, InstallProgress, Uninstalled
from app.supervisor.system_info import SystemInfo

if TYPE_CHECKING:
    from app.supervisor.api import ApiServer

log = logging.getLogger(__name__)

REFRESH_MS = 200  # model statuses are read again at most this often (downloads report many times a second)


class Bridge(QObject):
    """Turns the router's events into Qt signals and the window's intents into router tasks."""

    models_changed = Signal(list)  # [ModelView]
    backends_changed = Signal(object)  # SystemInfo
    engine_changed = Signal(object)  # EngineStateChanged
    engine_output = Signal(str, str)  # engine name, a line it printed
    usage_changed = Signal(object)  # EngineUsage
    system_sampled = Signal(object)  # SystemSample, each second while the Telemetry view watches
    recovery = Signal(object)  # EngineRecovery: a crashed engine restarts, or was given up on
    bench_progress = Signal(object)  # BenchProgress
    bench_finished = Signal(object)  # BenchRun (already saved)
    bench_failed = Signal(str)  # why, or that it was cancelled
    load_progress = Signal(object)  # LoadProgress
    install_progress = Signal(object)  # InstallProgress
    install_done = Signal(object, str)  # BackendKey, "" when installed, else why not
    fit_refused = Signal(str, str)  # model, the refusal with its numbers: the window may load anyway
    model_added = Signal(str)  # an imported model's name, or one added from the Hub
    downloads_changed = Signal(list)  # [DownloadRecord]: a download started, paused, ended...
    download_progress = Signal(object)  # DownloadProgress
    hub_results = Signal(str, list)  # query, [HubResult]
    hub_failed = Signal(str, str)  # query, why the search failed
    suggestion_ready = Signal(object)  # Suggestion | None: the first-run welcome's model
    reply_started = Signal()
    reply_delta = Signal(object)  # ChatDelta
    reply_card = Signal(object)  # RunCard: what produced the reply, just before reply_finished
    reply_finished = Signal(object)  # ChatDone: how the reply ended, with its telemetry
    reply_failed = Signal(str)  # the error, with the engine's last words when it does not quote them
    reply_tool = Signal(
        object
    )  # a ToolEvent of the reply in flight: a call started or ended, or none offered
    tool_permission = Signal(object)  # ToolRequest: ask the user; answer with answer_tool(call_id, ...)
    mcp_changed = Signal(list)  # [McpServerView]: every MCP server as it is now, after a change
    mcp_failed = Signal(str)  # why an MCP server could not be added, changed or removed
    context_counted = Signal(int, object)  # the count's ask id, ContextCount | None (nothing known)
    context_reloaded = Signal(bool)  # the model runs with its larger context (False: the reload failed)
    summary_ready = Signal(object)  # the Summary the model wrote, for a new chat (None: it failed)
    notify = Signal(str, str, bool)  # title, message, is an error
    error = Signal(str)  # something the user must be told
    api_changed = Signal(str, str)  # the local API's URL ("" when off), why it is off when it should be on
    api_request = Signal(object)  # RequestFinished: a reply the local API gave another app
    worker_changed = Signal(object)  # WorkerChanged: this machine's RPC worker started, stopped, failed
    remote_changed = Signal(object)  # RemoteChanged: a remote moved between states, or its models changed
    remotes_changed = Signal(list)  # [RemoteSnapshot]: every remote as it is now, after a RemoteChanged
    remote_added = Signal(str)  # a remote's name, once kept (its key in the keychain)
    remote_failed = Signal(str)  # why a remote could not be added or removed
    router_ready = Signal()  # start() made the router: intents reach it from now on
    attachment_ready = Signal(object, object)  # Ingested, TokenCount: a file read (and counted) for a message
    attachment_refused = Signal(str)  # why a file was not attached, or why the composer's message did not go
    attachments_kept = Signal(
        list
    )  # [AttachmentRef]: the composer's attachments are kept; its message may go
    attachment_read = Signal(str, object)  # a kept attachment's sha256, its bytes or Unreadable
    attachment_counted = Signal(str, object)  # sha256, TokenCount: counted again (the model loaded)

    def __init__(
        self, settings: Settings, parent: QObject | None = None, attachments: AttachmentStore | None = None
    ) -> None:
        super().__init__(parent)
        self._settings = settings
        self._attachments = attachments or attachment_store()
        self._router: Router | None = None  # made by start()
        self._unsubscribe = lambda: None
        self.warnings: list[str] = []  # the router's, once started
        self._tasks: set[asyncio.Task[Any]] = set()
        # Unloads are never cancelled: an engine stop cut short would leave its process unreaped.
        self._stopping: set[asyncio.Task[Any]] = set()
        self._chat: asyncio.Task[None] | None = None
        self._asking: dict[str, asyncio.Future[Permission]] = {}  # tool calls waiting on the user, by id
        self._count: asyncio.Task[None] | None = None
        self._bench: asyncio.Task[None] | None = None
        self._views: dict[str, ModelView] = {}  # the last statuses read, for the widgets' lookups
        # The statuses are read in a thread, while the router goes on: a read tells what it saw by the
        # count of router events handled when it began, and one that began before the last rows emitted
        # is dropped (rows never go back in time).
        self.events_seen = 0
        self.rows_as_of = 0  # events_seen when the read of the rows last emitted began
        self.info: SystemInfo | None = None
        self._api: ApiServer | None = None
        self._api_port = -1  # the port asked for (0: any free one), while it runs
        self.selected = ""  # the model the window shows: a message is meant for it
        self._refresh = QTimer(self)
        self._refresh.setSingleShot(True)
        self._refresh.setInterval(REFRESH_MS)
        self._refresh.timeout.connect(self.refresh)
        self.shut_down = False

    @property
    def router(self) -> Router:
        if self._router is None:
            raise RuntimeError("Bridge.start() makes the router: nothing reaches it before")
        return self._router

    @property
    def started(self) -> bool:
        return self._router is not None

    async def start(self) -> None:
        """Make the router (in a worker thread: its constructor reads files), show the models, then
        ``await router.start()`` (engines an earlier run left are stopped), watch the remotes, probe the
        backends and resume the downloads the last run left unfinished."""
        router = await asyncio.to_thread(Router, self._settings)
        self._router = router
        self._unsubscribe = router.subscribe(self._on_event)
        self.warnings = list(router.warnings)
        self.router_ready.emit()
        await self._read_statuses()  # the rows first: the rest takes a while
        await router.start()
        router.remotes.watch()
        self.remotes_changed.emit(router.remotes.snapshots())
        router.mcp.start()  # the enabled MCP servers, whose tools the chat offers models
        self.mcp_changed.emit(router.mcp.servers())
        await self._refresh_backends()
        await router.open_downloads()
        self.downloads_changed.emit(router.download_records())
        await self._read_statuses()  # the fits, now that the hardware is known

    # --- what the window reads ------------------------------------------------------------------------

    def rows(self) -> list[ModelView]:
        return list(self._views.values())

    def loaded(self) -> list[str]:
        return self.router.loaded()

    def options(self, name: str) -> ModelOptions:
        return self.router.options(name)

    def engine_log(self, name: str) -> tuple[list[str], Path | None]:
        """The engine's recent output (its bounded buffer) and its log file."""
        engine = self.router.engines.get(name)
        return (list(engine.lines), engine.log_path) if engine else ([], None)

    def remotes(self) -> list[RemoteSnapshot]:
        return self.router.remotes.snapshots()

    def chat_target(self, model: str | None = None) -> str:
        """The model a message meant for ``model`` (else the selected one) goes to, as the router
        decides from the statuses last read."""
        on_disk = {name for name, view in self._views.items() if view.on_disk}
        return self.router.chat_target(self.selected if model is None else model, on_disk)

    # --- tasks ----------------------------------------------------------------------------------------

    def spawn(self, job: Coroutine[Any, Any, Any], *, stops_engines: bool = False) -> asyncio.Task[Any]:
        """Run ``job`` as a task kept until it ends; a LemonDeskError it raises is told to the user.
        Quitting cancels it, unless it ``stops_engines``: then quitting waits for it."""
        task = asyncio.ensure_future(job)
        (self._stopping if stops_engines else self._tasks).add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        self._stopping.discard(task)
        if task.cancelled() or self.shut_down:
            return
        err = task.exception()
        if isinstance(err, LemonDeskError):
            self.error.emit(str(err))
        elif err is not None:
            log.error("a bridge task failed", exc_info=err)
            self.error.emit(f"Something went wrong: {err!r}. The log has the details.")

    # --- router events --------------------------------------------------------------------------------

    def _on_event(self, event: RouterEvent) -> None:
        if self.shut_down:
            return  # what the engines do while the app quits is for no one
        self.events_seen += 1
        if isinstance(event, ModelsChanged | DownloadProgress | DownloadChanged):
            if not self._refresh.isActive():
                self._refresh.start()
            if isinstance(event, DownloadProgress):
                self.download_progress.emit(event)
            elif isinstance(event, DownloadChanged):
                self.downloads_changed.emit(self.router.download_records())
        elif isinstance(event, EngineStateChanged):
            self._engine_changed(event)
        elif isinstance(event, EngineUsage):
            self.usage_changed.emit(event)
        elif isinstance(event, SystemSample):
            self.system_sampled.emit(event)
        elif isinstance(event, LoadProgress):
            self.load_progress.emit(event)
        elif isinstance(event, InstallProgress):
            self.install_progress.emit(event)
        elif isinstance(event, InstallFinished | Uninstalled):
            self.spawn(self._refresh_backends())
        elif isinstance(event, EngineRecovery):
            self.recovery.emit(event)
        elif isinstance(event, RequestFinished) and event.source is RequestSource.API:
            self.api_request.emit(event)  # the window's own replies reach the charts from the chat
        elif isinstance(event, WorkerChanged):
            self.worker_changed.emit(event)
        elif isinstance(event, RemoteChanged):
            self.remotes_changed.emit(self.router.remotes.snapshots())
            self.remote_changed.emit(event)
        elif isinstance(event, McpServerChanged):
            self.mcp_changed.emit(self.router.mcp.servers())

    def _engine_changed(self, event: EngineStateChanged) -> None:
        if event.state is EngineState.STARTING:
            name = event.model
            self.router.engines.follow_output(name, lambda line: self.engine_output.emit(name, line))
        self.router.sample_usage(bool(self.router.loaded()))
        self.engine_changed.emit(event)

    def refresh(self) -> asyncio.Task[None]:
        return self.spawn(self._read_statuses())

    async def _read_statuses(self) -> None:
        seen = self.events_seen
        views = await asyncio.to_thread(self.router.statuses)
        if seen < self.rows_as_of:
            return  # a read that began later was emitted first
        self.rows_as_of = seen
        self._views = {v.name: v for v in sorted(views, key=lambda v: v.name)}
        if not self.shut_down:
            self.models_changed.emit(self.rows())

    async def _refresh_backends(self) -> None:
        self.info = await self.router.backends.info()
        self.backends_changed.emit(self.info)

    # --- models ---------------------------------------------------------------------------------------

    def model(self, name: str) -> ModelView | None:
        return self._views.get(name)

    def import_model(self, path: str) -> asyncio.Task[None]:
        return self.spawn(self._import(Path(path)))

    async def _import(self, path: Path) -> None:
        model = await asyncio.to_thread(self.router.catalog.import_path, path)
        await self._read_statuses()
        self.model_added.emit(model.name)

    def delete(self, name: str) -> asyncio.Task[None]:
        return self.spawn(self._delete(name))

    async def _delete(self, name: str) -> None:
        said = await self.router.delete(name)
        self.notify.emit("Removed", said, False)

    def save_options(self, name: str, options: ModelOptions) -> None:
        try:
            self.router.save_options(name, options)
        except LemonDeskError as err:
            self.error.emit(str(err))

    def set_pinned(self, name: str, pinned: bool) -> None:
        try:
            self.router.set_pinned(name, pinned)
        except LemonDeskError as err:
            self.error.emit(str(err))

    def download(self, name: str) -> asyncio.Task[None]:
        return self.spawn(self._download(name))

    async def _download(self, name: str) -> None:
        await self.router.pull(name)
        self.notify.emit("Downloaded", f"{name} is ready to load.", False)

    def cancel_download(self, name: str, keep_partial: bool = False) -> asyncio.Task[None]:
        return self.spawn(self.router.cancel_download(name, keep_partial=keep_partial))

    def pause_download(self, name: str) -> asyncio.Task[None]:
        return self.spawn(self.router.pause_download(name))

    def resume_download(self, name: str) -> asyncio.Task[None]:
        return self.spawn(self.router.resume_download(name))

    def measure_fit(self, name: str) -> asyncio.Task[None]:
        return self.spawn(self.router.measure_fit(name))

    def search_hub(self, query: str, recipe: str | None, context: int) -> asyncio.Task[None]:
        return self.spawn(self._search_hub(query, recipe, context))

    async def _search_hub(self, query: str, recipe: str | None, context: int) -> None:
        try:
            results = await self.router.search_hub(query, recipe, context=context)
        except LemonDeskError as err:
            self.hub_failed.emit(query, str(err))
            return
        self.hub_results.emit(query, results)

    def add_from_hub(self, ref: str) -> asyncio.Task[None]:
        return self.spawn(self._add_from_hub(ref))

    async def _add_from_hub(self, ref: str) -> None:
        model = await self.router.add(ref)
        await self._read_statuses()
        self.model_added.emit(model.name)

    def suggest(self) -> asyncio.Task[None]:
        return self.spawn(self._suggest())

    async def _suggest(self) -> None:
        self.suggestion_ready.emit(await self.router.suggestion())

    # --- engines --------------------------------------------------------------------------------------

    def load(
        self,
        name: str,
        options: ModelOptions | None = None,
        *,
        force: bool = False,
        without: tuple[str, ...] = (),
    ) -> asyncio.Task[None]:
        """One-click: downloads the model and installs its backend first when needed. ``without``: the
        RPC workers (``host:port``) its last load used that this one leaves out (lost ones)."""
        return self.spawn(self._load(name, options, force, without))

    async def _load(
        self, name: str, options: ModelOptions | None, force: bool, without: tuple[str, ...]
    ) -> None:
        if is_remote_model(name):
            await self._load_remote(name)
            return
        if without:
            task = self.router.reload_without(name, without)
        else:
            task = self.router.load(name, options, force=force)
        await asyncio.wait([task])
        if task.cancelled():
            return
        err = task.exception()
        if err is None:
            self.notify.emit("Model loaded", f"{name} is ready.", False)
        elif isinstance(err, FitError):
            self.fit_refused.emit(name, str(err))
        else:
            self.notify.emit(f"{name} did not load", str(err), True)

    async def _load_remote(self, name: str) -> None:
        try:
            await self.router.remotes.load(name)
        except LemonDeskError as err:
            self.notify.emit(f"{name} did not load", str(err), True)
            return
        view = self.router.remotes.model(name)
        if view is not None and view.status is RemoteModelStatus.LOADED:
            self.notify.emit("Model loaded", f"{name} is ready on its remote.", False)
        else:
            self.notify.emit("Model ready", f"{name} loads on its remote with the first message.", False)

    def cancel_load(self, name: str) -> None:
        self.router.cancel_load(name)

    def unload(self, name: str) -> asyncio.Task[None]:
        # A remote's unload is a request to another machine: quitting does not wait for it.
        return self.spawn(self.router.unload(name), stops_engines=not is_remote_model(name))

    def unload_all(self) -> asyncio.Task[None]:
        return self.spawn(self.router.unload_all(), stops_engines=True)

    # --- backends -------------------------------------------------------------------------------------

    def install(self, recipe: str, backend: str) -> asyncio.Task[None]:
        return self.spawn(self._install(recipe, backend))

    async def _install(self, recipe: str, backend: str) -> None:
        key = BackendKey(recipe, backend)
        task = self.router.backends.install(key)
        await asyncio.wait([task])
        if task.cancelled():
            self.install_done.emit(key, "Cancelled: nothing was installed.")
        elif (err := task.exception()) is not None:
            self.install_done.emit(key, str(err))
        else:
            self.install_done.emit(key, "")
        await self._refresh_backends()

    def cancel_install(self, recipe: str, backend: str) -> None:
        self.router.backends.cancel_install(BackendKey(recipe, backend))

    def uninstall(self, recipe: str, backend: str) -> asyncio.Task[None]:
        return self.spawn(self._uninstall(recipe, backend))

    async def _uninstall(self, recipe: str, backend: str) -> None:
        await self.router.backends.uninstall(BackendKey(recipe, backend))
        await self._refresh_backends()

    def apply_settings(self, settings: Settings) -> None:
        try:
            self.router.apply_settings(settings)
        except LemonDeskError as err:
            self.error.emit(str(err))
        self.spawn(self._refresh_backends())

    def sync_worker(self) -> asyncio.Task[None]:
        """Run (or stop) this machine's RPC worker as the Settings say; ``worker_changed`` tells how."""
        return self.spawn(self.router.sync_worker())

    # --- remotes --------------------------------------------------------------------------------------

    def add_remote(self, name: str, url: str, key: str) -> asyncio.Task[None]:
        """Keep a remote (its key, if any, in the keychain); ``remote_added`` or ``remote_failed``."""
        return self.spawn(self._add_remote(name, url, key or None))

    async def _add_remote(self, name: str, url: str, key: str | None) -> None:
        try:
            await self.router.remotes.add(name, url, key)
        except LemonDeskError as err:
            self.remote_failed.emit(str(err))
            return
        self.remote_added.emit(name)

    def remove_remote(self, name: str) -> asyncio.Task[None]:
        return self.spawn(self._remove_remote(name))

    async def _remove_remote(self, name: str) -> None:
        try:
            await self.router.remotes.remove(name)
        except LemonDeskError as err:
            self.remote_failed.emit(str(err))

    # --- the local API ----------------------------------------------------------------------------------

    def serve(self, enabled: bool, port: int, ollama_port: int = 0) -> asyncio.Task[None]:
        """Run the local API on 127.0.0.1:``port``, and on ``ollama_port`` too unless 0 (or stop it);
        ``api_changed`` tells the outcome."""
        return self.spawn(self._serve(enabled, port, ollama_port))

    async def _serve(self, enabled: bool, port: int, ollama_port: int) -> None:
        from app.supervisor.api import ApiServer  # aiohttp: after the window shows, not before

        if self._api is not None:
            if enabled and self._api_port == port:
                await self._serve_ollama(self._api, ollama_port)
                return
            await self._api.stop()
            self._api = None
        if not enabled:
            self.api_changed.emit("", "")
            return
        server = ApiServer(self.router, "127.0.0.1", port)
        try:
            await server.start()
        except LemonDeskError as err:
            self.api_changed.emit(
                "", f"{err.message} Lemon Desk runs without it: choose another port in Settings."
            )
            return
        self._api, self._api_port = server, port
        self.api_changed.emit(server.url, "")
        await self._serve_ollama(server, ollama_port)

    async def _serve_ollama(self, server: ApiServer, port: int) -> None:
        """The API on Ollama's port too (0: not); a port taken is said, and the API goes on without it."""
        try:
            await server.listen_ollama(port)
        except LemonDeskError as err:
            self.api_changed.emit(
                server.url, f"{err.message} The local API goes on without it: change the port in Settings."
            )

    # --- chat -----------------------------------------------------------------------------------------

    def send(
        self,
        model: str,
        messages: list[dict[str, str]],
        params: dict[str, Any],
        conversation: str | None = None,
        servers: list[str] | None = None,
    ) -> None:
        """Ask for a reply meant for ``model`` (the router says which model gets it: that one, or the
        one used last) in the chat ``conversation`` (its turns keep their prompt cache); the reply comes
        as ``reply_started``, ``reply_delta``... or ``reply_failed``. ``servers``: the MCP servers whose
        tools the model may call (None: every ready one; empty: none)."""
        self.stop_reply()
        target = self.chat_target(model)
        if not target:
            self.reply_failed.emit("No model is loaded. Load one from the Models list, then send again.")
            return
        self._chat = self.spawn(self._stream(target, messages, params, conversation, servers))

    def count_context(
        self, asked: int, messages: list[dict[str, Any]], params: dict[str, Any], servers: list[str]
    ) -> None:
        """Count what ``messages`` (their attachments read as a send reads them) and the tools of the MCP
        servers ``servers`` take of the context of the model a send goes to, in a task (the engine's
        tokenizer answers over HTTP); ``context_counted`` carries the count with ``asked``."""
        if self._count is not None:
            self._count.cancel()  # a newer question replaces it
        target = self.chat_target() if self.started else ""
        self._count = self.spawn(self._count_context(asked, target, messages, params, servers))

    async def _count_context(
        self,
        asked: int,
        target: str,
        messages: list[dict[str, Any]],
        params: dict[str, Any],
        servers: list[str],
    ) -> None:
        count = None
        if target:
            try:
                sent = await self._expanded(messages)
                count = await self.router.count_context(target, sent, params, servers)
            except LemonDeskError as err:
                log.info("the context of %s was not counted: %s", target, err)
        self.context_counted.emit(asked, count)

    def reload_with_context(self, ctx_size: int) -> asyncio.Task[None]:
        """Load the model a send goes to again with a context of ``ctx_size`` (kept in its options)."""
        return self.spawn(self._reload_with_context(self.chat_target(), ctx_size))

    async def _reload_with_context(self, name: str, ctx_size: int) -> None:
        task = self.router.reload_with_context(name, ctx_size)
        await asyncio.wait([task])
        err = None if task.cancelled() else task.exception()
        if err is not None:
            self.notify.emit(f"{name} did not load with {ctx_size:,} tokens of context", str(err), True)
        self.context_reloaded.emit(err is None and not task.cancelled())

    def summarize(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> asyncio.Task[None]:
        """Have the model a send goes to summarize the chat ``messages`` (their attachments read as a send
        reads them); ``summary_ready`` has it."""
        return self.spawn(self._summarize(self.chat_target(), messages, params))

    async def _summarize(self, name: str, messages: list[dict[str, Any]], params: dict[str, Any]) -> None:
        summary: Summary | None = None
        try:
            summary = await self.router.summarize(name, await self._expanded(messages), params)
        except LemonDeskError as err:
            self.notify.emit("The chat was not summarized", self.router.failure_message(name, err), True)
        self.summary_ready.emit(summary)

    async def _expanded(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``messages`` with their attachments read into their content, as the engine gets them (the
        kept files are read in a worker thread)."""
        if any("attachments" in m for m in messages):
            return await asyncio.to_thread(expand_messages, self._attachments, messages)
        return messages

    def stop_reply(self) -> None:
        """Cancel the reply in flight; its stream is closed as the task unwinds."""
        if self._chat is not None and not self._chat.done():
            self._chat.cancel()
        self._chat = None

    async def _stream(
        self,
        target: str,
        messages: list[dict[str, Any]],
        params: dict[str, Any],
        conversation: str | None,
        servers: list[str] | None,
    ) -> None:
        self.reply_started.emit()  # before a load on demand, which may take a while
        messages = await self._expanded(messages)
        try:
            async for event in self.router.chat_with_tools(
                target, messages, ask=self._ask_tool, servers=servers, conversation=conversation, **params
            ):
                if isinstance(event, ChatDelta):
                    self.reply_delta.emit(event)
                elif isinstance(event, TOOL_EVENTS):
                    self.reply_tool.emit(event)
                else:
                    self.reply_card.emit(
                        self.router.run_card(target, params, event.telemetry, event.restored)
                    )
                    self.reply_finished.emit(event)
        except LemonDeskError as err:
            self.reply_failed.emit(self.router.failure_message(target, err))

    async def _ask_tool(self, request: ToolRequest) -> Permission:
        """The router asks before a tool call: the window shows ``tool_permission`` and answers with
        ``answer_tool``. Stop (the reply's task cancelled) drops the question."""
        answer: asyncio.Future[Permission] = asyncio.get_running_loop().create_future()
        self._asking[request.call_id] = answer
        self.tool_permission.emit(request)
        try:
            return await answer
        finally:
            self._asking.pop(request.call_id, None)

    def answer_tool(self, call_id: str, permission: Permission) -> None:
        """The user's answer to ``tool_permission`` (a question no longer asked is ignored)."""
        answer = self._asking.get(call_id)
        if answer is not None and not answer.done():
            answer.set_result(permission)

    # --- MCP servers ----------------------------------------------------------------------------------

    def mcp_servers(self) -> list[McpServerView]:
        return self.router.mcp.servers()

    def put_mcp_server(self, spec: McpServerSpec, token: str | None = None) -> None:
        """Add or replace a server (``token``: an HTTP server's bearer token, into the keychain)."""
        self.spawn(self._mcp_job(self.router.mcp.put(spec, token)))

    def remove_mcp_server(self, name: str) -> None:
        self.spawn(self._mcp_job(self.router.mcp.remove(name)))

    def enable_mcp_server(self, name: str, enabled: bool) -> None:
        self.spawn(self._mcp_job(self.router.mcp.set_enabled(name, enabled)))

    def import_mcp_json(self, path: str) -> None:
        """Add the servers of the mcp.json at ``path`` (read in a worker thread); what it refused is
        said through ``mcp_failed``."""

        async def job() -> None:
            found = await asyncio.to_thread(read_mcp_json, Path(path))
            refused = await self.router.mcp.import_json(found)
            if refused:
                self.mcp_failed.emit("Some servers were not imported:\n" + "\n".join(refused))

        self.spawn(self._mcp_job(job()))

    async def _mcp_job(self, job: Coroutine[Any, Any, Any]) -> None:
        try:
            await job
        except LemonDeskError as err:
            self.mcp_failed.emit(str(err))
        self.mcp_changed.emit(self.router.mcp.servers())

    # --- attachments ----------------------------------------------------------------------------------

    def vision_refusal(self, model: str | None = None) -> str:
        """ "" when the model a message meant for ``model`` (else the selected one) goes to takes images;
        else why not, naming one that does: the library's first, then the catalog's."""
        target = self.chat_target(model) if self.started else ""
        if is_remote_model(target):
            return ""  # what a remote's model takes is for it to say: it refuses an image it cannot see
        view = self._views.get(target)
        ranked = sorted(self._views.values(), key=lambda v: (not v.sees_images, not v.on_disk, v.name))
        seeing = [v.name for v in ranked if v.sees_images or "vision" in v.model.labels]
        return vision_refusal(target, view is not None and view.sees_images, seeing)

    def attach(self, path: str, model: str) -> asyncio.Task[None]:
        """Read a file for the composer (in a worker thread) and count its tokens as the model meant
        (``model``, else the selected one) counts them; ``attachment_ready`` or ``attachment_refused``."""
        return self.spawn(self._attach(lambda: ingest(Path(path)), model))

    def attach_data(self, name: str, data: bytes, model: str) -> asyncio.Task[None]:
        """``attach`` for bytes with no file (a pasted image)."""
        return self.spawn(self._attach(lambda: ingest_data(name, data), model))

    async def _attach(self, read: Callable[[], Ingested], model: str) -> None:
        try:
            taken = await asyncio.to_thread(read)
        except AttachmentError as err:
            self.attachment_refused.emit(str(err))
            return
        if taken.ref.kind is AttachmentKind.IMAGE:
            count = TokenCount(IMAGE_TOKENS_ESTIMATE, exact=False)
        else:
            target = self.chat_target(model) if self.started else ""
            count = (
                await self.router.count_tokens(target, taken.text) if target else estimate_tokens(taken.text)
            )
        self.attachment_ready.emit(taken, count)

    def recount(self, taken: list[Ingested], model: str) -> asyncio.Task[None]:
        """Count the composer's files again (the model they go to loaded, maybe with another context):
        ``attachment_counted`` for each."""
        return self.spawn(self._recount(taken, model))

    async def _recount(self, taken: list[Ingested], model: str) -> None:
        target = self.chat_target(model)
        for item in taken:
            if target and item.ref.kind is AttachmentKind.TEXT:
                self.attachment_counted.emit(
                    item.ref.sha256, await self.router.count_tokens(target, item.text)
                )

    def embedder(self) -> str:
        """The embeddings model retrieval uses: the first on disk, "" when there is none."""
        return next((v.name for v in self.rows() if v.on_disk and "embeddings" in v.model.labels), "")

    def keep_attachments(
        self, items: list[tuple[Ingested, AttachmentRef, int | None]], question: str = "", embedder: str = ""
    ) -> asyncio.Task[None]:
        """Before the composer's message goes: each file (what was read, the reference the message
        gets, a budget or None) must still be where it was attached from; then its content is kept (once,
        by hash). One with a budget (characters) goes as its chunks most related to ``question``, found
        with ``embedder``. ``attachments_kept`` with the references as they go, or ``attachment_refused``."""
        return self.spawn(self._keep(items, question, embedder))

    async def _keep(
        self, items: list[tuple[Ingested, AttachmentRef, int | None]], question: str, embedder: str
    ) -> None:
        taken = [item for item, _ref, _budget in items]

        def keep() -> str:
            gone = next((why for item in taken if (why := still_there(item))), "")
            if not gone:
                for item in taken:
                    self._attachments.put(item.data)
            return gone

        try:
            why = await asyncio.to_thread(keep)
        except OSError as err:
            why = (
                f"The attachments could not be kept in {self._attachments.root} ({err.strerror}). "
                "Free some disk space there, then send again."
            )
        if why:
            self.attachment_refused.emit(why)
            return
        refs = []
        for item, ref, budget in items:
            if budget is None:
                refs.append(ref)
                continue
            try:
                spans = await self.router.retrieve(embedder, item.text, question, budget)
            except LemonDeskError as err:
                self.attachment_refused.emit(
                    f"The parts of {item.ref.name} could not be found with {embedder}: {err}"
                )
                return
            refs.append(ref.retrieved(spans))
        self.attachments_kept.emit(refs)

    def read_attachments(self, refs: list[AttachmentRef]) -> asyncio.Task[None]:
        """Read kept attachments for the transcript (thumbnails; damaged or missing ones are said):
        ``attachment_read`` for each."""
        return self.spawn(self._read_attachments({ref.sha256 for ref in refs}))

    async def _read_attachments(self, hashes: set[str]) -> None:
        found = await asyncio.to_thread(lambda: {sha: self._attachments.read(sha) for sha in hashes})
        for sha, data in found.items():
            self.attachment_read.emit(sha, data)

    # --- telemetry and bench ----------------------------------------------------------------------------

    def watch_system(self, on: bool) -> None:
        """Sample the machine and the engines each second (``system_sampled``) while ``on``."""
        if self.started and not self.shut_down:
            self.router.watch_system(on)

    def run_bench(self, spec: BenchSpec) -> None:
        if self._bench is None or self._bench.done():
            self._bench = self.spawn(self._run_bench(spec))

    async def _run_bench(self, spec: BenchSpec) -> None:
        try:
            run = await bench(self.router, spec, self.bench_progress.emit)
        except asyncio.CancelledError:
            self.bench_failed.emit("Cancelled: nothing was kept from this run.")
            raise
        except LemonDeskError as err:
            self.bench_failed.emit(str(err))
            return
        self.bench_finished.emit(run)

    def cancel_bench(self) -> None:
        if self._bench is not None:
            self._bench.cancel()

    # --- quitting: the stages app.ui.quitting runs, in this order -----------------------------------

    def stop_accepting(self) -> None:
        """No new work: events are no longer passed on, nor tasks' errors told."""
        self.shut_down = True
        self._refresh.stop()

    async def cancel_tasks(self) -> None:
        """Cancel every task (replies in flight close their streams); wait for the unloads under way."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, *self._stopping, return_exceptions=True)

    async def stop_api(self) -> None:
        if self._api is not None:
            await self._api.stop()
            self._api = None

    async def stop_router(self) -> None:
        """Shut the router down: engines stopped, downloads paused (they go on when the window opens
        again)."""
        if self._router is not None:
            await self._router.shutdown(resume_downloads=True)
        self._unsubscribe()
