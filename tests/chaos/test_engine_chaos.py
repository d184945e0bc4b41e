"""The engine killed (SIGKILL) or frozen (SIGSTOP) at random moments, through the router, with the
stand-in engine (a real child process that answers like llama-server; tests/support/standin.py)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from app.core.engine_state import EngineState
from app.core.errors import EngineError
from app.core.hardware import hardware_from_json
from app.core.launch import LaunchRequest
from app.core.status import Status
from app.store.model_options import ModelOptions
from app.store.settings import Settings
from app.supervisor.engine import HANG_PROBES, Engine
from app.supervisor.router import EngineRecovery, Router, RouterEvent
from tests.chaos.conftest import Row, rng
from tests.conftest import profile_path
from tests.support.standin import control, make_standin_model

KILLS = 20
MOMENTS = ("loading", "idle", "mid-stream", "unload")
# The crash is heard from the engine's exit, tens of milliseconds here: 5 s leaves a machine ten times
# slower room, and is far short of what a crash found any other way would take (the idle probe every
# 15 s; an unload that waited out its stop grace, set to 60 s below).
ERROR_WITHIN_S = 5.0
PROMPT = [{"role": "user", "content": "tell me a long story"}]


def gone(pid: int) -> bool:
    """The process is reaped: neither running nor a zombie (``pid_exists`` is true for a zombie)."""
    return not psutil.pid_exists(pid)


async def reaped(pid: int, within_s: float = 20.0) -> bool:
    deadline = time.monotonic() + within_s
    while not gone(pid):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def engine_pid(router: Router, name: str) -> int:
    while True:
        engine = router.supervisor.engines.get(name)
        if engine is not None and engine.pid is not None:
            return engine.pid
        await asyncio.sleep(0.005)


class Trial:
    """One kill: when, how long until the caller or the front end heard of it, what state followed."""

    def __init__(self, router: Router, name: str) -> None:
        self.router = router
        self.name = name
        self.recoveries: list[EngineRecovery] = []
        self.heard_at: float | None = None
        self.unsubscribe = router.subscribe(self._seen)

    def _seen(self, event: RouterEvent) -> None:
        if isinstance(event, EngineRecovery) and event.model == self.name:
            self.recoveries.append(event)
            if self.heard_at is None:
                self.heard_at = time.monotonic()


async def kill_at(moment: str, router: Router, name: str, delay: float) -> tuple[str, float]:
    """Kill the engine of ``name`` at ``moment``; returns (what the router did, seconds to the error)."""
    trial = Trial(router, name)
    try:
        if moment == "loading":
            load = router.load(name)
            pid = await engine_pid(router, name)
            await asyncio.sleep(delay)
            assert router.engine_state(name) is EngineState.STARTING, "the load was meant to be under way"
            killed = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            with pytest.raises(EngineError, match="exited while loading"):
                await asyncio.wait_for(load, ERROR_WITHIN_S)
            took = time.monotonic() - killed
            assert router.engine_state(name) is EngineState.FAILED
            assert router.status(name).status.status is Status.FAILED
            outcome = "load failed"
        elif moment == "idle":
            await router.load(name)
            pid = await engine_pid(router, name)
            await asyncio.sleep(delay)
            killed = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            while trial.heard_at is None and time.monotonic() - killed < ERROR_WITHIN_S:
                await asyncio.sleep(0.01)
            assert trial.heard_at is not None, f"no recovery event within {ERROR_WITHIN_S} s of the crash"
            took = trial.heard_at - killed
            status = router.status(name).status
            assert router.engine_state(name) is EngineState.CRASHED and status.status is Status.CRASHED
            assert "restarting it in" in trial.recoveries[0].message and "SIGKILL" in status.message
            outcome = "crashed, restarting"
        elif moment == "mid-stream":
            await router.load(name)
            pid = await engine_pid(router, name)
            pieces = 0
            killed = 0.0
            with pytest.raises(EngineError, match="stopped unexpectedly"):
                async for _ in router.stream_chat(name, PROMPT):
                    pieces += 1
                    if pieces == int(delay * 100) + 1:
                        killed = time.monotonic()
                        os.kill(pid, signal.SIGKILL)
            took = time.monotonic() - killed
            assert router.status(name).status.status is Status.CRASHED
            outcome = "stream ended with the crash, restarting"
        else:
            await router.load(name)
            pid = await engine_pid(router, name)
            engine = router.supervisor.engines[name]
            engine.stop_grace_s = 60.0  # far over ERROR_WITHIN_S: the unload ends with the kill
            await control(engine.base_url, "ignore_sigterm")
            unload = asyncio.ensure_future(router.unload(name))
            await engine.wait_for_state(EngineState.STOPPING)
            await asyncio.sleep(delay / 4)
            killed = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            await asyncio.wait_for(unload, ERROR_WITHIN_S)
            took = time.monotonic() - killed
            assert engine.state is EngineState.STOPPED and router.engine_state(name) is None
            assert router.status(name).status.status is Status.DOWNLOADED and not trial.recoveries
            outcome = "unloaded, no restart"
        assert await reaped(pid), f"engine {pid} left running or a zombie"
        return outcome, took
    finally:
        trial.unsubscribe()
        await router.unload(name)  # also ends a restart the crash scheduled


@pytest.mark.chaos("engine SIGKILL at random moments (router)")
def test_engine_killed_at_random_moments(chaos_row: Row, standin_settings: Settings, tmp_path: Path) -> None:
    random = rng("engine-kill")
    plan = [(MOMENTS[i % len(MOMENTS)], random.uniform(0.0, 0.4)) for i in range(KILLS)]
    random.shuffle(plan)
    worst = 0.0

    async def go() -> None:
        nonlocal worst
        async with Router(standin_settings) as router:
            names = {}
            for moment in MOMENTS:
                behaviour = {"load_delay_s": 0.6} if moment == "loading" else {"tokens": 400}
                path = make_standin_model(tmp_path, moment.replace("-", ""), token_delay_s=0.01, **behaviour)
                model = router.library.import_path(path)
                router.save_options(model.name, ModelOptions(backend="system"))
                names[moment] = model.name
            for moment, delay in plan:
                outcome, took = await kill_at(moment, router, names[moment], delay)
                worst = max(worst, took)
                chaos_row.add(f"{moment}: {outcome}")
            assert not router.supervisor.engines

    asyncio.run(go())
    chaos_row.worst = f"error after {worst * 1000:.0f} ms"
    chaos_row.lost = "the reply in flight (mid-stream)"
    assert worst < ERROR_WITHIN_S


def standin_engine(settings: Settings, model: Path, **timing: float) -> Engine:
    hardware = hardware_from_json(json.loads(profile_path("cpu_only_x86").read_text()))
    request = LaunchRequest("llamacpp", "system", settings.llama_server_path, "", str(model), ctx_size=512)
    return Engine(model.stem, request, hardware, **timing)


FREEZES = 4
HANG_GRACE_S = 0.4
IDLE_PROBE_S = 0.3


@pytest.mark.chaos("engine SIGSTOP (watchdog)")
def test_engine_frozen_is_killed_by_the_watchdog_within_its_grace(
    chaos_row: Row, standin_settings: Settings, tmp_path: Path
) -> None:
    """Idle: the periodic probe; mid-stream: the silence. Either way within the probe interval or the
    grace, plus HANG_PROBES /health probes that each time out after the grace, plus one watchdog tick."""
    random = rng("engine-freeze")
    path = make_standin_model(tmp_path, "frozen", tokens=400, token_delay_s=0.01)
    worst = 0.0

    async def freeze(mid_stream: bool, delay: float) -> float:
        engine = standin_engine(standin_settings, path, hang_grace_s=HANG_GRACE_S, idle_probe_s=IDLE_PROBE_S)
        await engine.start()
        assert engine.pid is not None
        pid = engine.pid
        try:
            if mid_stream:
                async with engine.chat_client() as client:
                    stream = client.stream_chat(PROMPT)
                    await anext(stream)
                    await asyncio.sleep(delay)
                    os.kill(pid, signal.SIGSTOP)
                    frozen = time.monotonic()
                    with pytest.raises(EngineError, match="stopped responding"):
                        async for _ in stream:
                            pass
                bound = HANG_GRACE_S
            else:
                await asyncio.sleep(delay)
                os.kill(pid, signal.SIGSTOP)
                frozen = time.monotonic()
                await asyncio.wait_for(engine.wait_for_state(EngineState.CRASHED), 30.0)
                bound = IDLE_PROBE_S
            took = time.monotonic() - frozen
            assert engine.state is EngineState.CRASHED and engine.error is not None
            # About 2 s of the watchdog's own waiting, whatever the machine's speed, and 5 s for the rest on
            # a machine ten times slower; the defaults (a 15 s idle probe, a 90 s grace) would be far over.
            assert took <= bound + (HANG_PROBES + 1) * HANG_GRACE_S + 5.0, f"the watchdog took {took:.2f} s"
            assert await reaped(pid)
            return took
        finally:
            await engine.stop()

    async def go() -> None:
        nonlocal worst
        for i in range(FREEZES):
            mid_stream = i % 2 == 1
            took = await freeze(mid_stream, random.uniform(0.0, 0.3))
            worst = max(worst, took)
            chaos_row.add("mid-stream: killed as hung" if mid_stream else "idle: killed as hung")

    asyncio.run(go())
    chaos_row.worst = f"acted after {worst:.2f} s"
    chaos_row.lost = "the reply in flight (mid-stream)"
