"""A one-click load cancelled while its engine starts: the stand-in engine (a real child process) takes
30 s to load, the load task is cancelled part way, and nothing is left running or marked loaded.
The download and install phases are cancelled against the real llama-server in
tests/integration/test_one_click.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import psutil
import pytest

from app.core.engine_state import EngineState
from app.core.status import LoadState, Status
from app.store.model_options import ModelOptions
from app.store.settings import Settings
from app.supervisor.router import LoadProgress, Router, RouterEvent
from tests.support.standin import make_standin_model


def test_cancel_while_loading_stops_the_engine(standin_settings: Settings, tmp_path: Path) -> None:
    path = make_standin_model(tmp_path, "slow", load_delay_s=30)

    async def go() -> None:
        async with Router(standin_settings) as router:
            name = router.library.import_path(path).name
            events: list[RouterEvent] = []
            router.subscribe(events.append)
            task = router.load(name, ModelOptions(backend="system"))
            async with asyncio.timeout(30):
                while (engine := router.supervisor.engines.get(name)) is None or engine.pid is None:
                    await asyncio.sleep(0.02)
            assert any(isinstance(e, LoadProgress) and e.phase is LoadState.LOADING for e in events)
            process = psutil.Process(engine.pid)
            assert router.status(name).status.status is Status.LOADING

            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

            assert not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
            assert router.engine_state(name) in (None, EngineState.STOPPED)
            assert router.loaded() == []
            assert router.status(name).status.status is Status.DOWNLOADED

    asyncio.run(go())
