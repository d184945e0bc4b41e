"""OpenAI's routes: models, chat/completions, completions, embeddings, reranking, responses.

A generation request is checked, routed by its ``model`` to that model's engine (loaded on demand under
the router's policy; ``@NAME/MODEL`` to its remote) and sent on; the engine's SSE bytes are passed back
unparsed, a frame's worth at a time after the first token (``app.client.pacing``: one read and one
write a frame, not one a token), so the API adds next to nothing per token. ``_Watch`` only looks for
the first token and for the last events (``timings``, ``usage``) to feed the router's telemetry. A client that
goes away cancels the handler (mid-frame too), which closes the stream to the engine, which stops
generating.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import aiohttp
from aiohttp import web

from app.client.adapters import IMAGE_PARTS, Route
from app.client.capped import read_upto
from app.client.pacing import OPENAI_SSE, has_text_delta
from app.client.splice import EngineAnswer, Workers, splice
from app.core.engine_state import EngineState
from app.core.errors import LemonDeskError, RequestError
from app.core.models import Model
from app.core.reasoning import ReasoningFormat, reasoning_format
from app.core.remotes import is_remote_model, parse_remote_model
from app.core.telemetry import ClientTimes, Telemetry, telemetry_from
from app.core.units import GB
from app.supervisor.api.bodies import check_generation, parse_object, required_str
from app.supervisor.api.chat_events import ChatEvent, ChatReader
from app.supervisor.api.errors import (
    ApiError,
    bad_gateway,
    bad_request,
    from_app_error,
    model_not_found,
    server_failed,
    sse_error_event,
)
from app.supervisor.api.options import resolved_ctx_size, saved_json
from app.supervisor.resume import prompt_key

if TYPE_CHECKING:
    from app.client.chat import ChatClient
    from app.supervisor.remote_views import RemoteModelView
    from app.supervisor.router import ModelView, Router

log = logging.getLogger(__name__)

CREATED = 1_700_000_000  # OpenAI's "created" of a model with no files here (a remote's, one not downloaded)
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
PENDING_LIMIT = 1 << 20  # an event longer than this is not one we read figures from
# A whole (not streamed) reply is held here before it is passed on. Embeddings of many long inputs run to
# tens of MB (each float is some 20 bytes of JSON); a reply past this is no engine's, and is refused.
MAX_WHOLE_REPLY_BYTES = 256 << 20
SLOTTED = (Route.CHAT, Route.COMPLETIONS)  # the routes a llama-server slot (its KV cache) serves


def find_model(router: Router, name: str) -> Model:
    """A local model by name (a remote one is managed on its remote: refused here with that said)."""
    if is_remote_model(name):
        raise bad_request(
            f"{name} is a model of a remote server: delete it or change its options there.", "remote_model"
        )
    model = router.catalog.models().get(name)
    if model is None:
        raise model_not_found(name)
    return model


def context_length(router: Router, model: Model) -> int | None:
    """Tokens one request can hold: the running engine's context, else the one a load would use."""
    engine = router.engines.get(model.name)
    if engine is not None and engine.state is EngineState.READY:
        return engine.ctx_size
    return resolved_ctx_size(model.recipe, router.options(model.name))


def created_time(view: ModelView) -> int:
    """When a model came to this machine, for OpenAI's ``created``: the time its main file was made in
    the models' folder (a download's link to its blob, an imported file's own). Reads the disk."""
    local = view.files.local
    try:
        return int(os.lstat(local.main).st_mtime) if local is not None else CREATED
    except OSError:
        return CREATED


def model_json(router: Router, view: ModelView, created: int) -> dict[str, Any]:
    """A model as OpenAI lists it, with Lemonade's fields; a figure not known here is left out."""
    model = view.model
    data: dict[str, Any] = {
        "id": model.name,
        "object": "model",
        "created": created,
        "owned_by": "lemonade",  # what Lemonade Server's clients read here
        "checkpoint": model.checkpoint,
        "recipe": model.recipe,
    }
    if view.size_bytes:
        data["size"] = round(view.size_bytes / GB, 3)
    if view.context_window:
        data["max_context_window"] = view.context_window
    if (context := context_length(router, model)) is not None:
        data["context_length"] = context
    data.update(
        downloaded=view.on_disk,
        suggested=model.suggested,
        labels=list(model.labels),
        status=view.status.status.value,
    )
    return data


def check_remote(router: Router, name: str) -> None:
    """``@NAME/MODEL`` names a remote this app knows (the model itself is the remote's to know)."""
    try:
        remote = parse_remote_model(name).remote
    except LemonDeskError:
        raise model_not_found(name) from None
    if remote not in router.remotes.names():
        raise model_not_found(name)


def remote_model_json(view: RemoteModelView) -> dict[str, Any]:
    info = view.info
    return {
        "id": view.name,
        "object": "model",
        "created": CREATED,
        "owned_by": "lemon-desk",
        "checkpoint": info.checkpoint,
        "recipe": info.recipe,
        "size": round(info.size_bytes / GB, 3),
        "downloaded": True,
        "suggested": False,
        "labels": list(info.labels),
        "status": view.status.value,
        "remote": view.remote.name,
    }


class _Watch:
    """Figures from a passing stream without parsing it: when the first token went by, and the
    ``timings``/``usage`` of the events that carry them (only those are parsed)."""

    def __init__(self) -> None:
        self.sent = time.perf_counter()
        self.first: float | None = None
        self.end: float | None = None  # a whole reply's arrival (a stream ends when its figures are read)
        self.events = 0
        self.done = False  # the engine sent [DONE]
        self.timings: dict[str, Any] | None = None
        self.usage: dict[str, Any] | None = None
        self._pending = b""

    def feed(self, chunk: bytes) -> None:
        if self.first is None and has_text_delta(chunk):
            self.first = time.perf_counter()
        data = self._pending + chunk if self._pending else chunk
        end = data.rfind(b"\n\n")
        if end < 0:
            self._pending = data if len(data) < PENDING_LIMIT else b""
            return
        complete, self._pending = data[:end], data[end + 2 :]
        self.events += complete.count(b"data:")
        self.done = self.done or complete.endswith(b"data: [DONE]")
        if b'"timings"' in complete or b'"usage"' in complete:
            for event in complete.split(b"\n\n"):
                if b'"timings"' in event or b'"usage"' in event:
                    self.whole(event.partition(b"data:")[2])

    def read(self, reader: ChatReader, events: list[ChatEvent]) -> None:
        """``feed``, for a stream that ``reader`` reads (the other dialects'): its figures, not the
        bytes scanned again; ``events`` are those of its last read."""
        if self.first is None and events:
            self.first = time.perf_counter()
        self.events, self.done = reader.events, reader.done
        self.timings, self.usage = reader.timings or self.timings, reader.usage or self.usage

    def passed(self, chunk: bytes) -> bytes:
        """``feed``, for a stream passed on as it is (``app.client.splice``)."""
        self.feed(chunk)
        return chunk

    def whole(self, raw: bytes) -> None:
        """Read the figures from one JSON payload (an event's, or a whole reply's)."""
        try:
            payload = json.loads(raw)
        except (ValueError, RecursionError):
            return
        if isinstance(payload, dict):
            reply = payload.get("response")  # a Responses API event's (response.completed: with its usage)
            timings, usage = payload.get("timings"), payload.get("usage")
            if usage is None and isinstance(reply, dict):
                usage = reply.get("usage")
            self.timings = timings if isinstance(timings, dict) else self.timings
            self.usage = usage if isinstance(usage, dict) else self.usage

    def telemetry(self) -> Telemetry:
        end = self.end if self.end is not None else time.perf_counter()
        first = self.first if self.first is not None else (end if self.events else None)
        return telemetry_from(
            ClientTimes(self.sent, first, end, max(self.events - 2, 0)), self.timings, self.usage
        )


@dataclass(frozen=True)
class EngineCall:
    """One request on its way through ``OpenAIRoutes.engine_call``."""

    name: str  # the model
    streamed: bool  # the body asked for a stream
    stream: AsyncGenerator[bytes, None]  # the engine's bytes (first b"": the engine accepted the request)
    watch: _Watch  # its figures, for the telemetry
    spliced: EngineAnswer | None = None  # instead of ``stream``: its answer, passed on by a thread


class OpenAIRoutes:
    """The OpenAI-compatible routes, and ``engine_call``: every dialect's one path to an engine."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self._relay: aiohttp.ClientSession | None = None
        self._reconnects: set[asyncio.Task[None]] = set()
        self._closes_connections: set[str] = set()  # engines (base URLs) that keep none: not reconnected
        self.relays = Workers("api-relay")  # the threads that pass spliced streams on

    def relay(self) -> aiohttp.ClientSession:
        """The one pool of connections to the engines and remotes the API passes requests on to (made
        on first use, on the loop; closed with the app: ``close``)."""
        if self._relay is None:
            # Idle connections go before llama-server's own 5 s keep-alive ends, so a request seldom goes
            # out on a connection the engine is closing at that moment (one that does is sent again).
            # No limit: the engine's slots decide what runs and what queues.
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0)
            self._relay = aiohttp.ClientSession(connector=connector)
        return self._relay

    async def close(self, _app: web.Application) -> None:
        self.relays.close()
        for task in list(self._reconnects):
            task.cancel()
        await asyncio.gather(*self._reconnects, return_exceptions=True)
        if self._relay is not None:
            await self._relay.close()
            self._relay = None

    def add_to(self, app: web.Application, prefix: str) -> None:
        app.router.add_get(f"{prefix}/models", self.list_models)
        app.router.add_get(f"{prefix}/models/{{id}}", self.get_model)
        app.router.add_get(f"{prefix}/models/{{id:@[^/]+/.+}}", self.get_model)  # @REMOTE/MODEL
        app.router.add_post(f"{prefix}/chat/completions", self.chat_completions)
        app.router.add_post(f"{prefix}/completions", self.completions)
        app.router.add_post(f"{prefix}/responses", self.responses)
        app.router.add_post(f"{prefix}/embeddings", self.embeddings)
        for path in ("rerank", "reranking", "reranker"):  # Lemonade's route and its two aliases
            app.router.add_post(f"{prefix}/{path}", self.reranking)

    # --- models ---------------------------------------------------------------------------------------

    async def list_models(self, request: web.Request) -> web.Response:
        show_all = request.query.get("show_all", "").lower() in ("1", "true", "yes")
        views = [v for v in await self._views() if show_all or v.on_disk]
        times = await asyncio.to_thread(lambda: [created_time(v) for v in views])
        data = [model_json(self.router, v, t) for v, t in zip(views, times, strict=True)]
        data += [remote_model_json(v) for v in self.router.remotes.views()]
        return web.json_response({"object": "list", "data": data})

    async def get_model(self, request: web.Request) -> web.Response:
        name = request.match_info["id"]
        if is_remote_model(name):
            remote = self.router.remotes.model(name)  # None unless its remote listed it
            if remote is None:
                raise model_not_found(name)
            return web.json_response(remote_model_json(remote))
        model = find_model(self.router, name)
        view = await asyncio.to_thread(self.router.status, name)
        data = model_json(self.router, view, await asyncio.to_thread(created_time, view))
        data["recipe_options"] = saved_json(model.recipe, self.router.options(name))
        return web.json_response(data)

    async def _views(self) -> list[ModelView]:
        return await asyncio.to_thread(self.router.statuses)  # reads the cache: not on the loop

    # --- generation -----------------------------------------------------------------------------------

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, Route.CHAT, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, Route.COMPLETIONS, "completions")

    async def responses(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, Route.RESPONSES, "responses")

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, Route.EMBEDDINGS, "embeddings")

    async def reranking(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, Route.RERANK, "reranking")

    async def _generate(self, request: web.Request, route: Route, kind: str) -> web.StreamResponse:
        async with self.engine_call(parse_object(await request.read()), route, kind, splice=True) as call:
            if call.streamed:
                ends_with_done = route in (Route.CHAT, Route.COMPLETIONS)
                return await self._stream(request, call, ends_with_done)
            return web.Response(body=await self.read_whole(call), content_type="application/json")

    @contextlib.asynccontextmanager
    async def engine_call(
        self, body: dict[str, Any], route: Route, kind: str, splice: bool = False
    ) -> AsyncIterator[EngineCall]:
        """The one path of every dialect's generation: the body's model checked and routed to its engine
        (loaded on demand under the router's policy; ``@NAME/MODEL`` to its remote), the body checked
        and sent, and the reply's figures fed to the router's telemetry when it ends. ``splice``: the
        caller passes the stream on as it is, so one over plain HTTP may be ``spliced`` (``_stream``)."""
        name = required_str(body, "model")
        reasoning = None
        if is_remote_model(name):
            check_remote(self.router, name)  # the remote checks the model's kind itself
            if kind == "chat":  # not named: the remote places it, as its own model option says
                reasoning = self._named_reasoning(body)
        else:
            model = find_model(self.router, name)
            self._check_labels(model, kind)
            if kind == "chat":
                reasoning = self._reasoning(body, name)
                await self._check_abilities(model, body)
        check_generation(body, kind)
        # The engine serves one model; mlx-lm would take a "model" as one to go and load. A remote's
        # client names the remote's own model id.
        body.pop("model")
        watch = _Watch()
        answered = False
        try:
            # A slot of its own (never a chat's unsaved) unless the client chose one.
            slotted = route in SLOTTED and "id_slot" not in body
            held: contextlib.AbstractAsyncContextManager[int | None]
            if slotted:
                prompt = prompt_key(body.get("messages"), body.get("prompt"), body.get("tools"))
                held = self.router.request_slot(name, prompt)
            else:
                held = contextlib.nullcontext(None)
            async with self.router.client(name) as client, held as slot:
                if slot is not None:
                    body = {**body, "id_slot": slot}
                # A stream is read once a frame after its first token (``app.client.pacing``): not a
                # wake per token, in every dialect (the others read this stream through chat_events).
                pacing = OPENAI_SSE if body.get("stream") else None
                remote = is_remote_model(name)
                spliced = await client.open_spliced(route, body, reasoning) if splice else None
                forward = client.forward_stream(route, body, self.relay(), pacing, reasoning=reasoning)
                stream = cast(AsyncGenerator[bytes, None], forward)
                async with contextlib.aclosing(stream):
                    try:
                        yield EngineCall(name, bool(body.get("stream")), stream, watch, spliced)
                    finally:
                        if spliced is not None:
                            spliced.close()
                    if body.get("stream") and not remote and spliced is None:
                        self._reconnect(client)  # the engine closed the connection: open the next
            answered = True
        finally:
            # A client may hang up as soon as it has [DONE], before the engine's body has ended here
            # (aiohttp then cancels this handler): the reply was whole all the same, and counts.
            if answered or watch.done:
                self._finished(name, watch)

    async def chat_events(
        self, call: EngineCall, reader: ChatReader
    ) -> AsyncIterator[list[ChatEvent] | None]:
        """A streamed chat call read into the internal events (``app.supervisor.api.chat_events``) for
        the other dialects: first None, once the engine has accepted the request (a dialect can answer
        its headers then), then the events of each read of the engine's stream together (a frame's
        worth: the dialect writes them in one write), until ``reader.finished``; a stream that ends
        without finishing raises the reason (the engine's crash, when it crashed)."""
        await anext(call.stream, b"")
        yield None
        with self.router.reply_streaming(call.name):
            async for chunk in call.stream:
                events = reader.feed(chunk)
                call.watch.read(reader, events)
                if events:
                    yield events
                if reader.finished is not None:
                    return  # at a stop sequence: the caller's closing the stream stops the engine
            if events := reader.end():
                yield events
        if reader.finished is None:
            raise await self.cut_short(call.name)

    def _reconnect(self, client: ChatClient) -> None:
        if client.base_url in self._closes_connections:
            return
        task = asyncio.ensure_future(self._reconnect_to(client))
        self._reconnects.add(task)
        task.add_done_callback(self._reconnects.discard)

    async def _reconnect_to(self, client: ChatClient) -> None:
        if not await client.reconnect(self.relay()):
            self._closes_connections.add(client.base_url)

    def _reasoning(self, body: dict[str, Any], name: str) -> ReasoningFormat:
        """Where a local model's reasoning goes: the request's ``reasoning_format``, else the model's
        saved option, else its own field (``reasoning_content``)."""
        named = self._named_reasoning(body)
        saved = reasoning_format(self.router.options(name).reasoning_format)
        return named or saved or ReasoningFormat.SEPARATE

    @staticmethod
    def _named_reasoning(body: dict[str, Any]) -> ReasoningFormat | None:
        """The request's ``reasoning_format`` (taken out of the body: the engine's client asks for it in
        the engine's own words), None when it names none."""
        given = body.pop("reasoning_format", None)
        if given is None:
            return None
        fmt = reasoning_format(given) if isinstance(given, str) else None
        if fmt is None:
            names = ", ".join(f.value for f in ReasoningFormat)
            raise bad_request(f"'reasoning_format' must be one of {names}.", "invalid_reasoning_format")
        return fmt

    async def _check_abilities(self, model: Model, body: dict[str, Any]) -> None:
        """Refuse, before the engine is touched, what the model's engine cannot do: structured output
        on MLX (neither lemon-mlx nor mlx-lm reads ``response_format``), images without a projector."""
        response_format = body.get("response_format")
        kind = response_format.get("type") if isinstance(response_format, dict) else None
        if model.recipe != "llamacpp" and kind not in (None, "text"):
            raise bad_request(
                f"{model.name} runs on {model.recipe}, which cannot hold a reply to a schema: "
                f"'response_format' {kind!r} is served for llama.cpp models only.",
                "unsupported_response_format",
            )
        if _has_image(body) and await asyncio.to_thread(self.router.projector, model) is None:
            raise bad_request(
                f"{model.name} cannot read images: it has no vision projector here. Send text only, or "
                "use a vision model (a llama.cpp model with its mmproj file).",
                "image_not_supported",
            )

    def _check_labels(self, model: Model, kind: str) -> None:
        special = {"embeddings", "reranking"} & set(model.labels)
        if kind in ("embeddings", "reranking") and kind not in special:
            raise bad_request(
                f"{model.name} is not labelled '{kind}': it cannot answer /{kind}.", "wrong_model_type"
            )
        if kind not in ("embeddings", "reranking") and special:
            label = next(iter(special))
            raise bad_request(
                f"{model.name} is a {label} model: it answers /{label} only.", "wrong_model_type"
            )

    async def read_whole(self, call: EngineCall) -> bytes:
        """A whole (not streamed) reply, its figures fed to the telemetry; refused past the cap."""
        raw = await read_upto(call.stream, MAX_WHOLE_REPLY_BYTES)
        if len(raw) > MAX_WHOLE_REPLY_BYTES:
            raise bad_gateway(
                f"The reply of {call.name} went on past {MAX_WHOLE_REPLY_BYTES >> 20} MiB and was not passed "
                "on. Ask for less at a time (fewer inputs, a shorter reply), or stream the reply.",
                "reply_too_large",
            )
        # Its first token and its end arrive together: no decode speed is measured here, as in the chat's
        # whole replies (the engine's timings give it, when it sends them).
        watch = call.watch
        watch.end = time.perf_counter()
        watch.first = watch.first or watch.end
        watch.whole(raw)
        return raw

    async def _stream(
        self, request: web.Request, call: EngineCall, ends_with_done: bool
    ) -> web.StreamResponse:
        # The engine's answer (its 200, as b"") comes before ours starts, so an engine's refusal keeps its
        # own status; ours goes out while the engine reads the prompt, not with the first token.
        name, stream, watch, spliced = call.name, call.stream, call.watch, call.spliced
        first = b"" if spliced is not None else await anext(stream, b"")
        response = web.StreamResponse(headers=SSE_HEADERS)
        writer = await response.prepare(request)
        try:
            with self.router.reply_streaming(name):
                if spliced is not None and writer is not None:
                    # From a thread, one read and one write a frame: the loop is not woken per frame.
                    if not await splice(spliced, response, writer, OPENAI_SSE, self.relays, watch.passed):
                        return response  # the client went away
                else:
                    if first:
                        watch.feed(first)
                        await response.write(first)
                    async for chunk in stream:
                        watch.feed(chunk)
                        await response.write(chunk)
            if ends_with_done and not watch.done:
                await response.write(sse_error_event(from_app_error(await self.cut_short(name))))
        except LemonDeskError as err:
            await response.write(sse_error_event(from_app_error(err)))
        except ApiError as err:
            await response.write(sse_error_event(err))
        except Exception:
            # Our headers are out: an error response now would land inside the stream's body.
            log.exception("the local API failed while passing on a stream of %s", name)
            await response.write(sse_error_event(server_failed()))
        await response.write_eof()
        return response

    async def cut_short(self, name: str) -> LemonDeskError:
        """Why a stream ended without [DONE]: the engine's crash when it crashed, said as such."""
        error = RequestError("The engine ended the reply before finishing it.")
        return await self.router.engines.explain(name, error)

    def _finished(self, name: str, watch: _Watch) -> None:
        from app.supervisor.api.dialects import asked_in
        from app.supervisor.router import RequestSource

        if watch.first is not None or watch.usage is not None:
            self.router.request_finished(name, watch.telemetry(), RequestSource.API, asked_in.get())


def _has_image(body: dict[str, Any]) -> bool:
    """A chat body with an image part in any message."""
    messages = body.get("messages")
    return isinstance(messages, list) and any(
        isinstance(part, dict) and part.get("type") in IMAGE_PARTS
        for message in messages
        if isinstance(message, dict) and isinstance(message.get("content"), list)
        for part in message["content"]
    )
