"""The stdio transport of an MCP server the app started itself (``app.supervisor.child``: its own process
group, killed with the app, named in a run record), in the shape the ``mcp`` SDK's ``Client`` takes: a
context manager yielding the stream pair its session reads and writes.

The SDK's own ``stdio_client`` starts the process itself, outside those rules; this one only carries
newline-delimited JSON-RPC over the pipes of a child that is started and stopped by its owner. A message
longer than ``MAX_MESSAGE_BYTES`` is dropped (its request then fails on its own time limit) rather than
held: what a server sends cannot make the app's memory grow without end.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

import anyio
import mcp_types
from mcp.client import Transport
from mcp.shared.message import SessionMessage

from app.supervisor.child import ChildProcess

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 16 << 20
READ_BYTES = 1 << 16


class MessageTooLarge(ValueError):
    pass


def split_messages(rest: bytes, chunk: bytes, skipping: bool) -> tuple[list[bytes | None], bytes, bool]:
    """Whole lines out of ``rest + chunk``: (lines, what is left, whether a too long line is being
    skipped). A line over ``MAX_MESSAGE_BYTES`` comes out as None, once."""
    *lines, rest = (rest + chunk).split(b"\n")
    out: list[bytes | None] = []
    for line in lines:
        if skipping:  # the end of a line already said to be too long
            skipping = False
            continue
        out.append(None if len(line) > MAX_MESSAGE_BYTES else line)
    if len(rest) > MAX_MESSAGE_BYTES:
        if not skipping:
            out.append(None)
        rest, skipping = b"", True
    return [line for line in out if line is None or line.strip()], rest, skipping


@contextlib.asynccontextmanager
async def _streams(child: ChildProcess) -> AsyncIterator[tuple[object, object]]:
    stdin, stdout = child.stdin, child.stdout
    assert stdin is not None and stdout is not None, "the child was spawned with protocol=True"
    to_session, session_reads = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    session_writes, from_session = anyio.create_memory_object_stream[SessionMessage](0)

    async def read() -> None:
        rest, skipping = b"", False
        async with to_session:
            while chunk := await stdout.read(READ_BYTES):
                lines, rest, skipping = split_messages(rest, chunk, skipping)
                for line in lines:
                    if line is None:
                        await to_session.send(MessageTooLarge(f"a message over {MAX_MESSAGE_BYTES >> 20} MB"))
                        continue
                    try:
                        message = mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                    except ValueError as err:
                        await to_session.send(err)
                        continue
                    await to_session.send(SessionMessage(message))

    async def write() -> None:
        async with from_session:
            async for item in from_session:
                stdin.write(item.message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n")
                try:
                    await stdin.drain()
                except ConnectionError:
                    return  # it died: the reader sees its stdout end

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(read)
        tasks.start_soon(write)
        try:
            yield session_reads, session_writes
        finally:
            tasks.cancel_scope.cancel()
            with contextlib.suppress(OSError):
                stdin.close()


def child_transport(child: ChildProcess) -> Transport:
    """The SDK transport over ``child``'s pipes; leaving it stops reading, not the child."""
    return _streams(child)  # type: ignore[return-value]
