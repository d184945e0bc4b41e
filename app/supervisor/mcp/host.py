"""The MCP host: the collection of configured servers (``McpServer`` each), kept in the app's folder;
add, replace, remove, enable and disable them, import an ``mcp.json``, and the tools they offer a model
(named ``SERVER__TOOL``, made unique where two would be the same: ``app.core.mcp.tool_names``; the
servers' views say so) with the call that runs one.

Changes to the set run one at a time (one lock): a change that waits (a stop, the save) must not let
another replace the server it then starts, which the host would no longer know to stop.

Building it reads the file and starts nothing; ``start()`` connects the enabled servers (or those named),
``shutdown()`` stops every one (stdio processes terminated and reaped).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from app.core.errors import ConfigError
from app.core.mcp import (
    McpImport,
    McpServerSpec,
    McpState,
    McpTransport,
    check_server_name,
    tool_name,
    tool_names,
)
from app.store import secrets
from app.store.mcp_servers import load_mcp_servers, save_mcp_servers
from app.store.paths import logs_dir
from app.supervisor.listeners import Listeners
from app.supervisor.mcp.permissions import Permissions
from app.supervisor.mcp.server import (
    RESTART_BACKOFF_S,
    McpServer,
    McpServerChanged,
    McpTool,
    base_environment,
)


@dataclass(frozen=True)
class McpServerView:
    """A server as front ends show it."""

    spec: McpServerSpec
    state: McpState
    tools: tuple[McpTool, ...]
    message: str  # why it is FAILED or in BACKOFF, with its last words; "N tools" when READY


@dataclass(frozen=True)
class OfferedTool:
    """A tool as a model is offered it, and where a call of it goes."""

    name: str  # SERVER__TOOL, unless another tool's would be the same (``renamed``)
    server: str
    tool: McpTool
    renamed: bool = False  # its plain SERVER__TOOL is another tool's too: it ends in a hash instead

    def to_openai(self) -> dict[str, Any]:
        schema = self.tool.input_schema or {"type": "object", "properties": {}}
        function = {"name": self.name, "description": self.tool.description, "parameters": schema}
        return {"type": "function", "function": function}


class McpHost:
    def __init__(
        self,
        emit: Callable[[McpServerChanged], None] | None = None,
        *,
        backoff_s: tuple[float, ...] = RESTART_BACKOFF_S,
    ) -> None:
        self._listeners: Listeners[McpServerChanged] = Listeners("the MCP host")
        if emit is not None:
            self._listeners.add(emit)
        self._backoff_s = backoff_s
        self.permissions = Permissions()  # the tools allowed always
        self._running = False  # start() ran for every enabled server: one added later starts too
        self._changing = asyncio.Lock()  # put, remove, enable: one at a time
        loaded = load_mcp_servers()
        self.warnings = [w for w in (loaded.warning, self.permissions.warning) if w]
        self._servers: dict[str, McpServer] = {name: self._make(spec) for name, spec in loaded.items.items()}

    def subscribe(self, listener: Callable[[McpServerChanged], None]) -> Callable[[], None]:
        return self._listeners.add(listener)

    def _make(self, spec: McpServerSpec) -> McpServer:
        return McpServer(
            spec,
            emit=self._listeners.emit,
            token=secrets.get_mcp_token,
            log_path=logs_dir() / f"mcp-{spec.name}.log",
            base_env=base_environment(),
            backoff_s=self._backoff_s,
        )

    async def _save(self) -> None:
        """Saved in a worker thread: the window's thread does no file I/O."""
        await asyncio.to_thread(
            save_mcp_servers, {name: server.spec for name, server in self._servers.items()}
        )

    # --- what there is --------------------------------------------------------------------------------

    def servers(self) -> list[McpServerView]:
        renamed: dict[str, list[str]] = {}
        for tool in self._every_offered():
            if tool.renamed:
                renamed.setdefault(tool.server, []).append(tool.name)
        return [
            McpServerView(s.spec, s.state, s.tools, _with_renames(s.message, renamed.get(s.name, [])))
            for s in self._servers.values()
        ]

    def server(self, name: str) -> McpServer:
        if name not in self._servers:
            known = ", ".join(sorted(self._servers)) or "none"
            raise ConfigError(f"There is no MCP server named {name!r}.", f"Configured: {known}.")
        return self._servers[name]

    def offered(self, names: Iterable[str] | None = None) -> list[OfferedTool]:
        """The tools of the READY servers (of those in ``names``, when given), as a model is offered them.
        Names are made unique over every ready server, so a chat's choice of servers does not rename."""
        wanted = None if names is None else set(names)
        return [t for t in self._every_offered() if wanted is None or t.server in wanted]

    def _every_offered(self) -> list[OfferedTool]:
        pairs = [(s, t) for s in self._servers.values() if s.state is McpState.READY for t in s.tools]
        names = tool_names([(s.name, t.name) for s, t in pairs])
        return [
            OfferedTool(name, s.name, t, renamed=name != tool_name(s.name, t.name))
            for name, (s, t) in zip(names, pairs, strict=True)
        ]

    # --- running --------------------------------------------------------------------------------------

    def start(self, names: Iterable[str] | None = None) -> None:
        """Connect the enabled servers, or the ones named (enabled or not: ``run --mcp NAME``)."""
        self._running = self._running or names is None
        chosen = [self.server(n) for n in names] if names is not None else list(self._servers.values())
        for server in chosen:
            if names is not None or server.spec.enabled:
                server.start()

    async def wait_ready(
        self, names: Iterable[str], timeout_s: float, first_try: bool = False
    ) -> list[McpServerView]:
        """Wait for the named servers to be READY (or to fail; ``first_try``: or to fail once); returns
        their views."""
        servers = [self.server(n) for n in names]
        await asyncio.gather(*(s.wait_ready(timeout_s, first_try) for s in servers))
        return [view for view in self.servers() if view.spec.name in {s.name for s in servers}]

    async def shutdown(self) -> None:
        self._running = False
        async with self._changing:  # after a change under way: the server it starts is stopped too
            await asyncio.gather(*(s.stop() for s in self._servers.values()))

    # --- changing the set -----------------------------------------------------------------------------

    async def put(self, spec: McpServerSpec, token: str | None = None) -> None:
        """Add a server or replace the one of that name (restarted when it ran); saved. ``token``: an
        HTTP server's bearer token, into the keychain ("" removes it; None leaves it as it is)."""
        async with self._changing:
            await self._put(spec, token)

    async def _put(self, spec: McpServerSpec, token: str | None) -> None:
        check_server_name(spec.name)
        if token is not None:
            if spec.transport is not McpTransport.HTTP:
                raise ConfigError(f"{spec.name} is a stdio server: only an HTTP server takes a token.")
            if token:
                await asyncio.to_thread(secrets.set_mcp_token, spec.name, token)
            else:
                await asyncio.to_thread(secrets.delete_mcp_token, spec.name)
            spec = replace(spec, has_token=bool(token))
        old = self._servers.get(spec.name)
        running = old is not None and old.state is not McpState.OFF
        if old is not None:
            await old.stop()
            if (old.spec.command, old.spec.args, old.spec.url) != (spec.command, spec.args, spec.url):
                await self.permissions.forget(spec.name)  # another program: its tools ask again
        self._servers[spec.name] = self._make(spec)
        await self._save()
        if running or (self._running and spec.enabled):
            self._servers[spec.name].start()

    async def remove(self, name: str) -> None:
        async with self._changing:
            server = self.server(name)
            await server.stop()
            del self._servers[name]
            await self._save()
            await self.permissions.forget(name)
            if server.spec.has_token:
                await asyncio.to_thread(secrets.delete_mcp_token, name)

    async def set_enabled(self, name: str, enabled: bool) -> None:
        """Enabled, it is started; disabled, stopped. Saved."""
        async with self._changing:
            server = self.server(name)
            server.spec = replace(server.spec, enabled=enabled)
            await self._save()
            if enabled:
                server.start()
            else:
                await server.stop()

    async def import_json(self, found: McpImport) -> list[str]:
        """Add the servers of a parsed ``mcp.json`` (one of a name already here replaces it); returns what
        it refused."""
        async with self._changing:
            for spec in found.servers:
                await self._put(spec, None)
        return found.refused


def _with_renames(message: str, renamed: list[str]) -> str:
    """A ready server's message ("N tools"), with the tools offered under another name than
    SERVER__TOOL and why."""
    if not renamed:
        return message
    names = ", ".join(renamed)
    return f"{message}; offered as {names}: another server's tool would have had the same name"
