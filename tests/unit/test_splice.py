"""The local API's spliced streams (app/client/splice.py): the body's HTTP framing taken off as it comes,
in any pieces, and a broken one refused; then for real, an engine on loopback (an aiohttp server writing
SSE in random pieces, chunked or up to the close) passed on by the splice's thread through a real aiohttp
server to a real client: every byte in order, each HTTP chunk ends at an event's end, far fewer writes
than the engine's, the first token at once; a refusal raised with the engine's status; a client that
goes away mid-frame makes the engine's connection close at once."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from app.client import splice as splice_module
from app.client.pacing import Pacing
from app.client.splice import (
    BodyError,
    Chunked,
    EngineAnswer,
    Length,
    UpToClose,
    Workers,
    open_stream,
    plain_http_address,
    splice,
)
from tests.unit.test_pacing import EVENTS, STREAM, pieces

PACED = Pacing(interval_s=0.03)


def chunked(data: bytes, seed: int) -> bytes:
    """``data`` in the chunked framing, in random chunk sizes (some with an extension), then its end."""
    framed = b"".join(
        b"%x%s\r\n%s\r\n" % (len(piece), b";ext=1" if i % 5 == 0 else b"", piece)
        for i, piece in enumerate(pieces(data, seed))
    )
    return framed + b"0\r\n\r\n"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_chunked_framing_comes_off_whatever_the_pieces_it_is_read_in(seed: int) -> None:
    body = Chunked()
    framed = chunked(STREAM, seed)
    out = b"".join(body.feed(piece) for piece in pieces(framed + b"after the end", seed + 10))
    assert out == STREAM and body.ended
    body.eof()  # over: the close is no error


@pytest.mark.parametrize(
    "framed",
    [b"zz\r\nabc\r\n", b"3\r\nabcX\r\n", b"-3\r\nabc\r\n", b"9" * 2000, b"%x\r\n" % (17 << 20)],
    ids=["not hex", "no CRLF after the data", "negative", "endless size line", "too large"],
)
def test_a_broken_chunked_framing_is_refused(framed: bytes) -> None:
    with pytest.raises(BodyError):
        Chunked().feed(framed)


def test_a_body_cut_off_before_its_end_is_refused_and_one_up_to_the_close_is_not() -> None:
    body = Chunked()
    body.feed(b"5\r\nab")
    with pytest.raises(BodyError):
        body.eof()
    length = Length(10)
    assert length.feed(b"0123456789tail") == b"0123456789" and length.ended
    short = Length(10)
    short.feed(b"0123")
    with pytest.raises(BodyError):
        short.eof()
    close = UpToClose()
    assert close.feed(b"anything") == b"anything" and not close.ended
    close.eof()
    assert close.ended


def test_every_plain_http_server_is_read_from_a_socket_and_https_is_not() -> None:
    assert plain_http_address("http://127.0.0.1:8080") == ("127.0.0.1", 8080)
    assert plain_http_address("http://[::1]:9000/") == ("::1", 9000)
    assert plain_http_address("http://192.168.1.4:8080/lemon") == ("192.168.1.4", 8080)  # a remote
    assert plain_http_address("http://box.local") == ("box.local", 80)
    for url in ("https://127.0.0.1:8080", "https://box.local", "http://:80", "http://x:port", "ftp://x"):
        assert plain_http_address(url) is None


def test_a_server_named_by_host_name_is_reached_at_an_address_of_its_name() -> None:
    """``localhost`` may name ::1 first, where nothing listens here: its next address answers."""

    async def go() -> tuple[int, bytes]:
        async with Engine([EVENTS[0]], 0) as engine:
            answer = await open_stream(("localhost", engine.address[1]), "/v1/chat/completions", b"{}", {})
            try:
                return answer.status, await answer.read_upto(1000)
            finally:
                answer.close()

    assert asyncio.run(go()) == (200, EVENTS[0])


@pytest.mark.parametrize("host", ["no-such-host.invalid", "a..b", "x" * 64 + ".lan"])
def test_a_host_name_that_names_nothing_is_an_error_the_caller_reports(host: str) -> None:
    with pytest.raises(OSError):
        asyncio.run(open_stream((host, 80), "/", b"{}", {}))


class Engine:
    """An engine on loopback: ``writes`` as one answer's body, ``gap_s`` apart (chunked, or up to the
    close), or a refusal; it notes when it saw its client's connection close."""

    def __init__(
        self, writes: list[bytes], gap_s: float, *, close_delimited: bool = False, status: int = 200
    ):
        self.writes, self.gap_s, self.close_delimited, self.status = writes, gap_s, close_delimited, status
        self.address = ("127.0.0.1", 0)
        self.written = 0
        self.gone_at: float | None = None
        self._server: asyncio.Server | None = None

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(
            next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))[15:]
        )
        await reader.readexactly(length)
        if self.status != 200:
            refusal = b'{"error":{"message":"no such slot"}}'
            writer.write(
                b"HTTP/1.1 %d Nope\r\nContent-Length: %d\r\n\r\n%s" % (self.status, len(refusal), refusal)
            )
        elif self.close_delimited:
            writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        try:
            for piece in self.writes if self.status == 200 else ():
                writer.write(piece if self.close_delimited else b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
                self.written += 1
                await asyncio.sleep(self.gap_s)
            if not self.close_delimited:
                writer.write(b"0\r\n\r\n")
            await writer.drain()
            writer.close()
            await reader.read()  # until the other side closes
        except ConnectionError:
            pass  # it closed while this was writing
        self.gone_at = time.monotonic()

    async def __aenter__(self) -> Engine:
        self._server = await asyncio.start_server(self._answer, "127.0.0.1", 0)
        self.address = self._server.sockets[0].getsockname()[:2]
        return self

    async def __aexit__(self, *_exc: object) -> None:
        assert self._server is not None
        self._server.close()


@contextlib.asynccontextmanager
async def api(engine: Engine, pacing: Pacing) -> AsyncIterator[tuple[str, list[bytes]]]:
    """A real aiohttp server whose one route splices ``engine``'s answer; the URL, and what the route's
    ``on_data`` saw."""
    seen: list[bytes] = []
    relays = Workers("api-relay")

    async def route(request: web.Request) -> web.StreamResponse:
        answer = await open_stream(engine.address, "/v1/chat/completions", b"{}", {"Authorization": "x"})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        writer = await response.prepare(request)
        assert writer is not None

        def translate(events: bytes) -> bytes:
            seen.append(events)
            return events

        if await splice(answer, response, writer, pacing, relays, translate):
            await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/", route)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/", seen
    finally:
        await runner.cleanup()
        relays.close()


@pytest.mark.parametrize(("seed", "close_delimited"), [(1, False), (2, False), (3, True)])
def test_spliced_events_come_whole_in_order_and_a_frame_at_a_time(seed: int, close_delimited: bool) -> None:
    writes = pieces(STREAM, seed)

    async def go() -> tuple[list[bytes], list[bytes], float, float]:
        async with (
            Engine(writes, 0.0005, close_delimited=close_delimited) as engine,
            api(engine, PACED) as (url, seen),
            aiohttp.ClientSession() as session,
        ):
            sent = time.monotonic()
            async with session.post(url, data=b"{}") as response:
                got, first, part = [], 0.0, b""
                async for data, end_of_chunk in response.content.iter_chunks():
                    part += data
                    first = first or (time.monotonic() if b"t0 " in part else 0.0)
                    if end_of_chunk and part:  # one HTTP chunk of the API's: one write
                        got.append(part)
                        part = b""
            return got, seen, first - sent, time.monotonic() - sent

    got, seen, to_first, took = asyncio.run(go())
    assert b"".join(got) == STREAM and b"".join(seen) == STREAM
    assert all(chunk.endswith(b"\n\n") for chunk in got)  # no event cut in two
    assert len(got) < len(writes) / 4  # grouped: far fewer writes than the engine's
    assert to_first < took  # the first token before the end, not held to it


def test_a_refusal_keeps_the_engines_status_and_words() -> None:
    async def go() -> tuple[int, bytes]:
        async with Engine([], 0, status=404) as engine:
            answer = await open_stream(engine.address, "/slots/9", b"{}", {})
            try:
                return answer.status, await answer.read_upto(1000)
            finally:
                answer.close()

    assert asyncio.run(go()) == (404, b'{"error":{"message":"no such slot"}}')


def test_a_client_that_goes_away_mid_frame_closes_the_engines_connection_at_once() -> None:
    writes = [EVENTS[0], *EVENTS[1:] * 20]

    async def go() -> float:
        async with (
            Engine(writes, 0.01) as engine,
            api(engine, Pacing(interval_s=60.0)) as (url, _seen),
            aiohttp.ClientSession() as session,
        ):
            async with session.post(url, data=b"{}") as response:
                await response.content.readuntil(b"\n\n")  # the first token, at once
            left = time.monotonic()  # closed inside a 60 s frame
            while engine.gone_at is None:
                assert time.monotonic() - left < 20, "the engine's connection stayed open"
                await asyncio.sleep(0.01)
            assert engine.written < len(writes)
            return engine.gone_at - left

    assert asyncio.run(go()) < 20


SLOW = EVENTS[:12]  # an engine slower than the frames: an event every 0.1 s, frames 0.03 s
SLOW_GAP_S = 0.1


def test_a_relay_reads_an_engine_slower_than_its_frames_as_its_events_come(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not woken every frame for nothing: about one read an event (woken each frame, about four)."""
    reads = 0
    read = splice_module._read

    def counted(sock: socket.socket) -> bytes:
        nonlocal reads
        reads += 1
        return read(sock)

    monkeypatch.setattr(splice_module, "_read", counted)

    async def go() -> bytes:
        async with (
            Engine(SLOW, SLOW_GAP_S) as engine,
            api(engine, PACED) as (url, _seen),
            aiohttp.ClientSession() as session,
            session.post(url, data=b"{}") as response,
        ):
            return await response.read()

    assert asyncio.run(go()) == b"".join(SLOW)
    assert reads <= len(SLOW) + 3


def test_the_windows_reader_reads_an_engine_slower_than_its_frames_as_its_events_come(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The window's client's reads on the loop (``EngineAnswer.read``) likewise: one wake an event, not
    one for an empty frame and another for the event."""
    takes = 0
    take = splice_module._LoopReader._take

    def counted(reader: splice_module._LoopReader) -> bool:
        nonlocal takes
        takes += 1
        return take(reader)

    monkeypatch.setattr(splice_module._LoopReader, "_take", counted)

    async def go() -> bytes:
        async with Engine(SLOW, SLOW_GAP_S) as engine:
            answer = await open_stream(engine.address, "/v1/chat/completions", b"{}", {})
            frame = PACED.frame()
            got = b""
            try:
                while chunk := await answer.read(frame):
                    got += chunk
                    if not frame.on:
                        frame.start()  # the first token, as the chat client's parser says
            finally:
                answer.close()
            return got

    assert asyncio.run(go()) == b"".join(SLOW)
    assert takes <= len(SLOW) + 3


def test_an_answer_closed_twice_says_it_finished_once() -> None:
    calls: list[str] = []
    answer = EngineAnswer(socket.socket(), 200, "OK", UpToClose(), b"", finished=lambda: calls.append("done"))
    answer.close()
    answer.close()
    assert calls == ["done"]


def test_what_the_translation_raises_in_the_thread_is_raised_on_the_loop() -> None:
    def translate(events: bytes) -> bytes:
        raise ValueError("not a JSON object")

    async def go() -> str:
        async with Engine(pieces(STREAM, 4), 0.0005) as engine:
            seen: list[str] = []
            relays = Workers("api-relay")

            async def route(request: web.Request) -> web.StreamResponse:
                answer = await open_stream(engine.address, "/", b"{}", {})
                response = web.StreamResponse()
                writer = await response.prepare(request)
                assert writer is not None
                try:
                    await splice(answer, response, writer, PACED, relays, translate)
                except ValueError as err:
                    seen.append(str(err))
                await response.write_eof()
                return response

            app = web.Application()
            app.router.add_post("/", route)
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            try:
                async with aiohttp.ClientSession() as session:
                    url = f"http://127.0.0.1:{runner.addresses[0][1]}/"
                    async with session.post(url, data=b"{}") as response:
                        await response.read()
            finally:
                await runner.cleanup()
                relays.close()
            while engine.gone_at is None:  # its connection closed with the failure
                await asyncio.sleep(0.01)
            return seen[0]

    assert asyncio.run(go()) == "not a JSON object"


def _ran(workers: Workers, until: threading.Event | None = None) -> tuple[threading.Thread, threading.Event]:
    """The thread ``workers`` runs a job in, and the event its ``then`` sets; the job returns once
    ``until`` is set (at once without)."""
    began, over = threading.Event(), threading.Event()
    ran: list[threading.Thread] = []

    def job() -> None:
        ran.append(threading.current_thread())
        began.set()
        if until is not None:
            until.wait(10)

    workers.run(job, over.set)
    assert began.wait(10)
    return ran[0], over


def test_a_relay_thread_is_free_for_the_next_stream_when_it_says_its_stream_is_over() -> None:
    workers = Workers("api-relay")
    first, over = _ran(workers)
    assert over.wait(10)
    assert _ran(workers)[0] is first  # no thread started for the second
    workers.close()
    first.join(10)
    assert not first.is_alive()


def test_streams_given_together_each_have_a_thread_at_once() -> None:
    workers = Workers("api-relay")
    release = threading.Event()
    try:
        threads = [_ran(workers, release)[0] for _ in range(3)]  # each waits for the release: none queued
        assert len(set(threads)) == 3
    finally:
        release.set()
        workers.close()
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive()  # busy when closed: ended with its job


def test_a_relay_thread_left_idle_ends_and_a_new_one_takes_the_next_stream() -> None:
    workers = Workers("api-relay", idle_s=0.05)
    first, _ = _ran(workers)
    first.join(10)
    assert not first.is_alive()
    second, _ = _ran(workers)
    assert second is not first
    workers.close()
    second.join(10)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the job's, meant
def test_a_job_that_raises_ends_its_thread_and_still_says_it_is_over() -> None:
    workers = Workers("api-relay")
    over = threading.Event()
    ran: list[threading.Thread] = []

    def job() -> None:
        ran.append(threading.current_thread())
        raise RuntimeError("a job's failure")

    workers.run(job, over.set)
    assert over.wait(10)
    ran[0].join(10)
    assert not ran[0].is_alive() and workers._idle == []  # not given the next job
    assert _ran(workers)[0] is not ran[0]
    workers.close()
