"""Recovery (app.supervisor.router.recovery) on its own, against the stand-in engine (a real child
process, crashed on command): a crash moves the model to RESTARTING and a restart with the same options
brings it back RUNNING; the crash limit moves it to GAVE_UP with the engine's last words; a crash while
shutting down is left alone. The backoff and the clock are the part's arguments, no global is patched.
The rule alone, with a fake launch, is tests/unit/test_recovery.py's; through the whole router,
tests/unit/test_router.py's."""

from __future__ import annotations

import asyncio
from pathlib import Path

from app.core.engine_state import EngineState
from app.core.policy import CRASH_LIMIT
from app.core.status import LoadState
from app.store.settings import Settings
from app.supervisor.router.events import EngineRecovery, RouterEvent
from tests.support.router_parts import router_parts
from tests.support.standin import control, make_standin_model
from tests.support.waiting import until

BACKOFF = (0.05, 0.05, 0.05)


def recoveries(events: list[RouterEvent]) -> list[EngineRecovery]:
    return [e for e in events if isinstance(e, EngineRecovery)]


def test_a_crash_restarts_the_engine_with_the_same_options_and_it_runs_again(
    standin_settings: Settings, tmp_path: Path
) -> None:
    async def go() -> None:
        async with router_parts(standin_settings, backoff_s=BACKOFF) as parts:
            model = parts.library.import_path(make_standin_model(tmp_path, "flaky"))
            first = await parts.load(model)
            record = parts.runtime[model.name]
            assert record.state is LoadState.RUNNING
            await control(first.base_url, "crash")
            await until(lambda: record.state is LoadState.RESTARTING)
            assert "restarting it in 0.05 s" in record.error and "fatal: simulated crash" in record.error
            restart = record.restart
            assert restart is not None
            again = await restart
            assert again.state is EngineState.READY and again.pid != first.pid
            assert again.request.backend == "system", "restarted with the options it was loaded with"
            assert record.state is LoadState.RUNNING and record.error == ""
            said = recoveries(parts.events)
            assert [e.gave_up for e in said] == [False, False]
            assert said[-1].message == f"{model.name} was restarted and is ready again."

    asyncio.run(go())


def test_the_crash_limit_gives_up_with_the_engines_last_words(
    standin_settings: Settings, tmp_path: Path
) -> None:
    async def go() -> None:
        async with router_parts(standin_settings, backoff_s=BACKOFF) as parts:
            model = parts.library.import_path(make_standin_model(tmp_path, "fragile"))
            engine = await parts.load(model)
            record = parts.runtime[model.name]
            for crash in range(1, CRASH_LIMIT + 1):
                await control(engine.base_url, "crash")
                await engine.wait_for_state(EngineState.CRASHED)
                if crash < CRASH_LIMIT:
                    await until(lambda: record.state is LoadState.RESTARTING)
                    restart = record.restart
                    assert restart is not None
                    engine = await restart
            assert record.state is LoadState.GAVE_UP and record.restart is None
            assert f"crashed {CRASH_LIMIT} times in 5 minutes" in record.error
            assert "fatal: simulated crash" in record.error
            assert [e.gave_up for e in recoveries(parts.events)][-1] is True
            assert parts.supervisor.engines[model.name].state is EngineState.CRASHED, "no further start"

    asyncio.run(go())


def test_a_crash_while_shutting_down_is_not_recovered(standin_settings: Settings, tmp_path: Path) -> None:
    async def go() -> None:
        async with router_parts(standin_settings, backoff_s=BACKOFF) as parts:
            model = parts.library.import_path(make_standin_model(tmp_path, "late"))
            engine = await parts.load(model)
            parts.closing = True
            await control(engine.base_url, "crash")
            await engine.wait_for_state(EngineState.CRASHED)
            record = parts.runtime[model.name]
            assert record.restart is None and record.state is LoadState.RUNNING and record.error == ""
            assert recoveries(parts.events) == []

    asyncio.run(go())
