"""MCP tools in the terminal (``lemon-desk run --mcp NAME``): the servers started for the run, the
question asked before each call (``--allow-tools`` asks none, for scripts), and the calls shown on
stderr as they run. The tool loop itself is the router's, as in the window."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from app.core.errors import ConfigError
from app.core.mcp import McpState
from app.core.tools import (
    Permission,
    ToolCallFinished,
    ToolCallStarted,
    ToolEvent,
    ToolRequest,
    ToolsWithheld,
)
from app.supervisor.router import Router

READY_TIMEOUT_S = 120.0  # for the servers named to list their tools
ANSWERS = {"o": Permission.ALLOW_ONCE, "a": Permission.ALWAYS}  # anything else denies
ReadLine = Callable[[], Awaitable[str | None]]


@dataclass(frozen=True)
class ToolUse:
    servers: tuple[str, ...]
    allow_all: bool  # run every call without asking


async def start_servers(router: Router, use: ToolUse) -> None:
    """Start the servers named (enabled or not) and wait for their tools; one that fails is an error
    with its last words, at its first failure: a run does not wait out the window's starts again (1 s,
    5 s and 30 s apart) for a server that cannot start."""
    for name in use.servers:
        router.mcp.server(name)  # an unknown name is refused before anything starts
    router.mcp.start(use.servers)
    print(f"MCP: starting {', '.join(use.servers)}", file=sys.stderr, flush=True)
    for view in await router.mcp.wait_ready(use.servers, READY_TIMEOUT_S, first_try=True):
        if view.state is not McpState.READY:
            why = router.mcp.server(view.spec.name).failure or view.message
            state = McpState.FAILED if view.state is McpState.BACKOFF else view.state
            raise ConfigError(
                f"The MCP server {view.spec.name} is not ready ({state.value}). {why}",
                "Check its definition in Settings (MCP servers), or run without --mcp.",
            )
        print(f"MCP: {view.spec.name} ready with {len(view.tools)} tools", file=sys.stderr, flush=True)


async def read_stdin_line() -> str | None:
    """One line of stdin (None at its end), read by a daemon thread: a question left unanswered when
    the run ends does not hold the process."""
    loop = asyncio.get_running_loop()
    line: asyncio.Future[str | None] = loop.create_future()

    def answer(text: str) -> None:
        if not line.done():
            line.set_result(text or None)

    def read() -> None:
        text = sys.stdin.readline()
        if not loop.is_closed():
            loop.call_soon_threadsafe(answer, text)

    threading.Thread(target=read, daemon=True, name="stdin-answer").start()
    return await line


class TerminalAsk:
    """Asks on the terminal before a tool call: once, always (saved), or no (also at end of input)."""

    def __init__(self, read_line: ReadLine, allow_all: bool) -> None:
        self._read_line = read_line
        self._allow_all = allow_all

    async def __call__(self, request: ToolRequest) -> Permission:
        if self._allow_all:
            return Permission.ALLOW_ONCE
        arguments = json.dumps(request.arguments, ensure_ascii=False)
        print(
            f"\n{request.server} wants to run {request.tool} {arguments}\n"
            "Allow it? [o]nce, [a]lways for this tool, [N]o: ",
            end="",
            file=sys.stderr,
            flush=True,
        )
        answer = await self._read_line()
        return ANSWERS.get((answer or "").strip().lower()[:1], Permission.DENY)


def show_tool_event(event: ToolEvent) -> None:
    if isinstance(event, ToolsWithheld):
        print(f"[tools] {event.why}", file=sys.stderr, flush=True)
        return
    request = event.request
    where = f"{request.server}/{request.tool}" if request.server else request.tool
    if isinstance(event, ToolCallStarted):
        print(f"\n[tool] {where} {json.dumps(request.arguments, ensure_ascii=False)}", file=sys.stderr)
    elif isinstance(event, ToolCallFinished):
        first = event.result.splitlines()[0] if event.result else ""
        took = f", {event.elapsed_s:.1f} s" if event.elapsed_s else ""
        print(f"[tool] {where}: {event.outcome.value}{took}: {first[:200]}", file=sys.stderr, flush=True)
