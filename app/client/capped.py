"""Bodies sent by other machines (the Hub or a mirror, a remote, an engine), read up to a cap: one that
goes on without end is refused once past it, not held in memory."""

from __future__ import annotations

from collections.abc import AsyncIterable


async def read_upto(chunks: AsyncIterable[bytes], cap: int) -> bytes:
    """A body read until it ends or passes ``cap`` bytes, and no further: what was read, which is more
    than ``cap`` (by at most one chunk) when the body went on past it."""
    body = bytearray()
    async for chunk in chunks:
        body += chunk
        if len(body) > cap:
            break
    return bytes(body)
