"""Loading (app.supervisor.router.loading) on its own, against the stand-in engine (a real child
process): a one-click load of a model on disk goes LOADING then RUNNING; a load that fails is FAILED
with why; the cap evicts the least recently used and refuses when everything in the way is pinned; a
cancelled load is IDLE with nothing left running; unloading a running model makes it IDLE. The
download phase is tests/unit/test_router_pulls.py's; through the whole router, test_router.py's."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import psutil
import pytest

from app.core.engine_state import EngineState
from app.core.errors import EngineError, PolicyError
from app.core.status import LoadState
from app.store.settings import Settings
from app.supervisor.router.events import LoadProgress
from tests.support.router_parts import SYSTEM, router_parts
from tests.support.standin import make_standin_model
from tests.support.waiting import until


def test_a_load_of_a_model_on_disk_goes_loading_then_running(
    standin_settings: Settings, tmp_path: Path
) -> None:
    async def go() -> None:
        async with router_parts(standin_settings) as parts:
            model = parts.library.import_path(make_standin_model(tmp_path, "tiny"))
            engine = await parts.load(model)
            record = parts.runtime[model.name]
            assert engine.state is EngineState.READY
            assert [e.phase for e in parts.events if isinstance(e, LoadProgress)] == [LoadState.LOADING]
            assert record.state is LoadState.RUNNING and record.error == ""
            assert record.launched_with is not None and record.launched_with.backend == "system"
            assert parts.loading.loaded() == [model.name]
            await parts.loading.unload(model.name)
            assert record.state is LoadState.IDLE and parts.loading.loaded() == []

    asyncio.run(go())


def test_a_load_that_fails_is_failed_with_why(standin_settings: Settings, tmp_path: Path) -> None:
    async def go() -> None:
        async with router_parts(standin_settings) as parts:
            model = parts.library.import_path(make_standin_model(tmp_path, "broken", crash_on_load=True))
            with pytest.raises(EngineError) as failed:
                await parts.load(model)
            record = parts.runtime[model.name]
            assert record.state is LoadState.FAILED and record.error == str(failed.value)
            assert "simulated load failure" in record.error
            # Loading it again forgets the failure first; this model fails the same way once more.
            with pytest.raises(EngineError):
                await parts.load(model)
            assert record.state is LoadState.FAILED

    asyncio.run(go())


def test_the_cap_evicts_the_least_recent_and_a_pin_refuses(
    standin_settings: Settings, tmp_path: Path
) -> None:
    settings = dataclasses.replace(standin_settings, max_loaded_models=1)

    async def go() -> None:
        async with router_parts(settings) as parts:
            a, b = (parts.library.import_path(make_standin_model(tmp_path, n)) for n in ("a", "b"))
            await parts.load(a)
            await parts.load(b, pinned=True)
            assert parts.loading.loaded() == [b.name], "a made room for b"
            assert parts.runtime[a.name].state is LoadState.IDLE
            with pytest.raises(PolicyError):
                await parts.load(a)
            assert parts.runtime[a.name].state is LoadState.FAILED
            assert parts.loading.loaded() == [b.name], "the pinned one stays"

    asyncio.run(go())


def test_a_cancelled_load_is_idle_with_nothing_left_running(
    standin_settings: Settings, tmp_path: Path
) -> None:
    async def go() -> None:
        async with router_parts(standin_settings) as parts:
            model = parts.library.import_path(make_standin_model(tmp_path, "slow", load_delay_s=30))
            task = parts.loading.load(model, SYSTEM, False, None)
            record = parts.runtime[model.name]
            await until(
                lambda: (e := parts.supervisor.engines.get(model.name)) is not None and e.pid is not None
            )
            assert record.state is LoadState.LOADING
            pid = parts.supervisor.engines[model.name].pid
            assert pid is not None
            assert parts.loading.cancel_load(model.name)
            with pytest.raises(asyncio.CancelledError):
                await task
            assert record.state is LoadState.IDLE and record.error == ""
            assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE

    asyncio.run(go())
