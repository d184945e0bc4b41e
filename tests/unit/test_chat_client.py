"""The chat client against a scripted loopback SSE server (a stand-in engine that misbehaves on cue).

The real llama-server is in tests/integration; this one can send an error mid-stream, stop without
[DONE], refuse the key, or hold a stream open to see the client hang up.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx
import pytest

from app.client import chat, remote
from app.client.adapters import LemonMlxAdapter, Route
from app.client.chat import ChatClient, error_detail
from app.client.events import ChatDelta, ChatDone, ChatEvent
from app.core.errors import EngineError, LemonDeskError, RequestError

Script = Callable[[asyncio.StreamWriter], Awaitable[None]]


def sse(payload: Any) -> bytes:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode()


def delta(content: str = "", reasoning: str = "", finish: str | None = None) -> bytes:
    d: dict[str, str] = {}
    if content:
        d["content"] = content
    if reasoning:
        d["reasoning_content"] = reasoning
    return sse({"choices": [{"index": 0, "delta": d, "finish_reason": finish}]})


@dataclass
class StandInEngine:
    script: Script
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    hung_up: asyncio.Event = field(default_factory=asyncio.Event)
    handlers: set[asyncio.Task[None]] = field(default_factory=set)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.handlers.add(task)
        task.add_done_callback(self.handlers.discard)
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        request_line, *lines = head.split("\r\n")
        self.paths.append(request_line.split(" ")[1])
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines if line)}
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        self.headers.append(headers)
        self.requests.append(json.loads(body))
        try:
            await self.script(writer)
        except ConnectionError:
            self.hung_up.set()
        finally:
            writer.close()


async def start_stream(writer: asyncio.StreamWriter, status: str = "200 OK") -> None:
    writer.write(
        f"HTTP/1.1 {status}\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    )
    await writer.drain()


async def send(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(b"%x\r\n%s\r\n" % (len(data), data))
    await writer.drain()


async def end(writer: asyncio.StreamWriter) -> None:
    writer.write(b"0\r\n\r\n")
    await writer.drain()


class Flood:
    """A body without end, as far as a client with a cap can tell: 1 MiB pieces, 64 at most (far past
    every cap), then the end of the chunked body. ``sent`` counts the pieces that went out."""

    PIECES = 64

    def __init__(self) -> None:
        self.sent = 0

    async def pour(self, writer: asyncio.StreamWriter) -> None:
        piece = b"x" * (1 << 20)
        while self.sent < self.PIECES:
            await send(writer, piece)
            self.sent += 1
        await end(writer)


@asynccontextmanager
async def engine(script: Script) -> AsyncIterator[tuple[StandInEngine, str]]:
    stand_in = StandInEngine(script)
    server = await asyncio.start_server(stand_in.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        try:
            yield stand_in, f"http://127.0.0.1:{port}"
        finally:
            # A script still answering (or silent on purpose) ends with the test, not after it.
            for handler in list(stand_in.handlers):
                handler.cancel()
            await asyncio.gather(*stand_in.handlers, return_exceptions=True)


async def collect(client: ChatClient, **params: Any) -> list[ChatEvent]:
    return [e async for e in client.stream_chat([{"role": "user", "content": "hi"}], **params)]


def test_deltas_then_done_with_client_measured_telemetry() -> None:
    async def script(w: asyncio.StreamWriter) -> None:
        await start_stream(w)
        await send(w, b": heartbeat\n\n" + delta(reasoning="Let me think."))
        for word in ("Hello", ",", " world"):
            await send(w, delta(word))
        await send(w, delta(finish="stop") + sse("[DONE]"))
        await end(w)

    async def go() -> tuple[list[ChatEvent], StandInEngine]:
        async with engine(script) as (stand_in, url), ChatClient(url, "k3y") as client:
            return await collect(client, temperature=0.2), stand_in

    events, stand_in = asyncio.run(go())
    *deltas, done = events
    assert all(isinstance(delta, ChatDelta) for delta in deltas)
    assert 1 <= len(deltas) <= 4  # the deltas of one read come as one
    assert "".join(d.reasoning for d in deltas if isinstance(d, ChatDelta)) == "Let me think."
    assert "".join(d.content for d in deltas if isinstance(d, ChatDelta)) == "Hello, world"
    assert isinstance(done, ChatDone)
    assert done.finish_reason == "stop"
    assert done.telemetry.completion_tokens == 4  # counted on the client: no usage, no timings
    assert done.telemetry.ttft_s > 0
    assert stand_in.headers[0]["authorization"] == "Bearer k3y"
    assert stand_in.requests[0] == {
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_the_deltas_of_one_read_come_as_one_with_reasoning_after_content_apart() -> None:
    # A paced read holds a frame of tokens: one delta for them (its reasoning before its content), the
    # tokens still counted one by one.
    read = [delta(reasoning="Th"), delta(reasoning="ink."), delta("Hel"), delta("lo")]
    read += [delta(reasoning="More."), delta("!"), delta(finish="stop")]
    stream = chat._Stream(None)
    data = [event[len(b"data: ") : -2] for event in read]
    assert list(stream.consume(data)) == [ChatDelta("Hello", "Think."), ChatDelta("!", "More.")]
    assert (stream.deltas, stream.finish) == (6, "stop")


def test_error_event_mid_stream_raises_the_engines_message() -> None:
    async def script(w: asyncio.StreamWriter) -> None:
        await start_stream(w)
        await send(w, delta("partial"))
        await send(w, sse({"error": {"message": "the KV cache is full", "type": "server_error"}}))
        await end(w)

    async def go() -> tuple[list[ChatEvent], RequestError]:
        seen: list[ChatEvent] = []
        async with engine(script) as (_, url), ChatClient(url, None) as client:
            with pytest.raises(RequestError) as err:
                async for event in client.stream_chat([]):
                    seen.append(event)
        return seen, err.value

    seen, err = asyncio.run(go())
    assert seen == [ChatDelta("partial")]
    assert str(err) == "The engine reported an error: the KV cache is full"


def test_plain_string_error_event_without_done() -> None:
    async def script(w: asyncio.StreamWriter) -> None:
        await start_stream(w)
        await send(w, b'data: {"error":"model not loaded"}')
        await end(w)

    async def go() -> None:
        async with engine(script) as (_, url), ChatClient(url, None) as client:
            with pytest.raises(RequestError, match="reported an error: model not loaded"):
                await collect(client)

    asyncio.run(go())


def test_refused_key_and_server_errors_say_what_happened() -> None:
    async def refuse(w: asyncio.StreamWriter) -> None:
        body = json.dumps({"error": {"message": "Invalid API Key", "code": 401}}).encode()
        w.write(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await w.drain()

    async def go() -> None:
        async with engine(refuse) as (_, url), ChatClient(url, "wrong") as client:
            with pytest.raises(RequestError, match=r"refused the app's key \(HTTP 401: Invalid API Key\)"):
                await collect(client)
            with pytest.raises(RequestError, match=r"refused the app's key"):
                await client.chat([])

    asyncio.run(go())


class Watcher:
    """A RequestObserver that records calls and explains breaks as a crash, like an engine would."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def request_started(self) -> None:
        self.calls.append("started")

    def data_received(self) -> None:
        if self.calls[-1] != "data":
            self.calls.append("data")

    def request_finished(self) -> None:
        self.calls.append("finished")

    async def explain(self, error: RequestError) -> LemonDeskError:
        return EngineError("llama-server stopped unexpectedly (killed by signal SIGKILL).", str(error))


def test_a_broken_connection_is_explained_by_the_observer() -> None:
    async def script(w: asyncio.StreamWriter) -> None:
        await start_stream(w)
        await send(w, delta("half a"))
        w.transport.abort()  # the engine died: the chunked body never ends

    async def go() -> tuple[EngineError, Watcher]:
        watcher = Watcher()
        async with engine(script) as (_, url), ChatClient(url, None, observer=watcher) as client:
            with pytest.raises(EngineError) as err:
                await collect(client)
        return err.value, watcher

    err, watcher = asyncio.run(go())
    assert "killed by signal SIGKILL" in str(err)
    assert "The connection to the engine broke during the reply" in err.hint
    assert watcher.calls == ["started", "data", "finished"]


def test_a_stream_that_just_stops_is_not_a_reply() -> None:
    async def script(w: asyncio.StreamWriter) -> None:
        await start_stream(w)
        await send(w, delta("cut"))
        await end(w)

    async def go() -> None:
        async with engine(script) as (_, url), ChatClient(url, None) as client:
            with pytest.raises(RequestError, match="ended the reply before finishing it"):
                await collect(client)

    asyncio.run(go())


def test_cancelling_closes_the_connection() -> None:
    async def script(w: asyncio.StreamWriter) -> None:
        await start_stream(w)
        while True:  # an endless reply, until the client hangs up
            await send(w, delta("more "))
            await asyncio.sleep(0.01)

    async def go() -> bool:
        async with engine(script) as (stand_in, url), ChatClient(url, None) as client:
            got_one = asyncio.Event()

            async def consume() -> None:
                async for _ in client.stream_chat([]):
                    got_one.set()

            task = asyncio.create_task(consume())
            await got_one.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.wait_for(stand_in.hung_up.wait(), 10)
            return stand_in.hung_up.is_set()

    assert asyncio.run(go())


def test_a_stop_string_the_engine_ignores_ends_the_reply_and_hangs_up() -> None:
    # lemon-mlx-engine b1050-stable takes "stop" and goes on: the client cuts the reply and hangs up.
    async def script(w: asyncio.StreamWriter) -> None:
        await start_stream(w)
        await send(w, delta("<think>hm</think>Sure, "))
        await send(w, delta("a lem"))
        while True:  # an endless reply, until the client hangs up
            await send(w, delta("on and more "))
            await asyncio.sleep(0.01)

    async def go() -> tuple[list[ChatEvent], StandInEngine]:
        async with engine(script) as (stand_in, url):
            async with ChatClient(url, None, adapter=LemonMlxAdapter()) as client:
                events = await collect(client, stop=" lemon")
            await asyncio.wait_for(stand_in.hung_up.wait(), 10)
            return events, stand_in

    events, stand_in = asyncio.run(go())
    deltas = [e for e in events if isinstance(e, ChatDelta)]
    assert "".join(d.reasoning for d in deltas) == "hm"
    assert "".join(d.content for d in deltas) == "Sure, a"
    done = events[-1]
    assert isinstance(done, ChatDone) and done.finish_reason == "stop"
    assert stand_in.requests[0]["stop"] == [" lemon"]  # still sent, as the array the engine parses
    # Each lemon-mlx stream on a connection of its own (the engine leaves Nagle on: LemonMlxAdapter).
    assert stand_in.headers[0]["connection"] == "close"


def test_each_stream_from_an_engine_on_loopback_goes_on_a_connection_of_its_own() -> None:
    """Read straight from its socket, asked to close (llama-server closes a stream's connection anyway)."""

    async def script(w: asyncio.StreamWriter) -> None:
        await start_stream(w)
        await send(w, delta("hi") + delta(finish="stop") + sse("[DONE]"))
        await end(w)

    async def go() -> tuple[list[list[ChatEvent]], StandInEngine]:
        async with engine(script) as (stand_in, url), ChatClient(url, None) as client:
            return [await collect(client), await collect(client)], stand_in

    replies, stand_in = asyncio.run(go())
    assert [reply[0] for reply in replies] == [ChatDelta("hi", "")] * 2
    assert [h["connection"] for h in stand_in.headers] == ["close", "close"]


def test_a_stream_goes_to_the_route_under_the_servers_root() -> None:
    """A remote's root may be a folder (a server behind a path): its chat route is under it."""

    async def script(w: asyncio.StreamWriter) -> None:
        await start_stream(w)
        await send(w, delta("hi") + delta(finish="stop") + sse("[DONE]"))
        await end(w)

    async def go() -> StandInEngine:
        async with engine(script) as (stand_in, url), ChatClient(f"{url}/lemon/", None) as client:
            await collect(client)
            return stand_in

    assert asyncio.run(go()).paths == ["/lemon/v1/chat/completions"]


def test_non_streaming_reply_and_timeout() -> None:
    async def answer(w: asyncio.StreamWriter) -> None:
        body = json.dumps(
            {
                "choices": [
                    {"message": {"content": "Paris", "reasoning_content": "easy"}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 12, "completion_tokens": 2},
            }
        ).encode()
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await w.drain()

    async def silent(w: asyncio.StreamWriter) -> None:
        await asyncio.Event().wait()

    async def go() -> None:
        async with engine(answer) as (stand_in, url), ChatClient(url, None) as client:
            reply = await client.chat([{"role": "user", "content": "capital of France?"}])
            assert (reply.content, reply.reasoning, reply.finish_reason) == ("Paris", "easy", "stop")
            assert reply.telemetry.prompt_tokens == 12 and reply.telemetry.completion_tokens == 2
            assert stand_in.requests[0]["stream"] is False
        async with engine(silent) as (_, url), ChatClient(url, None, request_timeout_s=0.3) as client:
            with pytest.raises(RequestError, match=r"did not answer within 0.3 s"):
                await client.chat([])

    asyncio.run(go())


def _forwarded(failures: int) -> tuple[list[bytes] | RequestError, int]:
    """forward_stream to a loopback server whose first ``failures`` connections are closed once the
    request is read, without an answer (what a stale pooled connection looks like)."""
    calls = 0

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal calls
        calls += 1
        await reader.readuntil(b"\r\n\r\n")
        if calls > failures:
            body = b"data: [DONE]\n\n"
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n")
            writer.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()
        writer.close()

    async def go() -> list[bytes] | RequestError:
        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        async with server, aiohttp.ClientSession() as relay, ChatClient(url, "k") as client:
            try:
                return [c async for c in client.forward_stream(Route.CHAT, {"stream": True}, relay)]
            except RequestError as err:
                return err

    return asyncio.run(go()), calls


def test_forwarding_retries_once_on_a_connection_closed_before_any_answer() -> None:
    assert _forwarded(failures=1) == ([b"", b"data: [DONE]\n\n"], 2)
    error, calls = _forwarded(failures=2)
    assert isinstance(error, RequestError) and "ServerDisconnectedError" in str(error) and calls == 2


def test_a_streamed_reply_is_sent_again_once_on_a_connection_closed_before_any_answer() -> None:
    """A server over HTTPS (a remote: httpx's pool) may close a kept connection (llama-server does after
    every streamed reply): a next turn sent on that pooled connection meets "Server disconnected" and
    must go out once more, not fail the chat."""
    calls = 0
    sse = b'data: {"choices":[{"delta":{"content":"Paris"},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'

    def answer(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        return httpx.Response(200, content=sse, headers={"content-type": "text/event-stream"})

    async def go() -> list[object]:
        pool = httpx.AsyncClient(base_url="https://engine", transport=httpx.MockTransport(answer))
        async with pool, ChatClient("https://engine", "k", http=pool) as client:
            return [event async for event in client.stream_chat([{"role": "user", "content": "hi"}])]

    events = asyncio.run(go())
    assert calls == 2 and events[0] == ChatDelta("Paris", "") and isinstance(events[-1], ChatDone)


def test_a_refusal_is_quoted_by_its_error_message_else_its_body_else_its_reason() -> None:
    said = json.dumps({"error": {"message": "ctx too small", "type": "invalid_request_error"}}).encode()
    assert error_detail(said, "Bad Request") == "ctx too small"
    assert error_detail(b'{"error": "busy"}', "Conflict") == "busy"
    assert error_detail(b"<html>gateway</html>", "Bad Gateway") == "<html>gateway</html>"
    assert error_detail(b"", "Service Unavailable") == "Service Unavailable"
    assert len(error_detail(b"x" * 10_000, "")) == 500


def test_a_remote_that_refuses_a_load_is_quoted() -> None:
    """The remote's own message reaches the user, not its JSON or a traceback."""

    def answer(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/api/v1/load"
        return httpx.Response(
            409, json={"error": {"message": "every model is pinned", "code": "model_pinned"}}
        )

    async def go() -> None:
        async with httpx.AsyncClient(base_url="http://box", transport=httpx.MockTransport(answer)) as http:
            with pytest.raises(RequestError) as refused:
                await remote.load(http, None, "smol", 5.0)
        assert str(refused.value).startswith(
            "The remote refused to load smol (HTTP 409): every model is pinned"
        )
        assert refused.value.status == 409

    asyncio.run(go())


DEEP = b"[" * 100_000 + b"]" * 100_000  # valid JSON that Python's parser cannot read (RecursionError)


def test_an_engine_answer_too_deep_to_parse_is_an_unreadable_answer_not_a_traceback() -> None:
    """A streamed event, a whole reply and a refusal, each nested too deep for the parser: every one
    is a RequestError that says so (a remote is another machine's server, and answers what it likes)."""
    assert error_detail(DEEP, "Bad Request").startswith("[[[")

    async def streamed(w: asyncio.StreamWriter) -> None:
        await start_stream(w)
        await send(w, delta("Hello"))
        await send(w, b"data: " + DEEP + b"\n\n")
        await end(w)

    async def whole(w: asyncio.StreamWriter) -> None:
        w.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(DEEP)
        )
        w.write(DEEP)
        await w.drain()

    async def go() -> None:
        async with engine(streamed) as (_, url), ChatClient(url, None) as client:
            with pytest.raises(RequestError, match="The engine sent an unreadable event"):
                await collect(client)
        async with engine(whole) as (_, url), ChatClient(url, None) as client:
            with pytest.raises(RequestError, match="The engine sent an unreadable reply"):
                await client.chat([{"role": "user", "content": "hi"}])

    asyncio.run(go())


def test_events_of_the_wrong_shape_are_read_for_what_they_hold_and_never_raise() -> None:
    """An OpenAI-compatible server is whatever a remote runs: fields of the wrong type count as absent,
    figures that are not finite numbers as not given; the text that is there still arrives."""
    odd = [
        {"choices": "ab"},
        {"choices": [5, None]},
        {"choices": [{"delta": [1]}]},
        {"choices": [{"delta": {"content": 5, "reasoning_content": ["x"]}, "finish_reason": 3}]},
        {"choices": [{"delta": {"content": "Hi"}}], "timings": "fast", "usage": [1]},
    ]
    last = b'data: {"choices": [{"delta": {}, "finish_reason": "stop"}],'
    last += b' "usage": {"prompt_tokens": 1e999, "completion_tokens": 1' + b"0" * 400 + b"}}\n\n"

    async def script(w: asyncio.StreamWriter) -> None:
        await start_stream(w)
        for payload in odd:
            await send(w, sse(payload))
        await send(w, last + sse("[DONE]"))
        await end(w)

    async def whole(w: asyncio.StreamWriter) -> None:
        body = json.dumps({"choices": [{"message": [1]}]}).encode()
        w.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
        )
        w.write(body)
        await w.drain()

    async def go() -> list[ChatEvent]:
        async with engine(whole) as (_, url), ChatClient(url, None) as client:
            with pytest.raises(RequestError, match="The engine sent an unreadable reply"):
                await client.chat([{"role": "user", "content": "hi"}])
        async with engine(script) as (_, url), ChatClient(url, None) as client:
            return await collect(client)

    *deltas, done = asyncio.run(go())
    assert deltas == [ChatDelta("Hi", "")]
    assert isinstance(done, ChatDone) and done.finish_reason == "stop"
    assert (done.telemetry.prompt_tokens, done.telemetry.completion_tokens) == (0, 1)  # counted here


def test_an_answer_whose_body_cannot_be_decoded_is_a_broken_reply() -> None:
    """A body marked gzip that is not (a proxy's doing) makes httpx raise DecodingError, which is no
    TransportError: it is said as a broken reply, like a connection that broke, not raised as it is.
    (Through httpx's MockTransport: with a real socket, httpx leaves one of its own generators
    unfinished after this error, which the leak check here would flag.)"""

    def answer(request: httpx.Request) -> httpx.Response:
        raise httpx.DecodingError("Error -3 while decompressing data: incorrect header check")

    async def go() -> None:
        http = httpx.AsyncClient(base_url="https://engine", transport=httpx.MockTransport(answer))
        async with http, ChatClient("https://engine", None, http=http) as client:
            with pytest.raises(RequestError, match=r"The connection to the engine broke \(DecodingError\)"):
                await client.chat([{"role": "user", "content": "hi"}])
            with pytest.raises(RequestError, match=r"broke during the reply \(DecodingError\)"):
                await collect(client)

    asyncio.run(go())


@pytest.mark.leaves_running(
    "the stream is left unread on purpose (it may never end): httpx's body generator stays half-run "
    "until the loop's GC hook closes it, an aclose() task asyncio.run cancels at exit"
)
def test_a_stream_whose_line_never_ends_is_refused_not_read_into_memory() -> None:
    """A server (a remote is another machine's) that sends one line without end: the reply fails once
    the line passes the parser's cap, and what follows is not read."""
    flood = Flood()

    async def script(w: asyncio.StreamWriter) -> None:
        await start_stream(w)
        await send(w, delta("Hi"))
        await flood.pour(w)

    async def go() -> list[ChatEvent]:
        async with engine(script) as (_, url), ChatClient(url, None) as client:
            events: list[ChatEvent] = []
            with pytest.raises(
                RequestError, match="The engine's stream is unreadable: a line went on past 8 MiB"
            ):
                async for event in client.stream_chat([{"role": "user", "content": "hi"}]):
                    events.append(event)
            return events

    assert asyncio.run(go()) == [ChatDelta("Hi", "")]
    assert flood.sent < Flood.PIECES


LEFT_HALF_READ = pytest.mark.leaves_running(
    "the refusal is left unread past the cap on purpose (it may never end): httpx's body generators stay "
    "half-run until the loop's GC hook closes them, an aclose() task asyncio.run cancels at exit"
)


@pytest.mark.parametrize("through", [pytest.param("httpx", marks=LEFT_HALF_READ), "aiohttp", "whole reply"])
def test_a_refusal_without_end_is_quoted_from_its_start_not_read_into_memory(through: str) -> None:
    """An engine (or a remote passed on to) refusing with a body without end: the refusal is said, from
    what the client read of it, and the rest is not read (the chat's stream and a whole reply over httpx,
    and the local API's forwarding over aiohttp)."""
    flood = Flood()

    async def script(w: asyncio.StreamWriter) -> None:
        await start_stream(w, "500 Internal Server Error")
        await flood.pour(w)

    async def go() -> None:
        async with engine(script) as (_, url), ChatClient(url, None) as client:
            if through == "httpx":
                await collect(client)
            elif through == "whole reply":
                await client.chat([{"role": "user", "content": "hi"}])
            else:
                async with aiohttp.ClientSession() as relay:
                    async for _chunk in client.forward_stream(Route.CHAT, {"stream": True}, relay):
                        pass

    with pytest.raises(RequestError, match=r"refused the request \(HTTP 500\): x{500}$"):
        asyncio.run(go())
    assert flood.sent < Flood.PIECES


def test_a_whole_reply_without_end_is_refused_past_the_cap_not_read_into_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An engine (a remote is another machine's) whose non-streamed reply goes on and on: the chat fails
    saying so once the reply passes the cap (1 MiB here), and the rest is not read."""
    monkeypatch.setattr(chat, "MAX_ANSWER_BYTES", 1 << 20)
    flood = Flood()

    async def script(w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        await send(w, b'{"choices": [{"message": {"content": "')
        await flood.pour(w)

    async def go() -> None:
        async with engine(script) as (_, url), ChatClient(url, None) as client:
            await client.chat([{"role": "user", "content": "hi"}])

    with pytest.raises(
        RequestError, match="The engine's answer to /v1/chat/completions went on past 1 MiB and was not read"
    ):
        asyncio.run(go())
    assert flood.sent < Flood.PIECES
