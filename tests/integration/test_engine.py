"""The engine process with the real llama-server: ready, chat, stop, crash, hang, bad model, taken port."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from collections.abc import Callable, Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest

from app.client.events import ChatDelta, ChatDone
from app.core.engine_state import EngineState
from app.core.errors import EngineError
from app.core.hardware import Hardware
from app.core.launch import LaunchRequest
from app.store.paths import run_dir
from app.supervisor.engine import Engine

pytestmark = pytest.mark.integration
T = TypeVar("T")

S = EngineState
HELLO = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
LONG = {"max_tokens": 1500, "ignore_eos": True, "temperature": 0}


def run(engine: Engine, body: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``body`` on a fresh loop; the engine is stopped whatever happens, so a failure cannot hang."""

    async def main() -> T:
        try:
            return await body()
        finally:
            await engine.stop()

    return asyncio.run(main())


def gone(pid: int) -> bool:
    """Exited and reaped: not running, and no zombie left for its parent (us) to collect."""
    return not psutil.pid_exists(pid)


def record(engine: Engine) -> list[EngineState]:
    states: list[EngineState] = []
    engine.add_state_listener(states.append)
    return states


def test_start_chat_stop(llama_request: LaunchRequest, cpu_hardware: Hardware) -> None:
    engine = Engine("smol", llama_request, cpu_hardware)
    states = record(engine)
    lines: list[str] = []
    engine.add_output_listener(lines.append)

    async def go() -> tuple[str, ChatDone, int, str]:
        await engine.start()
        assert engine.state is S.READY and engine.pid is not None and engine.api_key
        pid, key = engine.pid, engine.api_key
        cmdline = " ".join(psutil.Process(pid).cmdline())
        assert key not in cmdline and "--api-key-file" in cmdline
        assert "--host 127.0.0.1" in cmdline
        keys = [p for p in run_dir().iterdir() if p.suffix == ".key"]
        assert keys == []  # the key file is gone once the engine has read it (its run record stays)
        reply, done = "", None
        async with engine.chat_client() as client:
            async for event in client.stream_chat(HELLO, temperature=0, max_tokens=16):
                if isinstance(event, ChatDelta):
                    reply += event.content
                else:
                    done = event
        await engine.stop()
        assert done is not None
        return reply, done, pid, key

    reply, done, pid, key = run(engine, go)
    assert "paris" in reply.lower()
    t = done.telemetry
    assert t.ttft_s > 0 and t.prompt_tokens > 0 and t.prompt_tps > 0
    assert t.completion_tokens > 0 and t.decode_tps > 0
    assert done.finish_reason in ("stop", "length")
    assert states == [S.STARTING, S.READY, S.STOPPING, S.STOPPED]
    assert gone(pid)
    assert engine.api_key is None
    assert any("listening on http://127.0.0.1" in line for line in lines)
    logged = engine.log_path.read_text()
    assert "listening on http://127.0.0.1" in logged and "=== stopped" in logged
    assert key not in logged and all(key not in line for line in engine.output)


async def stream_until_first_token(engine: Engine, then: Any) -> BaseException:
    """Stream a long reply, call ``then()`` at the first token, return what the stream raised."""
    async with engine.chat_client() as client:
        try:
            async for event in client.stream_chat(HELLO, **LONG):
                if isinstance(event, ChatDelta) and event.content:
                    then()
                    then = lambda: None  # noqa: E731 - only once
        except Exception as err:
            return err
    raise AssertionError("the stream ended without an error")


def test_kill_9_mid_stream_is_a_crash_with_a_clear_error(
    llama_request: LaunchRequest, cpu_hardware: Hardware
) -> None:
    engine = Engine("smol", llama_request, cpu_hardware)
    states = record(engine)

    async def go() -> tuple[BaseException, int]:
        await engine.start()
        assert engine.pid is not None
        pid = engine.pid
        err = await stream_until_first_token(engine, lambda: os.kill(pid, signal.SIGKILL))
        await engine.wait_for_state(S.CRASHED)
        await engine.stop()  # a no-op now, and safe
        return err, pid

    err, pid = run(engine, go)
    assert isinstance(err, EngineError)
    assert "llama-server stopped unexpectedly (killed by signal SIGKILL)" in str(err)
    assert err is engine.error
    assert states == [S.STARTING, S.READY, S.CRASHED]
    assert gone(pid)


def test_watchdog_kills_a_hung_engine(llama_request: LaunchRequest, cpu_hardware: Hardware) -> None:
    engine = Engine("smol", llama_request, cpu_hardware, hang_grace_s=1.0)

    async def go() -> tuple[BaseException, int]:
        await engine.start()
        assert engine.pid is not None
        pid = engine.pid
        # SIGSTOP freezes the real engine mid-reply: no bytes, and /health cannot answer.
        err = await stream_until_first_token(engine, lambda: os.kill(pid, signal.SIGSTOP))
        return err, pid

    err, pid = run(engine, go)
    assert engine.state is S.CRASHED
    assert isinstance(err, EngineError)
    assert "stopped responding to /health (no reply data for 1 s, then /health failed 3 times)" in str(err)
    assert gone(pid)


def test_a_slow_reply_is_not_a_hang(llama_request: LaunchRequest, cpu_hardware: Hardware) -> None:
    """A grace shorter than the gaps between tokens: /health still answers, so the engine lives."""
    engine = Engine("smol", llama_request, cpu_hardware, hang_grace_s=0.05)

    async def go() -> str:
        await engine.start()
        text = ""
        async with engine.chat_client() as client:
            async for event in client.stream_chat(HELLO, max_tokens=300, ignore_eos=True, temperature=0):
                if isinstance(event, ChatDelta):
                    text += event.content
        state = engine.state
        await engine.stop()
        assert state is S.READY
        return text

    assert len(run(engine, go)) > 100


def test_corrupt_gguf_fails_with_the_engines_own_reason(
    llama_request: LaunchRequest, cpu_hardware: Hardware, tmp_path: Path
) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"this is not a model" * 100)
    engine = Engine("broken", replace(llama_request, model=str(bad)), cpu_hardware)
    states = record(engine)
    with pytest.raises(EngineError) as err:
        run(engine, engine.start)
    text = str(err.value)
    assert text.startswith("llama-server exited while loading broken.gguf")
    assert "invalid magic characters" in text and "failed to load model" in text
    assert states == [S.STARTING, S.FAILED]
    assert engine.error is err.value
    assert engine.pid is not None and gone(engine.pid)


def test_taken_port_fails_at_once_with_the_engines_own_reason(
    llama_request: LaunchRequest, cpu_hardware: Hardware
) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()  # accepts connections but never answers: /health polls get nowhere
        port = squatter.getsockname()[1]
        engine = Engine("smol", llama_request, cpu_hardware, port=port)
        with pytest.raises(EngineError) as err:
            run(engine, engine.start)
    assert "couldn't bind HTTP server socket" in str(err.value)
    assert f"port: {port}" in str(err.value)
    assert engine.state is S.FAILED


def test_load_timeout_escalates_to_sigkill(llama_request: LaunchRequest, cpu_hardware: Hardware) -> None:
    """An engine frozen while loading: the timeout fires, SIGTERM is ignored (stopped), SIGKILL reaps it."""
    engine = Engine("smol", llama_request, cpu_hardware, load_timeout_s=1.0, stop_grace_s=0.5)
    frozen: list[int] = []

    def freeze(_line: str) -> None:
        if not frozen and engine.pid:
            os.kill(engine.pid, signal.SIGSTOP)
            frozen.append(engine.pid)

    engine.add_output_listener(freeze)
    with pytest.raises(EngineError, match="did not become ready within 1 s"):
        run(engine, engine.start)
    assert engine.state is S.FAILED
    assert "=== stopped (killed by signal SIGKILL)" in engine.log_path.read_text()
    assert frozen and gone(frozen[0])


def test_stop_while_loading_cancels_the_start(llama_request: LaunchRequest, cpu_hardware: Hardware) -> None:
    engine = Engine("smol", llama_request, cpu_hardware)
    states = record(engine)

    async def go() -> int:
        starting = asyncio.create_task(engine.start())
        first_line = asyncio.Event()
        engine.add_output_listener(lambda line: None if line.startswith("===") else first_line.set())
        await first_line.wait()
        assert engine.pid is not None
        await engine.stop()
        with pytest.raises(asyncio.CancelledError):
            await starting
        return engine.pid

    pid = run(engine, go)
    assert states == [S.STARTING, S.STOPPING, S.STOPPED]
    assert gone(pid)


def test_restart_after_a_crash(llama_request: LaunchRequest, cpu_hardware: Hardware) -> None:
    engine = Engine("smol", llama_request, cpu_hardware)

    async def go() -> tuple[int, int, str]:
        await engine.start()
        assert engine.pid is not None
        first = engine.pid
        os.kill(first, signal.SIGKILL)
        await engine.wait_for_state(S.CRASHED)
        await engine.start()
        assert engine.pid is not None and engine.error is None
        second = engine.pid
        async with engine.chat_client() as client:
            reply = await client.chat(HELLO, temperature=0, max_tokens=8)
        await engine.stop()
        return first, second, reply.content

    first, second, content = run(engine, go)
    assert first != second and "paris" in content.lower()
    assert gone(first) and gone(second)
