"""Which tools run without asking: those the user allowed always, per server and tool, saved in
``<home>/mcp_permissions.json`` (``app.store.mcp_servers``). Read when made (the router is made off the
window's thread); written in a worker thread."""

from __future__ import annotations

import asyncio

from app.store.mcp_servers import load_always_allowed, save_always_allowed


class Permissions:
    def __init__(self) -> None:
        loaded = load_always_allowed()
        self._always = dict(loaded.items)
        self.warning = loaded.warning

    def allowed(self, server: str, tool: str) -> bool:
        return tool in self._always.get(server, frozenset())

    async def allow_always(self, server: str, tool: str) -> None:
        self._always[server] = self._always.get(server, frozenset()) | {tool}
        await asyncio.to_thread(save_always_allowed, dict(self._always))

    async def forget(self, server: str) -> None:
        """A server removed: its tools ask again if one of that name comes back."""
        if self._always.pop(server, None) is not None:
            await asyncio.to_thread(save_always_allowed, dict(self._always))
