"""The local API in a process of its own, as ``lemon-desk serve`` runs it (an ApiServer over a Router on
loopback), that also tells its parent how to reach the engine behind it: for benches that compare a
request through the API with the same request sent straight to the same engine.

    python -m tests.support.served_engine MODEL

Loads MODEL, then prints one line, ``API_URL ENGINE_URL ENGINE_KEY``, to its parent's pipe (the engine's
key exists only in this process's memory otherwise: its file is gone once the engine has read it). Stops
every engine and exits when its standard input closes.
"""

from __future__ import annotations

import asyncio
import sys

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
            await asyncio.to_thread(sys.stdin.read)  # until the parent closes the pipe
        finally:
            await server.stop()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1]))
