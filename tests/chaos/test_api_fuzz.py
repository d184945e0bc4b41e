"""The local API fuzzed while it serves a real (stand-in) engine: malformed and wrong-typed JSON, a huge
body, 100 concurrent connections, slow clients and clients that go away mid-stream. The server stays up
and ``/health`` answers every time it is asked throughout; the table prints its p99, and
tests/bench/health_under_load.py measures that against a baseline (a timing is no test's to assert)."""

from __future__ import annotations

import asyncio
import statistics
from pathlib import Path

import httpx
import pytest

from app.store.model_options import ModelOptions
from app.store.settings import Settings
from app.supervisor.api import ApiServer
from app.supervisor.router import Router
from tests.chaos.conftest import Row, rng
from tests.support.api_load import CHAT, hostile_load, probe_health
from tests.support.standin import make_standin_model


@pytest.mark.chaos("API fuzz (stand-in engine)")
def test_the_api_stays_up_under_hostile_and_heavy_clients(
    chaos_row: Row, standin_settings: Settings, tmp_path: Path
) -> None:
    random = rng("api-fuzz")

    async def go() -> tuple[list[float], int]:
        async with Router(standin_settings) as router:
            model = router.library.import_path(make_standin_model(tmp_path, "fuzz", tokens=20))
            router.save_options(model.name, ModelOptions(backend="system"))
            server = ApiServer(router, "127.0.0.1", 0, None)
            await server.start()
            stop, latencies = asyncio.Event(), list[float]()
            prober = asyncio.ensure_future(probe_health(server.url, stop, latencies))
            try:
                limits = httpx.Limits(max_connections=200)
                async with httpx.AsyncClient(
                    base_url=server.url, trust_env=False, timeout=60, limits=limits
                ) as client:
                    ok = {"model": model.name, "messages": [{"role": "user", "content": "hi"}]}
                    await client.post(CHAT, json=ok)  # loads the model
                    before = len(latencies)
                    await hostile_load(client, server.url, model.name, random, chaos_row.add)
                    during = len(latencies) - before
                    after = await client.post(CHAT, json=ok)
                    assert after.status_code == 200, "still serving"
                    chaos_row.add("still serving at the end")
            finally:
                stop.set()
                await prober  # raises if a /health was not a 200 or did not come back
                await server.stop()
            return latencies, during

    latencies, during = asyncio.run(go())
    p99 = statistics.quantiles(latencies, n=100)[98]
    chaos_row.worst = f"/health p99 {p99 * 1000:.0f} ms"
    chaos_row.lost = f"nothing: /health answered {len(latencies)} times, p99 {p99 * 1000:.0f} ms"
    # /health was answered while the load ran, not only before and after it: a server that served
    # nothing else until the load was through would answer none here.
    assert during > 0, "/health was not answered while the hostile clients ran"
