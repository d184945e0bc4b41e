"""Recovery on its own (app.supervisor.router.recovery): a crashed engine restarts with the same
options after the backoff, the streak starts over after a stable run, and the third crash in the
window gives up with the engine's last words. The launch is a fake (it records what it was asked and
hands back a placeholder): what a real restart does is tests/unit/test_router.py's; this is the rule."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from app.core.backends import BackendKey
from app.core.engine_state import EngineState
from app.core.models import Model
from app.core.policy import CRASH_LIMIT, STABLE_S
from app.store.settings import Settings
from app.supervisor.engine import Engine
from app.supervisor.router.events import EngineRecovery, RouterEvent
from app.supervisor.router.recovery import Recovery
from app.supervisor.router.runtime import Runtime
from app.supervisor.supervisor import EngineStateChanged, LoadOptions, Supervisor

NAME = "user.tiny"
MODEL = Model(NAME, "llamacpp", "/models/tiny.gguf")
OPTIONS = LoadOptions(ctx_size=1024)
BACKOFF = (0.01, 0.02, 0.03)


@dataclass
class FakeLaunch:
    """Stands in for the loading policy's launch: records each call, starts nothing."""

    calls: list[tuple[Model, LoadOptions, bool]] = field(default_factory=list)

    async def __call__(self, model: Model, options: LoadOptions, force: bool) -> Engine:
        self.calls.append((model, options, force))
        return cast(Engine, object())  # recovery only hands it on to whoever awaits the restart


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


def make(events: list[RouterEvent], clock: Clock, launch: FakeLaunch) -> tuple[Recovery, Runtime]:
    runtime = Runtime(events.append)
    supervisor = Supervisor(Settings(), resolve_model=lambda m: Path(m.checkpoint), clean_start=False)
    recovery = Recovery(supervisor, runtime, launch, clock, lambda: False, backoff_s=BACKOFF)
    record = runtime[NAME]
    record.model, record.launched_with = MODEL, OPTIONS
    return recovery, runtime


def changed(state: EngineState, message: str = "") -> EngineStateChanged:
    return EngineStateChanged(NAME, NAME, BackendKey("llamacpp", "cpu"), state, message)


def recoveries(events: list[RouterEvent]) -> list[EngineRecovery]:
    return [e for e in events if isinstance(e, EngineRecovery)]


def test_a_crash_restarts_the_engine_with_its_options_after_the_first_step() -> None:
    events: list[RouterEvent] = []
    launch = FakeLaunch()

    async def go() -> None:
        recovery, runtime = make(events, Clock(), launch)
        recovery.engine_changed(changed(EngineState.READY))
        recovery.engine_changed(changed(EngineState.CRASHED, "fatal: out of cheese"))
        assert "restarting it in 0.01 s" in runtime[NAME].error
        restart = runtime[NAME].restart
        assert restart is not None
        await restart
        assert runtime[NAME].error == "" and runtime[NAME].restart is None

    asyncio.run(go())
    assert launch.calls == [(MODEL, OPTIONS, True)]  # forced: the fit was checked at the first load
    first, ready = recoveries(events)
    assert not first.gave_up and first.message.endswith("fatal: out of cheese")
    assert not ready.gave_up and "restarted and is ready again" in ready.message


def test_the_backoff_grows_and_starts_over_after_a_stable_run() -> None:
    events: list[RouterEvent] = []
    clock = Clock()

    async def go() -> list[str]:
        recovery, runtime = make(events, clock, FakeLaunch())
        delays = []
        for advance in (0.0, 1.0, STABLE_S + 1):
            clock.now += advance
            recovery.engine_changed(changed(EngineState.READY))
            clock.now += advance
            recovery.engine_changed(changed(EngineState.CRASHED))
            delays.append(runtime[NAME].error.split(" s.")[0].rsplit(" ", 1)[1])
            restart = runtime[NAME].restart
            assert restart is not None
            await restart
        return delays

    assert asyncio.run(go()) == ["0.01", "0.02", "0.01"]


def test_the_third_crash_in_the_window_gives_up_with_the_last_words() -> None:
    events: list[RouterEvent] = []
    launch = FakeLaunch()

    async def go() -> Runtime:
        recovery, runtime = make(events, Clock(), launch)
        for _ in range(CRASH_LIMIT):
            recovery.engine_changed(changed(EngineState.CRASHED, "fatal: simulated crash"))
            restart = runtime[NAME].restart
            if restart is not None:
                await restart
        return runtime

    runtime = asyncio.run(go())
    assert len(launch.calls) == CRASH_LIMIT - 1
    last = recoveries(events)[-1]
    assert last.gave_up and f"crashed {CRASH_LIMIT} times in 5 minutes" in last.message
    assert last.message.endswith("fatal: simulated crash") and runtime[NAME].error == last.message
    assert runtime[NAME].restart is None


def test_an_engine_the_router_did_not_launch_is_not_restarted() -> None:
    events: list[RouterEvent] = []
    launch = FakeLaunch()

    async def go() -> None:
        recovery, runtime = make(events, Clock(), launch)
        runtime[NAME].unloaded()  # forgets the model it ran
        recovery.engine_changed(changed(EngineState.CRASHED, "gone"))
        assert runtime[NAME].restart is None

    asyncio.run(go())
    assert launch.calls == [] and [e.gave_up for e in recoveries(events)] == [True]
