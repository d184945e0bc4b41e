"""Lemonade's management routes: load, unload, pull (with SSE progress; a ``user.`` model defined by
Lemonade's registration fields is registered first), models/register, delete, health, stats,
system-info, system-stats, and a model's saved options. Field names follow Lemonade Server's API
(``model_name``, ``ctx_size``, ``llamacpp_backend`` / ``lemon_mlx_backend``, ``*_args``, ``pinned``,
``save_options``); each call is one router call, so the window, the CLI and the API stay one truth.
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
from app.core.names import USER_PREFIX
from app.core.policy import parse_caps
from app.core.refs import FileSet
from app.core.registration import defines_model, user_model_from_request
from app.core.remotes import SERVER_LEMON_DESK, is_remote_model
from app.store.hfcache import hub_cache_dir
from app.store.model_options import ModelOptions
from app.supervisor.api.bodies import optional, parse_object, required_str
from app.supervisor.api.errors import ApiError, bad_request, from_app_error, model_not_found
from app.supervisor.api.openai import SSE_HEADERS, check_remote, created_time, find_model, model_json
from app.supervisor.api.options import (
    options_json,
    requested,
    resolved_ctx_size,
    saved_json,
)
from app.supervisor.api.pulling import followed, pulled
from app.supervisor.api.system import model_storage, system_info_json

if TYPE_CHECKING:
    from app.supervisor.router import EngineSnapshot, Router

OPTIONS_FIELDS = frozenset({"model_name", "dry_run"})
MODEL_TYPES = ("llm", "embedding", "reranking")


def _success(message: str, **extra: Any) -> web.Response:
    return web.json_response({"status": "success", "message": message, **extra})


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def model_type(model: Model | None) -> str:
    """Lemonade's ``type`` of a loaded model: ``llm``, ``embedding`` or ``reranking``."""
    labels = set(model.labels) if model else set()
    return "embedding" if "embeddings" in labels else "reranking" if "reranking" in labels else "llm"


class LemonadeRoutes:
    """Lemonade's management routes (load, unload, pull, register, delete, options, health, stats, system)."""

    def __init__(self, router: Router) -> None:
        self.router = router

    def add_to(self, app: web.Application, prefix: str) -> None:
        app.router.add_post(f"{prefix}/load", self.load)
        app.router.add_post(f"{prefix}/unload", self.unload)
        app.router.add_post(f"{prefix}/pull", self.pull)
        app.router.add_post(f"{prefix}/models/register", self.register)
        app.router.add_post(f"{prefix}/delete", self.delete)
        app.router.add_get(f"{prefix}/health", self.health)
        app.router.add_get(f"{prefix}/stats", self.stats)
        app.router.add_get(f"{prefix}/system-info", self.system_info)
        app.router.add_get(f"{prefix}/system-stats", self.system_stats)
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
        model = find_model(self.router, name)
        pinned = optional(body, "pinned", "bool")
        save = optional(body, "save_options", "bool")
        optional(body, "merge_args", "bool")  # no inherited arguments here: either way the same
        saved = self.router.options(name)
        asked = requested(model.recipe, body, saved)
        if save:
            self.router.save_options(name, asked.keep(saved))
            if pinned is not None:
                self.router.set_pinned(name, pinned)
        # Like the other options, a pin is for this load unless saved (Lemonade's rule); not named, a
        # running model keeps its own.
        pin = self.router.pinned(name) if pinned is None else pinned
        # Shielded: a client that gives up waiting does not cancel the load for everyone else.
        await asyncio.shield(self.router.load(name, asked.apply(saved), pinned=pin))
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
        if name not in self.router.engines:
            raise ApiError(404, f"{name} is not loaded.", "not_found_error", "model_not_loaded")
        await self.router.unload(name)
        return _success(f"Model unloaded: {name}")

    # --- pull, register and delete --------------------------------------------------------------------

    async def pull(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        name = required_str(body, "model_name")
        stream = optional(body, "stream", "bool")
        subscribe = optional(body, "subscribe", "bool")  # Lemonade's: it applies to a stream only
        if stream and subscribe is False:
            raise bad_request(
                "Server-owned download jobs ('subscribe': false) are not kept here. Pull with 'stream': "
                "true to follow the download; it goes on if the connection drops (`lemon-desk downloads`).",
                "unsupported",
            )
        model, files = await self.router.plan_pull(self._to_pull(body, name))
        if not stream:
            await pulled(self.router, model, files)
            return _success(f"Installed model: {model.name}")
        return await self._pull_streamed(request, model.name, model, files)

    def _to_pull(self, body: dict[str, Any], name: str) -> Model:
        """The model a pull names, or the user model its registration fields define (registered when
        its download starts, so a definition the Hub refuses leaves nothing behind)."""
        library = self.router.catalog
        if defines_model(body):
            return library.define(user_model_from_request(body, known=name in library.models()))
        if name in library.models() or "/" in name:
            return library.resolve(name)
        if name.startswith(USER_PREFIX):
            raise bad_request(
                f"There is no model {name} yet: give its 'checkpoint' and 'recipe' to register it.",
                "missing_field",
            )
        raise model_not_found(name)

    async def _pull_streamed(
        self, request: web.Request, name: str, model: Model, files: FileSet
    ) -> web.StreamResponse:
        total_files = len(files.files)
        names = [f.path for f in files.files]
        response = web.StreamResponse(headers=SSE_HEADERS)
        await response.prepare(request)
        progress = followed(self.router, model, files)
        try:
            async for event in progress:
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
                await response.write(_sse("progress", data))
        except LemonDeskError as err:
            await response.write(_sse("error", {"error": from_app_error(err).message}))
        else:
            done = {"file_index": total_files, "total_files": total_files, "percent": 100}
            await response.write(_sse("complete", {**done, "model_name": name}))
        finally:
            await progress.aclose()  # the client went away: the download goes on (pause or cancel it)
        await response.write_eof()
        return response

    async def register(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        required_str(body, "model_name")
        model = self.router.register(user_model_from_request(body))
        view = await asyncio.to_thread(self.router.status, model.name)
        return web.json_response(
            {
                "status": "success",
                "model_name": model.name,
                "canonical_model_name": model.name,
                "model": model_json(self.router, view, await asyncio.to_thread(created_time, view)),
            }
        )

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
        models = [self._loaded_json(engine) for name in loaded if (engine := router.engines.get(name))]
        pinned = dict.fromkeys(MODEL_TYPES, 0)
        for entry in models:
            pinned[entry["type"]] += entry["pinned"]
        return web.json_response(
            {
                "status": "ok",
                "server": SERVER_LEMON_DESK,  # how another Lemon Desk tells this one from a Lemonade Server
                "version": __version__,
                "model_loaded": loaded[-1] if loaded else None,
                "all_models_loaded": models,
                "pinned_models": pinned,
                "max_models": parse_caps(router.settings.max_loaded_models).to_json(),
            }
        )

    def _loaded_json(self, engine: EngineSnapshot) -> dict[str, Any]:
        router = self.router
        name = engine.model
        model = router.catalog.models().get(name)
        recipe = engine.backend.recipe
        loaded_with = router.load_options(name)
        args = loaded_with.args if loaded_with is not None else ""
        used = ModelOptions(backend=engine.backend.backend, ctx_size=engine.ctx_size, args=args)
        return {
            "model_name": name,
            "checkpoint": model.checkpoint if model else engine.checkpoint,
            "recipe": recipe,
            "backend": engine.backend.backend,
            "device": engine.device.value if engine.state is EngineState.READY else "",
            "type": model_type(model),
            "pinned": router.pinned(name),
            "last_use": router.last_used(name),
            "is_busy": router.busy(name),
            "is_streaming": router.streaming(name),
            "pid": engine.pid,
            "backend_url": f"{engine.base_url}/v1",
            "launch_command": list(engine.argv),
            "recipe_options": options_json(recipe, used),
        }

    async def stats(self, request: web.Request) -> web.Response:
        totals = self.router.totals
        data: dict[str, Any] = {
            "time_to_first_token": None,
            "tokens_per_second": None,
            "input_tokens": None,
            "output_tokens": None,
            "prompt_tokens": None,
            "cache_tokens": None,
            "prompt_tokens_per_second": None,
            "model_name": None,
            "source": None,
            "dialect": None,
        }
        last = self.router.last_request
        if last is not None:
            t = last.telemetry
            data.update(
                time_to_first_token=t.ttft_s,
                tokens_per_second=t.decode_tps,
                input_tokens=max(t.prompt_tokens - t.cached_tokens, 0),  # processed, not from the cache
                output_tokens=t.completion_tokens,
                prompt_tokens=t.prompt_tokens,
                cache_tokens=t.cached_tokens,
                prompt_tokens_per_second=t.prompt_tps,
                model_name=last.model,
                source=last.source.value,
                dialect=last.dialect.value if last.dialect else None,
            )
        data.update(
            request_count_total=totals.requests,
            input_tokens_total=totals.input_tokens,
            output_tokens_total=totals.output_tokens,
            prompt_tokens_total=totals.prompt_tokens,
            cache_tokens_total=totals.cache_tokens,
        )
        return web.json_response(data)

    async def system_info(self, request: web.Request) -> web.Response:
        info = await self.router.backends.info()
        path = hub_cache_dir(self.router.settings.models_dir)
        storage = await asyncio.to_thread(model_storage, path)
        return web.json_response(system_info_json(info, storage))

    async def system_stats(self, request: web.Request) -> web.Response:
        return web.json_response(await self.router.system_stats())

    # --- a model's options ----------------------------------------------------------------------------

    async def _options_reply(self, name: str, options: ModelOptions | None = None) -> web.Response:
        """Saved (on disk), effective (``options``, else the saved ones, with Auto's backend resolved)
        and default options, each effective and default one a whole ``load`` body."""
        model = find_model(self.router, name)
        saved = self.router.options(name)
        options = options or saved
        info = await self.router.backends.info()
        support = info.recipes.get(model.recipe)
        auto = support.default_backend if support else None

        def resolved(o: ModelOptions) -> dict[str, Any]:
            with_backend = dataclasses.replace(o, backend=o.backend or auto)
            return {"model_name": name, **options_json(model.recipe, with_backend)}

        return web.json_response(
            {
                "model_name": name,
                "recipe": model.recipe,
                "saved": saved_json(model.recipe, saved),
                "effective": resolved(options),
                "defaults": resolved(ModelOptions()),
                "resolved_ctx_size": resolved_ctx_size(model.recipe, options),
            }
        )

    async def get_options(self, request: web.Request) -> web.Response:
        return await self._options_reply(request.match_info["id"])

    async def save_options(self, request: web.Request) -> web.Response:
        name = request.match_info["id"]
        model = find_model(self.router, name)
        body = await self._body(request)
        dry_run = optional(body, "dry_run", "bool")
        saved = self.router.options(name)
        options = requested(model.recipe, body, saved, OPTIONS_FIELDS).apply(saved)
        if not dry_run:
            self.router.save_options(name, options)
        return await self._options_reply(name, options)

    async def reset_options(self, request: web.Request) -> web.Response:
        name = request.match_info["id"]
        find_model(self.router, name)
        self.router.save_options(name, ModelOptions())
        return await self._options_reply(name)
