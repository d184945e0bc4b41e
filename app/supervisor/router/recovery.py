"""Recovery: a crashed or hung engine restarts with the same options after 1 s, 5 s, 30 s (the streak
resets after a stable run); three crashes in five minutes and it gives up, with the engine's last
words. Each step is an ``EngineRecovery`` event and a move of the model's ``LoadState`` (RESTARTING, then
RUNNING again or GAVE_UP), whose message is the crash being recovered."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from app.core.engine_state import EngineState
from app.core.errors import LemonDeskError
from app.core.models import Model
from app.core.policy import CRASH_LIMIT, CRASH_WINDOW_S, RESTART_BACKOFF_S, STABLE_S, restart_delay
from app.core.rpc import memory_by_device
from app.core.status import LoadState
from app.supervisor.engine import Engine
from app.supervisor.router.events import EngineRecovery
from app.supervisor.router.runtime import Runtime
from app.supervisor.supervisor import EngineStateChanged, LoadOptions, Supervisor

Launch = Callable[[Model, LoadOptions, bool], Coroutine[Any, Any, Engine]]


class Recovery:
    def __init__(
        self,
        supervisor: Supervisor,
        runtime: Runtime,
        launch: Launch,
        clock: Callable[[], float],
        closing: Callable[[], bool],
        backoff_s: tuple[float, ...] | None = None,
    ) -> None:
        self._supervisor = supervisor
        self._runtime = runtime
        self._launch = launch  # the loading policy's launch: a restart makes room like any load
        self._clock = clock
        self._closing = closing
        self._backoff_s = backoff_s  # None: the policy's, read at each crash

    def engine_changed(self, event: EngineStateChanged) -> None:
        """Keep what a ready engine tells of itself; restart a crashed one."""
        name = event.model
        record = self._runtime[name]
        engine = self._supervisor.engines.get(name)
        if event.state is EngineState.READY:
            record.ready_at = self._clock()
            record.used = self._clock()
            if engine is not None:  # the load's lines are all in the output now; later ones push them out
                record.placement = memory_by_device(list(engine.output))
            record.lost_workers = ()
        else:
            record.placement = {}
        if event.state is EngineState.CRASHED and not self._closing():
            if engine is not None and engine.lost_workers:
                record.lost_workers = engine.lost_workers
            self._crashed(name, event.message)
        self._runtime.changed(name)

    def _crashed(self, name: str, why: str) -> None:
        record = self._runtime[name]
        now = self._clock()
        ready_at = record.ready_at if record.ready_at is not None else now
        if now - ready_at >= STABLE_S:
            record.streak = 0
        recent = [t for t in record.crashes if now - t < CRASH_WINDOW_S] + [now]
        record.crashes = recent
        model, options = record.model, record.launched_with
        if len(recent) >= CRASH_LIMIT or model is None or options is None:
            message = (
                f"{name} crashed {len(recent)} times in {CRASH_WINDOW_S / 60:g} minutes, so it was not "
                f"restarted again. Load it again once the cause is fixed.\n{why}"
            )
            self._gave_up(name, message)
            return
        delay = restart_delay(record.streak, self._backoff_s or RESTART_BACKOFF_S)
        record.streak += 1
        message = f"{name} crashed; restarting it in {delay:g} s.\n{why}"
        record.move(LoadState.RESTARTING, message)
        self._runtime.emit(EngineRecovery(name, message, gave_up=False))
        self._runtime.track(
            name, asyncio.ensure_future(self._restart(name, model, options, delay)), restart=True
        )

    async def _restart(self, name: str, model: Model, options: LoadOptions, delay: float) -> Engine:
        await asyncio.sleep(delay)
        record = self._runtime[name]
        try:
            engine = await self._launch(model, options, True)
        except LemonDeskError as err:
            self._gave_up(name, f"{name} crashed and did not start again: {err}")
            raise
        record.move(LoadState.RUNNING)
        self._runtime.emit(EngineRecovery(name, f"{name} was restarted and is ready again.", gave_up=False))
        return engine

    def _gave_up(self, name: str, message: str) -> None:
        self._runtime[name].move(LoadState.GAVE_UP, message)
        self._runtime.emit(EngineRecovery(name, message, gave_up=True))
