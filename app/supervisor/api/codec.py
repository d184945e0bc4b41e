"""What the Anthropic and Ollama dialects share: the OpenAI pieces their requests become (an image part,
a function call), one call of the OpenAI chat path read as internal events (``chat_events``), written
out by the dialect's ``Codec`` as a stream or gathered for a whole reply, and a tool call's arguments
read back as the object both dialects give.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any, Protocol, cast

from aiohttp import web

from app.client.adapters import Route
from app.client.pacing import OPENAI_SSE
from app.client.splice import splice
from app.core.errors import LemonDeskError
from app.core.reasoning import ReasoningFormat
from app.supervisor.api.chat_events import ChatEvent, ChatReader, Finished
from app.supervisor.api.errors import ApiError, bad_gateway, from_app_error, server_failed

if TYPE_CHECKING:
    from aiohttp.abc import AbstractStreamWriter

    from app.supervisor.api.openai import EngineCall, OpenAIRoutes

log = logging.getLogger(__name__)


def image_part(url: str) -> dict[str, Any]:
    """An OpenAI content part for an image at ``url`` (a ``data:`` URL for inline bytes)."""
    return {"type": "image_url", "image_url": {"url": url}}


def function_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """An earlier turn's tool call as OpenAI's ``tool_calls`` entry (``arguments``: JSON text)."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def tool_arguments(raw: str, name: str) -> dict[str, Any]:
    """A tool call's streamed arguments, joined, as the object Anthropic's ``input`` and Ollama's
    ``arguments`` are; arguments that are no JSON object are the engine's failure."""
    try:
        value = json.loads(raw) if raw.strip() else {}
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, dict):
        raise bad_gateway(f"The model called the tool {name!r} with arguments that are not a JSON object.")
    return value


class Codec(Protocol):
    """A dialect's reply: what it streams for each event, or gathers into its whole reply."""

    def start(self) -> bytes:
        """What a stream begins with, once the engine has accepted the request."""
        ...

    def feed(self, events: list[ChatEvent]) -> bytes:
        """Take the events of one read of the engine's stream; what to stream for them (b"": nothing
        yet)."""
        ...

    def finish(self, end: Finished) -> bytes:
        """What a stream ends with."""
        ...

    def error(self, error: ApiError) -> bytes:
        """A failure after the stream began, in the dialect's words."""
        ...


async def reply(
    openai: OpenAIRoutes,
    request: web.Request,
    chat: dict[str, Any],
    stops: list[str],
    codec: Codec,
    headers: dict[str, str] | None,
) -> Finished | web.StreamResponse:
    """Send ``chat`` (an OpenAI chat body, streamed) through the one chat path. With ``headers`` the
    reply is streamed through ``codec`` and the response given; without, the events are fed to
    ``codec`` and the end given, for the dialect to build its whole reply from."""
    # The dialect has a place of its own for the reasoning (a thinking block): the engine's (or the
    # remote's) comes apart from the text, whatever a model's option says for OpenAI's clients.
    chat["reasoning_format"] = ReasoningFormat.SEPARATE.value
    model = openai.router.catalog.models().get(chat["model"])
    if stops and model is not None and model.recipe == "llamacpp":
        # A reply cut at a stop sequence ends before the engine's usage: llama-server's figures come
        # with every token instead (see chat_events).
        chat["timings_per_token"] = True
    async with openai.engine_call(chat, Route.CHAT, "chat", splice=headers is not None) as call:
        reader = ChatReader(stops)
        if call.spliced is not None and headers is not None:
            return await _stream(request, headers, codec, _Spliced(openai, call, reader, codec), reader)
        events = cast(AsyncGenerator[list[ChatEvent] | None, None], openai.chat_events(call, reader))
        async with contextlib.aclosing(events):
            if headers is not None:
                return await _stream(request, headers, codec, _Relayed(events, codec), reader)
            async for batch in events:
                if batch:
                    codec.feed(batch)
    assert reader.finished is not None  # chat_events raises when a reply does not finish
    return reader.finished


class _Body(Protocol):
    """How a streamed reply's body goes out, once its start is written."""

    async def accepted(self) -> None:
        """Until the engine has accepted the request (a refusal before this keeps its own status)."""
        ...

    async def write(self, response: web.StreamResponse, writer: AbstractStreamWriter) -> bool:
        """The reply's events, written; False when the client went away."""
        ...


class _Relayed:
    """Read on the loop (``OpenAIRoutes.chat_events``), one write for each read of the engine's stream
    (a frame's worth after the first token), not one per event: the write, not the encoding, is what
    wakes the loop and the client."""

    def __init__(self, events: AsyncGenerator[list[ChatEvent] | None, None], codec: Codec) -> None:
        self._events, self._codec = events, codec

    async def accepted(self) -> None:
        await anext(self._events)

    async def write(self, response: web.StreamResponse, writer: AbstractStreamWriter) -> bool:
        async for batch in self._events:
            if batch and (data := self._codec.feed(batch)):
                await response.write(data)
        return True


class _Spliced:
    """Passed on from a thread (``app.client.splice``): each read of the engine's stream read into
    events and written in the dialect's words there, until the reply finishes (a stop sequence: the
    engine's connection closes, which stops it)."""

    def __init__(self, openai: OpenAIRoutes, call: EngineCall, reader: ChatReader, codec: Codec) -> None:
        self._openai, self._call, self._reader, self._codec = openai, call, reader, codec

    async def accepted(self) -> None:
        pass  # its answer's head is in

    def _translate(self, chunk: bytes) -> bytes:
        events = self._reader.feed(chunk)
        self._call.watch.read(self._reader, events)
        return self._codec.feed(events)

    def _finished(self) -> bool:
        return self._reader.finished is not None

    async def write(self, response: web.StreamResponse, writer: AbstractStreamWriter) -> bool:
        call, reader = self._call, self._reader
        assert call.spliced is not None
        with self._openai.router.reply_streaming(call.name):
            relays, translate, finished = self._openai.relays, self._translate, self._finished
            if not await splice(call.spliced, response, writer, OPENAI_SSE, relays, translate, finished):
                return False
        if reader.finished is None and (tail := self._codec.feed(reader.end())):
            await response.write(tail)
        if reader.finished is None:
            raise await self._openai.cut_short(call.name)
        return True


async def _stream(
    request: web.Request, headers: dict[str, str], codec: Codec, body: _Body, reader: ChatReader
) -> web.StreamResponse:
    await body.accepted()
    response = web.StreamResponse(headers=headers)
    writer = await response.prepare(request)
    assert writer is not None
    try:
        await response.write(codec.start())
        if not await body.write(response, writer):
            return response  # the client went away
        assert reader.finished is not None
        await response.write(codec.finish(reader.finished))
    except LemonDeskError as err:
        await response.write(codec.error(from_app_error(err)))
    except ApiError as err:
        await response.write(codec.error(err))
    except Exception:
        # Our headers are out: an error response now would land inside the stream's body.
        log.exception("the local API failed while streaming a reply of %s", request.path)
        await response.write(codec.error(server_failed()))
    await response.write_eof()
    return response
