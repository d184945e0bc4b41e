"""An OpenAI-compatible chat client for one engine, with telemetry per reply: a stream read straight from
its socket when the engine speaks plain HTTP (on this machine's loopback, or a remote at an ``http://``
address: ``app.client.splice``), else over httpx (a remote over HTTPS).

Streaming requests have no overall or read timeout (a long answer, or a long prompt being read, is not a
hang: the engine's watchdog decides that); non-streaming ones use ``request_timeout_s``. Cancelling or
closing a stream closes its connection, which makes llama-server stop generating. A stream is read a
frame at a time after its first token (``app.client.pacing``): not a wake of the loop per token.
"""

from __future__ import annotations

import contextlib
import functools
import json
import ssl
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from app.client.adapters import DeltaSplitter, EngineAdapter, LlamaCppAdapter, Route, sse_error
from app.client.capped import read_upto
from app.client.events import ChatDelta, ChatDone, ChatEvent, ChatReply, ToolCall
from app.client.pacing import OPENAI_SSE_SHOWN, UNPACED, Frame, Pacing, TransportValve, paced, paced_network
from app.client.reasoning_relay import StreamReasoning, whole_reasoning
from app.client.splice import BodyError, EngineAnswer, open_stream, plain_http_address
from app.client.sse import EventTooLarge, SSEParser, event_json
from app.client.stop_relay import StreamFinish, StreamStops, cut_whole, whole_finish
from app.core.errors import ContextError, LemonDeskError, RequestError, UnsupportedRequestError
from app.core.reasoning import ReasoningFormat
from app.core.stops import StopCutter, cut_at_stop
from app.core.telemetry import ClientTimes, Telemetry, telemetry_from

if TYPE_CHECKING:
    import aiohttp
    import httpx

CONNECT_TIMEOUT_S = 10.0
CHAT_PATH = "/v1/chat/completions"
# What is read of a refusal's body: an error message is far shorter, and only its start is quoted. The
# engine may be a remote (another machine), whose refusal could otherwise go on without end.
REFUSAL_BYTES = 1 << 20
# What is read of a whole (non-streamed) answer: a reply's text is a few hundred KB at most (a long
# context's worth), its JSON a few times that. The engine may be a remote (another machine), whose
# answer could otherwise go on without end.
MAX_ANSWER_BYTES = 64 << 20

Messages = Sequence[dict[str, Any]]  # OpenAI chat messages: {"role", "content"}
MAX_TOOL_CALLS = 64  # in one reply; more are not kept
MAX_TOOL_ARGUMENTS = 1 << 20  # characters of one call's arguments kept


class _ToolCalls:
    """The tool calls of one reply as they arrive: streamed as pieces keyed by ``index`` (the id and name
    first, then the arguments in fragments), or whole in a non-streamed message."""

    def __init__(self) -> None:
        self._parts: dict[int, tuple[str, str, list[str]]] = {}

    def feed(self, parts: Any) -> None:
        for part in parts if isinstance(parts, list) else ():
            if not isinstance(part, dict):
                continue
            index = part.get("index", len(self._parts))
            if not isinstance(index, int) or (
                index not in self._parts and len(self._parts) >= MAX_TOOL_CALLS
            ):
                continue
            call_id, name, arguments = self._parts.get(index, ("", "", []))
            function = part.get("function")
            function = function if isinstance(function, dict) else {}
            fragment = _text(function.get("arguments"))
            if sum(map(len, arguments)) + len(fragment) <= MAX_TOOL_ARGUMENTS:
                arguments.append(fragment)
            self._parts[index] = (
                _text(part.get("id")) or call_id,
                name + _text(function.get("name")),
                arguments,
            )

    def calls(self) -> tuple[ToolCall, ...]:
        return tuple(
            ToolCall(call_id or f"call_{index}", name, "".join(arguments))
            for index, (call_id, name, arguments) in sorted(self._parts.items())
            if name
        )


class RequestObserver(Protocol):
    """Who watches this client's traffic: the engine's watchdog."""

    def request_started(self) -> None: ...

    def data_received(self) -> None: ...

    def request_finished(self) -> None: ...

    async def explain(self, error: RequestError) -> LemonDeskError:
        """A broken request's real cause (e.g. the engine crashed), or ``error`` itself."""
        ...


class TelemetrySource(Protocol):
    """Numbers an engine reports outside its replies (lemon-mlx's ``[TPS]`` stderr lines)."""

    def request_started(self) -> None: ...

    async def refine(self, telemetry: Telemetry) -> Telemetry:
        """The reply's telemetry with the engine's own figures in place of the client's estimates."""
        ...


def _text(value: Any) -> str:
    """A text field of an engine's answer; anything else in its place (a remote server answers what it
    likes) counts as no text."""
    return value if isinstance(value, str) else ""


def _error_text(payload: Any) -> str:
    err = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(err, dict):
        return str(err.get("message") or json.dumps(err))
    return str(err) if err else json.dumps(payload)[:500]


def error_detail(content: bytes, reason: str) -> str:
    """What a refusal's body says: an OpenAI error's message, else the body's start, else ``reason``."""
    try:
        return _error_text(json.loads(content))[:500]
    except (ValueError, RecursionError):
        return content[:500].decode("utf-8", "replace") or reason


def _context_refusal(content: bytes) -> tuple[int, int] | None:
    """llama-server's refusal of a prompt longer than its context (``exceed_context_size_error``, with
    ``n_prompt_tokens`` and ``n_ctx``): the two numbers, else None."""
    try:
        err = json.loads(content).get("error")
        if err.get("type") == "exceed_context_size_error":
            return int(err["n_prompt_tokens"]), int(err["n_ctx"])
    except (ValueError, RecursionError, AttributeError, KeyError, TypeError):
        pass
    return None


def _status_error(status: int, content: bytes, reason: str) -> RequestError:
    detail = error_detail(content, reason)
    if status == 400 and (sizes := _context_refusal(content)) is not None:
        return ContextError(*sizes, status=status)
    if status == 401:
        return RequestError(
            f"The engine refused the app's key (HTTP 401: {detail}).",
            "Another program may be using this port; reload the model.",
            status=401,
        )
    return RequestError(f"The engine refused the request (HTTP {status}): {detail}", status=status)


async def read_answer(response: httpx.Response) -> bytes:
    """An engine's whole answer, read inside its stream: a refusal's body up to ``REFUSAL_BYTES`` (only
    its start is quoted), any other up to ``MAX_ANSWER_BYTES``, past which it is a RequestError."""
    if response.status_code != 200:
        return await read_upto(response.aiter_bytes(), REFUSAL_BYTES)
    body = await read_upto(response.aiter_bytes(), MAX_ANSWER_BYTES)
    if len(body) > MAX_ANSWER_BYTES:
        raise RequestError(
            f"The engine's answer to {response.request.url.path} went on past {MAX_ANSWER_BYTES >> 20} MiB "
            "and was not read further.",
            "No model answers at that length: reload the model, or check the remote it runs on.",
        )
    return body


class _Stream:
    """One streamed reply being read: its deltas, finish reason, engine timings and client times."""

    def __init__(self, splitter: DeltaSplitter | None, stops: tuple[str, ...] = ()) -> None:
        self.splitter = splitter
        self.cutter = StopCutter(stops) if stops else None  # stop strings the engine does not apply
        self.sent = 0.0
        self.first: float | None = None
        self.deltas = 0
        self.finish: str | None = None
        self.timings: dict[str, Any] | None = None
        self.usage: dict[str, Any] | None = None
        self.tool_calls = _ToolCalls()
        self.done = False  # [DONE] or an error arrived: the rest of the body is read and ignored
        self.failure: RequestError | None = None

    def fail(self, error: RequestError) -> None:
        self.failure, self.done = error, True

    def consume(self, events: list[bytes]) -> Iterator[ChatDelta]:
        """The deltas the data of a read's events bring, those in a row as one: a paced read holds a
        frame of tokens, which the chat shows at once (one delta to pass on, not one a token). A delta's
        reasoning comes before its content, so reasoning after content begins the next."""
        content: list[str] = []
        reasoning: list[str] = []
        for data in events:
            if data == b"[DONE]":
                self.done = True
                break
            try:
                payload = event_json(data)
            except (ValueError, RecursionError):
                text = data[:200].decode("utf-8", errors="replace")
                self.fail(RequestError(f"The engine sent an unreadable event: {text!r}"))
                break
            if not isinstance(payload, dict):
                continue
            if "error" in payload:
                self.fail(RequestError(f"The engine reported an error: {_error_text(payload)}"))
                break
            choices = payload.get("choices")
            for choice in choices if isinstance(choices, list) else ():
                if not isinstance(choice, dict):
                    continue
                delta = choice.get("delta")
                if isinstance(delta, dict):
                    text, thought = _text(delta.get("content")), _text(delta.get("reasoning_content"))
                    if "tool_calls" in delta:
                        self.tool_calls.feed(delta["tool_calls"])
                    if text or thought:
                        if self.first is None:
                            self.first = time.perf_counter()
                        self.deltas += 1
                        if self.cutter is not None:
                            text = self.cutter.feed(text)
                        if thought:
                            if content:  # reasoning after content: the delta so far goes first
                                yield from self._split(ChatDelta("".join(content), "".join(reasoning)))
                                content, reasoning = [], []
                            reasoning.append(thought)
                        if text:
                            content.append(text)
                if (reason := choice.get("finish_reason")) is not None:
                    self.finish = _text(reason) or self.finish
                if self.cutter is not None and self.cutter.hit:
                    # The reply ends at its stop string: the caller hangs up, which stops the engine.
                    self.finish, self.done = "stop", True
                    break
            if self.done:
                break
            if "timings" in payload or "usage" in payload:
                timings, usage = payload.get("timings"), payload.get("usage")
                self.timings = timings if isinstance(timings, dict) and timings else self.timings
                self.usage = usage if isinstance(usage, dict) and usage else self.usage
        if content or reasoning:
            yield from self._split(ChatDelta("".join(content), "".join(reasoning)))

    def _split(self, delta: ChatDelta) -> Iterable[ChatDelta]:
        if self.splitter is None:
            return (delta,) if delta.content or delta.reasoning else ()
        return self.splitter.feed(delta)

    @property
    def stopped(self) -> bool:
        """A stop string the client applies ended the reply."""
        return self.cutter is not None and self.cutter.hit

    def flush(self) -> Iterable[ChatDelta]:
        held = self.cutter.flush() if self.cutter is not None else ""
        tail = list(self._split(ChatDelta(held))) if held else []
        return [*tail, *(self.splitter.flush() if self.splitter is not None else ())]

    def result(self, end: float) -> ChatDone:
        times = ClientTimes(self.sent, self.first, end, self.deltas)
        return ChatDone(self.finish, telemetry_from(times, self.timings, self.usage), self.tool_calls.calls())


def response_valve(response: aiohttp.ClientResponse) -> TransportValve | None:
    """What holds back the reads of an aiohttp response's connection between frames (``paced``). The
    connection may be paused only while it is this response's: once aiohttp has read the body's end it
    puts the connection back in the pool (a paused one there would leave the next request on it
    unanswered), and not while aiohttp's own flow control holds it (a full buffer: it resumes it)."""
    connection = response.connection
    transport = connection.transport if connection is not None else None
    if connection is None or transport is None:
        return None
    protocol = connection.protocol

    def ours() -> bool:
        return (
            response.connection is connection
            and not response.content.is_eof()
            and protocol is not None
            and not protocol._reading_paused  # noqa: SLF001 - aiohttp's flow control says no other way
        )

    return TransportValve(transport, ours)


@functools.cache
def loopback_ssl() -> ssl.SSLContext:
    """One TLS context for every client of a loopback engine. Engines speak plain HTTP, but httpx builds
    a context (reading the CA bundle, ~19 ms) for each client it makes unless it is given one."""
    import httpx

    return httpx.create_ssl_context()


class ChatClient:
    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        *,
        adapter: EngineAdapter | None = None,
        observer: RequestObserver | None = None,
        telemetry: TelemetrySource | None = None,
        request_timeout_s: float = 300.0,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        """``http``: a connection pool to the engine shared by many clients (the engine's own), which
        closing this client leaves open. Without it the client makes its own: tens of milliseconds
        (httpx builds an SSL context), too much to pay per request of the local API."""
        import httpx

        self.base_url = base_url.rstrip("/")
        # Plain HTTP (an engine here, a remote at an http:// address): its streams read from the socket.
        self._address = plain_http_address(self.base_url)
        self._root = urlsplit(self.base_url).path  # what a route's path is under (a remote's may be a folder)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._owns_http = http is None
        # trust_env=False: a proxy from the environment must never see loopback traffic or the key.
        self._http = http or httpx.AsyncClient(base_url=base_url, trust_env=False, verify=loopback_ssl())
        self._adapter = adapter or LlamaCppAdapter()
        self._observer = observer
        self._telemetry = telemetry
        self._request_timeout = httpx.Timeout(request_timeout_s, connect=CONNECT_TIMEOUT_S)

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> ChatClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def _body(self, messages: Messages, stream: bool, params: dict[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = {"messages": list(messages), **params, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        return self._adapter.adapt_body(body)

    async def _broken(self, error: RequestError) -> LemonDeskError:
        return await self._observer.explain(error) if self._observer else error

    async def stream_chat(self, messages: Messages, **params: Any) -> AsyncIterator[ChatEvent]:
        """Yield ``ChatDelta``s as the reply arrives, then one ``ChatDone``.

        Raises RequestError (or the engine's EngineError when it crashed meanwhile) on any failure,
        including an ``{"error": ...}`` event mid-stream.
        """
        import httpx

        body = self._body(messages, True, params)
        stream = _Stream(self._adapter.splitter(), self._adapter.stops(body))
        observer = self._observer
        if observer:
            observer.request_started()
        if self._telemetry:
            self._telemetry.request_started()
        stream.sent = time.perf_counter()
        parser = SSEParser()
        shown = False  # pacing starts once the first text has been passed on
        frame = OPENAI_SSE_SHOWN.frame()
        address, headers = self._address, {**self._headers, **self._adapter.stream_headers}
        # Read to the end even after [DONE] or an error event (the engine ends the body right after
        # them). A reply that ends early (a stop string the client applies, an unreadable stream)
        # leaves, closing the reads' generator here: left half-run, it would be finalised by the
        # garbage collector outside the loop (qasync installs no async-generator hooks).
        reading = (
            self._socket_reads(address, body, headers, frame)
            if address
            else self._httpx_reads(body, headers, frame)
        )
        try:
            async with contextlib.aclosing(reading) as chunks:
                async for chunk in chunks:
                    if observer:
                        observer.data_received()
                    if stream.done:
                        continue
                    try:
                        events = parser.data(chunk)
                    except EventTooLarge as err:
                        # No engine's: the rest may never end, so it is not read.
                        stream.fail(RequestError(f"The engine's stream is unreadable: {err}."))
                        break
                    for delta in stream.consume(events):
                        if not shown:
                            shown = True
                            frame.start()
                        yield delta
                    if stream.stopped:
                        break  # leaving the stream closes its connection
            if not stream.done:
                for delta in stream.consume([event.data.encode() for event in parser.close()]):
                    yield delta
        except (httpx.HTTPError, OSError, BodyError) as err:  # a broken connection, or an undecodable body
            raise await self._broken(
                RequestError(f"The connection to the engine broke during the reply ({type(err).__name__}).")
            ) from None
        finally:
            if observer:
                observer.request_finished()
        if stream.failure is not None:
            raise stream.failure
        if not stream.done and stream.finish is None:
            raise await self._broken(RequestError("The engine ended the reply before finishing it."))
        for delta in stream.flush():
            yield delta
        done = stream.result(time.perf_counter())
        telemetry = await self._telemetry.refine(done.telemetry) if self._telemetry else done.telemetry
        finish = self._adapter.finish_reason(done.finish_reason, body, telemetry.completion_tokens)
        yield ChatDone(finish, telemetry, done.tool_calls)

    async def _socket_reads(
        self, address: tuple[str, int], body: dict[str, Any], headers: dict[str, str], frame: Frame
    ) -> AsyncGenerator[bytes, None]:
        """A stream's body from an engine over plain HTTP, on a connection of its own read straight from its
        socket, a frame at a time once ``frame`` is on (``EngineAnswer.read``: one wake of the loop a
        frame, and the engine's close is read at once, so a reply's last tokens are never held)."""
        answer = await open_stream(address, self._root + CHAT_PATH, json.dumps(body).encode(), headers)
        try:
            if answer.status != 200:
                refusal = await answer.read_upto(REFUSAL_BYTES)
                raise _status_error(answer.status, refusal, answer.reason)
            while chunk := await answer.read(frame):
                yield chunk
        finally:
            answer.close()

    async def _httpx_reads(
        self, body: dict[str, Any], headers: dict[str, str], frame: Frame
    ) -> AsyncGenerator[bytes, None]:
        """A stream's body over httpx (a remote over HTTPS), read a frame at a time once
        ``frame`` is on (``paced_network``: a frame of tokens in one read)."""
        import httpx

        for attempt in range(2):
            answered = False
            try:
                async with self._http.stream(
                    "POST",
                    CHAT_PATH,
                    json=body,
                    headers=headers,
                    timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S),
                ) as response:
                    answered = True
                    if response.status_code != 200:
                        refusal = await read_upto(response.aiter_bytes(), REFUSAL_BYTES)
                        raise _status_error(response.status_code, refusal, response.reason_phrase)
                    network = response.extensions.get("network_stream")
                    chunks = paced(response.aiter_bytes(), OPENAI_SSE_SHOWN, frame, reads_wait=bool(network))
                    with paced_network(network, frame) if network else contextlib.nullcontext():
                        async with contextlib.aclosing(chunks):
                            async for chunk in chunks:
                                yield chunk
                return
            except httpx.RemoteProtocolError:
                # llama-server closes its connection after every streamed reply; a pooled one it
                # closed as this request went out was never answered: sent once more, on a new one.
                if answered or attempt:
                    raise

    async def reconnect(self, relay: aiohttp.ClientSession) -> bool:
        """Leave an open connection to the engine in ``relay``'s pool for the next request. llama-server
        closes its connection after every streamed reply (whatever its Keep-Alive header says), so each
        request the local API passes on would otherwise wait for a new connection first, and for the
        engine's listening thread to hand it to a worker: about half a millisecond of the time to first
        token on two busy cores. A cheap ``/health`` is answered and the connection kept; a first try
        that meets the closed connection, still in the pool, is made again on a new one.

        False when the engine closed that connection too: it keeps none open (mlx-lm's server speaks
        HTTP/1.0 and closes every connection after its answer), and asking again would only cost it a
        request a reply."""
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=CONNECT_TIMEOUT_S)
        url = f"{self.base_url}/health"
        for _attempt in range(2):
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with relay.get(url, headers=self._headers, timeout=timeout) as answer:
                    await answer.read()
                    said = answer.headers.get("Connection", "").lower()
                    http11 = answer.version is not None and answer.version >= (1, 1)
                    return said != "close" if http11 else said == "keep-alive"
        return True  # not answered: whether it keeps connections is not known

    async def forward_stream(
        self,
        route: Route,
        body: dict[str, Any],
        relay: aiohttp.ClientSession,
        pacing: Pacing | None = None,
        reasoning: ReasoningFormat | None = None,
    ) -> AsyncIterator[bytes]:
        """Send a streamed OpenAI request as it is and yield the engine's SSE bytes, as the local API
        passes them on. A stream the engine cannot give (lemon-mlx's ``/v1/completions``) is answered
        here with an SSE error event and the end of the stream: never a hang, never an empty reply.
        Other requests the engine cannot answer raise UnsupportedRequestError. The first item is
        ``b""``, once the engine has accepted the request (its 200 came): the caller can then answer its
        own client's headers while the engine reads the prompt, not after its first token.

        ``relay`` is the local API's own aiohttp session: its client reads a stream for about half the
        CPU per event of httpx's (0.2 against 0.33-0.4 ms here), and on a machine whose cores the
        engine uses, every millisecond the relay takes per token is taken from the engine. Closing
        the generator early closes the connection (a body not read to its end is not pooled), which
        makes llama-server stop generating.

        ``pacing``: the stream is read at most once a frame after its first token (``paced``), with
        this dialect's event boundary; None reads it as it comes. ``reasoning``: where a chat's
        reasoning goes in the answer (None: where the engine puts it).
        """
        import aiohttp

        try:
            body = self._adapter.adapt_body(dict(body), route)
        except UnsupportedRequestError as err:
            if not body.get("stream"):
                raise
            yield sse_error(err)
            return
        placed = reasoning is not None and route is Route.CHAT and self._adapter.reasoning(body, reasoning)
        rewrite = reasoning if placed else None  # the engine cannot place it as asked: placed here
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S)
        url = f"{self.base_url}{route.value}"
        observer = self._observer
        if observer:
            observer.request_started()
        answered = False
        try:
            for attempt in range(2):
                try:
                    async with relay.post(url, json=body, headers=self._headers, timeout=timeout) as response:
                        answered = True
                        if response.status != 200:
                            refusal = await read_upto(response.content.iter_any(), REFUSAL_BYTES)
                            raise _status_error(response.status, refusal, response.reason or "")
                        yield b""
                        valve = response_valve(response) if pacing else None
                        chunks = paced(response.content.iter_any(), pacing or UNPACED, valve=valve)
                        async with contextlib.aclosing(chunks):
                            async for chunk in self._relayed(chunks, body, route, rewrite):
                                yield chunk
                    return
                except aiohttp.ServerDisconnectedError:
                    # A pooled connection the engine closed as the request went out: the engine never
                    # answered it, so it is sent once more on a new connection.
                    if answered or attempt:
                        raise
        except (aiohttp.ClientError, TimeoutError) as err:
            raise await self._broken(
                RequestError(f"The connection to the engine broke ({type(err).__name__}).")
            ) from None
        finally:
            if observer:
                observer.request_finished()

    async def open_spliced(
        self, route: Route, body: dict[str, Any], reasoning: ReasoningFormat | None = None
    ) -> EngineAnswer | None:
        """The engine's answer to a streamed request, its head read, for ``app.client.splice`` to pass
        its body on from a thread: when the engine speaks plain HTTP (here, or a remote's) and nothing of the
        stream is to be rewritten here (no stop strings it leaves to us, no reasoning to place, no
        finish reason to correct). None otherwise: the stream goes through ``forward_stream``. A refusal
        or a broken connection raises as there."""
        address = self._address
        if address is None or not body.get("stream"):
            return None
        try:
            body = self._adapter.adapt_body(dict(body), route)
        except UnsupportedRequestError:
            return None  # forward_stream answers it, with an SSE error event
        if reasoning is not None and route is Route.CHAT and self._adapter.reasoning(body, reasoning):
            return None
        if route in (Route.CHAT, Route.COMPLETIONS) and self._adapter.stops(body):
            return None
        limit = body.get("max_tokens")
        if (
            type(limit) is int
            and self._telemetry is not None
            and self._adapter.finish_reason("stop", body, limit) != "stop"
        ):
            return None
        observer = self._observer
        if observer:
            observer.request_started()
        try:
            path, data = self._root + route.value, json.dumps(body).encode()
            answer = await open_stream(address, path, data, self._headers)
        except (OSError, TimeoutError, BodyError) as err:
            if observer:
                observer.request_finished()
            raise await self._broken(
                RequestError(f"The connection to the engine broke ({type(err).__name__}).")
            ) from None
        if observer:
            answer.data_received, answer.finished = observer.data_received, observer.request_finished
        if answer.status != 200:
            try:
                refusal = await answer.read_upto(REFUSAL_BYTES)
            except (OSError, BodyError):
                refusal = b""
            finally:
                answer.close()
            raise _status_error(answer.status, refusal, answer.reason)
        return answer

    async def post_json(self, path: str, body: dict[str, Any]) -> Any:
        """POST ``body`` to one of the engine's own routes (llama-server's ``/apply-template``,
        ``/tokenize`` and ``/slots/{id}``) and give its JSON answer; a refusal or an unreadable answer is
        a RequestError."""
        return await self._json_call("POST", path, body)

    async def get_json(self, path: str) -> Any:
        """GET one of the engine's own routes (llama-server's ``/props``) and give its JSON answer."""
        return await self._json_call("GET", path, None)

    async def _json_call(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        import httpx

        try:
            async with self._http.stream(
                method, path, json=body, headers=self._headers, timeout=self._request_timeout
            ) as response:
                answer = await read_answer(response)
        except httpx.HTTPError as err:
            raise await self._broken(
                RequestError(f"The connection to the engine broke ({type(err).__name__}).")
            ) from None
        if response.status_code != 200:
            raise _status_error(response.status_code, answer, response.reason_phrase)
        try:
            return json.loads(answer)
        except (ValueError, RecursionError):
            raise RequestError(f"The engine's answer to {path} is not JSON.") from None

    async def _relayed(
        self,
        chunks: AsyncIterator[bytes],
        body: dict[str, Any],
        route: Route,
        reasoning: ReasoningFormat | None,
    ) -> AsyncIterator[bytes]:
        """The engine's answer as the local API passes it on: its bytes as they come, unless the engine
        leaves something undone: stop strings it does not apply (the answer is cut before the first
        one, and a stream ended there, which closes the connection and so stops the engine), reasoning
        to be placed (``reasoning``), a "stop" it says for a reply its limit cut (by the answer's usage,
        or, streamed, by the engine's own count of the tokens once the stream has ended)."""
        observer = self._observer
        stops = self._adapter.stops(body) if route in (Route.CHAT, Route.COMPLETIONS) else ()
        limit = body.get("max_tokens")  # an engine's "stop" at the limit its adapter corrects
        corrects = type(limit) is int and self._adapter.finish_reason("stop", body, limit) != "stop"
        if not body.get("stream") and (stops or reasoning or corrects):
            yield self._whole_relayed(await read_upto(chunks, MAX_ANSWER_BYTES), body, stops, reasoning)
            return
        cutter = StreamStops(stops) if stops else None
        placer = StreamReasoning(reasoning, split=self._adapter.reasoning_inline) if reasoning else None
        # A stream cut at a stop string says "stop" rightly: only a stream without one is held at its end.
        finisher = StreamFinish() if corrects and not stops and self._telemetry is not None else None
        if finisher is not None and self._telemetry is not None:
            self._telemetry.request_started()
        async for chunk in chunks:
            if observer:
                observer.data_received()
            if cutter is None and placer is None and finisher is None:
                yield chunk
                continue
            out = cutter.feed(chunk) if cutter is not None else chunk
            out = placer.feed(out) if placer is not None else out
            out = finisher.feed(out) if finisher is not None else out
            if out:
                yield out
            if cutter is not None and cutter.ended:
                return
        tail = cutter.close() if cutter is not None else b""
        tail = placer.feed(tail) + placer.close() if placer is not None else tail
        if finisher is not None and self._telemetry is not None:
            tail = finisher.feed(tail) + finisher.close()
            if finisher.holding:
                counted = await self._telemetry.refine(Telemetry(0.0, 0, 0.0, 0, 0.0))
                tail += finisher.release(self._adapter.finish_reason("stop", body, counted.completion_tokens))
        if tail:
            yield tail

    def _whole_relayed(
        self, answer: bytes, body: dict[str, Any], stops: tuple[str, ...], reasoning: ReasoningFormat | None
    ) -> bytes:
        answer = cut_whole(answer, stops) if stops else answer
        if reasoning:
            answer = whole_reasoning(answer, reasoning, split=self._adapter.reasoning_inline)
        return whole_finish(answer, lambda said, n: self._adapter.finish_reason(said, body, n))

    async def chat(self, messages: Messages, **params: Any) -> ChatReply:
        """One whole reply, without streaming, read up to ``MAX_ANSWER_BYTES``; gives up after
        ``request_timeout_s``."""
        import httpx

        body = self._body(messages, False, params)
        observer = self._observer
        if observer:
            observer.request_started()
        if self._telemetry:
            self._telemetry.request_started()
        sent = time.perf_counter()
        try:
            async with self._http.stream(
                "POST", CHAT_PATH, json=body, headers=self._headers, timeout=self._request_timeout
            ) as response:
                answer = await read_answer(response)
        except httpx.TimeoutException:
            raise RequestError(
                f"The engine did not answer within {self._request_timeout.read:g} s.",
                "Raise the request timeout in Settings, or ask for a shorter reply.",
            ) from None
        except httpx.HTTPError as err:  # a broken connection, or a body that cannot be decoded
            raise await self._broken(
                RequestError(f"The connection to the engine broke ({type(err).__name__}).")
            ) from None
        finally:
            if observer:
                observer.request_finished()
        end = time.perf_counter()
        if response.status_code != 200:
            raise _status_error(response.status_code, answer, response.reason_phrase)
        try:
            payload = json.loads(answer)
            choice = payload["choices"][0]
            message = choice.get("message") or {}
            content, reasoning = _text(message.get("content")), _text(message.get("reasoning_content"))
            calls = _ToolCalls()
            calls.feed(message.get("tool_calls"))
        except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError):
            text = answer[:200].decode("utf-8", "replace")
            raise RequestError(f"The engine sent an unreadable reply: {text!r}") from None
        said = _text(choice.get("finish_reason")) or None
        if stops := self._adapter.stops(body):
            content, hit = cut_at_stop(content, stops)
            said = "stop" if hit else said
        splitter = self._adapter.splitter()
        if splitter is not None:
            parts = [*splitter.feed(ChatDelta(content, reasoning)), *splitter.flush()]
            content, reasoning = "".join(p.content for p in parts), "".join(p.reasoning for p in parts)
        times = ClientTimes(sent, end, end, 1 if content or reasoning else 0)
        telemetry = telemetry_from(times, payload.get("timings"), payload.get("usage"))
        if self._telemetry:
            telemetry = await self._telemetry.refine(telemetry)
        finish = self._adapter.finish_reason(said, body, telemetry.completion_tokens)
        return ChatReply(content, reasoning, finish, telemetry, calls.calls())
