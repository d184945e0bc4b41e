"""An engine's stop hooks (what saves its slots' KV caches) run while it still answers, once per stop,
and never keep it from stopping: against the stand-in engine, a real child process."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import httpx
import pytest

from app.core.engine_state import EngineState
from app.store.settings import Settings
from app.supervisor import engine as engine_module
from app.supervisor.engine import Engine
from tests.support.standin import make_standin_model
from tests.unit.test_standin_engine import standin_engine


def test_hooks_run_once_while_the_engine_answers_then_it_stops(
    standin_settings: Settings, tmp_path: Path
) -> None:
    engine = standin_engine(standin_settings, make_standin_model(tmp_path, "saver"))
    seen: list[tuple[EngineState, int]] = []

    async def save(stopping: Engine) -> None:
        async with httpx.AsyncClient(trust_env=False) as client:
            health = await client.get(f"{stopping.base_url}/health")
        seen.append((stopping.state, health.status_code))

    async def go() -> None:
        await engine.start()
        engine.add_stop_hook(save)
        await asyncio.gather(engine.stop(), engine.stop())  # two stops at once: the hook runs once

    asyncio.run(go())
    assert seen == [(EngineState.READY, 200)]
    assert engine.state is EngineState.STOPPED


def test_a_failing_or_overrunning_hook_is_logged_and_the_engine_stops(
    standin_settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(engine_module, "STOP_HOOKS_TIMEOUT_S", 0.5)
    caplog.set_level(logging.WARNING, "app.supervisor.engine")
    cancelled: list[bool] = []

    async def broken(_: Engine) -> None:
        raise RuntimeError("the disk is on fire")

    async def endless(_: Engine) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def go(hooks: list[engine_module.StopHook], name: str) -> Engine:
        engine = standin_engine(standin_settings, make_standin_model(tmp_path, name))
        await engine.start()
        for hook in hooks:
            engine.add_stop_hook(hook)
        await engine.stop()
        return engine

    assert asyncio.run(go([broken], "broken")).state is EngineState.STOPPED
    assert "a stop hook of engine broken failed" in caplog.text and "the disk is on fire" in caplog.text
    assert asyncio.run(go([endless], "endless")).state is EngineState.STOPPED
    assert cancelled == [True] and "its stop hooks took over 0.5 s; stopping it anyway" in caplog.text


def test_an_engine_that_never_became_ready_runs_no_hook(standin_settings: Settings, tmp_path: Path) -> None:
    engine = standin_engine(standin_settings, make_standin_model(tmp_path, "idle"))
    ran: list[Engine] = []

    async def hook(stopping: Engine) -> None:
        ran.append(stopping)

    async def go() -> None:
        engine.add_stop_hook(hook)
        await engine.stop()

    asyncio.run(go())
    assert ran == [] and engine.state is EngineState.STOPPED
