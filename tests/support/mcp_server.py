"""A real MCP server for tests, written with the ``mcp`` SDK: run it as a child process with
``sys.executable``. Over stdio by default; ``--http PORT`` serves Streamable HTTP on 127.0.0.1:PORT/mcp
(``--token T``: answering 401 to a request without ``Authorization: Bearer T``).

Its tools:
    echo(text)     answers ``echo: TEXT``
    add(a, b)      answers the sum
    hang()         never answers (says ``hang: started`` on stderr first; a call cancelled by the client
                   is logged as ``hang-cancelled``)
    crash()        says ``fatal: crashing on purpose`` on stderr and exits with code 3 mid-call
    huge(chars)    answers ``chars`` characters of text
    fail()         answers an error result (``is_error``)
    get_weather(city)  answers ``Sunny, 20 degrees Celsius.``; ``city`` can only be ``Paris`` (its schema
                   has one value: the real engine's tool-call grammar then writes the arguments whole)

``--calls PATH``: each call is appended to PATH as a JSON line ``{"tool", "arguments"}`` as it starts, so a
test can tell which calls reached the server. ``--crash-at-start``: says ``fatal: bad config`` on stderr
and exits with code 2 before answering anything. ``--echo-as NAME``: ``echo`` is offered under ``NAME`` too
(a name another server's tool may clash with once the app names it SERVER__TOOL).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any, Literal

from mcp.server.mcpserver import MCPServer

server = MCPServer("lemon-desk-test")
CALLS: list[str] = []


def note(tool: str, arguments: dict[str, Any]) -> None:
    if CALLS:
        with open(CALLS[0], "a") as log:
            log.write(json.dumps({"tool": tool, "arguments": arguments}) + "\n")


@server.tool(description="Say the text back.")
def echo(text: str) -> str:
    note("echo", {"text": text})
    return f"echo: {text}"


@server.tool(description="Add two numbers.")
def add(a: float, b: float) -> str:
    note("add", {"a": a, "b": b})
    return str(a + b)


@server.tool(description="Never answer.")
async def hang() -> str:
    note("hang", {})
    print("hang: started", file=sys.stderr, flush=True)
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:  # the client cancelled the call (notifications/cancelled)
        note("hang-cancelled", {})
        raise
    return "never"


@server.tool(description="Die mid-call.")
def crash() -> str:
    note("crash", {})
    print("fatal: crashing on purpose", file=sys.stderr, flush=True)
    os._exit(3)


@server.tool(description="Answer a long text.")
def huge(chars: int) -> str:
    note("huge", {"chars": chars})
    return ("0123456789" * (chars // 10 + 1))[:chars]


@server.tool(description="Answer an error.")
def fail() -> str:
    note("fail", {})
    raise ValueError("the tool failed on purpose")


@server.tool(description="The weather in a city.")
def get_weather(city: Literal["Paris"]) -> str:
    note("get_weather", {"city": city})
    return "Sunny, 20 degrees Celsius."


def serve_http(port: int, token: str) -> None:
    import uvicorn

    app = server.streamable_http_app()

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and token:
            given = dict(scope["headers"]).get(b"authorization", b"").decode()
            if given != f"Bearer {token}":
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"no token"})
                return
        await app(scope, receive, send)

    uvicorn.run(guarded, host="127.0.0.1", port=port, log_level="warning", lifespan="on")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int)
    parser.add_argument("--token", default="")
    parser.add_argument("--calls")
    parser.add_argument("--crash-at-start", action="store_true")
    parser.add_argument("--echo-as")
    args = parser.parse_args()
    if args.echo_as:
        server.add_tool(echo, name=args.echo_as, description="Say the text back.")
    if args.calls:
        CALLS.append(args.calls)
    if args.crash_at_start:
        print("fatal: bad config", file=sys.stderr, flush=True)
        sys.exit(2)
    if args.http:
        serve_http(args.http, args.token)
    else:
        server.run("stdio")


if __name__ == "__main__":
    main()
