"""Bodies sent by other machines (the Hub or a mirror, a remote, an engine), read up to a cap: one that
goes on without end is refused once past it, not held in memory.

A redirect's body is not read at all. httpx, told to follow redirects, reads each redirect's body whole
before it follows (``_send_handling_redirects``), so a server answering ``302`` with a body without end
filled the memory; ``stream_following`` follows them itself and closes each redirect unread.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx


async def read_upto(chunks: AsyncIterable[bytes], cap: int) -> bytes:
    """A body read until it ends or passes ``cap`` bytes, and no further: what was read, which is more
    than ``cap`` (by at most one chunk) when the body went on past it."""
    body = bytearray()
    async for chunk in chunks:
        body += chunk
        if len(body) > cap:
            break
    return bytes(body)


def _too_many(request: httpx.Request) -> httpx.TooManyRedirects:
    import httpx

    return httpx.TooManyRedirects("Exceeded maximum allowed redirects.", request=request)


@asynccontextmanager
async def stream_following(
    client: httpx.AsyncClient, method: str, url: str, **kw: Any
) -> AsyncIterator[httpx.Response]:
    """``client.stream(method, url, **kw)`` with its redirects followed as httpx follows them (httpx's
    next request: no Authorization to another origin; at most ``client.max_redirects``, then
    TooManyRedirects), each redirect closed unread."""
    request = client.build_request(method, url, **kw)
    for _ in range(client.max_redirects + 1):
        response = await client.send(request, stream=True, follow_redirects=False)
        if response.next_request is None:
            try:
                yield response
            finally:
                await response.aclose()
            return
        await response.aclose()
        request = response.next_request
    raise _too_many(request)


@contextmanager
def stream_following_sync(client: httpx.Client, method: str, url: str, **kw: Any) -> Iterator[httpx.Response]:
    """``stream_following`` for a blocking client."""
    request = client.build_request(method, url, **kw)
    for _ in range(client.max_redirects + 1):
        response = client.send(request, stream=True, follow_redirects=False)
        if response.next_request is None:
            try:
                yield response
            finally:
                response.close()
            return
        response.close()
        request = response.next_request
    raise _too_many(request)
