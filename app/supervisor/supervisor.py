"""The supervisor: one object that owns backend installs and running engines, keyed by id, and tells
subscribers what happens through plain event dataclasses (the router passes them on to its own
subscribers, the bridge among them; ``lemon-desk backends`` hears them itself).

Every long job is an ``asyncio.Task`` kept here until it ends: ``install:<recipe>:<backend>`` and
``load:<engine id>``. Cancelling one cleans up after it; ``shutdown()`` cancels them all and stops every
engine. Made with ``clean_start`` (the default), it first stops the engines an earlier run of the app
left behind (``app.supervisor.orphans``); the router makes it without, and does that in ``start()``.
asyncio only: nothing here knows about Qt.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from app.client.chat import ChatClient
from app.core.backends import BackendKey, BackendKind, BackendState
from app.core.engine_state import EngineState
from app.core.errors import ConfigError, EngineError, InstallError, UnsupportedError
from app.core.hardware import Hardware
from app.core.launch import (
    ENGINE_BINARY,
    KEY_FILE_PLACEHOLDER,
    PORT_PLACEHOLDER,
    LaunchPlan,
    LaunchRequest,
    plan_launch,
    split_args,
)
from app.core.models import Model
from app.store.hfcache import hub_cache_dir
from app.store.installs import InstallManifest, install_dir
from app.store.kvcache import slot_cache_dir
from app.store.model_paths import gguf_architecture
from app.store.quirks import load_quirks
from app.store.settings import Settings
from app.supervisor.engine import Engine
from app.supervisor.installer import InstallPhase, InstallUpdate, install_backend, installed_binary
from app.supervisor.installer import uninstall_backend as _uninstall_files
from app.supervisor.listeners import Listeners
from app.supervisor.mlx_lm import venv_python
from app.supervisor.orphans import stop_orphans
from app.supervisor.system_info import SystemInfo, gather

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)
T = TypeVar("T")


# --- events -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InstallProgress:
    key: BackendKey
    phase: InstallPhase
    done: int = 0  # bytes downloaded so far
    total: int | None = None
    speed_bps: float = 0.0
    eta_s: float | None = None
    detail: str = ""  # pip backends: what pip is doing now


@dataclass(frozen=True)
class InstallFinished:
    key: BackendKey
    version: str
    sha256: str


@dataclass(frozen=True)
class Uninstalled:
    key: BackendKey


@dataclass(frozen=True)
class EngineStateChanged:
    engine_id: str
    model: str
    backend: BackendKey
    state: EngineState
    message: str = ""  # why, when FAILED or CRASHED


@dataclass(frozen=True)
class TaskFailed:
    task_id: str
    message: str  # what happened and what to do, for the user


@dataclass(frozen=True)
class TaskCancelled:
    task_id: str


SupervisorEvent = (
    InstallProgress | InstallFinished | Uninstalled | EngineStateChanged | TaskFailed | TaskCancelled
)
Listener = Callable[[SupervisorEvent], None]


@dataclass(frozen=True)
class LoadOptions:
    """How to load a model (its recipe options)."""

    backend: str | None = None  # a backend of the model's recipe; None: the best one installed here
    ctx_size: int | None = None  # None: the launcher's default
    args: str = ""  # extra engine arguments, as the user typed them
    rpc: tuple[str, ...] = ()  # llama.cpp RPC workers (host:port) to spread the model over


ModelResolver = Callable[[Model], Path]  # the GGUF or MLX folder to load; ModelError when not here
ProjectorResolver = Callable[[Model], Path | None]  # a vision model's projector file, when it loads one


def _no_projector(model: Model) -> Path | None:
    return None


class Supervisor:
    """Owns backend installs and engine processes, each a task keyed by id, and reports what happens."""

    def __init__(
        self,
        settings: Settings,
        *,
        hardware: Hardware | None = None,
        resolve_model: ModelResolver,
        resolve_projector: ProjectorResolver = _no_projector,
        clean_start: bool = True,
    ) -> None:
        self.settings = settings
        self._hardware = hardware
        self._resolve_model = resolve_model
        self._resolve_projector = resolve_projector
        self._listeners: Listeners[SupervisorEvent] = Listeners("the supervisor")
        self._tasks: dict[str, asyncio.Task[Any]] = {}
        self._engines: dict[str, Engine] = {}
        self._stops: set[asyncio.Future[None]] = set()  # engine stops under way; shutdown waits for them
        self._shutting_down = False
        if clean_start:  # else the owner does it before its first launch (``Router.start``)
            stop_orphans()  # engines of an earlier run that crashed: before this one starts its own

    async def __aenter__(self) -> Supervisor:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.shutdown()

    # --- events ---------------------------------------------------------------------------------------

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(event)`` for every event, on the event loop; returns the unsubscribe function."""
        return self._listeners.add(listener)

    def _emit(self, event: SupervisorEvent) -> None:
        self._listeners.emit(event)

    # --- tasks ----------------------------------------------------------------------------------------

    def _spawn(self, task_id: str, job: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        if self._shutting_down:
            job.close()
            raise EngineError("Lemon Desk is shutting down.")
        task = asyncio.create_task(job, name=task_id)
        self._tasks[task_id] = task
        task.add_done_callback(lambda t: self._task_done(task_id, t))
        return task

    def _task_done(self, task_id: str, task: asyncio.Task[Any]) -> None:
        if self._tasks.get(task_id) is task:
            del self._tasks[task_id]
        if task.cancelled():
            self._emit(TaskCancelled(task_id))
        elif (err := task.exception()) is not None:
            self._emit(TaskFailed(task_id, str(err)))

    def tasks(self) -> dict[str, asyncio.Task[Any]]:
        return dict(self._tasks)

    def cancel(self, task_id: str) -> bool:
        task = self._tasks.get(task_id)
        return task.cancel() if task is not None else False

    # --- backends -------------------------------------------------------------------------------------

    @property
    def hardware(self) -> Hardware:
        """The machine, as the last ``info()`` found it (every load asks ``info()`` first)."""
        if self._hardware is None:
            raise RuntimeError("Supervisor.hardware is known only after info()")
        return self._hardware

    @property
    def known_hardware(self) -> Hardware | None:
        """The machine if an ``info()`` has found it yet."""
        return self._hardware

    async def info(self) -> SystemInfo:
        """The machine and every backend's state now (probes run in a thread)."""
        info = await asyncio.to_thread(gather, self.settings, self._hardware)
        self._hardware = info.hardware
        return info

    def install(self, recipe: str, backend: str) -> asyncio.Task[InstallManifest]:
        """Start (or join) installing a backend; progress comes as InstallProgress events."""
        task_id = f"install:{BackendKey(recipe, backend)}"
        running = self._tasks.get(task_id)
        if running is not None:
            return running
        return self._spawn(task_id, self._install(recipe, backend))

    async def _install(self, recipe: str, backend: str) -> InstallManifest:
        info = await self.info()
        spec = info.versions.spec(recipe, backend)
        status = info.recipes[recipe].backends[backend]

        def report(update: InstallUpdate) -> None:
            p = update.progress
            if p is None:
                self._emit(InstallProgress(spec.key, update.phase, detail=update.detail))
            else:
                self._emit(InstallProgress(spec.key, update.phase, p.done, p.total, p.speed_bps, p.eta_s))

        import httpx

        with httpx.Client() as client:  # blocking: fetch moves the bytes in a worker thread
            manifest = await install_backend(spec, status, client, report)
        self._emit(InstallFinished(spec.key, manifest.version, manifest.sha256))
        return manifest

    async def uninstall(self, recipe: str, backend: str) -> bool:
        """Remove an installed backend; refused while it runs or installs. False when none was there."""
        key = BackendKey(recipe, backend)
        if f"install:{key}" in self._tasks:
            raise InstallError(f"{key} is being installed.", "Cancel the install first.")
        busy = [e.id for e in self._engines.values() if e.request.backend_key == key]
        if any(self._engines[i].state in (EngineState.STARTING, EngineState.READY) for i in busy):
            raise InstallError(f"{key} is running {', '.join(busy)}.", "Unload the model first.")
        removed = await asyncio.to_thread(_uninstall_files, recipe, backend)
        if removed:
            self._emit(Uninstalled(key))
        return removed

    # --- engines --------------------------------------------------------------------------------------

    def apply_settings(self, settings: Settings) -> None:
        """Take new settings at once: later launches use them, running engines take the new timeouts."""
        self.settings = settings
        for engine in self._engines.values():
            engine.load_timeout_s = settings.load_timeout_s
            engine.hang_grace_s = settings.hang_grace_s

    @property
    def engines(self) -> dict[str, Engine]:
        return dict(self._engines)

    def engine(self, engine_id: str) -> Engine:
        try:
            return self._engines[engine_id]
        except KeyError:
            raise EngineError(f"No model called {engine_id} is loaded.") from None

    async def engine_binary(
        self, recipe: str, backend: str | None, *, dry_run: bool = False
    ) -> tuple[str, Path, str]:
        """A recipe's backend (None: the best one here), its engine program and its library folder ("" for
        none); checks the backend runs here and is installed (unless ``dry_run``)."""
        info = await self.info()
        support = info.recipes.get(recipe)
        if support is None:
            raise ConfigError(f"The {recipe} recipe is unknown to this build.")
        backend = backend or support.default_backend
        if backend is None:
            raise UnsupportedError(f"No {recipe} backend can run on this machine.")
        status = support.backends.get(backend)
        if status is None:
            known = ", ".join(str(BackendKey(recipe, b)) for b in support.backends)
            raise ConfigError(f"{recipe} has no backend called {backend!r}.", f"Known: {known}.")
        key = BackendKey(recipe, backend)
        if status.state is BackendState.UNSUPPORTED:
            raise UnsupportedError(f"{key} cannot run on this machine: {status.message}")
        spec = info.versions.spec(recipe, backend)
        if spec.kind is BackendKind.SYSTEM:
            assert info.system_binary is not None  # else the backend would be unsupported
            binary = Path(info.system_binary.path)
            library_dir = ""
        else:
            if not dry_run and status.state is BackendState.INSTALLABLE:
                raise InstallError(
                    f"{key} is not installed.", f"Install it first: lemon-desk backends install {key}"
                )
            if not dry_run and status.state is BackendState.UPDATE_REQUIRED:
                raise InstallError(f"{key}: {status.message}", f"Run: lemon-desk backends install {key}")
            found = installed_binary(recipe, backend)
            if found is None and not dry_run:
                raise InstallError(f"{key} is installed but its engine is missing.", "Install it again.")
            folder = install_dir(recipe, backend)
            if spec.kind is BackendKind.PIP:  # the venv's python runs the engine as a module
                binary, library_dir = found or venv_python(folder), ""
            else:
                binary = found or folder / ENGINE_BINARY.get(recipe, "server")
                library_dir = str(binary.parent)
        return backend, binary, library_dir

    async def launch_request(
        self, model: Model, options: LoadOptions, *, dry_run: bool = False
    ) -> LaunchRequest:
        """What to run for ``model``: checks the backend runs here and is installed (unless ``dry_run``)."""
        engine = await self.engine_binary(model.recipe, options.backend, dry_run=dry_run)
        backend, binary, library_dir = engine
        hub = hub_cache_dir(self.settings.models_dir)
        model_argument = self._model_argument(model, dry_run)
        architecture = ""
        if model.recipe == "llamacpp":  # the quirk table keys on the GGUF's architecture
            architecture = await asyncio.to_thread(gguf_architecture, Path(model_argument))
        # A model labelled for embeddings or reranking is served in that mode (llama-server's flags).
        mode = [f"--{label}" for label in ("embeddings", "reranking") if label in model.labels]
        mode = mode if model.recipe == "llamacpp" else []
        projector = self._resolve_projector(model) if model.recipe == "llamacpp" else None
        return LaunchRequest(
            recipe=model.recipe,
            backend=backend,
            binary=str(binary),
            library_dir=library_dir,
            model=model_argument,
            ctx_size=options.ctx_size,
            user_args=(*mode, *split_args(options.args)),
            hf_hub_cache=str(hub),
            architecture=architecture,
            quirks=load_quirks(),
            mmproj=str(projector) if projector else "",
            alias=model.name if model.recipe == "llamacpp" else "",
            rpc=self._rpc_workers(model, options),
            slot_save_path=str(slot_cache_dir(make=not dry_run)) if model.recipe == "llamacpp" else "",
        )

    @staticmethod
    def _rpc_workers(model: Model, options: LoadOptions) -> tuple[str, ...]:
        if options.rpc and model.recipe != "llamacpp":
            raise ConfigError(
                f"{model.name} is a {model.recipe} model: RPC workers serve llama.cpp models only.",
                "Load it without workers (rpc: local).",
            )
        return options.rpc

    def _model_argument(self, model: Model, dry_run: bool) -> str:
        """A file or folder; for lemon-mlx the repo id whenever there is one (the engine finds it in
        the HF cache), once the app has downloaded it: the engine's own downloads are not atomic."""
        if model.recipe != "lemon-mlx" or model.repo_id is None:
            return str(self._resolve_model(model))
        if not dry_run:
            self._resolve_model(model)  # raises, saying how to download it, when it is not here
        return model.repo_id

    async def dry_run(self, model: Model, options: LoadOptions, parent_env: dict[str, str]) -> LaunchPlan:
        """The command and the variables the app would set, with per-launch secrets masked."""
        request = await self.launch_request(model, options, dry_run=True)
        assert self._hardware is not None
        return plan_launch(request, self._hardware, PORT_PLACEHOLDER, KEY_FILE_PLACEHOLDER, parent_env)

    def load(self, model: Model, options: LoadOptions | None = None) -> asyncio.Task[Engine]:
        """Start an engine for ``model`` (its id is the model's name); a loaded or loading one is replaced."""
        task_id = f"load:{model.name}"
        previous = self._tasks.get(task_id)
        if previous is not None:
            previous.cancel()
        return self._spawn(task_id, self._load(model, options or LoadOptions()))

    async def _load(self, model: Model, options: LoadOptions) -> Engine:
        request = await self.launch_request(model, options)
        await self.unload(model.name)
        assert self._hardware is not None
        engine = Engine(
            model.name,
            request,
            self._hardware,
            load_timeout_s=self.settings.load_timeout_s,
            hang_grace_s=self.settings.hang_grace_s,
        )
        self._engines[model.name] = engine
        backend = request.backend_key

        def changed(state: EngineState) -> None:
            failed = state in (EngineState.FAILED, EngineState.CRASHED) and engine.error is not None
            message = str(engine.error) if failed else ""
            self._emit(EngineStateChanged(engine.id, model.name, backend, state, message))

        engine.add_state_listener(changed)
        await engine.start()
        return engine

    async def unload(self, engine_id: str) -> None:
        """Stop an engine and forget it (a load in progress for it is cancelled)."""
        loading = self._tasks.get(f"load:{engine_id}")
        if loading is not None and loading is not asyncio.current_task():
            loading.cancel()
            await asyncio.gather(loading, return_exceptions=True)
        engine = self._engines.pop(engine_id, None)
        if engine is not None:
            # A caller cancelled mid-stop must not leave the process unreaped: the stop runs on.
            stop = asyncio.ensure_future(engine.stop())
            self._stops.add(stop)
            stop.add_done_callback(self._stops.discard)
            await asyncio.shield(stop)

    def chat_client(self, engine_id: str) -> ChatClient:
        """A client for a ready engine, with the request timeout from settings; close it when done."""
        return self.engine(engine_id).chat_client(self.settings.request_timeout_s)

    # --- shutdown -------------------------------------------------------------------------------------

    async def shutdown(self) -> None:
        """Cancel every task and stop every engine; nothing is left running."""
        self._shutting_down = True
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        engines = list(self._engines.values())
        self._engines.clear()
        stops = [*(e.stop() for e in engines), *self._stops]
        for outcome in await asyncio.gather(*stops, return_exceptions=True):
            if isinstance(outcome, BaseException):
                log.error("stopping an engine failed: %r", outcome)
