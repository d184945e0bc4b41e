"""Ollama's API under ``/api/`` (no version: ``/api/v0/`` and ``/api/v1/`` are Lemonade's), and ``GET /``
and ``HEAD /`` answering "Ollama is running" as Ollama does, since clients probe them.

``chat`` and ``generate`` are codecs over the OpenAI chat path (``OpenAIRoutes.engine_call`` and
``chat_events``: the same routing, loading and telemetry as ``/v1/chat/completions``; their bodies and
replies are translated in ``ollama_chat``), streamed as NDJSON unless ``"stream": false``; ``embed``
and ``embeddings`` go through ``/v1/embeddings`` the same way. ``tags``, ``show``, ``ps`` and ``delete``
are router calls, ``version`` a constant.

Names: Ollama's ``model:tag`` resolves to one of our models by ``resolve``: ``hf.co/ORG/REPO:QUANT``
to the model of that Hub checkpoint (Ollama's own name for a Hub GGUF; ``ollama_models`` pulls it);
else the name as given, else without a ``:latest`` tag, else in Lemonade's ``user.`` namespace, else
the one model whose name matches it ignoring case. ``tags`` lists each model as ``NAME:latest``.
Nothing else is guessed: another tag is a 404 that says to list the models.

A model's saved sampling options (``temperature``, ``top_p``, ``max_tokens``: what ``create`` keeps
from a Modelfile's parameters) are the defaults of a ``chat`` or ``generate`` that does not set them,
as a Modelfile's are in Ollama: a request's ``num_predict`` of -1 is no limit, whatever the default.

``pull``, ``copy`` and ``create`` are ``ollama_models``'s, with ``push`` and ``blobs`` (a 501 that
says what to use instead). Errors take Ollama's shape, ``{"error": "..."}``, with our statuses.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from app.client.adapters import Route
from app.core.models import Model
from app.core.names import in_user_namespace
from app.supervisor.api.bodies import optional, parse_object
from app.supervisor.api.codec import reply
from app.supervisor.api.errors import (
    NOT_FOUND,
    ApiError,
    bad_gateway,
    bad_request,
)
from app.supervisor.api.ollama_chat import NDJSON, Reply, chat_messages, iso, now, sampling, user_content
from app.supervisor.api.ollama_models import OllamaModels, hub_checkpoint
from app.supervisor.api.openai import CREATED, context_length

if TYPE_CHECKING:
    from app.supervisor.api.openai import OpenAIRoutes
    from app.supervisor.router import ModelView

# The Ollama API level served: clients gate features on /api/version (tools, thinking, /api/embed
# arrived by 0.5), so it is the version whose API this module follows, not this app's own.
OLLAMA_VERSION = "0.12.0"
FAR_FUTURE = "2318-11-24T00:00:00Z"  # Ollama's expires_at for a model kept loaded for good
# A model's saved sampling options, each with the request option that overrides it.
SAVED_DEFAULTS = {"temperature": "temperature", "top_p": "top_p", "max_tokens": "num_predict"}


def is_ollama_path(path: str) -> bool:
    return path == "/" or (path.startswith("/api/") and not path.startswith(("/api/v0/", "/api/v1/")))


def error_response(error: ApiError) -> web.Response:
    return web.json_response({"error": error.message}, status=error.status)


def _not_found(name: str) -> ApiError:
    return ApiError(404, f"model '{name}' not found: GET /api/tags lists the models here.", NOT_FOUND)


def _details(model: Model) -> dict[str, Any]:
    return {
        "parent_model": "",
        "format": "gguf" if model.recipe == "llamacpp" else "safetensors",
        "family": "",
        "families": None,
        "parameter_size": "",
        "quantization_level": model.variant or "",
    }


def _digest(model: Model) -> str:
    """A stable id for the model (its name and checkpoint): Ollama's is its manifest's, which we lack."""
    return hashlib.sha256(f"{model.name}\0{model.checkpoint}".encode()).hexdigest()


def _capabilities(model: Model) -> list[str]:
    labels = set(model.labels)
    found = ["embedding"] if "embeddings" in labels else [] if "reranking" in labels else ["completion"]
    if "vision" in labels or model.mmproj:
        found.append("vision")
    if "tool-calling" in labels:
        found.append("tools")
    if "reasoning" in labels:
        found.append("thinking")
    return found


def keep_alive_unloads(keep_alive: Any) -> bool:
    """Ollama's ``keep_alive`` of 0 ("0", "0s", "0m"): unload the model once the reply is done."""
    if isinstance(keep_alive, int | float) and not isinstance(keep_alive, bool):
        return keep_alive == 0
    return isinstance(keep_alive, str) and keep_alive.strip() in ("0", "0s", "0m", "0h")


class OllamaRoutes:
    """Ollama's ``/api/NAME`` routes and ``/``, over the OpenAI routes' chat and embeddings paths."""

    def __init__(self, openai: OpenAIRoutes) -> None:
        self.openai = openai
        self.router = openai.router

    def add_to(self, app: web.Application) -> None:
        app.router.add_get("/", self.running)  # and HEAD
        app.router.add_get("/api/version", self.version)
        app.router.add_get("/api/tags", self.tags)
        app.router.add_get("/api/ps", self.ps)
        app.router.add_post("/api/show", self.show)
        app.router.add_post("/api/chat", self.chat)
        app.router.add_post("/api/generate", self.generate)
        app.router.add_post("/api/embed", self.embed)
        app.router.add_post("/api/embeddings", self.embeddings)
        app.router.add_delete("/api/delete", self.delete)
        OllamaModels(self.router, self.resolve).add_to(app)

    def resolve(self, given: Any) -> Model:
        """Our model for an Ollama name (the rule is the module's docstring's)."""
        if not isinstance(given, str) or not given:
            raise bad_request("'model' must name a model.")
        models = self.router.catalog.models()
        checkpoint = hub_checkpoint(given)
        if checkpoint is not None:
            found = [m for m in models.values() if m.checkpoint.lower() == checkpoint.lower()]
            if found:
                return found[0]
            raise _not_found(given)
        base = given.removesuffix(":latest")
        for name in (given, base, in_user_namespace(base)):
            if name in models:
                return models[name]
        same = [m for n, m in models.items() if n.lower() == base.lower()]
        if len(same) == 1:
            return same[0]
        raise _not_found(given)

    async def _body(self, request: web.Request) -> dict[str, Any]:
        return parse_object(await request.read())

    # --- state ----------------------------------------------------------------------------------------

    async def running(self, request: web.Request) -> web.Response:
        return web.Response(text="Ollama is running")

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": OLLAMA_VERSION})

    async def tags(self, request: web.Request) -> web.Response:
        views = await asyncio.to_thread(self.router.statuses)
        return web.json_response({"models": [self._tag(v) for v in views if v.on_disk]})

    def _tag(self, view: ModelView) -> dict[str, Any]:
        model = view.model
        return {
            "name": f"{model.name}:latest",
            "model": f"{model.name}:latest",
            "modified_at": iso(CREATED),
            "size": view.size_bytes,
            "digest": _digest(model),
            "details": _details(model),
        }

    async def ps(self, request: web.Request) -> web.Response:
        router = self.router
        minutes = router.settings.idle_unload_minutes
        out = []
        for name in router.loaded():
            view = await asyncio.to_thread(router.status, name)
            used = router.last_used(name)
            keeps = minutes <= 0 or router.pinned(name) or used is None
            out.append(
                {
                    **self._tag(view),
                    "expires_at": FAR_FUTURE if keeps else iso((used or 0) + minutes * 60),
                    "size_vram": sum(v for k, v in view.memory.items() if k.lower() != "cpu"),
                    "context_length": engine.ctx_size if (engine := router.engines.get(name)) else None,
                }
            )
        return web.json_response({"models": out})

    async def show(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        model = self.resolve(body.get("model") or body.get("name"))
        context = context_length(self.router, model)
        info: dict[str, Any] = {"general.architecture": "", "general.basename": model.name}
        if context is not None:
            info["general.context_length"] = context
        return web.json_response(
            {
                "license": "",
                "modelfile": f"# Served by Lemon Desk\nFROM {model.checkpoint}\n",
                "parameters": "",
                "template": "",  # the engine applies the model's own chat template
                "details": _details(model),
                "model_info": info,
                "capabilities": _capabilities(model),
                "modified_at": iso(CREATED),
            }
        )

    async def delete(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        model = self.resolve(body.get("model") or body.get("name"))
        await self.router.delete(model.name)
        return web.Response()

    # --- generation -----------------------------------------------------------------------------------

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        model = self.resolve(body.get("model"))
        messages = chat_messages(body.get("messages"))
        if not messages:
            return await self._load_or_unload(body, model, chat=True)
        return await self._generate(request, body, model, {"messages": messages}, as_chat=True)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        model = self.resolve(body.get("model"))
        for field in ("suffix", "template", "raw", "context"):
            if body.get(field) not in (None, "", False, []):
                raise ApiError(
                    501,
                    f"'{field}' is not served: the engine applies the model's chat template to the prompt.",
                    "not_implemented",
                )
        prompt = optional(body, "prompt", "str") or ""
        system = optional(body, "system", "str")
        if not prompt and body.get("images") is None:
            return await self._load_or_unload(body, model, chat=False)
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": user_content(prompt, body.get("images"), "images")})
        return await self._generate(request, body, model, {"messages": messages}, as_chat=False)

    async def _load_or_unload(self, body: dict[str, Any], model: Model, *, chat: bool) -> web.Response:
        """Ollama's way to load a model (a request with nothing to answer) or to unload one (the same
        with ``keep_alive`` 0)."""
        if keep_alive_unloads(body.get("keep_alive")):
            if model.name in self.router.engines:
                await self.router.unload(model.name)
            reason = "unload"
        else:
            await self.router.ensure_loaded(model.name)
            reason = "load"
        data: dict[str, Any] = {"model": body["model"], "created_at": now()}
        data.update({"message": {"role": "assistant", "content": ""}} if chat else {"response": ""})
        return web.json_response({**data, "done": True, "done_reason": reason})

    async def _generate(
        self, request: web.Request, body: dict[str, Any], model: Model, chat: dict[str, Any], *, as_chat: bool
    ) -> web.StreamResponse:
        chat["model"] = model.name
        stops = sampling(body, chat)
        saved = self.router.options(model.name)
        named = optional(body, "options", "object") or {}
        for field, theirs in SAVED_DEFAULTS.items():  # the model's defaults (``create``'s)
            if named.get(theirs) is None and getattr(saved, field) is not None:
                chat[field] = getattr(saved, field)
        chat.update(stream=True, stream_options={"include_usage": True})
        built = Reply(str(body["model"]), as_chat, time.perf_counter())
        headers = {"Content-Type": NDJSON} if optional(body, "stream", "bool") is not False else None
        end = await reply(self.openai, request, chat, stops, built, headers)
        response = end if isinstance(end, web.StreamResponse) else web.json_response(built.whole(end))
        if keep_alive_unloads(body.get("keep_alive")) and not self.router.pinned(model.name):
            await self.router.unload(model.name)
        return response

    # --- embeddings -----------------------------------------------------------------------------------

    async def embed(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        model = self.resolve(body.get("model"))
        started = time.perf_counter()
        data, usage = await self._embeddings(model, body.get("input"), body.get("dimensions"))
        return web.json_response(
            {
                "model": body["model"],
                "embeddings": data,
                "total_duration": int((time.perf_counter() - started) * 1e9),
                "load_duration": 0,
                "prompt_eval_count": usage,
            }
        )

    async def embeddings(self, request: web.Request) -> web.Response:
        """The older route: one ``prompt``, one ``embedding``."""
        body = await self._body(request)
        model = self.resolve(body.get("model"))
        prompt = optional(body, "prompt", "str")
        if not prompt:
            return web.json_response({"embedding": []})
        data, _ = await self._embeddings(model, prompt, None)
        return web.json_response({"embedding": data[0]})

    async def _embeddings(self, model: Model, given: Any, dimensions: Any) -> tuple[list[Any], int]:
        """The engine's embeddings of ``given`` (a string or a list of them), and the tokens they took."""
        body: dict[str, Any] = {"model": model.name, "input": given}
        if dimensions is not None:
            body["dimensions"] = dimensions
        async with self.openai.engine_call(body, Route.EMBEDDINGS, "embeddings") as call:
            raw = await self.openai.read_whole(call)
        try:
            payload = json.loads(raw)
            data = [item["embedding"] for item in sorted(payload["data"], key=lambda d: d["index"])]
        except (ValueError, KeyError, TypeError, RecursionError):
            raise bad_gateway(f"The engine of {model.name} sent embeddings that cannot be read.") from None
        usage = payload.get("usage") if isinstance(payload.get("usage"), dict) else {}
        tokens = usage.get("prompt_tokens")
        return data, tokens if isinstance(tokens, int) else 0
