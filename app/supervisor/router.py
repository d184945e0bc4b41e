"""The router: the one owner of what runs. The window (through the bridge), the tray, the CLI and the
local API are front ends over it and call the same methods.

It owns the supervisor (engines and backend installs), the download manager, the loading policy
(``app.core.policy``: caps, LRU by last load or request, pins, idle unload), one-click loads (download,
install, fit check, evict, launch: one ``LoadProgress`` event per phase), recovery (a crashed or hung
engine restarts with the same options after 1 s, 5 s, 30 s; three crashes in five minutes and it gives
up, with the engine's last words), engine CPU and memory samples, and the per-model facts from which
``app.core.status.model_status`` derives the one status every front end shows.

Every event reaches subscribers as a plain dataclass on the loop thread: the supervisor's and the
download manager's are passed on, and the router adds its own below. asyncio only, no Qt.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import shlex
import time
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import psutil

from app.client.chat import ChatClient, Messages
from app.client.events import ChatDone, ChatEvent, ChatReply
from app.core.backends import BackendKind, BackendState
from app.core.bench import BenchRun, BenchSpec, hardware_summary, known_version
from app.core.downloads import INTERRUPTED, DownloadRecord, DownloadState
from app.core.engine_state import EngineState
from app.core.errors import EngineError, LemonDeskError, ModelError
from app.core.fit import (
    DEFAULT_CONTEXT,
    SIZE_ONLY,
    BandwidthCap,
    FitEstimate,
    ModelShape,
    check_live_fit,
    download_cap,
    estimate,
    largest_context,
    memory_budget,
)
from app.core.gguf import HEADER_FIRST
from app.core.launch import DEFAULT_CTX_SIZE, LaunchRequest, engine_device
from app.core.lemon_mlx import DeviceType
from app.core.models import Model
from app.core.policy import (
    CRASH_LIMIT,
    CRASH_WINDOW_S,
    RAISE_LIMIT,
    RESTART_BACKOFF_S,
    STABLE_S,
    LoadedModel,
    over_caps,
    parse_caps,
    plan_evictions,
    restart_delay,
)
from app.core.quirks import effective_labels
from app.core.refs import FileSet, parse_ref, select
from app.core.remotes import is_remote_model
from app.core.rpc import (
    LOCAL_ONLY,
    Endpoint,
    WorkerInfo,
    exposure_warning,
    memory_by_device,
    parse_endpoint,
    worker_endpoint,
    workers_for,
)
from app.core.runcard import RunCard, figures, quant_of
from app.core.status import LoadPhase, ModelFacts, ModelStatus, model_status
from app.core.suggest import suggest
from app.core.telemetry import Telemetry, TelemetryTotals
from app.platform import detect_hardware, free_memory
from app.store.bench_results import save_run
from app.store.downloads import load_downloads
from app.store.hfcache import RepoCache
from app.store.library import GB, Library, ModelState
from app.store.library import ModelStatus as DiskStatus
from app.store.model_options import ModelOptions, load_model_options, save_model_options
from app.store.model_paths import gguf_architecture, local_parameter_count, local_shape
from app.store.paths import home
from app.store.quirks import load_quirks
from app.store.secrets import get_hf_token
from app.store.settings import Settings
from app.supervisor.bench import BenchProgress, run_bench
from app.supervisor.collections import Collections
from app.supervisor.downloads import (
    DownloadChanged,
    DownloadEvent,
    DownloadManager,
    DownloadProgress,
    DownloadSnapshot,
    recovered,
)
from app.supervisor.engine import Engine
from app.supervisor.hub import HubClient, gated_error
from app.supervisor.hubsearch import HubResult, search
from app.supervisor.listeners import Listeners
from app.supervisor.modelmeta import remote_parameter_count, remote_shape
from app.supervisor.remotes import RemoteChanged, Remotes
from app.supervisor.rpc import (
    Worker,
    WorkerChanged,
    check_workers,
    engine_protocol,
    rpc_server_binary,
    worker_plan,
)
from app.supervisor.sampler import Sampler, SystemSample
from app.supervisor.supervisor import (
    EngineStateChanged,
    InstallProgress,
    LoadOptions,
    Supervisor,
    SupervisorEvent,
)

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)

IDLE_CHECK_S = 30.0
USAGE_INTERVAL_S = 2.0
SYSTEM_INTERVAL_S = 1.0  # the Telemetry view's charts, while it is watched


# --- events -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadProgress:
    """A one-click load entered a phase, or moved on within it."""

    model: str
    phase: LoadPhase
    done: int = 0  # bytes, in the download and install phases
    total: int = 0
    detail: str = ""


@dataclass(frozen=True)
class ModelsChanged:
    """The facts behind some models' statuses changed: front ends read ``statuses()`` again."""

    names: tuple[str, ...]


@dataclass(frozen=True)
class EngineUsage:
    model: str
    cpu_percent: float
    rss_bytes: int


@dataclass(frozen=True)
class EngineRecovery:
    model: str
    message: str  # what happened and what the router does about it
    gave_up: bool  # True: the engine stays down until someone loads it again


class RequestSource(Enum):
    CHAT = "chat"  # the window's chat pane or the CLI
    API = "api"  # a request through the local API


@dataclass(frozen=True)
class RequestFinished:
    """A reply ended: its figures, for the telemetry charts and the API's ``GET stats``."""

    model: str
    source: RequestSource
    telemetry: Telemetry


RouterEvent = (
    SupervisorEvent
    | DownloadEvent
    | LoadProgress
    | ModelsChanged
    | EngineUsage
    | EngineRecovery
    | BenchProgress
    | SystemSample
    | RequestFinished
    | WorkerChanged
    | RemoteChanged
)


@dataclass(frozen=True)
class Suggestion:
    """The model the first-run welcome offers, with what a person needs to decide."""

    model: Model
    size_bytes: int
    fit: FitEstimate
    reason: str  # why this one
    speed_bps: float | None  # the Hub's speed, measured by reading the model's header; None if unknown
    note: str = ""  # why the Hub could not be asked, when it could not

    @property
    def download_s(self) -> float | None:
        return self.size_bytes / self.speed_bps if self.speed_bps else None


Listener = Callable[[RouterEvent], None]


@dataclass(frozen=True)
class ModelView:
    """A model as every front end shows it: what it is, where its files are, and its one status."""

    model: Model
    status: ModelStatus
    on_disk: bool
    size_bytes: int
    disk: DiskStatus
    fit: FitEstimate | None = None  # at the model's context; None until the hardware is known
    fit_exact: bool = False  # False: by size alone (the header is not read yet), a lower bound
    fit_note: str = ""  # why the header could not be read, when it could not
    context_window: int | None = None  # the context the model was trained for, once its header is read
    memory: dict[str, int] = dataclasses.field(default_factory=dict)  # loaded: bytes per device, from its log
    lost_workers: tuple[str, ...] = ()  # crashed: the RPC workers found gone ("host:port"), to load without

    @property
    def name(self) -> str:
        return self.model.name

    def to_json(self) -> dict[str, Any]:
        data = self.disk.to_json()
        data["state"] = self.status.status.value
        data["pinned"] = self.status.pinned
        data["message"] = self.status.message
        return data


# --- the router -------------------------------------------------------------------------------------


class Router:
    def __init__(
        self,
        settings: Settings,
        *,
        library: Library | None = None,
        clock: Callable[[], float] = time.monotonic,
        raise_limit: str = RAISE_LIMIT,
    ) -> None:
        self.settings = settings
        self.raise_limit = raise_limit  # how the front end's user raises max_loaded_models, for a refusal
        self.library = library or Library(settings)
        self.supervisor = Supervisor(
            settings, resolve_model=lambda m: self.library.location(m), resolve_projector=self._projector
        )
        self._unsubscribe = [self.supervisor.subscribe(self._on_supervisor)]
        loaded = load_model_options()
        self._options = loaded.items
        self.warnings = [*self.library.warnings, *([loaded.warning] if loaded.warning else [])]
        self._clock = clock
        self._listeners: Listeners[RouterEvent] = Listeners("the router")
        # Other machines' servers, whose models are named @NAME/MODEL (app.supervisor.remotes).
        self.remotes = Remotes(self._emit, timeouts=self._remote_timeouts)
        self.warnings += self.remotes.warnings
        self._models: dict[str, Model] = {}  # what each engine runs, for restarts
        self._load_options: dict[str, LoadOptions] = {}
        self._pins: dict[str, bool] = {}  # pins a running model's load set for itself alone (not saved)
        self._used: dict[str, float] = {}  # last load or request
        self._busy: Counter[str] = Counter()  # requests in flight
        self._streaming: Counter[str] = Counter()  # replies streaming to their readers (first token sent)
        self.last_request: RequestFinished | None = None
        self.totals = TelemetryTotals()  # over every reply since the router started
        self._phases: dict[str, LoadProgress] = {}
        self._shapes: dict[str, ModelShape] = {}  # by checkpoint, read from the Hub before a download
        self._shape_errors: dict[str, str] = {}
        self._errors: dict[str, str] = {}  # why the last load failed, or the crash being recovered
        self._crashes: dict[str, list[float]] = {}
        self._streak: Counter[str] = Counter()  # restarts in a row without a stable run
        self._ready_at: dict[str, float] = {}
        self._versions: dict[str, str] = {}  # the engine version each model was last loaded with
        self._placement: dict[str, dict[str, int]] = {}  # where each loaded model's memory is (RPC loads)
        self._lost: dict[str, tuple[str, ...]] = {}  # the RPC workers a crashed model lost, till it loads
        self._loads: dict[str, asyncio.Task[Engine]] = {}
        self._restarts: dict[str, asyncio.Task[Engine]] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._room: asyncio.Lock | None = None  # held while choosing evictions and launching
        self._http: httpx.AsyncClient | None = None
        self._hub: HubClient | None = None
        self._downloads: DownloadManager | None = None
        self._idle: asyncio.Task[None] | None = None
        self._sampler: asyncio.Task[None] | None = None
        self._sampling = False
        self._system_sampler: Sampler | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._watching = False
        self._closing = False
        self.worker: Worker | None = None  # this machine's RPC worker, when it runs one

    async def __aenter__(self) -> Router:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    def _remote_timeouts(self) -> tuple[float, float]:
        return self.settings.load_timeout_s, self.settings.request_timeout_s

    # --- events ---------------------------------------------------------------------------------------

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(event)`` for every event, on the loop; returns the unsubscribe function."""
        return self._listeners.add(listener)

    def _emit(self, event: RouterEvent) -> None:
        self._listeners.emit(event)

    def _changed(self, *names: str) -> None:
        self._emit(ModelsChanged(names))

    def _spawn(self, job: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(job)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    # --- facts and statuses ---------------------------------------------------------------------------

    def options(self, name: str) -> ModelOptions:
        return self._options.get(name, ModelOptions())

    def save_options(self, name: str, options: ModelOptions) -> None:
        """Keep a model's recipe options for every later load (its pin stays as it is)."""
        self._store_options(name, dataclasses.replace(options, pinned=self.options(name).pinned))

    def set_pinned(self, name: str, pinned: bool) -> None:
        """A pinned model is never evicted or unloaded when idle; saved with its options (a pin its load
        set for itself alone gives way)."""
        self.library.resolve(name)  # an unknown name is an error, not a stray option
        self._pins.pop(name, None)
        self._store_options(name, dataclasses.replace(self.options(name), pinned=pinned))

    def pinned(self, name: str) -> bool:
        """Whether a model is pinned: as its load asked when that load pinned it for itself alone
        (``load(pinned=...)``), else as saved."""
        if name in self._pins and name in self.supervisor.engines:
            return self._pins[name]
        return self.options(name).pinned

    def _store_options(self, name: str, options: ModelOptions) -> None:
        self._options[name] = options
        try:
            save_model_options(self._options)
        except OSError as err:
            raise ModelError(
                f"Could not save the options of {name}: {err.strerror}.", f"Check that {home()} is writable."
            ) from None
        self._changed(name)

    def last_used(self, name: str) -> float | None:
        """When a loaded model was last loaded or asked, as a Unix time; None when it is not loaded."""
        used = self._used.get(name)
        return None if used is None else time.time() - (self._clock() - used)

    def busy(self, name: str) -> bool:
        """Whether requests to the model are in flight."""
        return self._busy[name] > 0

    def streaming(self, name: str) -> bool:
        """Whether a reply of the model is streaming to its reader (its first token went out)."""
        return self._streaming[name] > 0

    @contextlib.contextmanager
    def reply_streaming(self, name: str) -> Iterator[None]:
        """Mark a reply of ``name`` as streaming for as long as the block runs."""
        self._streaming[name] += 1
        try:
            yield
        finally:
            self._streaming[name] -= 1

    def load_options(self, name: str) -> LoadOptions | None:
        """The options a running model was loaded with (None when it is not loaded)."""
        return self._load_options.get(name) if name in self.supervisor.engines else None

    def engine_state(self, name: str) -> EngineState | None:
        engine = self.supervisor.engines.get(name)
        return engine.state if engine is not None else None

    def loaded(self) -> list[str]:
        """Models whose engine is ready, least recently used first."""
        ready = [n for n, e in self.supervisor.engines.items() if e.state is EngineState.READY]
        return sorted(ready, key=lambda n: self._used.get(n, 0.0))

    def _facts(self, disk: DiskStatus) -> ModelFacts:
        name = disk.model.name
        record = disk.download
        phase = self._phases.get(name)
        done, total = (phase.done, phase.total) if phase else (0, 0)
        if phase is None and record is not None:
            done, total = self._download_done(record), record.files.size
        return ModelFacts(
            on_disk=disk.state in (ModelState.DOWNLOADED, ModelState.LOCAL),
            download=record.state if record is not None else None,
            done_bytes=done,
            total_bytes=total,
            download_message=record.message if record is not None else "",
            phase=phase.phase if phase else None,
            engine=self.engine_state(name),
            error=self._errors.get(name, ""),
            pinned=self.pinned(name),
        )

    def _download_done(self, record: DownloadRecord) -> int:
        live = self._downloads.progress.get(record.id) if self._downloads else None
        return live if live is not None else record.done_bytes

    def _view(self, disk: DiskStatus) -> ModelView:
        on_disk = disk.state in (ModelState.DOWNLOADED, ModelState.LOCAL)
        size = disk.local.size if disk.local and disk.local.size else int(disk.model.size_gb * GB)
        shape = self._shape(disk)
        fit, exact = self._fit(disk, size, shape)
        note = self._shape_errors.get(disk.model.checkpoint, "")
        window = (shape.context_train or None) if shape is not None else None
        facts = model_status(self._facts(disk))
        name = disk.model.name
        memory, lost = self._placement.get(name, {}), self._lost.get(name, ())
        return ModelView(disk.model, facts, on_disk, size, disk, fit, exact, note, window, memory, lost)

    def _shape(self, disk: DiskStatus) -> ModelShape | None:
        """The model's shape from its header when read: on disk, or from the Hub (``measure_fit``)."""
        shape = self._shapes.get(disk.model.checkpoint)
        if shape is None and disk.local is not None:
            with contextlib.suppress(ModelError, OSError):
                shape = local_shape(disk.model.recipe, disk.local.main)
        return shape

    def _fit(self, disk: DiskStatus, size: int, shape: ModelShape | None) -> tuple[FitEstimate | None, bool]:
        """The fit at the model's context: from its header when read, else by size alone."""
        model = disk.model
        hardware = self.supervisor.known_hardware
        if hardware is None or (not size and disk.local is None):
            return None, False
        context = self.options(model.name).ctx_size or DEFAULT_CONTEXT
        recipe = model.recipe or "llamacpp"
        return estimate(size, shape or SIZE_ONLY, hardware, recipe, context), shape is not None

    async def measure_fit(self, name: str) -> None:
        """Read a model's header from the Hub (a Range read, once) so that its fit counts the KV cache."""
        model = self.library.resolve(name)
        if model.checkpoint in self._shapes or model.repo_id is None or self.library.local_files(model):
            return
        try:
            _, files = await self.plan_pull(model)
            self._shapes[model.checkpoint] = await remote_shape(await self.hub(), files)
            self._shape_errors.pop(model.checkpoint, None)
        except ModelError as err:
            self._shape_errors[model.checkpoint] = str(err)
        self._changed(model.name)

    async def suggestion(self, context: int = DEFAULT_CONTEXT) -> Suggestion | None:
        """The model a first run offers, its size from the Hub and the Hub's speed measured on its header."""
        info = await self.supervisor.info()
        runnable = {recipe for recipe, support in info.recipes.items() if support.default_backend}
        choice = suggest(self.library.models().values(), runnable, info.hardware, context)
        if choice is None:
            return None
        model, size, speed, note = choice.model, int(choice.model.size_gb * GB), None, ""
        try:
            _, files = await self.plan_pull(model)
            size = files.size
            started = time.monotonic()
            self._shapes[model.checkpoint] = await remote_shape(await self.hub(), files)
            elapsed = time.monotonic() - started
            read = min(files.size, HEADER_FIRST) if model.recipe == "llamacpp" else 0
            speed = read / elapsed if read >= HEADER_FIRST // 4 and elapsed > 0 else None
        except ModelError as err:
            note = str(err)
        fit = self._view(self.library.status(model, None)).fit or choice.fit
        return Suggestion(model, size, fit, choice.reason, speed, note)

    async def search_hub(
        self, query: str, recipe: str | None = None, limit: int = 10, context: int = DEFAULT_CONTEXT
    ) -> list[HubResult]:
        """Hugging Face search: each hit's variants with their sizes and fit at ``context``."""
        hardware = self.supervisor.known_hardware or (await self.supervisor.info()).hardware
        return await search(await self.hub(), query, recipe, limit, hardware, context)

    def statuses(self) -> list[ModelView]:
        """Every model with its status; reads the cache, so front ends on the loop call it in a thread."""
        records = self._downloads.records if self._downloads else None
        return [self._view(d) for d in self.library.statuses(records)]

    def status(self, name: str) -> ModelView:
        model = self.library.resolve(name)
        records = self._downloads.records if self._downloads else None
        return self._view(self.library.status(model, records))

    @functools.cached_property
    def collections(self) -> Collections:
        """Named sets of models with their options: save, load under the policy, export, import."""
        return Collections(self)

    def labels(self, model: Model) -> tuple[str, ...]:
        """A model's labels less what its quirks strip (``resources/quirks.json``: GLM-4 GGUF has no
        ``mtp``); the architecture comes from the model's file when it is here. Reads a header."""
        local = self.library.local_files(model) if model.recipe == "llamacpp" else None
        architecture = gguf_architecture(local.main) if local is not None else ""
        return effective_labels(model.labels, load_quirks(), model.recipe, architecture)

    def _projector(self, model: Model) -> Path | None:
        """The projector a GGUF model loads with, as Lemonade gives llama-server ``--mmproj``: for a
        model labelled ``vision`` or naming its projector, when the file is here."""
        if "vision" not in model.labels and not model.mmproj:
            return None
        local = self.library.local_files(model)
        return local.mmproj if local is not None else None

    # --- parameter counts -----------------------------------------------------------------------------

    def local_parameter_count(self, model: Model) -> int | None:
        """A model's parameters from its files on disk (GGUF tensor infos, safetensors headers); None
        when it is not here or its headers say nothing. Reads files: call it in a thread on the loop."""
        local = self.library.local_files(model)
        if local is None:
            return None
        try:
            return local_parameter_count(model.recipe, local.main)
        except ModelError as err:
            log.info("no parameter count for %s: %s", model.name, err)
            return None

    async def parameter_count(self, name: str) -> int | None:
        """A model's parameters: from its files when downloaded, else from the Hub with Range reads."""
        model = self.library.resolve(name)
        count = await asyncio.to_thread(self.local_parameter_count, model)
        if count is not None or model.repo_id is None:
            return count
        try:
            _, files = await self.plan_pull(model)
            return await remote_parameter_count(await self.hub(), files)
        except ModelError as err:
            log.info("no parameter count for %s: %s", model.name, err)
            return None

    # --- downloads ------------------------------------------------------------------------------------

    async def hub(self) -> HubClient:
        if self._hub is None:
            import httpx  # on first use: the window's start-up does without it

            token = await asyncio.to_thread(get_hf_token)
            if self._hub is None:  # two first calls at once (the window's) make one client, not two
                self._http = httpx.AsyncClient()
                self._hub = HubClient(self._http, token=token)
        return self._hub

    def downloads(self) -> DownloadManager:
        if self._downloads is None:
            assert self._hub is not None, "hub() comes first"
            self._downloads = DownloadManager(self.library.cache_root, self._hub, cap_policy=self._cap)
            if self._downloads.warning:
                self.warnings.append(self._downloads.warning)
            self._downloads.subscribe(self._on_download)
        return self._downloads

    def register(self, model: Model) -> Model:
        """Register a user model defined from outside (Lemonade's ``models/register``), downloading
        nothing; a name defined otherwise already is refused (``Library.define``). Returns it as kept."""
        model = self.library.define(model)
        self.library.register(model)
        self._changed(model.name)
        return model

    async def plan_pull(self, name_or_ref: str | Model, recipe: str | None = None) -> tuple[Model, FileSet]:
        """The model and the files a download of it needs (asks the Hub; downloads nothing)."""
        model = name_or_ref if isinstance(name_or_ref, Model) else self.library.resolve(name_or_ref)
        if model.repo_id is None:
            raise ModelError(f"{model.name} is a local model: there is nothing to download.")
        hub = await self.hub()
        ref = parse_ref(model.checkpoint)
        listing = await hub.listing(ref.repo_id)
        if listing.gated and not hub.token:
            raise gated_error(ref.repo_id, hub.endpoint)
        files = select(listing, ref, recipe or model.recipe or None, model.mmproj)
        if model.user:
            model = dataclasses.replace(model, recipe=files.recipe, size_gb=round(files.size / GB, 3))
        return model, files

    async def download(self, model: Model, files: FileSet) -> DownloadRecord:
        """Fetch ``files`` for ``model`` into the cache (joining a download of it under way).

        Raises why it failed (``DownloadManager.outcome``); cancelling this call leaves the download
        running (pause or cancel it through ``downloads()``).
        """
        self.library.register(model)
        manager = self.downloads()
        self._errors.pop(model.name, None)
        manager.submit(model.checkpoint, model.name, files)
        self._changed(model.name)
        record = await manager.outcome(model.checkpoint)
        if record.state is DownloadState.CANCELLED:
            raise asyncio.CancelledError
        return record

    async def add(self, ref: str) -> Model:
        """Register a Hub reference (``org/repo:VARIANT``) as a model and start its download; returns
        the model without waiting for the download (its progress comes as events)."""
        model, files = await self.plan_pull(ref)
        self.library.register(model)
        self._errors.pop(model.name, None)
        self.downloads().submit(model.checkpoint, model.name, files)
        self._changed(model.name)
        return model

    async def pull(self, name_or_ref: str | Model, recipe: str | None = None) -> DownloadRecord:
        """The one pull: the CLI's, the window's and the API's."""
        model, files = await self.plan_pull(name_or_ref, recipe)
        return await self.download(model, files)

    async def pause_download(self, name: str) -> None:
        await self.hub()
        await self.downloads().pause(self.library.resolve(name).checkpoint)

    async def resume_download(self, name: str) -> None:
        await self.hub()
        self.downloads().resume(self.library.resolve(name).checkpoint)

    async def cancel_download(self, name: str, *, keep_partial: bool = False) -> None:
        """Stop a download and delete its partial files (``keep_partial``: keep them, so a later
        download of the model goes on from there)."""
        await self.hub()
        await self.downloads().cancel(self.library.resolve(name).checkpoint, keep_partial=keep_partial)
        self._changed(name)

    def download_snapshots(self) -> list[DownloadSnapshot]:
        """Every download the app remembers (``<home>/downloads.json``), with speed and ETA for those
        running in this process. Reads files: front ends on the loop call it in a thread."""
        if self._downloads is not None:
            return self._downloads.snapshots()
        loaded = load_downloads()
        if loaded.warning:
            self.warnings.append(loaded.warning)
        root = self.library.cache_root
        out = []
        for record in (recovered(r, root) for r in loaded.items.values()):
            # Running in another process: its record's count is from when it started; the disk is now.
            live = RepoCache(root, record.files.repo_id).bytes_on_disk(record.files.files)
            out.append(DownloadSnapshot(record, live if record.state.active else record.done_bytes))
        return out

    def _cap(self, recipe: str, remaining: int) -> BandwidthCap | None:
        """The seed's bandwidth cap for a download on unified memory (``app.core.fit.download_cap``)."""
        try:
            hardware = self.supervisor.hardware
        except RuntimeError:  # no load has asked for the machine yet
            hardware = detect_hardware()
        kind = memory_budget(hardware, recipe).kind
        return download_cap(kind, remaining, free_memory(kind, hardware))

    def download_records(self) -> list[DownloadRecord]:
        """Every download remembered, as the download manager has it (empty before ``open_downloads``)."""
        return list(self._downloads.records.values()) if self._downloads else []

    async def open_downloads(self) -> list[str]:
        """Read the downloads remembered and resume those the app's last run left unfinished (quit or
        crash); returns the names of those resumed."""
        await self.hub()
        manager = self.downloads()
        resumed = []
        for record in list(manager.records.values()):
            if record.state is DownloadState.PAUSED and record.message == INTERRUPTED:
                manager.resume(record.id)
                resumed.append(record.model)
        if resumed:
            self._changed(*resumed)
        return resumed

    def _on_download(self, event: DownloadEvent) -> None:
        self._emit(event)
        record = self._downloads.records.get(event.id) if self._downloads else None
        name = record.model if record else event.id
        phase = self._phases.get(name)
        if phase is not None and phase.phase is LoadPhase.DOWNLOADING and isinstance(event, DownloadProgress):
            self._set_phase(name, LoadPhase.DOWNLOADING, event.done, event.total, event.file)
        elif isinstance(event, DownloadChanged):
            self._changed(name)

    # --- one-click load -------------------------------------------------------------------------------

    def load(
        self,
        model: str | Model,
        options: ModelOptions | None = None,
        *,
        force: bool = False,
        pinned: bool | None = None,
    ) -> asyncio.Task[Engine]:
        """Load a model, downloading it and installing its backend first when needed, under the policy.

        One ``LoadProgress`` per phase. A load of the same model under way is replaced. Cancelling the
        task at any phase leaves nothing half made: a partial download is deleted, an install undone,
        a starting engine stopped. ``force`` skips the check against the memory free now. ``pinned``:
        pinned or not while this load runs, whatever is saved (None: as saved).
        """
        if isinstance(model, str):
            model = self.library.resolve(model)
        if self._closing:
            raise EngineError("Lemon Desk is shutting down.")
        name = model.name
        self._cancel_recovery(name)
        previous = self._loads.get(name)
        if previous is not None:
            previous.cancel()
        task = asyncio.ensure_future(self._load(model, options or self.options(name), force, pinned))
        self._loads[name] = task
        task.add_done_callback(lambda t: self._loads.pop(name, None) if self._loads.get(name) is t else None)
        return task

    def reload_without(self, name: str, workers: tuple[str, ...]) -> asyncio.Task[Engine]:
        """Load a model again on the RPC workers of its last load less ``workers`` (lost ones); with none
        left it loads here alone. Its saved options do not change."""
        last = self._load_options.get(name)
        remaining = [w for w in (last.rpc if last else ()) if w not in workers]
        options = dataclasses.replace(self.options(name), rpc=",".join(remaining) or LOCAL_ONLY)
        # A local file is known by its last load; a pin that load set for itself holds for this one.
        return self.load(self._models.get(name) or name, options, pinned=self._pins.get(name))

    def cancel_load(self, name: str) -> bool:
        task = self._loads.get(name)
        return task.cancel() if task is not None else False

    def _set_phase(
        self, name: str, phase: LoadPhase, done: int = 0, total: int = 0, detail: str = ""
    ) -> None:
        progress = LoadProgress(name, phase, done, total, detail)
        self._phases[name] = progress
        self._emit(progress)
        self._changed(name)

    async def _load(self, model: Model, options: ModelOptions, force: bool, pinned: bool | None) -> Engine:
        name = model.name
        self._errors.pop(name, None)
        downloading = False
        try:
            if model.repo_id is not None and self.library.local_files(model) is None:
                self._set_phase(name, LoadPhase.DOWNLOADING)
                planned, files = await self.plan_pull(model)
                downloading = True
                await self.download(planned, files)
                downloading = False
                model = self.library.resolve(name) if name in self.library.models() else planned
            request = self.launch_options(model, options)
            await self._install_backend(model, request)
            self._set_phase(name, LoadPhase.LOADING)
            self._pins.pop(name, None)
            if pinned is not None:
                self._pins[name] = pinned
            return await self._launch(model, request, force)
        except asyncio.CancelledError:
            if downloading and self._downloads is not None:
                await asyncio.shield(self._downloads.cancel(model.checkpoint))
            raise
        except LemonDeskError as err:
            self._errors[name] = str(err)
            raise
        finally:
            self._phases.pop(name, None)
            self._changed(name)

    def launch_options(self, model: Model, options: ModelOptions) -> LoadOptions:
        """What a load of ``model`` with its recipe ``options`` asks of the supervisor: the RPC workers
        are the option's (``local``: none), else the Settings' list for a llama.cpp model."""
        settings = self.settings.rpc_workers if model.recipe == "llamacpp" else ""
        workers = workers_for(None, options.rpc, settings)
        return LoadOptions(options.backend, options.ctx_size, options.args, tuple(map(str, workers)))

    async def _install_backend(self, model: Model, options: LoadOptions) -> None:
        """Install the backend the load will use when it is installable or out of date."""

        def installing(key: str) -> None:
            self._set_phase(model.name, LoadPhase.INSTALLING, detail=key)

        version = await self.install_backend(model.recipe, options.backend, installing)
        if version is not None:
            self._versions[model.name] = version

    async def install_backend(
        self, recipe: str, backend: str | None, installing: Callable[[str], None] | None = None
    ) -> str | None:
        """Install a recipe's backend (None: the best one here) when it is installable or out of date,
        calling ``installing("recipe:backend")`` first; returns its version, None for an unknown one."""
        info = await self.supervisor.info()
        support = info.recipes.get(recipe)
        backend = backend or (support.default_backend if support else None)
        status = support.backends.get(backend) if support and backend else None
        if status is None or info.versions.spec(recipe, backend or "").kind is BackendKind.SYSTEM:
            return status.version if status else None  # the launch says what is wrong
        if status.state in (BackendState.INSTALLABLE, BackendState.UPDATE_REQUIRED):
            if installing is not None:
                installing(f"{recipe}:{backend}")
            await self.supervisor.install(recipe, backend or "")
        return status.version

    async def _launch(self, model: Model, options: LoadOptions, force: bool) -> Engine:
        request = await self.supervisor.launch_request(model, options)
        device = engine_device(request, self.supervisor.hardware)
        workers = await self._check_workers(request) if request.rpc else []
        if not force:
            await self._check_fit(model, options, sum(w.free_bytes for w in workers))
        if self._room is None:
            self._room = asyncio.Lock()
        async with self._room:
            caps = parse_caps(self.settings.max_loaded_models)
            for victim in plan_evictions(self._running(), model.name, device, caps, self.raise_limit):
                log.info("unloading %s to make room for %s", victim, model.name)
                await self.unload(victim)
            self._models[model.name] = model
            self._load_options[model.name] = options
            engine = await self.supervisor.load(model, options)
        self._touch(model.name)
        self._start_idle_watch()
        return engine

    async def _check_workers(self, request: LaunchRequest) -> list[WorkerInfo]:
        """Each RPC worker of the load answers, is free and speaks the engine's protocol; else a
        WorkerError naming those that do not."""
        os_name = self.supervisor.hardware.os
        expected = await engine_protocol(Path(request.binary), request.library_dir, os_name)
        return await check_workers(tuple(map(parse_endpoint, request.rpc)), expected)

    def _running(self) -> list[LoadedModel]:
        live = (EngineState.STARTING, EngineState.READY)
        return [
            LoadedModel(name, device_of(engine), self.pinned(name), self._used.get(name, 0.0))
            for name, engine in self.supervisor.engines.items()
            if engine.state in live
        ]

    async def _check_fit(self, model: Model, options: LoadOptions, on_workers: int = 0) -> None:
        """Refuse, with the numbers and the ways out, a model that needs more memory than is free now
        (here, plus ``on_workers`` bytes free on its RPC workers)."""
        local = self.library.local_files(model)
        if local is None:
            return
        try:
            shape = await asyncio.to_thread(local_shape, model.recipe, local.main)
        except ModelError as err:
            log.info("no fit check for %s: %s", model.name, err)
            return
        hardware = self.supervisor.hardware
        context = options.ctx_size or DEFAULT_CONTEXT
        fit = estimate(local.size, shape, hardware, model.recipe, context)
        free = await asyncio.to_thread(free_memory, fit.budget.kind, hardware)
        if free is None:
            return
        free += on_workers
        others = [(n, self._rss(n)) for n in self.loaded() if n != model.name and not self.pinned(n)]
        check_live_fit(model.name, fit, free, largest_context(local.size, shape, free, model.recipe), others)

    def _rss(self, name: str) -> int:
        engine = self.supervisor.engines.get(name)
        if engine is None or engine.pid is None:
            return 0
        try:
            return int(psutil.Process(engine.pid).memory_info().rss)
        except psutil.Error:
            return 0

    # --- unload ---------------------------------------------------------------------------------------

    async def unload(self, name: str) -> None:
        """Stop a model's engine (a load or a restart of it under way is cancelled); a remote model is
        unloaded by its remote."""
        if is_remote_model(name):
            await self.remotes.unload(name)
            return
        self._cancel_recovery(name)
        loading = self._loads.get(name)
        if loading is not None and loading is not asyncio.current_task():
            loading.cancel()
            await asyncio.gather(loading, return_exceptions=True)
        await self.supervisor.unload(name)
        self._models.pop(name, None)
        self._used.pop(name, None)
        self._pins.pop(name, None)
        self._changed(name)

    async def unload_all(self) -> None:
        for name in {*self.supervisor.engines, *self._loads, *self._restarts}:
            await self.unload(name)

    async def delete(self, name: str) -> str:
        """Unload a model and delete its files; returns what was done, for people."""
        model = self.library.resolve(name)
        await self.unload(model.name)
        if self._downloads is not None and model.checkpoint in self._downloads.records:
            await self._downloads.cancel(model.checkpoint)
        said = await asyncio.to_thread(self.library.remove, name)
        self._errors.pop(model.name, None)
        if self._options.pop(model.name, None) is not None:
            save_model_options(self._options)
        self._changed(model.name)
        return said

    # --- requests -------------------------------------------------------------------------------------

    def _touch(self, name: str) -> None:
        self._used[name] = self._clock()

    async def ensure_loaded(self, name: str) -> Engine:
        """The model's ready engine, loading it (one-click) under the policy when it is not loaded."""
        engine = self.supervisor.engines.get(name)
        if engine is not None and engine.state is EngineState.READY:
            self._touch(name)
            return engine
        pending = self._restarts.get(name) or self._loads.get(name) or self.load(name)
        return await asyncio.shield(pending)

    @contextlib.asynccontextmanager
    async def client(self, name: str) -> AsyncIterator[ChatClient]:
        """A client for the model's engine, loaded on demand; the model counts as used while it is open.
        A remote model (``@NAME/MODEL``) gets a client pointed at its remote."""
        if is_remote_model(name):
            async with self.remotes.client(name) as remote:
                yield remote
            return
        engine = await self.ensure_loaded(name)
        self._busy[name] += 1
        self._touch(name)
        try:
            async with engine.chat_client(self.settings.request_timeout_s) as client:
                yield client
        finally:
            self._busy[name] -= 1
            self._touch(name)

    def request_finished(self, name: str, telemetry: Telemetry, source: RequestSource) -> None:
        """Note a finished reply's figures (the last one is kept) and tell the front ends."""
        self.last_request = RequestFinished(name, source, telemetry)
        self.totals = self.totals.add(telemetry)
        self._emit(self.last_request)

    async def stream_chat(self, name: str, messages: Messages, **params: Any) -> AsyncIterator[ChatEvent]:
        """A streamed reply. An engine that dies mid-reply ends it with an EngineError naming the cause
        (the engine restarts behind it; a stream cannot be replayed without the user seeing it twice)."""
        async with self.client(name) as client:
            # Closing the generator closes the HTTP stream, which stops the engine generating.
            stream = cast(AsyncGenerator[ChatEvent, None], client.stream_chat(messages, **params))
            async with contextlib.aclosing(stream):
                with contextlib.ExitStack() as marks:
                    marked = False
                    async for event in stream:
                        if not marked:  # streaming from its first event on
                            marks.enter_context(self.reply_streaming(name))
                            marked = True
                        if isinstance(event, ChatDone):
                            self.request_finished(name, event.telemetry, RequestSource.CHAT)
                        yield event

    async def chat(self, name: str, messages: Messages, **params: Any) -> ChatReply:
        """A whole reply. One broken by an engine crash is sent once more after the restart."""
        try:
            async with self.client(name) as client:
                reply = await client.chat(messages, **params)
        except EngineError:
            restart = self._restarts.get(name)
            if restart is None:
                raise
            log.info("replaying a request to %s after its engine restarts", name)
            await asyncio.shield(restart)
            async with self.client(name) as client:
                reply = await client.chat(messages, **params)
        self.request_finished(name, reply.telemetry, RequestSource.CHAT)
        return reply

    def run_card(self, name: str, params: dict[str, Any], telemetry: Telemetry) -> RunCard:
        """What produced a reply of ``name``'s engine: its model, engine, options, sampling, hardware
        and figures, for the reply's run card."""
        if is_remote_model(name):
            return self.remotes.run_card(name, params, telemetry)
        engine = self.supervisor.engines.get(name)
        model = self._models.get(name)
        request = engine.request if engine is not None else None
        hardware = engine.hardware.to_json() if engine is not None else {}
        checkpoint = model.checkpoint if model is not None else (request.model if request else "")
        return RunCard(
            model=name,
            checkpoint=checkpoint,
            quant=quant_of(checkpoint),
            recipe=request.recipe if request else "",
            backend=request.backend if request else "",
            engine_version=known_version(self._versions.get(name, "")),
            ctx_size=request.ctx_size or (DEFAULT_CTX_SIZE if request.recipe == "llamacpp" else None)
            if request
            else None,
            extra_args=shlex.join(request.user_args) if request else "",
            sampling={k: v for k, v in params.items() if isinstance(v, int | float | str)},
            hardware=hardware_summary(hardware) if hardware else "",
            **figures(telemetry),
        )

    # --- bench --------------------------------------------------------------------------------------

    async def bench(self, spec: BenchSpec, run_id: str = "") -> BenchRun:
        """Measure every model of ``spec`` on each of its backends (``BenchProgress`` events); the CLI's
        and the window's one bench. Cancelling it unloads what it loaded. The run is kept in the app's
        home with its hardware and versions (``app.store.bench_results``)."""
        run = await run_bench(self, spec, self._emit, run_id)
        saved = await asyncio.to_thread(save_run, run)
        if saved.warning:
            log.warning("%s", saved.warning)
            self.warnings.append(saved.warning)
        return run

    # --- recovery -------------------------------------------------------------------------------------

    def _on_supervisor(self, event: SupervisorEvent) -> None:
        self._emit(event)
        if isinstance(event, InstallProgress):
            for name, phase in list(self._phases.items()):
                if phase.phase is LoadPhase.INSTALLING and phase.detail == str(event.key):
                    self._set_phase(name, LoadPhase.INSTALLING, event.done, event.total or 0, phase.detail)
        if not isinstance(event, EngineStateChanged):
            return
        name = event.model
        engine = self.supervisor.engines.get(name)
        if event.state is EngineState.READY:
            self._ready_at[name] = self._clock()
            self._touch(name)
            if engine is not None:  # the load's lines are all in the output now; later ones push them out
                self._placement[name] = memory_by_device(list(engine.output))
            self._lost.pop(name, None)
        else:
            self._placement.pop(name, None)
        if event.state is EngineState.CRASHED and not self._closing:
            if engine is not None and engine.lost_workers:
                self._lost[name] = engine.lost_workers
            self._crashed(name, event.message)
        self._changed(name)

    def _crashed(self, name: str, why: str) -> None:
        now = self._clock()
        if now - self._ready_at.get(name, now) >= STABLE_S:
            self._streak[name] = 0
        recent = [t for t in self._crashes.get(name, []) if now - t < CRASH_WINDOW_S] + [now]
        self._crashes[name] = recent
        model, options = self._models.get(name), self._load_options.get(name)
        if len(recent) >= CRASH_LIMIT or model is None or options is None:
            message = (
                f"{name} crashed {len(recent)} times in {CRASH_WINDOW_S / 60:g} minutes, so it was not "
                f"restarted again. Load it again once the cause is fixed.\n{why}"
            )
            self._errors[name] = message
            self._emit(EngineRecovery(name, message, gave_up=True))
            return
        delay = restart_delay(self._streak[name], RESTART_BACKOFF_S)
        self._streak[name] += 1
        message = f"{name} crashed; restarting it in {delay:g} s.\n{why}"
        self._errors[name] = message
        self._emit(EngineRecovery(name, message, gave_up=False))
        task = asyncio.ensure_future(self._restart(name, model, options, delay))
        self._restarts[name] = task
        task.add_done_callback(
            lambda t: self._restarts.pop(name, None) if self._restarts.get(name) is t else None
        )

    async def _restart(self, name: str, model: Model, options: LoadOptions, delay: float) -> Engine:
        await asyncio.sleep(delay)
        try:
            engine = await self._launch(model, options, force=True)
        except LemonDeskError as err:
            message = f"{name} crashed and did not start again: {err}"
            self._errors[name] = message
            self._emit(EngineRecovery(name, message, gave_up=True))
            raise
        self._errors.pop(name, None)
        self._emit(EngineRecovery(name, f"{name} was restarted and is ready again.", gave_up=False))
        return engine

    def _cancel_recovery(self, name: str) -> None:
        restart = self._restarts.pop(name, None)
        if restart is not None and restart is not asyncio.current_task():
            restart.cancel()
        self._crashes.pop(name, None)
        self._streak.pop(name, None)

    # --- this machine's RPC worker ------------------------------------------------------------------

    async def start_worker(
        self, endpoint: Endpoint, backend: str | None = None, threads: int | None = None
    ) -> Worker:
        """Run an RPC worker (``ggml-rpc-server``) from this machine's llama.cpp backend, installing the
        backend first when it is installable or out of date; kept running (``WorkerChanged`` events)
        until ``stop_worker`` or shutdown. Binding beyond loopback is the caller's decision to check
        (``app.core.rpc.exposure_warning``)."""
        await self.stop_worker()
        await self.install_backend("llamacpp", backend)
        _, engine, library_dir = await self.supervisor.engine_binary("llamacpp", backend)
        binary = rpc_server_binary(engine)
        if binary is None:
            raise EngineError(
                f"The llama.cpp build in {engine.parent} has no ggml-rpc-server, so it cannot be a worker.",
                "Use the llamacpp:cpu backend (llama.cpp's releases carry it), or build llama.cpp with "
                "-DGGML_RPC=ON.",
            )
        plan = worker_plan(binary, library_dir, endpoint, threads, self.supervisor.hardware.os)
        worker = Worker(plan, endpoint)
        worker.subscribe(self._emit)
        self.worker = worker
        await worker.start()
        return worker

    async def sync_worker(self) -> None:
        """Run this machine's worker as the Settings say (the window's): started, moved to another
        address, or stopped. What stops it from running comes as a final ``WorkerChanged``."""
        settings = self.settings
        current = self.worker
        try:
            wanted = worker_endpoint(settings.worker_host, settings.worker_port)
            if settings.worker_enabled:
                exposure_warning(wanted, settings.worker_allow_network)
        except LemonDeskError as err:
            self._emit(
                WorkerChanged(
                    f"{settings.worker_host}:{settings.worker_port}", EngineState.FAILED, str(err), final=True
                )
            )
            return
        if not settings.worker_enabled:
            await self.stop_worker()
            return
        if current is not None and current.endpoint == wanted and current.state is not EngineState.CRASHED:
            return
        try:
            await self.start_worker(wanted)
        except LemonDeskError as err:
            if self.worker is None or self.worker.state is not EngineState.FAILED:  # else it said so itself
                self._emit(WorkerChanged(str(wanted), EngineState.FAILED, str(err), final=True))

    async def stop_worker(self) -> None:
        worker, self.worker = self.worker, None
        if worker is not None:
            await worker.stop()

    # --- idle unload and usage samples ----------------------------------------------------------------

    def _start_idle_watch(self) -> None:
        if self._idle is None or self._idle.done():
            self._idle = asyncio.ensure_future(self._watch_idle())

    async def _watch_idle(self) -> None:
        while self.supervisor.engines:
            await asyncio.sleep(IDLE_CHECK_S)
            await self.unload_idle()

    async def unload_idle(self) -> list[str]:
        """Unload every unpinned model without a request for ``idle_unload_minutes`` (0: never)."""
        minutes = self.settings.idle_unload_minutes
        if minutes <= 0:
            return []
        now = self._clock()
        idle = [
            name
            for name in self.loaded()
            if not self.pinned(name)
            and not self._busy[name]
            and now - self._used.get(name, now) >= minutes * 60
        ]
        for name in idle:
            log.info("unloading %s: no request for %d minutes", name, minutes)
            await self.unload(name)
        return idle

    def sample_usage(self, on: bool) -> None:
        """Sample every engine's CPU and memory (``EngineUsage`` events) while ``on``."""
        self._sampling = on
        if on and (self._sampler is None or self._sampler.done()):
            self._sampler = asyncio.ensure_future(self._sample())

    async def _sample(self) -> None:
        processes: dict[int, psutil.Process] = {}
        while self._sampling:
            for name, engine in self.supervisor.engines.items():
                if engine.state is not EngineState.READY or engine.pid is None:
                    continue
                try:
                    proc = processes.setdefault(engine.pid, psutil.Process(engine.pid))
                    with proc.oneshot():
                        self._emit(EngineUsage(name, proc.cpu_percent(None), proc.memory_info().rss))
                except psutil.Error:
                    processes.pop(engine.pid, None)
            await asyncio.sleep(USAGE_INTERVAL_S)

    def _sampler_now(self) -> Sampler:
        if self._system_sampler is None:
            hardware = self.supervisor._hardware
            unified = hardware is not None and hardware.os == "macos" and hardware.metal.available
            self._system_sampler = Sampler(unified_memory=unified)
        return self._system_sampler

    def _engine_pids(self) -> dict[str, int]:
        return {
            name: engine.pid
            for name, engine in self.supervisor.engines.items()
            if engine.state is EngineState.READY and engine.pid is not None
        }

    async def system_sample(self) -> SystemSample:
        """CPU, RAM, GPU and VRAM now, for the machine and each running engine (sampled in a thread)."""
        return await asyncio.to_thread(self._sampler_now().sample, self._engine_pids())

    async def system_stats(self) -> dict[str, Any]:
        """The local API's ``GET system-stats``: ``cpu_percent``, ``memory_gb``, ``gpu_percent``, ``vram_gb``
        (null where the machine does not say)."""
        return (await self.system_sample()).stats()

    def watch_system(self, on: bool) -> None:
        """A ``SystemSample`` event every second while ``on`` (the Telemetry view is on screen); off,
        nothing is sampled at all."""
        self._watching = on and not self._closing
        if self._watching and (self._watcher is None or self._watcher.done()):
            self._watcher = asyncio.ensure_future(self._watch_system())

    @property
    def watching_system(self) -> bool:
        return self._watcher is not None and not self._watcher.done()

    async def _watch_system(self) -> None:
        while self._watching:
            started = time.monotonic()
            sample = await self.system_sample()
            if not self._watching:
                break
            self._emit(sample)
            await asyncio.sleep(max(0.0, SYSTEM_INTERVAL_S - (time.monotonic() - started)))

    # --- settings -------------------------------------------------------------------------------------

    def apply_settings(self, settings: Settings) -> None:
        """Take new settings at once: caps (evicting what is over them), idle unload, models folder,
        release mirror and timeouts; nothing needs a restart."""
        parse_caps(settings.max_loaded_models)  # a bad value is refused before anything changes
        old, self.settings = self.settings, settings
        self.supervisor.settings = settings
        for engine in self.supervisor.engines.values():
            engine.load_timeout_s = settings.load_timeout_s
            engine.hang_grace_s = settings.hang_grace_s
        if settings.models_dir != old.models_dir:
            self.library = Library(settings)
            if self._downloads is not None and not self._downloads.busy:
                # Downloads under way finish where they started; the next one goes to the new folder.
                self._spawn(self._downloads.close())
                self._downloads = None
        self._spawn(self._enforce_caps())
        self._changed()

    async def _enforce_caps(self) -> None:
        """Unload the least recently used unpinned models until the running ones are within the caps."""
        for name in over_caps(self._running(), parse_caps(self.settings.max_loaded_models)):
            await self.unload(name)

    # --- shutdown -------------------------------------------------------------------------------------

    async def shutdown(self, resume_downloads: bool = False) -> None:
        """Cancel every load, restart and background job, pause downloads, stop every engine.
        ``resume_downloads``: the paused downloads go on at the next ``open_downloads`` (the window's)."""
        self._closing = True
        self._sampling = False
        self._watching = False
        jobs = [*self._loads.values(), *self._restarts.values(), *self._background]
        jobs += [t for t in (self._idle, self._sampler, self._watcher) if t is not None]
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
        await self.stop_worker()
        await self.supervisor.shutdown()
        await self.remotes.close()
        if self._downloads is not None:
            await self._downloads.close(resume_later=resume_downloads)
        if self._http is not None:
            await self._http.aclose()
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._unsubscribe = []


def device_of(engine: Engine) -> DeviceType:
    return engine_device(engine.request, engine.hardware)
