"""A multi-turn chat in the terminal: Ctrl-C stops the reply being written, Ctrl-D (end of input) quits.

Lines are read by a daemon thread so the event loop keeps serving the engine (its output, its watchdog)
while the user types; the caller stops the engine however the chat ends. Replies come through the
router, so a remote model (``@NAME/MODEL``) chats as a local one does.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from app.client.events import ChatDelta
from app.commands.output import telemetry_line
from app.commands.overflow import TerminalChat, make_room
from app.commands.tools import TerminalAsk, ToolUse, show_tool_event
from app.core.context import Overflow
from app.core.engine_state import EngineState
from app.core.errors import EngineError, LemonDeskError
from app.core.tools import TOOL_EVENTS
from app.supervisor.router import Router

PROMPT = "> "
TerminalTools = tuple[ToolUse, TerminalAsk]


def _watch(router: Router, name: str, local: bool) -> asyncio.Future[Any]:
    """What ends the chat: the local engine's end (its error when it crashed)."""
    if local:
        return asyncio.ensure_future(router.engines.ended(name))
    return asyncio.get_running_loop().create_future()  # a remote's server may go and come back


def _asking(lines: asyncio.Queue[str | None]) -> Callable[[], Awaitable[str | None]]:
    """The next line, for a question the chat asks; the end of input is left for the chat to end on."""

    async def ask() -> str | None:
        line = await lines.get()
        if line is None:
            lines.put_nowait(None)
        return line

    return ask


def _answer(lines: asyncio.Queue[str | None]) -> Callable[[], Awaitable[str | None]]:
    """The line typed after a tool call's question; the end of input is left for the chat to end on.
    At a terminal, lines typed ahead of the question (while the reply ran) are not its answer (piped
    input is a script's, answers and all)."""
    ask = _asking(lines)
    typed = sys.stdin.isatty()

    async def answer() -> str | None:
        while typed and not lines.empty():
            if lines.get_nowait() is None:
                lines.put_nowait(None)
                return None
        return await ask()

    return answer


def _pid(router: Router, name: str) -> int | None:
    engine = router.engines.get(name)
    return engine.pid if engine is not None else None


def _read_lines(loop: asyncio.AbstractEventLoop, lines: asyncio.Queue[str | None]) -> None:
    with contextlib.suppress(RuntimeError):  # the chat ended and its loop closed while we waited
        for line in sys.stdin:
            loop.call_soon_threadsafe(lines.put_nowait, line.rstrip("\n"))
        loop.call_soon_threadsafe(lines.put_nowait, None)


async def _reply(
    router: Router, name: str, history: list[dict[str, Any]], text: list[str], tools: TerminalTools | None
) -> None:
    stream = (
        router.chat_with_tools(name, history, ask=tools[1], servers=tools[0].servers)
        if tools is not None
        else router.stream_chat(name, history)
    )
    async for event in stream:
        if isinstance(event, TOOL_EVENTS):
            show_tool_event(event)
        elif isinstance(event, ChatDelta):
            text.append(event.content)
            sys.stderr.write(event.reasoning)
            sys.stdout.write(event.content)
            sys.stdout.flush()
        else:
            print()
            print(telemetry_line(event.telemetry), file=sys.stderr)


async def chat_in_terminal(
    router: Router,
    name: str,
    *,
    local: bool = False,
    tools: ToolUse | None = None,
    on_overflow: Overflow | None = None,
) -> None:
    """Chat with ``name`` until end of input: a model loaded here (``local``), or a remote model. The
    local engine's death ends the chat with its error; a reply that fails otherwise (a remote that went
    away) is said, and the question can be asked again. ``tools``: MCP servers it may call, each call
    asked about on the terminal (the answer is the next line typed). A message that would not fit the
    model's context is not sent until a way out is chosen (``app.commands.overflow``; ``on_overflow``:
    chosen beforehand)."""
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[str | None] = asyncio.Queue()
    threading.Thread(target=_read_lines, args=(loop, lines), daemon=True, name="stdin").start()
    asking = (tools, TerminalAsk(_answer(lines), tools.allow_all)) if tools is not None else None
    replying: asyncio.Task[None] | None = None

    def interrupt() -> None:
        if replying is not None and not replying.done():
            replying.cancel()
        else:
            print("\n(Ctrl-D quits)", file=sys.stderr)
            print(PROMPT, end="", file=sys.stderr, flush=True)

    loop.add_signal_handler(signal.SIGINT, interrupt)
    chat = TerminalChat()
    died = _watch(router, name, local)
    print(f"Chatting with {name}. Ctrl-C stops a reply; Ctrl-D quits.", file=sys.stderr)
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
            chat.messages.append({"role": "user", "content": line})
            if local:
                before = _pid(router, name)
                try:
                    servers = tools.servers if tools is not None else ()
                    room = await make_room(router, name, chat, _asking(lines), on_overflow, servers)
                except LemonDeskError as err:  # the way out failed (a reload that did not fit, ...)
                    room = False
                    print(f"error: {err}", file=sys.stderr)
                if not room:
                    chat.messages.pop()
                    if router.engine_state(name) is not EngineState.READY:
                        await asyncio.wait({died}, timeout=5)
                        break
                    continue
                if _pid(router, name) != before:  # loaded again, with a larger context
                    died.cancel()
                    died = _watch(router, name, local)
            text: list[str] = []
            replying = asyncio.create_task(_reply(router, name, chat.sent(), text, asking))
            try:
                await replying
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
                print()
                print("[stopped]", file=sys.stderr)
            except LemonDeskError as err:
                if local and router.engine_state(name) is not EngineState.READY:
                    await asyncio.wait({died}, timeout=5)
                    break  # the engine died: its own error is raised below
                print(f"\nerror: {err}", file=sys.stderr)
                chat.messages.pop()  # unanswered: the user may ask again
                continue
            chat.messages.append({"role": "assistant", "content": "".join(text)})
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        died.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await died
    crashed: EngineError | None = died.result() if died.done() and not died.cancelled() else None
    if crashed is not None:
        raise crashed
