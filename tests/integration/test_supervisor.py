"""The supervisor facade as the UI bridge will drive it: tasks keyed by id, events, unload, shutdown."""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from app.core.engine_state import EngineState
from app.core.errors import InstallError
from app.store.library import location_on_demand
from app.store.model_paths import model_for_path
from app.store.settings import Settings
from app.supervisor.supervisor import (
    EngineStateChanged,
    LoadOptions,
    Supervisor,
    SupervisorEvent,
    TaskCancelled,
    TaskFailed,
)
from tests.integration.conftest import Mirror

pytestmark = pytest.mark.integration
S = EngineState


def states(events: list[SupervisorEvent]) -> list[EngineState]:
    return [e.state for e in events if isinstance(e, EngineStateChanged)]


def test_load_chat_unload_with_events(mirror: Mirror, smol_gguf: Path) -> None:
    events: list[SupervisorEvent] = []
    model = model_for_path(smol_gguf)

    async def go() -> tuple[str, int]:
        async with Supervisor(Settings(), resolve_model=location_on_demand(Settings())) as supervisor:
            supervisor.subscribe(events.append)
            await supervisor.install("llamacpp", "cpu")
            engine = await supervisor.load(model, LoadOptions(ctx_size=1024))
            assert supervisor.engines == {model.name: engine}
            async with supervisor.chat_client(model.name) as client:
                reply = await client.chat([{"role": "user", "content": "Say hi."}], max_tokens=8)
            with pytest.raises(InstallError, match="is running SmolLM2"):
                await supervisor.uninstall("llamacpp", "cpu")
            assert engine.pid is not None
            pid = engine.pid
            await supervisor.unload(model.name)
            assert supervisor.engines == {}
            return reply.content, pid

    content, pid = asyncio.run(go())
    assert content
    assert states(events) == [S.STARTING, S.READY, S.STOPPING, S.STOPPED]
    changed = [e for e in events if isinstance(e, EngineStateChanged)]
    assert {(e.engine_id, str(e.backend)) for e in changed} == {(model.name, "llamacpp:cpu")}
    assert not psutil.pid_exists(pid)


def test_failed_load_is_a_task_failure_with_the_engines_words(mirror: Mirror, tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model")
    events: list[SupervisorEvent] = []

    async def go() -> None:
        async with Supervisor(Settings(), resolve_model=location_on_demand(Settings())) as supervisor:
            supervisor.subscribe(events.append)
            await supervisor.install("llamacpp", "cpu")
            load = supervisor.load(model_for_path(bad))
            await asyncio.gather(load, return_exceptions=True)
            assert supervisor.engine("bad").state is S.FAILED

    asyncio.run(go())
    failed = [e for e in events if isinstance(e, TaskFailed)]
    assert len(failed) == 1 and failed[0].task_id == "load:bad"
    assert "invalid magic characters" in failed[0].message
    assert states(events) == [S.STARTING, S.FAILED]
    last = [e for e in events if isinstance(e, EngineStateChanged)][-1]
    assert "llama-server exited while loading bad.gguf" in last.message


def test_crash_is_an_event_with_the_reason(mirror: Mirror, smol_gguf: Path) -> None:
    events: list[SupervisorEvent] = []

    async def go() -> None:
        async with Supervisor(Settings(), resolve_model=location_on_demand(Settings())) as supervisor:
            supervisor.subscribe(events.append)
            await supervisor.install("llamacpp", "cpu")
            engine = await supervisor.load(model_for_path(smol_gguf))
            assert engine.pid is not None
            os.kill(engine.pid, signal.SIGKILL)
            await engine.wait_for_state(S.CRASHED)

    asyncio.run(go())
    crash = [e for e in events if isinstance(e, EngineStateChanged)][-1]
    assert crash.state is S.CRASHED
    assert crash.message.startswith("llama-server stopped unexpectedly (killed by signal SIGKILL)")


def test_shutdown_cancels_a_load_and_stops_everything(mirror: Mirror, smol_gguf: Path) -> None:
    events: list[SupervisorEvent] = []

    async def go() -> int:
        supervisor = Supervisor(Settings(), resolve_model=location_on_demand(Settings()))
        supervisor.subscribe(events.append)
        await supervisor.install("llamacpp", "cpu")
        model = model_for_path(smol_gguf)
        first = await supervisor.load(model)
        assert first.pid is not None
        other_started = asyncio.Event()

        def on_event(event: SupervisorEvent) -> None:
            if isinstance(event, EngineStateChanged) and event.engine_id == "other":
                other_started.set()

        supervisor.subscribe(on_event)
        loading = supervisor.load(replace(model, name="other"))
        await other_started.wait()
        await supervisor.shutdown()
        assert loading.cancelled()
        assert supervisor.engines == {} and supervisor.tasks() == {}
        assert first.state is S.STOPPED
        return first.pid

    pid = asyncio.run(go())
    assert TaskCancelled("load:other") in events
    assert not psutil.pid_exists(pid)


def test_install_of_one_backend_is_one_task(mirror: Mirror) -> None:
    async def go() -> bool:
        async with Supervisor(Settings(), resolve_model=location_on_demand(Settings())) as supervisor:
            first = supervisor.install("llamacpp", "cpu")
            second = supervisor.install("llamacpp", "cpu")
            assert supervisor.tasks() == {"install:llamacpp:cpu": first}
            await first
            return first is second

    assert asyncio.run(go())
    # The asset is downloaded once (beside one look at the release's metadata for its digest).
    assert sum(1 for path, _ in mirror.served.log if "/releases/download/" in path) == 1


def test_an_unload_cancelled_half_way_still_reaps_the_engine(mirror: Mirror, smol_gguf: Path) -> None:
    async def go() -> int:
        supervisor = Supervisor(Settings(), resolve_model=location_on_demand(Settings()))
        await supervisor.install("llamacpp", "cpu")
        model = model_for_path(smol_gguf)
        engine = await supervisor.load(model)
        assert engine.pid is not None
        stopping = asyncio.Event()
        engine.add_state_listener(lambda state: stopping.set() if state is S.STOPPING else None)
        unloading = asyncio.ensure_future(supervisor.unload(model.name))
        await stopping.wait()
        unloading.cancel()
        with pytest.raises(asyncio.CancelledError):
            await unloading
        await supervisor.shutdown()
        assert engine.state is S.STOPPED
        return engine.pid

    pid = asyncio.run(go())
    assert not psutil.pid_exists(pid)
