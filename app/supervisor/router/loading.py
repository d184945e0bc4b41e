"""Loading: the one-click load (download, install, fit check, evict, launch: one ``LoadProgress`` per
phase), unload, and the loading policy (``app.core.policy``: caps, LRU by last load or request, pins,
idle unload). Evictions and the launch they make room for run under one lock, so two loads at once
cannot both count the same free slot."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil

from app.core.engine_state import EngineState
from app.core.errors import EngineError, LemonDeskError, ModelError
from app.core.fit import DEFAULT_CONTEXT, check_live_fit, estimate, largest_context
from app.core.launch import LaunchRequest, engine_device
from app.core.models import Model
from app.core.policy import LoadedModel, over_caps, parse_caps, plan_evictions
from app.core.rpc import LOCAL_ONLY, WorkerInfo, parse_endpoint
from app.core.status import LOAD_PHASES, LoadState
from app.platform import free_memory
from app.store.library import Library
from app.store.model_options import ModelOptions
from app.store.model_paths import local_shape
from app.store.settings import Settings
from app.supervisor.engine import Engine
from app.supervisor.router.backends import install_backend, launch_options
from app.supervisor.router.engines import device_of
from app.supervisor.router.pulls import Pulls
from app.supervisor.router.runtime import Runtime
from app.supervisor.rpc import check_workers, engine_protocol
from app.supervisor.supervisor import LoadOptions, Supervisor

log = logging.getLogger(__name__)

IDLE_CHECK_S = 30.0


class Loading:
    def __init__(
        self,
        *,
        settings: Callable[[], Settings],
        library: Callable[[], Library],
        supervisor: Supervisor,
        runtime: Runtime,
        pulls: Pulls,
        clock: Callable[[], float],
        raise_limit: str,
        closing: Callable[[], bool],
        started: Callable[[], Awaitable[None]],
    ) -> None:
        self._settings = settings
        self._library = library
        self._supervisor = supervisor
        self._runtime = runtime
        self._pulls = pulls
        self._clock = clock
        self._raise_limit = raise_limit  # how the front end's user raises max_loaded_models, for a refusal
        self._closing = closing
        self._started = started  # the router's start: engines an earlier run left are stopped first
        self._room: asyncio.Lock | None = None  # held while choosing evictions and launching
        self.idle: asyncio.Task[None] | None = None
        self._caps: asyncio.Task[None] | None = None  # new settings' caps, being enforced

    # --- facts ----------------------------------------------------------------------------------------

    def pinned(self, name: str) -> bool:
        return self._runtime.pinned(name, lambda n: n in self._supervisor.engines)

    def touch(self, name: str) -> None:
        self._runtime[name].used = self._clock()

    def used(self, name: str) -> float | None:
        record = self._runtime.get(name)
        return record.used if record is not None else None

    def loaded(self) -> list[str]:
        """Models whose engine is ready, least recently used first."""
        ready = [n for n, e in self._supervisor.engines.items() if e.state is EngineState.READY]
        return sorted(ready, key=lambda n: self.used(n) or 0.0)

    def _running(self) -> list[LoadedModel]:
        live = (EngineState.STARTING, EngineState.READY)
        return [
            LoadedModel(name, device_of(engine), self.pinned(name), self.used(name) or 0.0)
            for name, engine in self._supervisor.engines.items()
            if engine.state in live
        ]

    # --- one-click load -------------------------------------------------------------------------------

    def load(
        self, model: str | Model, options: ModelOptions | None, force: bool, pinned: bool | None
    ) -> asyncio.Task[Engine]:
        if isinstance(model, str):
            model = self._library().resolve(model)
        if self._closing():
            raise EngineError("Lemon Desk is shutting down.")
        name = model.name
        record = self._runtime[name]
        record.stop_recovery()
        if record.load is not None:
            record.load.cancel()
        options = options or self._runtime.options(name)
        task = asyncio.ensure_future(self._load(model, options, force, pinned))
        self._runtime.track(name, task)
        return task

    def reload_without(self, name: str, workers: tuple[str, ...]) -> asyncio.Task[Engine]:
        record = self._runtime[name]
        last = record.launched_with
        remaining = [w for w in (last.rpc if last else ()) if w not in workers]
        options = dataclasses.replace(self._runtime.options(name), rpc=",".join(remaining) or LOCAL_ONLY)
        # A local file is known by its last load; a pin that load set for itself holds for this one.
        return self.load(record.model or name, options, False, record.pin)

    def cancel_load(self, name: str) -> bool:
        record = self._runtime.get(name)
        task = record.load if record is not None else None
        return task.cancel() if task is not None else False

    async def _load(self, model: Model, options: ModelOptions, force: bool, pinned: bool | None) -> Engine:
        name = model.name
        runtime, library = self._runtime, self._library()
        record = runtime[name]
        record.move(LoadState.IDLE)  # a new load: the last one's outcome is forgotten
        downloading = False
        try:
            if model.repo_id is not None and library.local_files(model) is None:
                runtime.set_phase(name, LoadState.DOWNLOADING)
                planned, files = await self._pulls.plan_pull(model)
                downloading = True
                await self._pulls.download(planned, files)
                downloading = False
                library = self._library()
                model = library.resolve(name) if name in library.models() else planned
            request = launch_options(self._settings(), model, options)
            await self._install_backend(model, request)
            runtime.set_phase(name, LoadState.LOADING)
            record.pin = pinned
            engine = await self.launch(model, request, force)
            if record.state is LoadState.LOADING:  # else it crashed at once, and recovery has it
                record.move(LoadState.RUNNING)
            return engine
        except asyncio.CancelledError:
            manager = self._pulls.running
            if downloading and manager is not None:
                await asyncio.shield(manager.cancel(model.checkpoint))
            raise
        except LemonDeskError as err:
            if record.load is asyncio.current_task():  # a load that replaced this one speaks for itself
                record.move(LoadState.FAILED, str(err))
            raise
        finally:
            if record.load is asyncio.current_task() and record.state in LOAD_PHASES:
                record.move(LoadState.IDLE)  # cancelled, or stopped by a bug: no phase is left showing
            runtime.changed(name)

    async def _install_backend(self, model: Model, options: LoadOptions) -> None:
        """Install the backend the load will use when it is installable or out of date."""

        def installing(key: str) -> None:
            self._runtime.set_phase(model.name, LoadState.INSTALLING, detail=key)

        version = await install_backend(self._supervisor, model.recipe, options.backend, installing)
        if version is not None:
            self._runtime[model.name].version = version

    def install_progress(self, key: str, done: int, total: int) -> None:
        """A backend install moved on: the loads waiting on it say so."""
        for name, _ in self._runtime.items():
            installing = self._runtime.in_phase(name, LoadState.INSTALLING)
            if installing is not None and installing.detail == key:
                self._runtime.set_phase(name, LoadState.INSTALLING, done, total, key)

    async def launch(self, model: Model, options: LoadOptions, force: bool) -> Engine:
        """Check the workers and the fit, make room under the caps, start the engine."""
        await self._started()
        supervisor = self._supervisor
        request = await supervisor.launch_request(model, options)
        device = engine_device(request, supervisor.hardware)
        workers = await self._check_workers(request) if request.rpc else []
        if not force:
            await self._check_fit(model, options, sum(w.free_bytes for w in workers))
        if self._room is None:
            self._room = asyncio.Lock()
        async with self._room:
            caps = parse_caps(self._settings().max_loaded_models)
            for victim in plan_evictions(self._running(), model.name, device, caps, self._raise_limit):
                log.info("unloading %s to make room for %s", victim, model.name)
                await self.unload(victim)
            record = self._runtime[model.name]
            record.model = model
            record.launched_with = options
            engine = await supervisor.load(model, options)
        self.touch(model.name)
        self._start_idle_watch()
        return engine

    async def _check_workers(self, request: LaunchRequest) -> list[WorkerInfo]:
        """Each RPC worker of the load answers, is free and speaks the engine's protocol; else a
        WorkerError naming those that do not."""
        os_name = self._supervisor.hardware.os
        expected = await engine_protocol(Path(request.binary), request.library_dir, os_name)
        return await check_workers(tuple(map(parse_endpoint, request.rpc)), expected)

    async def _check_fit(self, model: Model, options: LoadOptions, on_workers: int = 0) -> None:
        """Refuse, with the numbers and the ways out, a model that needs more memory than is free now
        (here, plus ``on_workers`` bytes free on its RPC workers)."""
        local = self._library().local_files(model)
        if local is None:
            return
        try:
            shape = await asyncio.to_thread(local_shape, model.recipe, local.main)
        except ModelError as err:
            log.info("no fit check for %s: %s", model.name, err)
            return
        hardware = self._supervisor.hardware
        context = options.ctx_size or DEFAULT_CONTEXT
        fit = estimate(local.size, shape, hardware, model.recipe, context)
        free = await asyncio.to_thread(free_memory, fit.budget.kind, hardware)
        if free is None:
            return
        free += on_workers
        others = [(n, self.rss(n)) for n in self.loaded() if n != model.name and not self.pinned(n)]
        check_live_fit(model.name, fit, free, largest_context(local.size, shape, free, model.recipe), others)

    def rss(self, name: str) -> int:
        """The memory a model's engine holds now (0: none, or unknown)."""
        engine = self._supervisor.engines.get(name)
        if engine is None or engine.pid is None:
            return 0
        try:
            return int(psutil.Process(engine.pid).memory_info().rss)
        except psutil.Error:
            return 0

    # --- unload ---------------------------------------------------------------------------------------

    async def unload(self, name: str) -> None:
        """Stop a local model's engine (a load or a restart of it under way is cancelled)."""
        record = self._runtime[name]
        record.stop_recovery()
        loading = record.load
        if loading is not None and loading is not asyncio.current_task():
            loading.cancel()
            await asyncio.gather(loading, return_exceptions=True)
        await self._supervisor.unload(name)
        record.unloaded()
        self._runtime.changed(name)

    async def delete(self, name: str) -> str:
        """Unload a model, cancel its download and delete its files; returns what was done, for people."""
        library = self._library()
        model = library.resolve(name)
        await self.unload(model.name)
        await self._pulls.drop(model)
        said = await asyncio.to_thread(library.remove, name)
        self._runtime.forget(model.name)
        self._runtime.drop_options(model.name)
        self._runtime.changed(model.name)
        return said

    async def unload_all(self) -> None:
        runtime = self._runtime
        for name in {*self._supervisor.engines, *runtime.loads(), *runtime.restarts()}:
            await self.unload(name)

    def jobs(self) -> list[asyncio.Task[Any]]:
        """What runs in the background for loading: loads, restarts and the idle watch (for shutdown)."""
        runtime = self._runtime
        own = [t for t in (self.idle, self._caps) if t is not None]
        return [*runtime.loads().values(), *runtime.restarts().values(), *own]

    def settings_changed(self) -> None:
        """Enforce the caps of new settings, in the background."""
        self._caps = asyncio.ensure_future(self.enforce_caps())

    async def enforce_caps(self) -> None:
        """Unload the least recently used unpinned models until the running ones are within the caps."""
        for name in over_caps(self._running(), parse_caps(self._settings().max_loaded_models)):
            await self.unload(name)

    # --- idle unload ----------------------------------------------------------------------------------

    def _start_idle_watch(self) -> None:
        if self.idle is None or self.idle.done():
            self.idle = asyncio.ensure_future(self._watch_idle())

    async def _watch_idle(self) -> None:
        while self._supervisor.engines:
            await asyncio.sleep(IDLE_CHECK_S)
            await self.unload_idle()

    async def unload_idle(self) -> list[str]:
        """Unload every unpinned model without a request for ``idle_unload_minutes`` (0: never)."""
        minutes = self._settings().idle_unload_minutes
        if minutes <= 0:
            return []
        now = self._clock()
        idle = []
        for name in self.loaded():
            record = self._runtime[name]
            used = record.used if record.used is not None else now
            if not self.pinned(name) and not record.busy and now - used >= minutes * 60:
                idle.append(name)
        for name in idle:
            log.info("unloading %s: no request for %d minutes", name, minutes)
            await self.unload(name)
        return idle
