"""The local API in a process of its own, as ``lemon-desk serve`` runs it (an ApiServer over a Router on
loopback), that also tells its parent how to reach the engine behind it: for benches that compare a
request through the API with the same request sent straight to the same engine.

    python -m tests.support.served_engine MODEL

Loads MODEL, then prints one line, ``API_URL ENGINE_URL ENGINE_KEY``, to its parent's pipe (the engine's
key exists only in this process's memory otherwise: its file is gone once the engine has read it). Then
answers each ``cpu`` line on its standard input with the CPU time this process has spent, every thread's
(live or ended), in seconds to the nanosecond: user + system time from outside come in 10 ms ticks, about
what the API spends on a whole 200-token reply. Stops every engine and exits when its standard input closes.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

from app.store.settings import load_settings
from app.supervisor.api import ApiServer
from app.supervisor.router import Router


async def serve(model: str) -> None:
    async with Router(load_settings().settings) as router:
        server = ApiServer(router, "127.0.0.1", 0)
        await server.start()
        try:
            engine = await router.ensure_loaded(model)
            print(server.url, engine.base_url, engine.api_key or "-", flush=True)
            await _answer_cpu()
        finally:
            await server.stop()


async def _answer_cpu() -> None:
    """Answer each ``cpu`` line on standard input, until it closes. Read on the loop, as its bytes
    come: a thread's read, woken for each line, cost 60-200 us, which the bench counted as the API's."""
    loop = asyncio.get_running_loop()
    closed = loop.create_future()
    stdin = sys.stdin.fileno()

    def answer() -> None:
        data = os.read(stdin, 4096)
        for _ in range(data.count(b"cpu\n")):
            print(time.clock_gettime(time.CLOCK_PROCESS_CPUTIME_ID), flush=True)
        if not data and not closed.done():
            closed.set_result(None)

    loop.add_reader(stdin, answer)
    try:
        await closed
    finally:
        loop.remove_reader(stdin)


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1]))
