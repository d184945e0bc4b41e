"""Test MCP servers (``tests/support/mcp_server.py``, a real server written with the ``mcp`` SDK) as the
app is told of them, and a Streamable HTTP one run on loopback for the length of a test."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from app.core.mcp import McpServerSpec, McpTransport

SERVER = Path(__file__).with_name("mcp_server.py")


def stdio_spec(name: str, *args: str, calls: Path | None = None, script: Path = SERVER) -> McpServerSpec:
    """The test server over stdio (``args``: its flags, ``--crash-at-start``); ``calls``: its call log."""
    extra = ("--calls", str(calls)) if calls is not None else ()
    return McpServerSpec(name, McpTransport.STDIO, command=sys.executable, args=(str(script), *args, *extra))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def http_server(token: str = "", calls: Path | None = None) -> Iterator[str]:
    """The test server over Streamable HTTP on loopback; yields its URL, stops it after."""
    port = free_port()
    extra = ["--calls", str(calls)] if calls is not None else []
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "--http", str(port), "--token", token, *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.TransportError):
                httpx.get(url, timeout=1.0, trust_env=False)
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the test MCP server on port {port} did not start")
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
