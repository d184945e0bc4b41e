"""A stand-in for a remote server, on loopback, for the fast remote tests: it answers the routes Lemon Desk
uses on a remote (``GET /v1/models``, ``GET /api/v1/health``, ``GET /api/v1/stats``, ``POST
/v1/chat/completions`` streamed or whole, ``POST /api/v1/load`` and ``/api/v1/unload``) the way a Lemon
Desk, a Lemonade Server or a plain OpenAI server does, with an optional key. It stops and starts again
on the same port, so a remote can go away and come back. The real thing (two ``lemon-desk serve``) is in
tests/integration/test_remote.py.

    remote = StandinRemote(models=("smol",), key="k")
    await remote.start()      # on the running loop; remote.url
    await remote.stop(); await remote.start()   # down, then back on the same port
    with remote.in_thread():  # for tests that call the CLI (which runs its own loop)
        ...
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

REPLY = ["Hello", " from", " the", " remote", "."]


@dataclass
class Seen:
    method: str
    path: str
    authorization: str | None
    body: dict[str, Any] | None


@dataclass
class StandinRemote:
    models: tuple[str, ...] = ("smol",)
    key: str | None = None
    kind: str = "lemon-desk"  # "lemon-desk", "lemonade", or "openai" (no /api/v1 routes)
    listing: str = "ok"  # "endless": a model list without end; "drip": one byte each 0.2 s
    usage_json: str | None = (
        None  # the last event's "usage" as this text (a hostile remote's), not the real one
    )
    # A reasoning model's thought before the reply: apart (reasoning_content) when the request asks
    # "auto" or "deepseek" (llama-server's names, which Lemon Desk reads), else inside the content as
    # <think>...</think>, as a Lemon Desk whose model option says "inline" sends it.
    thought: str | None = None
    loaded: set[str] = field(default_factory=set)
    seen: list[Seen] = field(default_factory=list)
    port: int = 0
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def requests(self, path: str) -> list[Seen]:
        return [s for s in self.seen if s.path == path]

    # --- running ------------------------------------------------------------------------------------

    async def start(self) -> None:
        app = web.Application(middlewares=[self._record_and_check_key])
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        if self.kind != "openai":
            app.router.add_get("/api/v1/health", self._health)
            app.router.add_get("/api/v1/stats", self._stats)
            app.router.add_post("/api/v1/load", self._load)
            app.router.add_post("/api/v1/unload", self._unload)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", self.port, reuse_address=True)
        await site.start()
        self._runner = runner
        self.port = int(runner.addresses[0][1])

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    @contextmanager
    def in_thread(self) -> Iterator[StandinRemote]:
        """Serve from a thread with its own loop (for code under test that runs ``asyncio.run``)."""
        loop = asyncio.new_event_loop()
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self.start())
            started.set()
            loop.run_forever()
            loop.run_until_complete(self.stop())
            loop.close()

        thread = threading.Thread(target=run, name="standin-remote", daemon=True)
        thread.start()
        assert started.wait(10), "the stand-in remote did not start"
        try:
            yield self
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)

    # --- routes -------------------------------------------------------------------------------------

    @web.middleware
    async def _record_and_check_key(self, request: web.Request, handler: Any) -> web.StreamResponse:
        raw = await request.read()
        body = json.loads(raw) if raw else None
        auth = request.headers.get("Authorization")
        self.seen.append(Seen(request.method, request.path, auth, body))
        if self.key and auth != f"Bearer {self.key}":
            error = {"error": {"message": "A valid API key is required.", "type": "authentication_error"}}
            return web.json_response(error, status=401)
        return await handler(request)

    async def _models(self, request: web.Request) -> web.StreamResponse:
        if self.listing != "ok":
            return await self._hostile_listing(request)
        owner = "lemon-desk" if self.kind == "lemon-desk" else self.kind
        data = [
            {"id": m, "object": "model", "owned_by": owner, "recipe": "llamacpp", "size": 0.1, "labels": []}
            for m in self.models
        ]
        return web.json_response({"object": "list", "data": data})

    async def _hostile_listing(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(b'{"data": [')
        with contextlib.suppress(ConnectionError):
            while True:
                if self.listing == "drip":
                    await asyncio.sleep(0.2)
                    await response.write(b" ")
                else:
                    await response.write(b'{"id": "x"},' * 4096)
        return response

    async def _health(self, request: web.Request) -> web.Response:
        loaded = [{"model_name": m} for m in sorted(self.loaded)]
        server = {"server": "lemon-desk"} if self.kind == "lemon-desk" else {}
        return web.json_response({"status": "ok", "version": "9.9.9", "all_models_loaded": loaded, **server})

    async def _stats(self, request: web.Request) -> web.Response:
        return web.json_response({"tokens_per_second": 123.0, "time_to_first_token": 0.01})

    async def _load(self, request: web.Request) -> web.Response:
        name = (await request.json())["model_name"]
        if name not in self.models:
            return web.json_response({"error": {"message": f"no model {name}"}}, status=404)
        self.loaded.add(name)
        return web.json_response({"status": "success"})

    async def _unload(self, request: web.Request) -> web.Response:
        self.loaded.discard((await request.json())["model_name"])
        return web.json_response({"status": "success"})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("model") not in self.models:
            error = {"error": {"message": f"There is no model named '{body.get('model')}'.", "type": "x"}}
            return web.json_response(error, status=404)
        self.loaded.add(body["model"])
        usage = {"prompt_tokens": 7, "completion_tokens": len(REPLY), "total_tokens": 7 + len(REPLY)}
        deltas: list[dict[str, str]] = [{"content": token} for token in REPLY]
        if self.thought is not None:
            apart = body.get("reasoning_format") in ("auto", "deepseek")
            thought = (
                {"reasoning_content": self.thought}
                if apart
                else {"content": f"<think>{self.thought}</think>"}
            )
            deltas.insert(0, thought)
        if not body.get("stream"):
            message: dict[str, str] = {"role": "assistant", "content": ""}
            for delta in deltas:
                for key, text in delta.items():
                    message[key] = message.get(key, "") + text
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            return web.json_response({"choices": [choice], "usage": usage})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for delta in deltas:
            chunk = {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        end = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": usage}
        last = json.dumps(end)
        if self.usage_json is not None:
            last = last.replace(json.dumps(usage), self.usage_json)
        await response.write(f"data: {last}\n\ndata: [DONE]\n\n".encode())
        await response.write_eof()
        return response
