"""The one place where the window meets the supervisor: supervisor and download events become Qt signals,
and the window's intents (load, unload, send, install, download...) become tasks.

Everything here runs on the Qt thread, which is also the asyncio loop's thread (qasync): listeners are
called there and signals are emitted there. Every task the bridge starts is kept in ``_tasks`` until it
ends, and ``shutdown()`` cancels them, stops every engine and closes the download manager, so quitting
leaves no engine behind. Widgets only see signals and call the plain methods below; they never await.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncGenerator, Coroutine
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import psutil
from PySide6.QtCore import QObject, QTimer, Signal

from app.client.events import ChatDelta, ChatEvent
from app.core.downloads import DownloadState
from app.core.errors import LemonDeskError, ModelError
from app.core.models import Model
from app.core.refs import parse_ref, select
from app.library import GB, Library, ModelState, ModelStatus
from app.store.model_options import ModelOptions, load_model_options, save_model_options
from app.store.paths import home
from app.store.secrets import get_hf_token
from app.store.settings import Settings
from app.supervisor.downloads import DownloadChanged, DownloadEvent, DownloadManager, DownloadProgress
from app.supervisor.engine import EngineState
from app.supervisor.hub import HubClient, gated_error
from app.supervisor.supervisor import (
    EngineStateChanged,
    InstallFinished,
    InstallProgress,
    LoadOptions,
    Supervisor,
    SupervisorEvent,
    Uninstalled,
)
from app.system_info import SystemInfo

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)

USAGE_INTERVAL_MS = 2000  # engine CPU and memory are sampled only while an engine runs
LAST_WORDS = 8  # engine output lines quoted when a reply fails


class RowState(Enum):
    AVAILABLE = "available"  # known (catalog or user), not on this machine
    DOWNLOADING = "downloading"  # a download is queued, running or paused; ``progress`` says how far
    DOWNLOADED = "downloaded"  # on this machine (downloaded or imported), not loaded
    LOADING = "loading"  # its engine is starting
    LOADED = "loaded"  # its engine is ready
    ERROR = "error"  # the last download or load failed; ``message`` says why


@dataclass(frozen=True)
class ModelRow:
    """A model as the Model Manager shows it."""

    name: str
    recipe: str
    size_gb: float
    labels: tuple[str, ...]
    state: RowState
    user: bool
    on_disk: bool  # downloaded or imported: it can be loaded
    progress: int | None = None  # download percent
    message: str = ""


def _row(status: ModelStatus, engine: EngineState | None, error: str, progress: int | None) -> ModelRow:
    model = status.model
    on_disk = status.state in (ModelState.DOWNLOADED, ModelState.LOCAL)
    message = error
    if engine is EngineState.READY:
        state = RowState.LOADED
    elif engine is EngineState.STARTING:
        state = RowState.LOADING
    elif error:
        state = RowState.ERROR
    elif status.state is ModelState.FAILED:
        state, message = RowState.ERROR, status.download.message if status.download else "download failed"
    elif status.state in (ModelState.QUEUED, ModelState.DOWNLOADING, ModelState.PAUSED):
        state = RowState.DOWNLOADING
        if progress is None and status.download is not None and status.download.files.size:
            progress = int(100 * status.download.done_bytes / status.download.files.size)
    else:
        state = RowState.DOWNLOADED if on_disk else RowState.AVAILABLE
    size = status.local.size / GB if status.local and status.local.size else model.size_gb
    return ModelRow(
        model.name, model.recipe, size, model.labels, state, model.user, on_disk, progress, message
    )


class Bridge(QObject):
    models_changed = Signal(list)  # [ModelRow]
    backends_changed = Signal(object)  # SystemInfo
    engine_changed = Signal(str, str, str)  # engine (model) name, EngineState value, message
    engine_output = Signal(str, str)  # engine name, a line it printed
    usage_changed = Signal(str, float, int)  # engine name, CPU %, resident memory in bytes
    install_progress = Signal(str, str, int, int)  # "recipe:backend", phase, bytes done, total (0: unknown)
    install_done = Signal(str, str)  # "recipe:backend", "" when installed, else why not
    model_added = Signal(str)  # an imported model's name
    reply_started = Signal()
    reply_delta = Signal(str, str)  # content, reasoning
    reply_finished = Signal(dict)  # telemetry
    reply_failed = Signal(str)
    notify = Signal(str, str, bool)  # title, message, is an error
    error = Signal(str)  # something the user must be told

    def __init__(self, settings: Settings, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.settings = settings
        self.library = Library(settings)
        self.supervisor = Supervisor(settings, resolve_model=self.library.location)
        self._unsubscribe = [self.supervisor.subscribe(self._on_supervisor)]
        loaded = load_model_options()
        self._options = loaded.items
        self.warnings = [*self.library.warnings, *([loaded.warning] if loaded.warning else [])]
        self._tasks: set[asyncio.Task[Any]] = set()
        # Unloads are never cancelled: an engine stop cut short would leave its process unreaped.
        self._stopping: set[asyncio.Task[Any]] = set()
        self._chat: asyncio.Task[None] | None = None
        self._statuses: dict[str, ModelStatus] = {}
        self._engine_states: dict[str, tuple[EngineState, str]] = {}
        self._errors: dict[str, str] = {}  # model -> why its last load or download failed
        self._progress: dict[str, int] = {}  # model -> download percent
        self._ready: list[str] = []  # loaded models, oldest first
        self._processes: dict[str, psutil.Process] = {}
        self._http: httpx.AsyncClient | None = None
        self._downloads: DownloadManager | None = None
        self.info: SystemInfo | None = None
        self.selected = ""  # the model the window shows: chat goes to it when it is loaded
        self._usage = QTimer(self)
        self._usage.setInterval(USAGE_INTERVAL_MS)
        self._usage.timeout.connect(self._sample_usage)
        self.shut_down = False

    # --- what the window reads ------------------------------------------------------------------------

    def rows(self) -> list[ModelRow]:
        rows = []
        for name, status in sorted(self._statuses.items()):
            state, message = self._engine_states.get(name, (None, ""))
            failed = state in (EngineState.FAILED, EngineState.CRASHED)
            error = message if failed else self._errors.get(name, "")
            rows.append(_row(status, state, error, self._progress.get(name)))
        return rows

    def loaded(self) -> list[str]:
        return list(self._ready)

    def model(self, name: str) -> Model | None:
        status = self._statuses.get(name)
        return status.model if status else None

    def options(self, name: str) -> ModelOptions:
        return self._options.get(name, ModelOptions())

    def engine_log(self, name: str) -> tuple[list[str], Path | None]:
        """The engine's recent output (its bounded buffer) and its log file."""
        engine = self.supervisor.engines.get(name)
        return (list(engine.output), engine.log_path) if engine else ([], None)

    def chat_target(self) -> str:
        """The loaded model a message goes to: the selected one, else the last one loaded."""
        if self.selected in self._ready:
            return self.selected
        return self._ready[-1] if self._ready else ""

    # --- tasks ----------------------------------------------------------------------------------------

    def spawn(self, job: Coroutine[Any, Any, Any], *, stops_engines: bool = False) -> asyncio.Task[Any]:
        """Run ``job`` as a task kept until it ends; a LemonDeskError it raises is told to the user.
        Shutdown cancels it, unless it ``stops_engines``: then shutdown waits for it."""
        task = asyncio.ensure_future(job)
        (self._stopping if stops_engines else self._tasks).add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        self._stopping.discard(task)
        if task.cancelled():
            return
        err = task.exception()
        if isinstance(err, LemonDeskError):
            self.error.emit(str(err))
        elif err is not None:
            log.error("a bridge task failed", exc_info=err)
            self.error.emit(f"Something went wrong: {err!r}. The log has the details.")

    # --- models ---------------------------------------------------------------------------------------

    def refresh(self) -> asyncio.Task[None]:
        return self.spawn(self._refresh())

    async def _refresh(self) -> None:
        statuses = await asyncio.to_thread(self.library.statuses)
        self._statuses = {s.model.name: s for s in statuses}
        self.models_changed.emit(self.rows())
        await self._refresh_backends()

    async def _refresh_backends(self) -> None:
        self.info = await self.supervisor.info()
        self.backends_changed.emit(self.info)

    def import_model(self, path: str) -> asyncio.Task[None]:
        return self.spawn(self._import(Path(path)))

    async def _import(self, path: Path) -> None:
        model = await asyncio.to_thread(self.library.import_path, path)
        await self._refresh()
        self.model_added.emit(model.name)

    def delete(self, name: str) -> asyncio.Task[None]:
        return self.spawn(self._delete(name))

    async def _delete(self, name: str) -> None:
        if name in self.supervisor.engines:
            await self._unload(name)
        said = await asyncio.to_thread(self.library.remove, name)
        self._errors.pop(name, None)
        self._options.pop(name, None)
        await self._refresh()
        self.notify.emit("Removed", said, False)

    def save_options(self, name: str, options: ModelOptions) -> None:
        self._options[name] = options
        try:
            save_model_options(self._options)
        except OSError as err:
            self.error.emit(
                f"Could not save the options of {name}: {err.strerror}. Check that {home()} is writable."
            )

    # --- downloads ------------------------------------------------------------------------------------

    def download(self, name: str) -> asyncio.Task[None]:
        return self.spawn(self._download(name))

    async def _download(self, name: str) -> None:
        model = self.library.resolve(name)
        if model.repo_id is None:
            raise ModelError(f"{name} is a local model: there is nothing to download.")
        self._errors.pop(name, None)
        if self._http is None:
            import httpx

            self._http = httpx.AsyncClient()
        hub = HubClient(self._http, token=await asyncio.to_thread(get_hf_token))
        ref = parse_ref(model.checkpoint)
        listing = await hub.listing(ref.repo_id)
        if listing.gated and not hub.token:
            raise gated_error(ref.repo_id, hub.endpoint)
        files = select(listing, ref, model.recipe or None)
        if model.user:
            model = dataclasses.replace(model, recipe=files.recipe, size_gb=round(files.size / GB, 3))
            await asyncio.to_thread(self.library.register, model)
        if self._downloads is None:
            self._downloads = DownloadManager(self.library.cache_root, hub)
            self._unsubscribe.append(self._downloads.subscribe(self._on_download))
        self._downloads.submit(model.checkpoint, model.name, files)
        self._progress[name] = 0
        await self._refresh()
        record = await self._downloads.wait(model.checkpoint)
        self._progress.pop(name, None)
        if record.state is DownloadState.FAILED:
            self._errors[name] = f"download failed: {record.message}"
        await self._refresh()

    def cancel_download(self, name: str) -> None:
        model = self.model(name)
        if self._downloads is not None and model is not None:
            self.spawn(self._downloads.cancel(model.checkpoint))

    def _on_download(self, event: DownloadEvent) -> None:
        name = next((n for n, s in self._statuses.items() if s.model.checkpoint == event.id), event.id)
        if isinstance(event, DownloadProgress):
            self._progress[name] = int(100 * event.done / event.total) if event.total else 0
        elif isinstance(event, DownloadChanged) and not event.state.active:
            self._progress.pop(name, None)
        self.models_changed.emit(self.rows())

    # --- engines --------------------------------------------------------------------------------------

    def load(self, name: str, options: ModelOptions | None = None) -> asyncio.Task[None]:
        return self.spawn(self._load(name, options or self.options(name)))

    async def _load(self, name: str, options: ModelOptions) -> None:
        model = self.library.resolve(name)
        self._errors.pop(name, None)
        for old in self._ready[: max(0, len(self._ready) - self.settings.max_loaded_models + 1)]:
            if old != name:
                await self._unload(old)  # over the limit: the oldest goes first
        task = self.supervisor.load(model, LoadOptions(options.backend, options.ctx_size, options.args))
        await asyncio.wait([task])
        if task.cancelled():
            return
        err = task.exception()
        if err is None:
            self.notify.emit("Model loaded", f"{name} is ready.", False)
            return
        message = str(err)
        self._errors[name] = message
        self.models_changed.emit(self.rows())
        self.notify.emit(f"{name} did not load", message, True)

    def unload(self, name: str) -> asyncio.Task[None]:
        return self.spawn(self.supervisor.unload(name), stops_engines=True)

    def unload_all(self) -> asyncio.Task[None]:
        return self.spawn(self._unload_all(), stops_engines=True)

    async def _unload_all(self) -> None:
        for name in list(self.supervisor.engines):
            await self.supervisor.unload(name)

    async def _unload(self, name: str) -> None:
        """Unload from inside a task that may be cancelled: the stop itself runs on to its end."""
        await asyncio.shield(self.unload(name))

    def _on_supervisor(self, event: SupervisorEvent) -> None:
        if isinstance(event, EngineStateChanged):
            self._engine_changed(event)
        elif isinstance(event, InstallProgress):
            self.install_progress.emit(event.key, event.phase.value, event.done, event.total or 0)
        elif isinstance(event, InstallFinished | Uninstalled):
            self.spawn(self._refresh_backends())

    def _engine_changed(self, event: EngineStateChanged) -> None:
        name, state = event.engine_id, event.state
        self._engine_states[name] = (state, event.message)
        engine = self.supervisor.engines.get(name)
        if state is EngineState.STARTING and engine is not None:
            engine.add_output_listener(lambda line: self.engine_output.emit(name, line))
        if name in self._ready:
            self._ready.remove(name)
        self._processes.pop(name, None)
        if state is EngineState.READY:
            self._ready.append(name)
            if engine is not None and engine.pid is not None:
                with contextlib.suppress(psutil.Error):
                    self._processes[name] = psutil.Process(engine.pid)
        if state is EngineState.CRASHED:
            self.notify.emit(f"{name} stopped", event.message, True)
        if self._processes and not self._usage.isActive():
            self._usage.start()
        elif not self._processes:
            self._usage.stop()
        self.engine_changed.emit(name, state.value, event.message)
        self.models_changed.emit(self.rows())

    def _sample_usage(self) -> None:
        for name, proc in list(self._processes.items()):
            try:
                with proc.oneshot():
                    self.usage_changed.emit(name, proc.cpu_percent(None), proc.memory_info().rss)
            except psutil.Error:
                self._processes.pop(name, None)

    # --- backends -------------------------------------------------------------------------------------

    def install(self, recipe: str, backend: str) -> asyncio.Task[None]:
        return self.spawn(self._install(recipe, backend))

    async def _install(self, recipe: str, backend: str) -> None:
        key = f"{recipe}:{backend}"
        task = self.supervisor.install(recipe, backend)
        await asyncio.wait([task])
        if task.cancelled():
            self.install_done.emit(key, "Cancelled: nothing was installed.")
        elif (err := task.exception()) is not None:
            self.install_done.emit(key, str(err))
        else:
            self.install_done.emit(key, "")
        await self._refresh_backends()

    def cancel_install(self, recipe: str, backend: str) -> None:
        self.supervisor.cancel(f"install:{recipe}:{backend}")

    def uninstall(self, recipe: str, backend: str) -> asyncio.Task[None]:
        return self.spawn(self._uninstall(recipe, backend))

    async def _uninstall(self, recipe: str, backend: str) -> None:
        await self.supervisor.uninstall(recipe, backend)
        await self._refresh_backends()

    # --- chat -----------------------------------------------------------------------------------------

    def send(self, _conversation_id: str, messages: list[dict[str, str]], params: dict[str, Any]) -> None:
        self.stop_reply()
        target = self.chat_target()
        if not target:
            self.reply_failed.emit("No model is loaded. Load one from the Models list, then send again.")
            return
        self._chat = self.spawn(self._stream(target, messages, params))

    def stop_reply(self) -> None:
        """Cancel the reply in flight; its stream is closed as the task unwinds."""
        if self._chat is not None and not self._chat.done():
            self._chat.cancel()
        self._chat = None

    async def _stream(self, target: str, messages: list[dict[str, str]], params: dict[str, Any]) -> None:
        try:
            async with self.supervisor.chat_client(target) as client:
                # A stop cancels this task; closing the generator closes the HTTP stream with it.
                stream = cast(AsyncGenerator[ChatEvent, None], client.stream_chat(messages, **params))
                async with contextlib.aclosing(stream):
                    self.reply_started.emit()
                    async for event in stream:
                        if isinstance(event, ChatDelta):
                            self.reply_delta.emit(event.content, event.reasoning)
                        else:
                            self.reply_finished.emit(dataclasses.asdict(event.telemetry))
        except LemonDeskError as err:
            self.reply_failed.emit(self._with_last_words(target, str(err)))

    def _with_last_words(self, target: str, message: str) -> str:
        engine = self.supervisor.engines.get(target)
        words = engine.last_output(LAST_WORDS) if engine else ""
        if not words or words in message:
            return message
        return f"{message}\n\nThe engine's last words:\n{words}"

    # --- quitting -------------------------------------------------------------------------------------

    async def shutdown(self) -> None:
        """Cancel every task, stop every engine and close downloads: nothing is left running."""
        self.shut_down = True
        self._usage.stop()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, *self._stopping, return_exceptions=True)
        await self.supervisor.shutdown()
        if self._downloads is not None:
            await self._downloads.close()
        if self._http is not None:
            await self._http.aclose()
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._unsubscribe = []
