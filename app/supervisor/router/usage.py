"""Usage: each running engine's CPU and memory (``EngineUsage``, while the window's status bar asks) and
the machine's with every engine's (``SystemSample``, each second while the Telemetry view is on
screen; off, nothing is sampled at all). While both are asked for, one sampler serves both: the
status bar's figures come from the Telemetry view's samples (every other one: ``USAGE_INTERVAL_S`` apart,
as from their own timer), not from a timer of their own."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import psutil

from app.core.engine_state import EngineState
from app.supervisor.router.events import Emit, EngineUsage
from app.supervisor.sampler import Sampler, SystemSample
from app.supervisor.supervisor import Supervisor

USAGE_INTERVAL_S = 2.0
SYSTEM_INTERVAL_S = 1.0  # the Telemetry view's charts, while it is watched


class Usage:
    def __init__(self, supervisor: Supervisor, emit: Emit, closing: Callable[[], bool]) -> None:
        self._supervisor = supervisor
        self._emit = emit
        self._closing = closing
        self.sampler: asyncio.Task[None] | None = None
        self.sampling = False
        self._system_sampler: Sampler | None = None
        self.watcher: asyncio.Task[None] | None = None
        self.watching = False

    def sample_usage(self, on: bool) -> None:
        """Sample every engine's CPU and memory (``EngineUsage`` events) while ``on``."""
        self.sampling = on
        self._start_sampler()

    def _start_sampler(self) -> None:
        if self.sampling and not self.watching and (self.sampler is None or self.sampler.done()):
            self.sampler = asyncio.ensure_future(self._sample())

    async def _sample(self) -> None:
        processes: dict[int, psutil.Process] = {}
        while self.sampling and not self.watching:
            for name, engine in self._supervisor.engines.items():
                if engine.state is not EngineState.READY or engine.pid is None:
                    continue
                try:
                    proc = processes.get(engine.pid)
                    if proc is None:  # made once: psutil reads the process's start time to make one
                        proc = processes[engine.pid] = psutil.Process(engine.pid)
                    with proc.oneshot():
                        self._emit(EngineUsage(name, proc.cpu_percent(None), proc.memory_info().rss))
                except psutil.Error:
                    processes.pop(engine.pid, None)
            await asyncio.sleep(USAGE_INTERVAL_S)

    def _sampler_now(self) -> Sampler:
        if self._system_sampler is None:
            hardware = self._supervisor.known_hardware
            unified = hardware is not None and hardware.os == "macos" and hardware.metal.available
            self._system_sampler = Sampler(unified_memory=unified)
        return self._system_sampler

    def _engine_pids(self) -> dict[str, int]:
        return {
            name: engine.pid
            for name, engine in self._supervisor.engines.items()
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
        """A ``SystemSample`` event every second while ``on``; off, nothing is sampled at all."""
        self.watching = on and not self._closing()
        if self.watching and (self.watcher is None or self.watcher.done()):
            self.watcher = asyncio.ensure_future(self._watch_system())
        self._start_sampler()  # watched no more: the status bar's figures have their own timer again

    @property
    def watching_system(self) -> bool:
        return self.watcher is not None and not self.watcher.done()

    async def _watch_system(self) -> None:
        usage_due = 0.0  # the status bar's figures keep their own pace: a new text lays the bar out
        while self.watching:
            started = time.monotonic()
            sample = await self.system_sample()
            if not self.watching:
                break
            self._emit(sample)
            for engine in sample.engines if self.sampling and started >= usage_due else ():
                if engine.cpu_percent is not None:  # None: first seen, nothing to compare with yet
                    self._emit(EngineUsage(engine.model, engine.cpu_percent, engine.rss_bytes))
                    usage_due = started + USAGE_INTERVAL_S - SYSTEM_INTERVAL_S / 2
            await asyncio.sleep(max(0.0, SYSTEM_INTERVAL_S - (time.monotonic() - started)))

    def stop(self) -> list[asyncio.Task[None]]:
        """Stop sampling; returns the tasks to cancel and wait for."""
        self.sampling = False
        self.watching = False
        return [t for t in (self.sampler, self.watcher) if t is not None]
