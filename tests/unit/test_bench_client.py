"""The bench's client against a loopback server that answers llama-server's routes wrongly: every odd
answer is a RequestError that says so, and an engine gone before the bench asks its version is no crash."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import pytest
from aiohttp import web

from app.client.bench import BenchClient
from app.core.errors import RequestError


async def _serving(answers: dict[str, Any]) -> tuple[web.AppRunner, str]:
    async def answer(request: web.Request) -> web.Response:
        return web.Response(text=answers[request.path], content_type="application/json")

    app = web.Application()
    for path in answers:
        app.router.add_route("*", path, answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


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


def test_an_engine_gone_has_no_version_to_tell() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens here once the socket is closed

    async def go() -> str:
        async with BenchClient(f"http://127.0.0.1:{port}", None) as client:
            return await client.version()

    assert asyncio.run(go()) == ""
