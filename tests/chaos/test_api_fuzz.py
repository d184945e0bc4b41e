"""The local API fuzzed while it serves a real (stand-in) engine: malformed and wrong-typed JSON, a huge
body, 100 concurrent connections, slow clients and clients that go away mid-stream. The server stays up
and ``/health`` answers within 100 ms at the 99th percentile throughout."""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

import httpx
import pytest

from app.store.model_options import ModelOptions
from app.store.settings import Settings
from app.supervisor.api import ApiServer
from app.supervisor.router import Router
from tests.chaos.conftest import Row, rng
from tests.support.standin import make_standin_model

CHAT = "/v1/chat/completions"
HEALTH_EVERY_S = 0.02


async def probe_health(url: str, stop: asyncio.Event, latencies: list[float]) -> None:
    async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=5) as client:
        while not stop.is_set():
            started = time.perf_counter()
            response = await client.get("/api/v1/health")
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


@pytest.mark.chaos("API fuzz (stand-in engine)")
def test_the_api_stays_up_under_hostile_and_heavy_clients(
    chaos_row: Row, standin_settings: Settings, tmp_path: Path
) -> None:
    random = rng("api-fuzz")

    async def go() -> list[float]:
        async with Router(standin_settings) as router:
            model = router.library.import_path(make_standin_model(tmp_path, "fuzz", tokens=20))
            router.save_options(model.name, ModelOptions(backend="system"))
            server = ApiServer(router, "127.0.0.1", 0, None)
            await server.start()
            stop, latencies = asyncio.Event(), []
            prober = asyncio.ensure_future(probe_health(server.url, stop, latencies))
            try:
                limits = httpx.Limits(max_connections=200)
                async with httpx.AsyncClient(
                    base_url=server.url, trust_env=False, timeout=60, limits=limits
                ) as client:
                    ok = {"model": model.name, "messages": [{"role": "user", "content": "hi"}]}
                    await client.post(CHAT, json=ok)  # loads the model

                    for _ in range(50):  # malformed JSON: cut at a random place
                        text = b'{"model": "x", "messages": [{"role": "user"'
                        cut = text[: random.randrange(1, len(text))]
                        response = await client.post(CHAT, content=cut)
                        chaos_row.add(f"malformed JSON: {response.status_code}")
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
                        chaos_row.add(f"wrong types: {response.status_code}")
                        assert response.status_code == 400, (body, response.text)
                    huge = b'{"model": "x", "pad": "' + b"a" * (40 << 20) + b'"}'
                    response = await client.post(CHAT, content=huge)
                    chaos_row.add(f"a 40 MiB body: {response.status_code}")
                    assert response.status_code == 413

                    answers = await asyncio.gather(
                        *(client.post(CHAT, json={**ok, "max_tokens": 4}) for _ in range(100))
                    )
                    codes = sorted({a.status_code for a in answers})
                    chaos_row.add(f"100 concurrent requests: {codes}")
                    assert codes == [200]

                    host, port = "127.0.0.1", int(server.url.rsplit(":", 1)[1])
                    slow = await asyncio.gather(
                        *(
                            slow_client(
                                host, port, b'{"model": "%s", "messages": []}' % model.name.encode(), 0.05
                            )
                            for _ in range(10)
                        )
                    )
                    chaos_row.add(
                        f"slow clients answered: {sum(1 for s in slow if s.startswith(b'HTTP/1.1'))}"
                    )

                    for _ in range(20):  # clients that go away after the first chunk
                        async with client.stream("POST", CHAT, json={**ok, "stream": True}) as stream:
                            async for _chunk in stream.aiter_bytes():
                                break
                        chaos_row.add("stream dropped mid-reply")
                    after = await client.post(CHAT, json=ok)
                    assert after.status_code == 200, "still serving"
                    chaos_row.add("still serving at the end")
            finally:
                stop.set()
                await prober
                await server.stop()
            return latencies

    latencies = asyncio.run(go())
    p99 = statistics.quantiles(latencies, n=100)[98]
    chaos_row.worst = f"/health p99 {p99 * 1000:.0f} ms"
    chaos_row.lost = f"nothing: /health answered {len(latencies)} times, p99 {p99 * 1000:.0f} ms"
    assert p99 < 0.1, f"/health p99 {p99 * 1000:.0f} ms"
