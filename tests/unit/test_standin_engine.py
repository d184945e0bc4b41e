"""The engine and the supervisor against the stand-in engine (a real child process that answers like
llama-server and crashes, hangs or ignores SIGTERM on command): the risky paths, in seconds."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from app.core.errors import EngineError
from app.core.fit import estimate, shape_from_gguf
from app.core.hardware import hardware_from_json
from app.core.models import Model
from app.library import Library
from app.platform.probe import find_system_llama_server
from app.store.settings import Settings
from app.supervisor.engine import EngineState
from app.supervisor.modelmeta import local_gguf_metadata
from app.supervisor.supervisor import EngineStateChanged, LoadOptions, Supervisor, SupervisorEvent
from tests.conftest import profile_path
from tests.support.standin import control, make_standin_model

S = EngineState
SYSTEM = LoadOptions(backend="system")


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
        async with Supervisor(standin_settings) as supervisor:
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


def test_a_crash_is_seen_within_a_second_with_the_last_words(
    standin_settings: Settings, tmp_path: Path
) -> None:
    model = imported(standin_settings, make_standin_model(tmp_path, "crashy"))

    async def go() -> tuple[float, str]:
        async with Supervisor(standin_settings) as supervisor:
            engine = await supervisor.load(model, SYSTEM)
            crashed = asyncio.ensure_future(engine.wait_for_state(S.CRASHED))
            started = time.monotonic()
            await control(engine.base_url, "crash")
            await asyncio.wait_for(crashed, 1.0)
            assert engine.error is not None
            return time.monotonic() - started, engine.error.last_output

    took, details = asyncio.run(go())
    assert took < 1.0
    assert "fatal: simulated crash" in details


def test_crash_on_load_fails_the_load_with_the_last_words(standin_settings: Settings, tmp_path: Path) -> None:
    model = imported(standin_settings, make_standin_model(tmp_path, "broken", crash_on_load=True))

    async def go() -> EngineError:
        async with Supervisor(standin_settings) as supervisor:
            with pytest.raises(EngineError) as failed:
                await supervisor.load(model, SYSTEM)
            assert supervisor.engine(model.name).state is S.FAILED
            return failed.value

    error = asyncio.run(go())
    assert "exited while loading broken.gguf (exit code 3)" in str(error)
    assert "simulated load failure" in error.last_output
