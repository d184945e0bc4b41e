"""Which tools run without asking: those the user allowed always, per server and tool, saved in
``<home>/mcp_permissions.json`` (``app.store.mcp_servers``). Read once, when first asked."""

from __future__ import annotations

from app.store.mcp_servers import load_always_allowed, save_always_allowed


class Permissions:
    def __init__(self) -> None:
        self._always: dict[str, frozenset[str]] | None = None
        self.warning = ""

    def _loaded(self) -> dict[str, frozenset[str]]:
        if self._always is None:
            loaded = load_always_allowed()
            self._always, self.warning = dict(loaded.items), loaded.warning
        return self._always

    def allowed(self, server: str, tool: str) -> bool:
        return tool in self._loaded().get(server, frozenset())

    def allow_always(self, server: str, tool: str) -> None:
        always = self._loaded()
        always[server] = always.get(server, frozenset()) | {tool}
        save_always_allowed(always)

    def forget(self, server: str) -> None:
        """A server removed: its tools ask again if one of that name comes back."""
        if self._loaded().pop(server, None) is not None:
            save_always_allowed(self._loaded())
