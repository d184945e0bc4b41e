"""Hostile and heavy clients of the local API, and a ``/health`` prober to run beside them: the chaos
test (tests/chaos/test_api_fuzz.py) checks every answer, the bench (tests/bench/health_under_load.py)
times ``/health`` under the same load."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

import httpx

CHAT = "/v1/chat/completions"
HEALTH = "/api/v1/health"
HEALTH_EVERY_S = 0.02
# Long enough that a machine ten times slower than a busy one (p99 ~0.1 s) answers within it: a /health
# that does not come back at all still fails.
HEALTH_TIMEOUT_S = 30.0


async def probe_health(url: str, stop: asyncio.Event, latencies: list[float]) -> None:
    """Ask for ``/health`` every few milliseconds until ``stop``; each answer must be a 200."""
    async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=HEALTH_TIMEOUT_S) as client:
        while not stop.is_set():
            started = time.perf_counter()
            response = await client.get(HEALTH)
            latencies.append(time.perf_counter() - started)
            assert response.status_code == 200
            await asyncio.sleep(HEALTH_EVERY_S)


async def slow_client(host: str, port: int, body: bytes, delay_s: float) -> bytes:
    """Sends a request a few bytes at a time, then reads whatever comes back."""
    reader, writer = await asyncio.open_connection(host, port)
    head = f"POST {CHAT} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    request = head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body
    try:
        for i in range(0, len(request), 16):
            writer.write(request[i : i + 16])
            await writer.drain()
            await asyncio.sleep(delay_s)
        return await asyncio.wait_for(reader.read(200), 30)
    finally:
        writer.close()
        await writer.wait_closed()


async def hostile_load(
    client: httpx.AsyncClient, url: str, model: str, chance: random.Random, note: Callable[[str], None]
) -> None:
    """Malformed and wrong-typed JSON, a 40 MiB body, 100 concurrent requests, 10 slow clients and 20
    streams dropped after their first chunk, against a server at ``url`` whose ``model`` is loaded;
    every answer is checked and ``note``d."""
    ok = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(50):  # malformed JSON: cut at a random place
        text = b'{"model": "x", "messages": [{"role": "user"'
        cut = text[: chance.randrange(1, len(text))]
        response = await client.post(CHAT, content=cut)
        note(f"malformed JSON: {response.status_code}")
        assert response.status_code == 400 and "Traceback" not in response.text
    wrong = [
        {**ok, "messages": "hi"},
        {**ok, "max_tokens": "lots"},
        {**ok, "model": 5},
        {**ok, "stream": "yes"},
        {**ok, "temperature": [1]},
        [ok],
        "hello",
        None,
    ]
    for body in wrong:
        response = await client.post(CHAT, json=body)
        note(f"wrong types: {response.status_code}")
        assert response.status_code == 400, (body, response.text)
    huge = b'{"model": "x", "pad": "' + b"a" * (40 << 20) + b'"}'
    response = await client.post(CHAT, content=huge)
    note(f"a 40 MiB body: {response.status_code}")
    assert response.status_code == 413

    answers = await asyncio.gather(*(client.post(CHAT, json={**ok, "max_tokens": 4}) for _ in range(100)))
    codes = sorted({a.status_code for a in answers})
    note(f"100 concurrent requests: {codes}")
    assert codes == [200]

    host, port = "127.0.0.1", int(url.rsplit(":", 1)[1])
    slow_body = b'{"model": "%s", "messages": []}' % model.encode()
    slow = await asyncio.gather(*(slow_client(host, port, slow_body, 0.05) for _ in range(10)))
    note(f"slow clients answered: {sum(1 for s in slow if s.startswith(b'HTTP/1.1'))}")

    for _ in range(20):  # clients that go away after the first chunk
        async with client.stream("POST", CHAT, json={**ok, "stream": True}) as stream:
            async for _chunk in stream.aiter_bytes():
                break
        note("stream dropped mid-reply")
