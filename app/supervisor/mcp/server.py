"""One MCP server as the app runs it: its state (``app.core.mcp.McpState``, changed in ``_set`` only), its
connection, kept by one task for as long as it is enabled, and its tools.

A stdio server is a child process (``app.supervisor.child``: own process group, SIGKILL when the app
dies, a run record for the next start's sweep, SIGTERM then SIGKILL on every way out); a Streamable HTTP
server is a URL, with its headers and a bearer token from the keychain. Either one that ends or fails
is started again after a backoff, until it fails ``RESTART_LIMIT`` times in a row (a run of
``STABLE_S`` starts the count again); then it stays FAILED with its last words until enabled again.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.core.mcp import McpServerSpec, McpState, McpTransport, can_transition
from app.core.policy import STABLE_S, restart_delay
from app.supervisor.child import ChildProcess

if TYPE_CHECKING:
    import mcp_types
    from mcp.client import Client, Transport

log = logging.getLogger(__name__)

RESTART_BACKOFF_S = (1.0, 5.0, 30.0)  # before the 1st, 2nd, 3rd+ start again in a row
RESTART_LIMIT = 4  # failures in a row before it is left FAILED
STOP_GRACE_S = 3.0  # SIGTERM, then this long, then SIGKILL
LIST_TIMEOUT_S = 30.0  # for its handshake and its tool list
EXIT_GRACE_S = 2.0  # a server whose connection failed: how long its own exit may trail its closed pipe
HTTP_TIMEOUT_S = 30.0
LAST_WORDS = 20  # lines of its stderr kept in a failure's message


@dataclass(frozen=True)
class McpTool:
    name: str  # the server's own name for it
    description: str
    input_schema: dict[str, Any]


@dataclass(frozen=True)
class McpServerChanged:
    """A server's state changed; ``message`` says why (for FAILED and BACKOFF, with its last words)."""

    name: str
    state: McpState
    tools: int
    message: str = ""


@dataclass(frozen=True)
class ToolOutput:
    """What a tool call gave back: its text (the SDK's content blocks, text kept, others named)."""

    text: str
    is_error: bool


class McpCallError(Exception):
    """A call that could not be made or did not complete (the server is not ready, broke, refused it)."""


def _describe(err: BaseException) -> str:
    from mcp.shared.exceptions import MCPError

    while isinstance(err, BaseExceptionGroup) and err.exceptions:  # the SDK's task groups wrap what failed
        err = err.exceptions[0]

    if isinstance(err, MCPError):
        return err.error.message
    text = str(err) or type(err).__name__
    return text if isinstance(err, OSError | McpCallError) else f"{type(err).__name__}: {text}"


def output_text(result: mcp_types.CallToolResult) -> str:
    import mcp_types

    parts: list[str] = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        else:
            parts.append(f"[{block.type} content, not shown to the model]")
    return "\n".join(parts)


class McpServer:
    """Use it from the app's event loop: ``start()``, ``call()``, ``stop()``."""

    def __init__(
        self,
        spec: McpServerSpec,
        *,
        emit: Callable[[McpServerChanged], None],
        token: Callable[[str], str | None],
        log_path: Path,
        base_env: Mapping[str, str],
        backoff_s: Sequence[float] = RESTART_BACKOFF_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.spec = spec
        self.state = McpState.OFF
        self.message = ""
        self.failure = ""  # why it last ended, with its last words ("" while it has not)
        self.tools: tuple[McpTool, ...] = ()
        self.child: ChildProcess | None = None  # a stdio server's process while it runs
        self._emit = emit
        self._token = token
        self._log_path = log_path
        self._base_env = base_env
        self._backoff_s = backoff_s
        self._clock = clock
        self._client: Client | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._broken = asyncio.Event()  # a call found the connection gone: connect again
        self._exit_code: int | None = None  # a stdio server's, when it ended before it was stopped
        self._changed = asyncio.Event()  # set at each change of state, then replaced

    @property
    def name(self) -> str:
        return self.spec.name

    def _set(self, state: McpState, message: str = "") -> None:
        if state is self.state and message == self.message:
            return
        if state is not self.state and not can_transition(self.state, state):
            raise RuntimeError(
                f"MCP server {self.name}: {self.state.value} -> {state.value} is not a legal move"
            )
        self.state, self.message = state, message
        self._changed.set()
        self._changed = asyncio.Event()
        self._emit(McpServerChanged(self.name, state, len(self.tools), message))

    # --- running --------------------------------------------------------------------------------------

    def start(self) -> None:
        """Connect (a stdio server: start it) and keep it connected; nothing when it runs already."""
        if self._keeper is None or self._keeper.done():
            self._keeper = asyncio.create_task(self._keep(), name=f"mcp:{self.name}")

    async def stop(self) -> None:
        """Disconnect (a stdio server: stop its process); safe in any state and twice."""
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
        if self.state is not McpState.OFF:
            self._set(McpState.OFF)

    async def wait_ready(self, timeout_s: float, first_try: bool = False) -> bool:
        """Whether it is READY within ``timeout_s``; False as soon as it FAILED or is OFF, and with
        ``first_try`` as soon as its first start failed (not after its starts again)."""
        ends = {McpState.READY, McpState.FAILED, McpState.OFF} | ({McpState.BACKOFF} if first_try else set())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while self.state not in ends:
                    await self._changed.wait()
        return self.state is McpState.READY

    async def _keep(self) -> None:
        streak = 0
        while True:
            self._set(McpState.STARTING)
            started = self._clock()
            why = await self._run_once()
            if self._clock() - started >= STABLE_S:
                streak = 0
            streak += 1
            words = self.child.last_output(LAST_WORDS) if self.child is not None else ""
            said = self.failure = f"{why}\n\nIts last words:\n{words}" if words else why
            if streak >= RESTART_LIMIT:
                self._set(
                    McpState.FAILED,
                    f"{said}\n\nIt failed {streak} times in a row, so it was not started again.",
                )
                return
            delay = restart_delay(streak - 1, self._backoff_s)
            self._set(McpState.BACKOFF, f"{said}\n\nStarting it again in {delay:g} s.")
            await asyncio.sleep(delay)

    async def _run_once(self) -> str:
        """Connect, list the tools, be READY until the connection ends; returns why it ended."""
        from mcp.client import Client  # the SDK costs half a second to import: not at the app's start

        self._broken.clear()
        self._exit_code = None
        try:
            async with contextlib.AsyncExitStack() as stack:
                transport, ended = await self._open(stack)
                client = Client(transport, read_timeout_seconds=None)
                async with asyncio.timeout(LIST_TIMEOUT_S):
                    await stack.enter_async_context(client)
                    listed = await client.list_tools()
                self.tools = tuple(
                    McpTool(t.name, t.description or "", dict(t.input_schema)) for t in listed.tools
                )
                self._client = client
                try:
                    self._set(McpState.READY, f"{len(self.tools)} tools")
                    waits = [asyncio.ensure_future(self._broken.wait()), *([ended] if ended else [])]
                    try:
                        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        waits[0].cancel()
                finally:
                    self._client = None
                if ended is not None and ended.done():
                    return f"{self.name} exited (code {ended.result()})."
                return f"The connection to {self.name} broke."
        except TimeoutError:
            return f"{self.name} did not list its tools within {LIST_TIMEOUT_S:g} s."
        except Exception as err:  # whatever the SDK or the server raises: the server failed
            log.debug("MCP server %s failed", self.name, exc_info=True)
            if self._exit_code is not None:  # it ended by itself: that says more than the broken pipe
                return f"{self.name} exited (code {self._exit_code}) before it listed its tools."
            return f"{self.name} failed: {_describe(err)}"

    async def _open(self, stack: contextlib.AsyncExitStack) -> tuple[Transport, asyncio.Task[int] | None]:
        """The SDK transport to the server, and for a stdio one the task its exit completes."""
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        from app.supervisor.mcp.transport import child_transport

        spec = self.spec
        if spec.transport is McpTransport.HTTP:
            headers = dict(spec.headers)
            if spec.has_token and (token := await asyncio.to_thread(self._token, spec.name)):
                headers["Authorization"] = f"Bearer {token}"
            http = httpx2.AsyncClient(
                headers=headers, trust_env=False, timeout=httpx2.Timeout(HTTP_TIMEOUT_S, read=None)
            )
            await stack.enter_async_context(http)
            return streamable_http_client(spec.url, http_client=http), None
        child = ChildProcess(f"mcp-{spec.name}", self._log_path)
        self.child = child
        stack.push_async_exit(functools.partial(self._stop_child, child))
        await child.spawn([spec.command, *spec.args], {**self._base_env, **spec.env}, protocol=True)
        assert child.exited is not None
        return child_transport(child), child.exited

    async def _stop_child(self, child: ChildProcess, failed: type[BaseException] | None, *_: object) -> None:
        """Stop the server; when its connection failed (``failed``, not a cancel), first wait briefly for
        an exit of its own: its pipe closes before its exit is seen, and its exit code says more."""
        try:
            if child.exited is not None:
                if failed is not None and not issubclass(failed, asyncio.CancelledError):
                    await asyncio.wait([child.exited], timeout=EXIT_GRACE_S)
                if child.exited.done():
                    self._exit_code = child.exited.result()
        finally:  # a stop that comes during that wait still stops it
            await asyncio.shield(child.terminate(STOP_GRACE_S))
            child.close_log()

    # --- calls ----------------------------------------------------------------------------------------

    async def call(self, tool: str, arguments: dict[str, Any]) -> ToolOutput:
        """Run ``tool``; raises McpCallError when the server is not ready or the call broke. The caller
        bounds its time (cancelling abandons the call; the server's answer, if any, is dropped)."""
        import anyio
        from mcp.shared.exceptions import MCPError

        broken = (OSError, anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream)
        client = self._client
        if client is None or self.state is not McpState.READY:
            raise McpCallError(f"The MCP server {self.name} is not ready ({self.state.value}).")
        try:
            result = await client.call_tool(tool, arguments)
        except MCPError as err:
            return ToolOutput(err.error.message, True)
        except broken as err:
            self._broken.set()
            raise McpCallError(f"The connection to {self.name} broke: {_describe(err)}") from None
        except Exception as err:  # whatever else the SDK or a server's answer raises: a broken call
            log.debug("MCP call %s of %s failed", tool, self.name, exc_info=True)
            self._broken.set()
            raise McpCallError(f"The call to {self.name} failed: {_describe(err)}") from None
        return ToolOutput(output_text(result), bool(result.is_error))


# What a stdio server gets of the app's environment before its own ``env``: enough to find and run its
# program, not the app's secrets (an HF_TOKEN, a proxy's credentials).
INHERITED_ENV = ("HOME", "LOGNAME", "USER", "PATH", "SHELL", "TERM", "LANG", "TMPDIR", "XDG_RUNTIME_DIR")


def base_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k in INHERITED_ENV or k.startswith("LC_")}
