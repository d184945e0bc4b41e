"""MCP servers as the user defines them, their states, and the import of a Cursor/Claude-style ``mcp.json``
(``{"mcpServers": {NAME: {"command", "args", "env"} | {"url", "headers"}}}``). Pure: no I/O; the host
that runs them is ``app.supervisor.mcp``, the file they are kept in ``app.store.mcp_servers``.

A server's states and the legal moves between them::

    OFF -> STARTING -> READY -> BACKOFF -> STARTING ...
              |          |        '-----> FAILED (died too often: its last words kept)
              '----------+--------------> OFF (disabled, or the app stops)
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any
from urllib.parse import urlsplit

from app.core.errors import ConfigError
from app.core.names import plain_name_problem

MAX_NAME = 40
TOOL_NAME_SEPARATOR = "__"  # a tool offered to a model is named SERVER__TOOL
MAX_TOOL_NAME = 64  # what OpenAI-style function names may be
_UNSAFE_IN_TOOL_NAME = re.compile(r"[^A-Za-z0-9_-]")


class McpTransport(Enum):
    STDIO = "stdio"  # a command the app starts, speaking JSON-RPC on its stdin and stdout
    HTTP = "http"  # Streamable HTTP at a URL


class McpState(Enum):
    OFF = "off"  # not running: disabled, not started yet, or stopped with the app
    STARTING = "starting"  # started (or connecting), its tools not listed yet
    READY = "ready"  # connected, its tools listed
    BACKOFF = "backoff"  # it ended or failed; started again after a wait
    FAILED = "failed"  # ended or failed too often in a row: not started again until enabled again


_TRANSITIONS: dict[McpState, frozenset[McpState]] = {
    McpState.OFF: frozenset({McpState.STARTING}),
    McpState.STARTING: frozenset({McpState.READY, McpState.BACKOFF, McpState.FAILED, McpState.OFF}),
    McpState.READY: frozenset({McpState.BACKOFF, McpState.FAILED, McpState.OFF}),
    McpState.BACKOFF: frozenset({McpState.STARTING, McpState.OFF}),
    McpState.FAILED: frozenset({McpState.STARTING, McpState.OFF}),
}


def can_transition(old: McpState, new: McpState) -> bool:
    return new in _TRANSITIONS[old]


@dataclass(frozen=True)
class McpServerSpec:
    """One server as configured. A bearer token is never here: only whether one is in the keychain."""

    name: str
    transport: McpTransport
    command: str = ""  # stdio
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)  # added to the app's environment
    url: str = ""  # http
    headers: dict[str, str] = field(default_factory=dict)
    has_token: bool = False  # a bearer token for it is in the keychain
    enabled: bool = True

    def to_json(self) -> dict[str, Any]:
        if self.transport is McpTransport.STDIO:
            body: dict[str, Any] = {"command": self.command, "args": list(self.args), "env": self.env}
        else:
            body = {"url": self.url, "headers": self.headers, "token": self.has_token}
        return {**body, "enabled": self.enabled}


def check_server_name(name: str) -> str:
    """An MCP server's name as the user typed it; else a ConfigError saying what is allowed. Names go into
    tool names (``SERVER__TOOL``) and keychain accounts, so they keep to a plain alphabet."""
    why = plain_name_problem(name, MAX_NAME)
    if not why and ("." in name or TOOL_NAME_SEPARATOR in name):
        why = "has '.' or '__' in it"
    if why:
        raise ConfigError(
            f"{name!r} cannot name an MCP server: it {why}.",
            f"Use letters, digits, '_' and '-' (at most {MAX_NAME}, no '__'), starting with a letter or "
            "digit.",
        )
    return name


def _strings(value: Any, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ConfigError(f"its {what} must be an object of strings")
    return dict(value)


def _check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"its url {url!r} is not an http(s) address")
    return url


def parse_server(name: str, raw: Any) -> McpServerSpec:
    """One entry of ``mcpServers`` (or of the app's own file); a ConfigError names what is wrong."""
    check_server_name(name)
    try:
        if not isinstance(raw, dict):
            raise ConfigError("it is not an object")
        enabled = raw.get("enabled", True)
        if not isinstance(enabled, bool):
            raise ConfigError("its 'enabled' is not true or false")
        if "command" in raw and "url" in raw:
            raise ConfigError("it has both a command and a url")
        if isinstance(raw.get("url"), str):
            headers = _strings(raw.get("headers"), "headers")
            if any(k.lower() == "authorization" for k in headers):
                raise ConfigError("its headers carry a credential (keep the token in the keychain instead)")
            url = _check_url(raw["url"])
            return McpServerSpec(
                name,
                McpTransport.HTTP,
                url=url,
                headers=headers,
                has_token=raw.get("token") is True,
                enabled=enabled,
            )
        command = raw.get("command")
        if not isinstance(command, str) or not command.strip():
            raise ConfigError("it has neither a command nor a url")
        args = raw.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ConfigError("its args must be a list of strings")
        return McpServerSpec(
            name,
            McpTransport.STDIO,
            command=command,
            args=tuple(args),
            env=_strings(raw.get("env"), "env"),
            enabled=enabled,
        )
    except ConfigError as err:
        raise ConfigError(f"The MCP server {name!r} was refused: {err.message}.", err.hint) from None


def spec_from_fields(name: str, target: str, pairs: str, enabled: bool = True) -> McpServerSpec:
    """A server as typed in Settings: ``target`` is a URL (Streamable HTTP) or a command line (stdio,
    split as a shell would); ``pairs`` is ``KEY=VALUE`` words, the HTTP headers or the command's
    environment. A ConfigError says what is wrong."""
    values: dict[str, str] = {}
    try:
        words, argv = shlex.split(pairs), shlex.split(target)
    except ValueError as err:
        raise ConfigError(f"Could not read that: {err}.", "Close the quotes you opened.") from None
    for word in words:
        key, eq, value = word.partition("=")
        if not eq or not key:
            raise ConfigError(
                f"{word!r} is not KEY=VALUE.", "Give each one as KEY=VALUE, separated by spaces."
            )
        values[key] = value
    if not argv:
        raise ConfigError("Give the server's command line, or its http(s) URL.")
    if urlsplit(target.strip()).scheme in ("http", "https"):
        raw: dict[str, Any] = {"url": target.strip(), "headers": values}
    else:
        raw = {"command": argv[0], "args": argv[1:], "env": values}
    return parse_server(name, {**raw, "enabled": enabled})


def describe_target(spec: McpServerSpec) -> tuple[str, str]:
    """What the Settings form shows of a server: its command line or URL, and its KEY=VALUE pairs."""
    if spec.transport is McpTransport.HTTP:
        target, pairs = spec.url, spec.headers
    else:
        target, pairs = shlex.join([spec.command, *spec.args]), spec.env
    return target, " ".join(shlex.quote(f"{k}={v}") for k, v in pairs.items())


@dataclass(frozen=True)
class McpImport:
    servers: list[McpServerSpec]
    refused: list[str]  # one line per entry left out, saying why


def parse_mcp_json(data: Any) -> McpImport:
    """The servers of a Cursor/Claude-style ``mcp.json``; each bad entry is refused with its reason, and
    the good ones kept. A file without an ``mcpServers`` object is a ConfigError."""
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        raise ConfigError(
            "This is not an mcp.json: it has no 'mcpServers' object.",
            'Expected {"mcpServers": {"name": {"command": ..., "args": [...]}}}.',
        )
    good: list[McpServerSpec] = []
    refused: list[str] = []
    for name, raw in servers.items():
        try:
            # A file from elsewhere never names the keychain's token: an entry that says "token": true
            # under a name kept here would have that server's token sent to its own url.
            good.append(replace(parse_server(str(name), raw), has_token=False))
        except ConfigError as err:
            refused.append(err.message)
    return McpImport(good, refused)


def tool_name(server: str, tool: str) -> str:
    """The name a model sees for ``tool`` of ``server``: ``SERVER__TOOL`` in the alphabet function names
    allow, cut to their length."""
    return f"{server}{TOOL_NAME_SEPARATOR}{_UNSAFE_IN_TOOL_NAME.sub('_', tool)}"[:MAX_TOOL_NAME]


def _hashed(name: str, server: str, tool: str) -> str:
    digest = hashlib.sha256(f"{server}\0{tool}".encode()).hexdigest()[:8]
    return f"{name[: MAX_TOOL_NAME - 9]}_{digest}"


def tool_names(tools: Sequence[tuple[str, str]]) -> list[str]:
    """The names a model sees for ``(server, tool)`` pairs: each one's ``tool_name``, unless two come out
    the same (``_`` for what the alphabet refuses, ``a`` + ``_b`` beside ``a_`` + ``b``, or cut to
    length): then each of those ends in the start of a hash of its server and tool instead (the same
    whatever the pairs' order)."""
    plain = [tool_name(server, tool) for server, tool in tools]
    seen = Counter(plain)
    return [
        name if seen[name] == 1 else _hashed(name, server, tool)
        for name, (server, tool) in zip(plain, tools, strict=True)
    ]
