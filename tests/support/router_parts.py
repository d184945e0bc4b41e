"""The router's parts put together without the ``Router``, for tests of one part on its own: a real
supervisor (engines are real child processes: the stand-in engine), the runtime records, pulls,
loading and recovery, wired as ``app.supervisor.router.router`` wires them. Collaborators a test wants
to control (the clock, the backoff, "shutting down") are arguments, never patched module globals."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from app.core.models import Model
from app.store.library import Library
from app.store.model_options import ModelOptions
from app.store.settings import Settings
from app.supervisor.engine import Engine
from app.supervisor.router.events import RouterEvent
from app.supervisor.router.loading import Loading
from app.supervisor.router.pulls import Pulls
from app.supervisor.router.recovery import Recovery
from app.supervisor.router.runtime import Runtime
from app.supervisor.supervisor import EngineStateChanged, Supervisor, SupervisorEvent

SYSTEM = ModelOptions(backend="system")  # the stand-in engine, as the `system` llama.cpp backend


@dataclass
class Parts:
    settings: Settings
    library: Library
    supervisor: Supervisor
    runtime: Runtime
    pulls: Pulls
    loading: Loading
    recovery: Recovery
    events: list[RouterEvent] = field(default_factory=list)
    closing: bool = False  # what the parts are told of "shutting down"

    async def load(
        self, model: Model, options: ModelOptions = SYSTEM, *, pinned: bool | None = None
    ) -> Engine:
        """A one-click load of ``model``, awaited."""
        return await self.loading.load(model, options, False, pinned)


@asynccontextmanager
async def router_parts(
    settings: Settings,
    *,
    clock: Callable[[], float] = time.monotonic,
    backoff_s: tuple[float, ...] | None = None,
) -> AsyncIterator[Parts]:
    library = Library(settings)
    parts: Parts
    supervisor = Supervisor(settings, resolve_model=library.location, clean_start=False)
    runtime = Runtime(lambda event: parts.events.append(event))
    pulls = Pulls(lambda: library, runtime, lambda: supervisor.hardware, [])

    async def started() -> None:
        return None

    loading = Loading(
        settings=lambda: parts.settings,
        library=lambda: library,
        supervisor=supervisor,
        runtime=runtime,
        pulls=pulls,
        clock=clock,
        raise_limit="raise max_loaded_models",
        closing=lambda: parts.closing,
        started=started,
    )
    recovery = Recovery(supervisor, runtime, loading.launch, clock, lambda: parts.closing, backoff_s)
    parts = Parts(settings, library, supervisor, runtime, pulls, loading, recovery)

    def on_supervisor(event: SupervisorEvent) -> None:
        parts.events.append(event)
        if isinstance(event, EngineStateChanged):
            recovery.engine_changed(event)

    unsubscribe = supervisor.subscribe(on_supervisor)
    try:
        yield parts
    finally:
        parts.closing = True
        jobs = loading.jobs()
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
        await supervisor.shutdown()
        await pulls.close(resume_later=False)
        unsubscribe()
