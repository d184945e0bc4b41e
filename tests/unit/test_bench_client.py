"""The bench's client against a loopback server that answers llama-server's routes wrongly: every odd
answer is a RequestError that says so, and an engine gone before the bench asks its context is no crash."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from app.client import chat
from app.client.bench import BenchClient
from app.core.errors import RequestError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def _serving(answers: dict[str, str | Handler]) -> tuple[web.AppRunner, str]:
    """A server answering each path with its text, or its handler's answer."""

    async def answer(request: web.Request) -> web.StreamResponse:
        said = answers[request.path]
        if callable(said):
            return await said(request)
        return web.Response(text=said, content_type="application/json")

    app = web.Application()
    for path in answers:
        app.router.add_route("*", path, answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


def tokenize_from(answer: Handler) -> list[int]:
    """The bench's tokenize of "hello" against a server answering /tokenize with ``answer``."""

    async def go() -> list[int]:
        runner, url = await _serving({"/tokenize": answer})
        try:
            async with BenchClient(url, None) as client:
                return await client.tokenize("hello")
        finally:
            await runner.cleanup()

    return asyncio.run(go())


def test_odd_answers_are_request_errors() -> None:
    timings = {"prompt_n": 1e999, "prompt_ms": 1, "predicted_n": 1, "predicted_ms": 1}  # 1e999: Infinity
    answers = {"/tokenize": '{"tokens": ["abc", 5]}', "/completion": json.dumps({"timings": timings})}

    async def go() -> None:
        runner, url = await _serving(answers)
        try:
            async with BenchClient(url, None) as client:
                with pytest.raises(RequestError, match="unreadable answer to /tokenize"):
                    await client.tokenize("hello")
                with pytest.raises(RequestError, match="no timings to measure with"):
                    await client.measure([1], 1)
        finally:
            await runner.cleanup()

    asyncio.run(go())


def test_an_engine_gone_has_no_context_to_tell() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens here once the socket is closed

    async def go() -> int | None:
        async with BenchClient(f"http://127.0.0.1:{port}", None) as client:
            return await client.context_size()

    assert asyncio.run(go()) is None


@pytest.mark.leaves_running(
    "the answer is left unread past the cap on purpose (it may never end): httpx's aiter_bytes and "
    "aiter_raw stay half-run until the loop's GC hook closes them, an aclose() task asyncio.run cancels"
)
def test_an_answer_without_end_is_refused_past_the_cap_not_read_into_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An engine broken into answering /tokenize without end: the bench fails saying so once the answer
    passes the cap of a whole reply (1 MiB here), and the rest is not read."""
    monkeypatch.setattr(chat, "MAX_ANSWER_BYTES", 1 << 20)
    sent = 0

    async def endless(request: web.Request) -> web.StreamResponse:
        nonlocal sent
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        piece = b"x" * (1 << 20)
        try:
            while sent < 64:  # 64 MiB at most, far past the cap: the client stops reading long before
                await response.write(piece)
                sent += 1
        except ConnectionError:  # the client hung up, as it should
            pass
        return response

    with pytest.raises(RequestError, match="The engine's answer to /tokenize went on past 1 MiB"):
        tokenize_from(endless)
    assert sent < 64


@pytest.mark.parametrize(
    ("props", "context"),
    [
        ({"default_generation_settings": {"n_ctx": 8192}}, 8192),
        ({"default_generation_settings": {"n_ctx": True}}, None),
        ({"default_generation_settings": {"n_ctx": "8192"}}, None),
        ({"default_generation_settings": []}, None),
        ([], None),
    ],
)
def test_the_context_a_request_holds_is_read_from_props_or_not_known(props: Any, context: int | None) -> None:
    async def go() -> int | None:
        runner, url = await _serving({"/props": json.dumps(props)})
        try:
            async with BenchClient(url, None) as client:
                return await client.context_size()
        finally:
            await runner.cleanup()

    assert asyncio.run(go()) == context


@pytest.mark.leaves_running(
    "httpx raises DecodingError from aiter_bytes with its inner aiter_raw generator unfinished; the loop's "
    "GC hook closes it (an aclose() task asyncio.run cancels at exit)"
)
def test_an_answer_that_does_not_decode_is_a_request_error() -> None:
    """A body marked gzip that is not: httpx's DecodingError is no TransportError, and escaped the bench
    as a traceback."""

    async def not_gzip(request: web.Request) -> web.StreamResponse:
        return web.Response(body=b'{"tokens": [1]}', headers={"Content-Encoding": "gzip"})

    with pytest.raises(
        RequestError, match=r"The engine's answer to /tokenize could not be read \(DecodingError\)"
    ):
        tokenize_from(not_gzip)
