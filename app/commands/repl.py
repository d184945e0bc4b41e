"""A multi-turn chat in the terminal: Ctrl-C stops the reply being written, Ctrl-D (end of input) quits.

Lines are read by a daemon thread so the event loop keeps serving the engine (its output, its watchdog)
while the user types; the caller stops the engine however the chat ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import threading
from typing import Any

from app.client.events import ChatDelta
from app.commands.output import telemetry_line
from app.core.engine_state import EngineState
from app.supervisor.engine import Engine
from app.supervisor.supervisor import Supervisor

PROMPT = "> "


def _read_lines(loop: asyncio.AbstractEventLoop, lines: asyncio.Queue[str | None]) -> None:
    with contextlib.suppress(RuntimeError):  # the chat ended and its loop closed while we waited
        for line in sys.stdin:
            loop.call_soon_threadsafe(lines.put_nowait, line.rstrip("\n"))
        loop.call_soon_threadsafe(lines.put_nowait, None)


async def _reply(
    supervisor: Supervisor, engine: Engine, history: list[dict[str, Any]], text: list[str]
) -> None:
    async with supervisor.chat_client(engine.id) as client:
        async for event in client.stream_chat(history):
            if isinstance(event, ChatDelta):
                text.append(event.content)
                sys.stderr.write(event.reasoning)
                sys.stdout.write(event.content)
                sys.stdout.flush()
            else:
                print()
                print(telemetry_line(event.telemetry), file=sys.stderr)


async def chat_in_terminal(supervisor: Supervisor, engine: Engine) -> None:
    """Chat until end of input; raises the engine's error if it dies meanwhile."""
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[str | None] = asyncio.Queue()
    threading.Thread(target=_read_lines, args=(loop, lines), daemon=True, name="stdin").start()
    replying: asyncio.Task[None] | None = None

    def interrupt() -> None:
        if replying is not None and not replying.done():
            replying.cancel()
        else:
            print("\n(Ctrl-D quits)", file=sys.stderr)
            print(PROMPT, end="", file=sys.stderr, flush=True)

    loop.add_signal_handler(signal.SIGINT, interrupt)
    history: list[dict[str, Any]] = []
    died = asyncio.create_task(engine.wait_for_state(EngineState.CRASHED, EngineState.STOPPED))
    print(f"Chatting with {engine.id}. Ctrl-C stops a reply; Ctrl-D quits.", file=sys.stderr)
    try:
        while True:
            print(PROMPT, end="", file=sys.stderr, flush=True)
            next_line = asyncio.create_task(lines.get())
            await asyncio.wait({next_line, died}, return_when=asyncio.FIRST_COMPLETED)
            if not next_line.done():
                next_line.cancel()
                break
            line = next_line.result()
            if line is None:
                print(file=sys.stderr)
                break
            if not line.strip():
                continue
            history.append({"role": "user", "content": line})
            text: list[str] = []
            replying = asyncio.create_task(_reply(supervisor, engine, history, text))
            try:
                await replying
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
                print()
                print("[stopped]", file=sys.stderr)
            history.append({"role": "assistant", "content": "".join(text)})
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        died.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await died
    if engine.state is EngineState.CRASHED and engine.error is not None:
        raise engine.error
