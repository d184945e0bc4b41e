"""The engine and the supervisor against the stand-in engine (a real child process that answers like
llama-server and crashes, hangs or ignores SIGTERM on command): the risky paths, in seconds."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from app.core.engine_state import EngineState
from app.core.errors import EngineError
from app.core.fit import estimate, shape_from_gguf
from app.core.hardware import hardware_from_json
from app.core.launch import LaunchRequest
from app.core.models import Model
from app.platform.probe import find_system_llama_server
from app.store.library import Library
from app.store.model_paths import local_gguf_metadata
from app.store.settings import Settings
from app.supervisor.engine import Engine
from app.supervisor.supervisor import EngineStateChanged, LoadOptions, Supervisor, SupervisorEvent
from tests.conftest import profile_path
from tests.support.standin import control, make_standin_model

S = EngineState
SYSTEM = LoadOptions(backend="system")
# A crash is seen by the engine's exit (tens of milliseconds here), not by the idle /health probe, which
# comes every IDLE_PROBE_S (15 s): 5 s leaves a machine ten times slower room and tells the two apart.
CRASH_SEEN_WITHIN_S = 5.0


def supervise(settings: Settings) -> Supervisor:
    return Supervisor(settings, resolve_model=Library(settings).location)


def imported(settings: Settings, path: Path) -> Model:
    return Library(settings).import_path(path)


def test_the_app_takes_the_standin_for_a_llama_server(standin_settings: Settings, tmp_path: Path) -> None:
    found = find_system_llama_server(standin_settings.llama_server_path)
    assert found is not None and found.version == "b4242"
    path = make_standin_model(tmp_path, "tiny")
    model = imported(standin_settings, path)
    assert model.recipe == "llamacpp" and model.name == "user.tiny"
    hw = hardware_from_json(json.loads(profile_path("cpu_only_x86").read_text()))
    fit = estimate(path.stat().st_size, shape_from_gguf(local_gguf_metadata(path)), hw, "llamacpp")
    assert fit.need > 0


def test_load_then_stream_a_chat_through_the_supervisor(standin_settings: Settings, tmp_path: Path) -> None:
    path = make_standin_model(tmp_path, "chatty", reply="Hello from the stand-in")
    model = imported(standin_settings, path)
    events: list[SupervisorEvent] = []

    async def go() -> tuple[str, str | None, int | None]:
        async with Supervisor(
            standin_settings, resolve_model=Library(standin_settings).location
        ) as supervisor:
            supervisor.subscribe(events.append)
            engine = await supervisor.load(model, SYSTEM)
            assert engine.state is S.READY and engine.request.backend == "system"
            text = ""
            async with supervisor.chat_client(model.name) as client:
                async for event in client.stream_chat([{"role": "user", "content": "hi"}]):
                    text += getattr(event, "content", "")
                    finish = getattr(event, "finish_reason", None)
                    completion = getattr(getattr(event, "telemetry", None), "completion_tokens", None)
            return text, finish, completion

    text, finish, completion = asyncio.run(go())
    assert text == "Hello from the stand-in"
    assert finish == "stop" and completion == 4
    states = [e.state for e in events if isinstance(e, EngineStateChanged)]
    assert states == [S.STARTING, S.READY, S.STOPPING, S.STOPPED]


def test_a_crash_is_seen_at_once_with_the_last_words(standin_settings: Settings, tmp_path: Path) -> None:
    model = imported(standin_settings, make_standin_model(tmp_path, "crashy"))

    async def go() -> tuple[float, str]:
        async with Supervisor(
            standin_settings, resolve_model=Library(standin_settings).location
        ) as supervisor:
            engine = await supervisor.load(model, SYSTEM)
            crashed = asyncio.ensure_future(engine.wait_for_state(S.CRASHED))
            started = time.monotonic()
            await control(engine.base_url, "crash")
            await asyncio.wait_for(crashed, CRASH_SEEN_WITHIN_S)
            assert engine.error is not None
            return time.monotonic() - started, engine.error.last_output

    took, details = asyncio.run(go())
    assert took < CRASH_SEEN_WITHIN_S
    assert "fatal: simulated crash" in details


def test_crash_on_load_fails_the_load_with_the_last_words(standin_settings: Settings, tmp_path: Path) -> None:
    model = imported(standin_settings, make_standin_model(tmp_path, "broken", crash_on_load=True))

    async def go() -> EngineError:
        async with Supervisor(
            standin_settings, resolve_model=Library(standin_settings).location
        ) as supervisor:
            with pytest.raises(EngineError) as failed:
                await supervisor.load(model, SYSTEM)
            assert supervisor.engine(model.name).state is S.FAILED
            return failed.value

    error = asyncio.run(go())
    assert "exited while loading broken.gguf (exit code 3)" in str(error)
    assert "simulated load failure" in error.last_output


# --- the engine's watchdog and stop, on the engine itself (small grace periods) ----------------------


def standin_engine(settings: Settings, model: Path, **timing: float) -> Engine:
    hw = hardware_from_json(json.loads(profile_path("cpu_only_x86").read_text()))
    request = LaunchRequest("llamacpp", "system", settings.llama_server_path, "", str(model), ctx_size=512)
    return Engine(model.stem, request, hw, **timing)


def test_a_hang_mid_stream_is_a_crash_after_the_grace(standin_settings: Settings, tmp_path: Path) -> None:
    model = make_standin_model(tmp_path, "stuck", tokens=1000, token_delay_s=0.01)
    engine = standin_engine(standin_settings, model, hang_grace_s=0.5, idle_probe_s=60.0)

    async def go() -> tuple[float, Exception]:
        await engine.start()
        try:
            async with engine.chat_client() as client:
                replies = client.stream_chat([{"role": "user", "content": "go on"}])
                await anext(replies)
                await control(engine.base_url, "hang")
                hung_at = time.monotonic()
                with pytest.raises(EngineError) as broken:
                    async for _ in replies:
                        pass
                return time.monotonic() - hung_at, broken.value
        finally:
            await engine.stop()

    took, error = asyncio.run(go())
    assert engine.state is S.CRASHED
    assert "stopped responding to /health (no reply data for 0.5 s" in str(error)
    # The grace, then three /health probes of at most 0.5 s each: 2 s of waiting here, whatever the
    # machine's speed; the default grace (90 s) would be far over 30 s.
    assert 0.5 <= took < 30.0


def test_an_idle_hang_is_found_by_the_periodic_health_probe(
    standin_settings: Settings, tmp_path: Path
) -> None:
    engine = standin_engine(
        standin_settings, make_standin_model(tmp_path, "idle"), hang_grace_s=0.3, idle_probe_s=0.2
    )

    async def go() -> None:
        await engine.start()
        try:
            await control(engine.base_url, "hang")
            await asyncio.wait_for(engine.wait_for_state(S.CRASHED), 30.0)  # ~1.7 s of probes here
        finally:
            await engine.stop()

    asyncio.run(go())
    assert engine.error is not None
    assert "stopped responding to /health (while idle, /health failed 3 times in a row)" in str(engine.error)
    assert "hanging now" in engine.error.last_output
    assert engine.pid is not None and not psutil.pid_exists(engine.pid)


def test_a_healthy_idle_engine_is_probed_and_left_alone(standin_settings: Settings, tmp_path: Path) -> None:
    # A /health probe gives up after min(5 s, the grace): a short grace would find a machine ten times
    # slower hung.
    engine = standin_engine(
        standin_settings, make_standin_model(tmp_path, "calm"), hang_grace_s=5.0, idle_probe_s=0.05
    )
    probes: list[str] = []

    async def go() -> None:
        await engine.start()
        three_probes = asyncio.Event()

        def seen(line: str) -> None:
            if "GET /health 127.0.0.1 200" in line:
                probes.append(line)
                if len(probes) >= 3:
                    three_probes.set()

        engine.add_output_listener(seen)
        try:
            await asyncio.wait_for(three_probes.wait(), 30.0)  # 0.15 s of probes here
        finally:
            await engine.stop()

    asyncio.run(go())
    assert engine.state is S.STOPPED and engine.error is None


def test_an_idle_engines_watchdog_sleeps_until_its_probe_is_due(
    standin_settings: Settings, tmp_path: Path
) -> None:
    """Idle, nothing is due before the next /health probe: the watchdog set a timer every second (one
    of the app's idle wakes), now none until the probe, and a request that starts wakes it (the hang
    mid-stream test above, whose probe is a minute away)."""
    engine = standin_engine(
        standin_settings, make_standin_model(tmp_path, "quiet"), hang_grace_s=5.0, idle_probe_s=60.0
    )

    async def go() -> list[str]:
        await engine.start()
        loop = asyncio.get_running_loop()
        timers: list[str] = []
        call_at = loop.call_at

        def counted(when: float, callback: Any, *args: Any, context: Any = None) -> asyncio.TimerHandle:
            timers.append(getattr(callback, "__qualname__", repr(callback)))
            return call_at(when, callback, *args, context=context)

        loop.call_at = counted  # type: ignore[method-assign]
        try:
            await asyncio.sleep(3.0)
        finally:
            loop.call_at = call_at  # type: ignore[method-assign]
            await engine.stop()
        return [t for t in timers if t != "_set_result_unless_cancelled"]  # the test's own sleep

    assert asyncio.run(go()) in ([], ["_release_waiter"])  # at most the one until the probe (was 3)


def test_stop_kills_an_engine_that_ignores_sigterm_and_reaps_it(
    standin_settings: Settings, tmp_path: Path
) -> None:
    engine = standin_engine(standin_settings, make_standin_model(tmp_path, "stubborn"), stop_grace_s=0.5)

    async def go() -> tuple[int, float]:
        await engine.start()
        assert engine.pid is not None
        await control(engine.base_url, "ignore_sigterm")
        started = time.monotonic()
        await engine.stop()
        return engine.pid, time.monotonic() - started

    pid, took = asyncio.run(go())
    assert engine.state is S.STOPPED
    # The kill came after this engine's 0.5 s grace, not the default 10 s: 8 s leaves a machine ten times
    # slower room for the kill and the reaping, and is still short of the default.
    assert 0.5 <= took < 8.0
    assert "SIGTERM received and ignored" in engine.last_output()
    assert "stopped (killed by signal SIGKILL)" in engine.last_output()
    assert not psutil.pid_exists(pid)  # reaped: not even a zombie is left
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
