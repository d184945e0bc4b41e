"""Lemonade's management routes: load, unload, pull (with SSE progress), delete, health, stats,
system-info, and a model's saved options. Field names follow Lemonade Server's API (``model_name``,
``ctx_size``, ``llamacpp_backend``, ``llamacpp_args``, ``pinned``, ``save_options``); each call is one
router call, so the window, the CLI and the API stay one truth.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import TYPE_CHECKING, Any

from aiohttp import web

from app import __version__
from app.core.engine_state import EngineState
from app.core.errors import LemonDeskError
from app.core.models import Model
from app.core.policy import parse_caps
from app.core.refs import FileSet
from app.core.remotes import is_remote_model
from app.store.model_options import ModelOptions
from app.supervisor.api.bodies import optional, parse_object, required_str
from app.supervisor.api.errors import ApiError, bad_request, from_app_error, model_not_found
from app.supervisor.api.openai import SSE_HEADERS, check_remote, find_model

if TYPE_CHECKING:
    from app.supervisor.router import Router, RouterEvent

# Lemonade's option names and ours. ctx_size -1 (Lemonade's "automatic") is our None.
OPTION_FIELDS = {"ctx_size": "ctx_size", "llamacpp_backend": "backend", "llamacpp_args": "args"}


def _success(message: str, **extra: Any) -> web.Response:
    return web.json_response({"status": "success", "message": message, **extra})


def _option_value(body: dict[str, Any], field: str) -> Any:
    if field == "ctx_size":
        size = optional(body, field, "int")
        if size is not None and size != -1 and size <= 0:
            raise bad_request("'ctx_size' must be a positive number of tokens, or -1 for automatic.")
        return None if size == -1 else size
    value = optional(body, field, "str")
    return value or (None if field == "llamacpp_backend" else "")


def _apply(options: ModelOptions, body: dict[str, Any]) -> ModelOptions:
    """``options`` with the recipe options ``body`` names (a null one goes back to its default)."""
    changes = {ours: _option_value(body, theirs) for theirs, ours in OPTION_FIELDS.items() if theirs in body}
    return dataclasses.replace(options, **changes)


def _options_json(options: ModelOptions) -> dict[str, Any]:
    return {
        "ctx_size": options.ctx_size if options.ctx_size is not None else -1,
        "llamacpp_backend": options.backend or "",
        "llamacpp_args": options.args,
    }


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


class LemonadeRoutes:
    def __init__(self, router: Router) -> None:
        self.router = router

    def add_to(self, app: web.Application, prefix: str) -> None:
        app.router.add_post(f"{prefix}/load", self.load)
        app.router.add_post(f"{prefix}/unload", self.unload)
        app.router.add_post(f"{prefix}/pull", self.pull)
        app.router.add_post(f"{prefix}/delete", self.delete)
        app.router.add_get(f"{prefix}/health", self.health)
        app.router.add_get(f"{prefix}/stats", self.stats)
        app.router.add_get(f"{prefix}/system-info", self.system_info)
        app.router.add_get(f"{prefix}/models/{{id}}/options", self.get_options)
        app.router.add_post(f"{prefix}/models/{{id}}/options", self.save_options)
        app.router.add_delete(f"{prefix}/models/{{id}}/options", self.reset_options)

    async def _body(self, request: web.Request) -> dict[str, Any]:
        return parse_object(await request.read())

    # --- load and unload ------------------------------------------------------------------------------

    async def load(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        name = required_str(body, "model_name")
        if is_remote_model(name):
            check_remote(self.router, name)
            await asyncio.shield(self.router.remotes.load(name))  # its remote loads it
            return _success(f"Loaded model: {name}")
        find_model(self.router, name)
        pinned = optional(body, "pinned", "bool")
        save = optional(body, "save_options", "bool")
        options = _apply(self.router.options(name), body)
        if save:
            self.router.save_options(name, options)
        if pinned is not None:
            self.router.set_pinned(name, pinned)
        # Shielded: a client that gives up waiting does not cancel the load for everyone else.
        await asyncio.shield(self.router.load(name, options))
        return _success(f"Loaded model: {name}")

    async def unload(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        name = optional(body, "model_name", "str")
        if not name:
            await self.router.unload_all()
            return _success("All models unloaded")
        if is_remote_model(name):
            check_remote(self.router, name)
            await self.router.unload(name)  # its remote unloads it
            return _success(f"Model unloaded: {name}")
        find_model(self.router, name)
        if name not in self.router.supervisor.engines:
            raise ApiError(404, f"{name} is not loaded.", "not_found_error", "model_not_loaded")
        await self.router.unload(name)
        return _success(f"Model unloaded: {name}")

    # --- pull and delete ------------------------------------------------------------------------------

    async def pull(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        name = required_str(body, "model_name")
        stream = optional(body, "stream", "bool")
        if name not in self.router.library.models() and "/" not in name:
            raise model_not_found(name)
        if not stream:
            await self.router.pull(name)
            return _success(f"Installed model: {name}")
        model, files = await self.router.plan_pull(name)
        return await self._pull_streamed(request, model.name, model, files)

    async def _pull_streamed(
        self, request: web.Request, name: str, model: Model, files: FileSet
    ) -> web.StreamResponse:
        from app.supervisor.downloads import DownloadProgress

        queue: asyncio.Queue[bytes] = asyncio.Queue()
        total_files = len(files.files)
        names = [f.path for f in files.files]

        def on_event(event: RouterEvent) -> None:
            if isinstance(event, DownloadProgress) and event.id == model.checkpoint:
                index = names.index(event.file) + 1 if event.file in names else 0
                percent = int(100 * event.done / event.total) if event.total else 0
                data = {
                    "file": event.file,
                    "file_index": index,
                    "total_files": total_files,
                    "bytes_downloaded": event.done,
                    "bytes_total": event.total,
                    "percent": percent,
                }
                queue.put_nowait(_sse("progress", data))

        response = web.StreamResponse(headers=SSE_HEADERS)
        await response.prepare(request)
        unsubscribe = self.router.subscribe(on_event)
        download = asyncio.ensure_future(self.router.download(model, files))
        try:
            while not download.done() or not queue.empty():
                getter = asyncio.ensure_future(queue.get())
                await asyncio.wait({getter, download}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    await response.write(getter.result())
                else:
                    getter.cancel()
                    await asyncio.gather(getter, return_exceptions=True)
            try:
                download.result()
            except LemonDeskError as err:
                await response.write(_sse("error", {"error": from_app_error(err).message}))
            else:
                done = {"file_index": total_files, "total_files": total_files, "percent": 100}
                await response.write(_sse("complete", {**done, "model_name": name}))
        finally:
            unsubscribe()
            if not download.done():
                # The client went away: the download goes on (pause or cancel it from the app).
                download.cancel()
            await asyncio.gather(download, return_exceptions=True)
        await response.write_eof()
        return response

    async def delete(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        name = required_str(body, "model_name")
        find_model(self.router, name)
        said = await self.router.delete(name)
        return _success(f"Deleted model: {name}", detail=said)

    # --- state ----------------------------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        router = self.router
        loaded = router.loaded()  # least recently used first
        models = []
        for name in loaded:
            engine = router.supervisor.engines[name]
            model = router.library.models().get(name)
            labels = set(model.labels) if model else set()
            kind = "embedding" if "embeddings" in labels else "reranking" if "reranking" in labels else "llm"
            models.append(
                {
                    "model_name": name,
                    "checkpoint": model.checkpoint if model else engine.request.model,
                    "recipe": engine.request.recipe,
                    "backend": engine.request.backend,
                    "device": _device(engine),
                    "type": kind,
                    "pinned": router.options(name).pinned,
                    "pid": engine.pid,
                    "recipe_options": _options_json(router.options(name)),
                }
            )
        return web.json_response(
            {
                "status": "ok",
                "server": "lemon-desk",  # how another Lemon Desk tells this one from a Lemonade Server
                "version": __version__,
                "model_loaded": loaded[-1] if loaded else None,
                "all_models_loaded": models,
                "max_models": parse_caps(router.settings.max_loaded_models).to_json(),
            }
        )

    async def stats(self, request: web.Request) -> web.Response:
        last = self.router.last_request
        if last is None:
            keys = (
                "time_to_first_token",
                "tokens_per_second",
                "input_tokens",
                "output_tokens",
                "prompt_tokens",
            )
            return web.json_response(dict.fromkeys(keys))
        t = last.telemetry
        return web.json_response(
            {
                "time_to_first_token": t.ttft_s,
                "tokens_per_second": t.decode_tps,
                "input_tokens": t.prompt_tokens,
                "output_tokens": t.completion_tokens,
                "prompt_tokens": t.prompt_tokens,
                "prompt_tokens_per_second": t.prompt_tps,
                "model_name": last.model,
                "source": last.source.value,
            }
        )

    async def system_info(self, request: web.Request) -> web.Response:
        info = await self.router.supervisor.info()
        return web.json_response(info.to_json())

    # --- a model's options ----------------------------------------------------------------------------

    def _options_reply(self, name: str) -> web.Response:
        model = find_model(self.router, name)
        options = self.router.options(name)
        defaults = {"model_name": name, **_options_json(ModelOptions())}
        effective = {"model_name": name, **_options_json(options)}
        saved = {k: v for k, v in _options_json(options).items() if v != defaults[k]}
        return web.json_response(
            {
                "model_name": name,
                "recipe": model.recipe,
                "saved": saved,
                "effective": effective,
                "defaults": defaults,
            }
        )

    async def get_options(self, request: web.Request) -> web.Response:
        return self._options_reply(request.match_info["id"])

    async def save_options(self, request: web.Request) -> web.Response:
        name = request.match_info["id"]
        find_model(self.router, name)
        body = await self._body(request)
        unknown = set(body) - set(OPTION_FIELDS) - {"model_name"}
        if unknown:
            raise bad_request(f"Unknown option(s): {', '.join(sorted(unknown))}.", "unknown_option")
        self.router.save_options(name, _apply(self.router.options(name), body))
        return self._options_reply(name)

    async def reset_options(self, request: web.Request) -> web.Response:
        name = request.match_info["id"]
        find_model(self.router, name)
        self.router.save_options(name, ModelOptions())
        return self._options_reply(name)


def _device(engine: Any) -> str:
    from app.supervisor.router import device_of

    return str(device_of(engine).value) if engine.state is EngineState.READY else ""
