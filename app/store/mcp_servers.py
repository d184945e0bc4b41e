"""MCP servers, in ``<home>/mcp_servers.json``, and the tools the user allowed always, in
``<home>/mcp_permissions.json``. A server's bearer token is only in the OS keychain (``app.store.secrets``).

Read carefully and written atomically (``app.store.records``): an unreadable file is set aside, never
deleted; an entry that does not pass ``app.core.mcp.parse_server`` sets the file aside with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.core.errors import ConfigError
from app.core.mcp import McpImport, McpServerSpec, check_server_name, parse_mcp_json, parse_server
from app.store.files import read_json
from app.store.paths import home
from app.store.records import Loaded, load_records, save_records
from app.store.saving import saving

SERVERS_KEY = "servers"
ALWAYS_KEY = "always"  # server name -> the tools it may run without asking


def mcp_servers_path() -> Path:
    return home() / "mcp_servers.json"


def mcp_permissions_path() -> Path:
    return home() / "mcp_permissions.json"


def load_mcp_servers(path: Path | None = None) -> Loaded[McpServerSpec]:
    return load_records(path or mcp_servers_path(), SERVERS_KEY, parse_server, "MCP servers")


def save_mcp_servers(servers: dict[str, McpServerSpec], path: Path | None = None) -> None:
    with saving("the MCP servers"):
        save_records(path or mcp_servers_path(), SERVERS_KEY, {n: s.to_json() for n, s in servers.items()})


MAX_MCP_JSON_BYTES = 1 << 20  # an mcp.json is a few KB


def read_mcp_json(path: Path) -> McpImport:
    """A user's mcp.json, parsed (``app.core.mcp.parse_mcp_json``); a file that cannot be read is a
    ConfigError saying why."""
    try:
        if path.stat().st_size > MAX_MCP_JSON_BYTES:
            raise ValueError(f"it is larger than {MAX_MCP_JSON_BYTES >> 20} MB")
        data = read_json(path)
    except (OSError, ValueError, UnicodeDecodeError) as err:
        raise ConfigError(
            f"Could not read {path}: {err}.", "Choose a Cursor or Claude style mcp.json."
        ) from None
    return parse_mcp_json(data)


def _tools(server: str, raw: Any) -> frozenset[str]:
    check_server_name(server)
    if not isinstance(raw, list) or not all(isinstance(t, str) for t in raw):
        raise ConfigError(f"the tools allowed for {server!r} are not a list of names")
    return frozenset(raw)


def load_always_allowed(path: Path | None = None) -> Loaded[frozenset[str]]:
    return load_records(path or mcp_permissions_path(), ALWAYS_KEY, _tools, "MCP permissions")


def save_always_allowed(allowed: dict[str, frozenset[str]], path: Path | None = None) -> None:
    with saving("the MCP permissions"):
        save_records(path or mcp_permissions_path(), ALWAYS_KEY, {s: sorted(t) for s, t in allowed.items()})
