"""Ollama's ``pull``, ``copy`` and ``create``, as far as they map onto our models; the rest of them a
501 that says what to use instead.

``pull`` goes through the router's one pull (the window's and ``lemon-desk pull``'s): the Hub's
listing is Ollama's manifest, each file a layer. What a name pulls:

    hf.co/ORG/REPO:QUANT     the Hub checkpoint ORG/REPO:QUANT (Ollama's own name for a Hub GGUF;
                             ``huggingface.co/`` too; ``:latest`` or no tag: the repo's default file)
    a model here             its files (the name rule of ``ollama.resolve``: a catalog or user model;
                             one imported from a file here has nothing to pull: ``success`` at once)

Anything else (``llama3.2:1b``, a name of Ollama's own library) is a 404 that says what to pull instead.
Progress comes in Ollama's NDJSON shape: ``pulling manifest``, ``pulling <digest>`` lines with
``digest``, ``total`` and ``completed`` per file, then ``verifying sha256 digest`` (the download
manager checked each file's SHA-256 as it came), ``writing manifest`` and ``success``; ``stream:
false`` gives the last one alone. A failure after the first line is an ``{"error": ...}`` line.

``copy`` makes a user model with the source's checkpoint, recipe, labels and saved options under the
new name (the files are shared, not copied). ``create`` with ``from`` does the same, and keeps the
``parameters`` our model options hold: ``num_ctx`` (the load's context size, within what a load
takes), ``temperature``, ``top_p`` and ``num_predict`` (defaults a request that does not set them
gets; -1 is no limit), each checked as a request's would be (NaN or infinity is no temperature). A
system prompt, a template, other parameters, files, adapters, messages or a quantization cannot be
kept with a model here: a 501 naming them. New names go in Lemonade's ``user.`` namespace
(``ollama.resolve`` finds them without it).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from app.core.errors import LemonDeskError
from app.core.launch import AUTO_CTX_SIZE, ctx_size_problem
from app.core.models import Model
from app.core.names import in_user_namespace, model_name_problem
from app.core.refs import FileSet, RepoFile, parse_ref
from app.store.model_options import ModelOptions
from app.supervisor.api.bodies import C_INT_MAX, optional, parse_object
from app.supervisor.api.errors import NOT_FOUND, ApiError, bad_request, from_app_error
from app.supervisor.api.ollama_chat import NDJSON, ndjson_line
from app.supervisor.api.pulling import followed, pulled

if TYPE_CHECKING:
    from app.supervisor.router import Router

HUB_PREFIXES = ("hf.co/", "huggingface.co/")
NOT_SERVED = {
    "push": "This app publishes no models.",
    "blobs": "Import a GGUF file with `lemon-desk import`, or register a Hub model with POST "
    "/api/v1/models/register.",
}
# What ``create`` can keep: Ollama's parameter, and the model option it becomes.
KEPT_PARAMETERS = {
    "num_ctx": "ctx_size",
    "temperature": "temperature",
    "top_p": "top_p",
    "num_predict": "max_tokens",
}
NO_LIMIT = (-1, -2)  # Ollama's num_predict for "no limit" and "fill the context": the engine's own default
# ``create``'s fields that cannot be kept with a model here, and what to do instead.
NOT_KEPT = {
    "files": "Import a GGUF file with `lemon-desk import`, or create from a model here with 'from'.",
    "adapters": "LoRA adapters are not served.",
    "quantize": "Models are not quantized here: pull the quantization you want (hf.co/ORG/REPO:QUANT).",
    "template": "The engine applies the model's own chat template.",
    "system": "Send the system prompt as the first message of each request.",
    "messages": "Send the conversation with each request.",
    "license": "",
}


def not_served(what: str) -> ApiError:
    return ApiError(501, f"/api/{what} is not served here. {NOT_SERVED[what]}", "not_implemented")


def hub_checkpoint(given: str) -> str | None:
    """The Hub checkpoint ``hf.co/ORG/REPO[:TAG]`` names (a ModelError when it is no reference), else None."""
    prefix = next((p for p in HUB_PREFIXES if given.lower().startswith(p)), None)
    if prefix is None:
        return None
    ref = parse_ref(given[len(prefix) :])
    if ref.variant is None or ref.variant.lower() == "latest":
        return ref.repo_id
    return str(ref)


def _digest(file: RepoFile) -> str:
    return f"sha256:{file.sha256}" if file.sha256 else f"sha1:{file.blob_id or ''}"


def _layer(file: RepoFile, completed: int) -> dict[str, Any]:
    digest = _digest(file)
    # Ollama names a layer by the first 12 hex digits of its digest.
    return {
        "status": f"pulling {digest.partition(':')[2][:12]}",
        "digest": digest,
        "total": file.size,
        "completed": completed,
    }


class OllamaModels:
    """``pull``, ``copy`` and ``create`` over the router; ``resolve`` is the name rule of ``ollama``."""

    def __init__(self, router: Router, resolve: Callable[[Any], Model]) -> None:
        self.router = router
        self.resolve = resolve  # (given) -> Model, or a 404 in Ollama's words

    def add_to(self, app: web.Application) -> None:
        app.router.add_post("/api/pull", self.pull)
        app.router.add_post("/api/copy", self.copy)
        app.router.add_post("/api/create", self.create)
        app.router.add_post("/api/push", self.push)
        app.router.add_route("*", "/api/blobs/{digest}", self.blobs)

    async def push(self, request: web.Request) -> web.Response:
        raise not_served("push")

    async def blobs(self, request: web.Request) -> web.Response:
        raise not_served("blobs")

    # --- pull -----------------------------------------------------------------------------------------

    def to_pull(self, given: Any) -> Model:
        """The model an Ollama name pulls (the module docstring's rule)."""
        if not isinstance(given, str) or not given:
            raise bad_request("'model' must name a model to pull.")
        checkpoint = hub_checkpoint(given)
        if checkpoint is not None:
            return self.router.catalog.resolve(checkpoint)
        try:
            return self.resolve(given)
        except ApiError as err:
            if err.status != 404:
                raise
        raise ApiError(
            404,
            f"'{given}' is not a model Lemon Desk can pull: it downloads from Hugging Face, not from "
            "Ollama's library. Pull a Hub GGUF as hf.co/ORG/REPO:QUANT (for example "
            "hf.co/unsloth/Qwen3-0.6B-GGUF:Q4_0), or a model of `lemon-desk models`.",
            NOT_FOUND,
        )

    async def pull(self, request: web.Request) -> web.StreamResponse:
        body = parse_object(await request.read())
        asked = self.to_pull(body.get("model") or body.get("name"))
        streamed = optional(body, "stream", "bool") is not False
        if asked.repo_id is None:  # a file or folder of this machine's: here already, as Ollama's would be
            done = ndjson_line({"status": "success"})
            return web.Response(body=done, content_type=NDJSON if streamed else "application/json")
        # Asked before the first line: a refusal (no such repo, a gated one) keeps its own status.
        model, files = await self.router.plan_pull(asked)
        if not streamed:
            await pulled(self.router, model, files)
            return web.json_response({"status": "success"})
        response = web.StreamResponse(headers={"Content-Type": NDJSON})
        await response.prepare(request)
        await response.write(ndjson_line({"status": "pulling manifest"}))
        try:
            await self._layers(response, model, files)
        except LemonDeskError as err:
            await response.write(ndjson_line({"error": from_app_error(err).message}))
        else:
            for status in ("verifying sha256 digest", "writing manifest", "success"):
                await response.write(ndjson_line({"status": status}))
        await response.write_eof()
        return response

    async def _layers(self, response: web.StreamResponse, model: Model, files: FileSet) -> None:
        """Each file's progress as one of Ollama's layers; files already here come whole at the end."""
        by_path = {f.path: f for f in files.files}
        reported: set[str] = set()
        progress = followed(self.router, model, files)
        try:
            async for event in progress:
                file = by_path.get(event.file)
                if file is not None:
                    reported.add(file.path)
                    await response.write(ndjson_line(_layer(file, min(event.file_done, file.size))))
        finally:
            await progress.aclose()  # the client went away: the download goes on in the app
        for file in files.files:
            if file.path not in reported:
                await response.write(ndjson_line(_layer(file, file.size)))

    # --- copy and create ------------------------------------------------------------------------------

    def _new_name(self, given: Any, field: str) -> str:
        if not isinstance(given, str) or not given:
            raise bad_request(f"'{field}' must name the new model.")
        name = in_user_namespace(given.removesuffix(":latest"))
        if why := model_name_problem(name):
            raise bad_request(f"'{field}': {why}; a tag other than ':latest' is not kept here.")
        if name in self.router.catalog.models():
            raise bad_request(f"A model named {name} exists already: delete it first, or pick another name.")
        return name

    def _register(self, source: Model, name: str, options: ModelOptions) -> None:
        copied = dataclasses.replace(source, name=name, user=True, suggested=False)
        self.router.register(copied)
        self.router.save_options(name, options)

    async def copy(self, request: web.Request) -> web.Response:
        body = parse_object(await request.read())
        source = self.resolve(body.get("source"))
        name = self._new_name(body.get("destination"), "destination")
        self._register(source, name, self.router.options(source.name))
        return web.Response()

    async def create(self, request: web.Request) -> web.Response:
        body = parse_object(await request.read())
        refused = [f for f in NOT_KEPT if body.get(f) not in (None, "", [], {})]
        if body.get("from") in (None, ""):
            refused = refused or ["files"]
        if refused:
            hints = " ".join(dict.fromkeys(NOT_KEPT[f] for f in refused if NOT_KEPT[f]))
            raise ApiError(
                501,
                f"/api/create cannot keep {', '.join(map(repr, refused))} with a model here. {hints} "
                "What can be kept: 'from' a model here, with 'parameters' "
                f"{', '.join(KEPT_PARAMETERS)}.",
                "not_implemented",
            )
        source = self.resolve(body["from"])
        name = self._new_name(body.get("model") or body.get("name"), "model")
        options = self._options(
            optional(body, "parameters", "object") or {}, self.router.options(source.name)
        )
        self._register(source, name, options)
        if optional(body, "stream", "bool") is False:
            return web.json_response({"status": "success"})
        lines = [{"status": "using existing layer"}, {"status": "writing manifest"}, {"status": "success"}]
        return web.Response(body=b"".join(map(ndjson_line, lines)), content_type=NDJSON)

    @staticmethod
    def _options(parameters: dict[str, Any], options: ModelOptions) -> ModelOptions:
        other = sorted(set(parameters) - set(KEPT_PARAMETERS))
        if other:
            raise ApiError(
                501,
                f"/api/create cannot keep the parameters {', '.join(map(repr, other))} with a model here: "
                f"send them in each request's 'options'. What can be kept: {', '.join(KEPT_PARAMETERS)}.",
                "not_implemented",
            )
        changes = {
            KEPT_PARAMETERS[theirs]: _kept(theirs, value)
            for theirs, value in parameters.items()
            if value is not None
        }
        return dataclasses.replace(options, **changes)


def _kept(theirs: str, value: Any) -> Any:
    """A ``create`` parameter as the model option it becomes, checked as a load or a request would check
    it (a value kept here is sent with every request after): a 400 saying what it may be, else."""
    whole = isinstance(value, int) and not isinstance(value, bool)
    if theirs == "num_ctx":
        if whole and not ctx_size_problem(value):
            return None if value == AUTO_CTX_SIZE else value
        raise bad_request(f"'parameters.num_ctx' {ctx_size_problem(0)}.")
    if theirs == "num_predict":
        if whole and (value in NO_LIMIT or 1 <= value <= C_INT_MAX):
            return None if value in NO_LIMIT else value
        raise bad_request(
            f"'parameters.num_predict' must be a whole number of tokens from 1 to {C_INT_MAX}, "
            "or -1 (no limit)."
        )
    if theirs == "top_p":
        if (whole or isinstance(value, float)) and 0 <= value <= 1:  # NaN is not within
            return value
        raise bad_request("'parameters.top_p' must be a number from 0 to 1.")
    if (whole or isinstance(value, float)) and 0 <= value < math.inf:  # NaN is not within
        return value
    raise bad_request("'parameters.temperature' must be a finite number of at least 0 (0: greedy decoding).")
