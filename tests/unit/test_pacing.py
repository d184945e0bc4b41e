"""Frame pacing (app/client/pacing.py): over a real loopback HTTP stream read with aiohttp (its
transport held between frames by the relay's valve), through the local API in every dialect in front of
the stand-in engine (a real child process that answers like llama-server), and in the window's client
(httpx) against a scripted loopback engine: nothing reordered, events passed on whole, the first token
at once and the rest with the next frame, one write a frame in the Anthropic and Ollama dialects, a
client that goes away mid-frame stops the engine at once, the end of a reply never waits a second
interval, and a connection aiohttp has pooled again is never left held."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
from aiohttp import web

from app.client import pacing
from app.client.adapters import LemonMlxAdapter
from app.client.chat import ChatClient, response_valve
from app.client.events import ChatDelta, ChatDone, ChatEvent
from app.client.pacing import UNPACED, Pacing, paced
from app.store.settings import Settings
from app.supervisor.router import Router
from tests.unit.test_api import HI, models, run_api
from tests.unit.test_chat_client import delta, end, engine, send, sse, start_stream

EVENTS = [f'data: {{"choices":[{{"delta":{{"content":"t{i} "}}}}]}}\n\n'.encode() for i in range(300)]
STREAM = b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n' + b"".join(EVENTS) + b"data: [DONE]\n\n"


def pieces(data: bytes, seed: int) -> list[bytes]:
    """``data`` cut at random places: inside events, inside ``\\n\\n``, a byte or a few hundred long."""
    rng = random.Random(seed)
    out, at = [], 0
    while at < len(data):
        step = rng.choice((1, 2, 7, 40, 90, 300))
        out.append(data[at : at + step])
        at += step
    return out


class Served:
    """``writes`` served on loopback as one chunked HTTP body each (``gap_s`` apart), at ``url``."""

    def __init__(self, writes: list[bytes], gap_s: float) -> None:
        self.writes, self.gap_s = writes, gap_s
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _handler(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        for piece in self.writes:
            await response.write(piece)
            await asyncio.sleep(self.gap_s)
        await response.write_eof()
        return response

    async def __aenter__(self) -> Served:
        app = web.Application()
        app.router.add_get("/", self._handler)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/"
        return self

    async def __aexit__(self, *_exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


async def read_paced(writes: list[bytes], gap_s: float, how: Pacing, valved: bool = False) -> list[bytes]:
    """Serve ``writes`` and read them paced (``valved``: as the relay does, its transport held)."""
    async with (
        Served(writes, gap_s) as served,
        aiohttp.ClientSession() as session,
        session.get(served.url) as response,
    ):
        valve = response_valve(response) if valved else None
        return [chunk async for chunk in paced(response.content.iter_any(), how, valve=valve)]


@pytest.mark.parametrize("seed", [1, 2])
def test_events_are_never_reordered_and_split_events_are_joined(seed: int) -> None:
    writes = pieces(STREAM, seed)
    got = asyncio.run(read_paced(writes, 0.0005, Pacing(interval_s=0.02)))
    assert b"".join(got) == STREAM
    assert all(chunk.endswith(b"\n\n") for chunk in got)  # no event cut in two
    assert len(got) < len(writes) / 4  # grouped: far fewer reads than writes


@pytest.mark.parametrize("seed", [4, 5])
def test_through_the_relays_valve_events_are_never_reordered_nor_cut(seed: int) -> None:
    writes = pieces(STREAM, seed)
    got = asyncio.run(read_paced(writes, 0.0005, Pacing(interval_s=0.02), valved=True))
    assert b"".join(got) == STREAM
    assert all(chunk.endswith(b"\n\n") for chunk in got)
    assert len(got) < len(writes) / 4


def test_a_body_that_ends_during_a_frame_ends_the_stream_with_the_next_read() -> None:
    """The rest of the reply and the body's end come while the relay's valve holds the transport: the
    next read takes them all and the stream ends there, no wake-up lost and nothing held back. (A reader
    whose task sleeps out the frame instead sees the end only after a second frame, since it waits
    before every read: a stream without [DONE], such as the Responses API's, ended a frame late.)"""
    body = STREAM[: STREAM.index(EVENTS[40])]
    writes = [body[: len(EVENTS[0]) + 50], *pieces(body[len(EVENTS[0]) + 50 :], 7)]
    interval = 1.0

    async def go() -> tuple[list[bytes], float]:
        started = time.monotonic()
        got = await read_paced(writes, 0.002, Pacing(interval_s=interval), valved=True)
        return got, time.monotonic() - started

    got, took = asyncio.run(go())
    assert b"".join(got) == body and len(got) <= 3  # the rest in one read after the first token's
    assert took < 2 * interval  # ended with that read, not a frame later


def test_the_valve_holds_the_transport_between_frames_and_lets_go_at_the_end() -> None:
    async def go() -> tuple[list[bool], bool]:
        async with (
            Served(pieces(STREAM, 6), 0.0005) as served,
            aiohttp.ClientSession() as session,
            session.get(served.url) as response,
        ):
            transport = response.connection.transport if response.connection else None
            assert transport is not None
            valve = response_valve(response)
            reading = []
            async for _chunk in paced(response.content.iter_any(), Pacing(interval_s=0.05), valve=valve):
                reading.append(transport.is_reading())
            return reading, transport.is_closing() or transport.is_reading()

    reading, after = asyncio.run(go())
    assert reading[0]  # the first token's read: not held (the next read is at once)
    assert not any(reading[1:-1])  # every read after it held the socket until the next frame
    assert after  # not left paused: the connection goes back to the pool reading


def test_a_connection_back_in_the_pool_is_never_held_for_the_next_request() -> None:
    """aiohttp pools a connection again as soon as it has read the body's end, while the relay may still
    be writing that read on: a transport held then would hold the next request sent on it."""
    events = EVENTS[:20]  # no [DONE]: pacing stays on to the end
    interval = 10.0

    async def go() -> float:
        async with (
            Served(events, 0.005) as served,
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session,
        ):
            async with session.get(served.url) as response:
                valve = response_valve(response)
                chunks = paced(response.content.iter_any(), Pacing(interval_s=interval), valve=valve)
                got = b""
                while len(got) < sum(map(len, events)):
                    got += await anext(chunks)  # the last read: its body's end is read too
                # The reply is passed on, the stream not yet closed (a write to a slow client): the
                # pooled connection takes the next request.
                started = time.monotonic()
                async with session.get(served.url) as second:
                    assert await second.read() == b"".join(events)
                took = time.monotonic() - started
                await chunks.aclose()
            return took

    assert asyncio.run(go()) < interval / 2  # not held for a frame


def test_without_pacing_chunks_pass_as_they_come() -> None:
    writes = pieces(STREAM, 3)
    got = asyncio.run(read_paced(writes, 0.0005, UNPACED))
    assert b"".join(got) == STREAM
    assert any(not chunk.endswith(b"\n\n") for chunk in got)  # as the network cut them


def test_what_is_left_unended_at_the_end_is_passed_on() -> None:
    async def source() -> AsyncIterator[bytes]:
        for piece in (EVENTS[0], EVENTS[1][:10], EVENTS[1][10:], b"data: no end"):
            await asyncio.sleep(0)
            yield piece

    async def read() -> list[bytes]:
        return [chunk async for chunk in paced(source(), Pacing(interval_s=0.01))]

    assert asyncio.run(read()) == [EVENTS[0], EVENTS[1], b"data: no end"]


# --- the window's client (httpx, whose anyio stream pauses its transport while nobody reads) -----------


def test_the_windows_client_gets_the_first_token_at_once_then_a_frame_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Then a frame without a byte: the next token is read as it comes; and the reply's end, with the
    engine's close, is read at once, not a frame later."""
    monkeypatch.setattr(pacing, "FRAME_S", 0.5)
    words = [f"w{i} " for i in range(40)]
    sent: dict[str, float] = {}

    async def script(w: asyncio.StreamWriter) -> None:
        await start_stream(w)
        await send(w, delta(words[0]))
        await asyncio.sleep(0.05)
        for word in words[1:20]:  # as fast as the loop writes them: far inside one frame
            await send(w, delta(word))
        await asyncio.sleep(1.2)  # a frame goes by without a byte
        sent["resumed"] = time.monotonic()
        await send(w, delta(words[20]))
        await asyncio.sleep(0.4)  # not read with the rest: at once
        for word in words[21:]:
            await send(w, delta(word))
        await send(w, delta(finish="stop") + sse("[DONE]"))
        await end(w)
        sent["ended"] = time.monotonic()

    async def go() -> list[tuple[float, ChatEvent]]:
        async with engine(script) as (_stand_in, url), ChatClient(url, None) as client:
            chat = client.stream_chat([{"role": "user", "content": "hi"}])
            return [(time.monotonic(), event) async for event in chat]

    got = asyncio.run(go())
    deltas = [(t, e.content) for t, e in got if isinstance(e, ChatDelta)]
    assert "".join(text for _, text in deltas) == "".join(words) and isinstance(got[-1][1], ChatDone)
    times = [t for t, text in deltas for _word in text.split()]  # when each word came: a read is one delta
    # The first token came alone, the rest (sent well inside a frame) together with the next frame.
    assert times[1] - times[0] >= 0.3
    assert times[19] - times[1] < 0.25
    assert times[20] - sent["resumed"] < 0.25  # not held: the frame before it had nothing
    assert got[-1][0] - sent["ended"] < 0.25  # the end is read with the close, not at the frame


def test_pacing_starts_at_the_first_text_shown_not_at_a_tag_the_client_takes_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """lemon-mlx sends its reasoning inline: "<think>" is the first text delta, and the window shows
    nothing of it. Held a frame after it, the first word the user sees was late by a frame."""
    monkeypatch.setattr(pacing, "FRAME_S", 1.0)
    sent: list[float] = []

    async def script(w: asyncio.StreamWriter) -> None:
        await start_stream(w)
        await send(w, delta("<think>"))
        await asyncio.sleep(0.2)
        sent.append(time.monotonic())
        await send(w, delta("Let"))
        await asyncio.sleep(0.05)
        for word in (" me", " think", "</think>", "Sure"):
            await send(w, delta(word))
        await asyncio.sleep(1.5)  # held until the frame, not until the reply's end (read with the close)
        await send(w, delta(finish="stop") + sse("[DONE]"))
        await end(w)

    async def go() -> list[tuple[float, ChatEvent]]:
        async with (
            engine(script) as (_stand_in, url),
            ChatClient(url, None, adapter=LemonMlxAdapter()) as client,
        ):
            chat = client.stream_chat([{"role": "user", "content": "hi"}])
            return [(time.monotonic(), event) async for event in chat]

    got = asyncio.run(go())
    shown = [(t, e) for t, e in got if isinstance(e, ChatDelta)]
    assert "".join(e.reasoning for _, e in shown) == "Let me think"
    assert "".join(e.content for _, e in shown) == "Sure"
    assert shown[0][1].reasoning == "Let"
    assert shown[0][0] - sent[0] < 0.5  # at once, not a 1 s frame after "<think>"
    assert shown[1][0] - shown[0][0] >= 0.7  # the rest waited for the frame that "Let" started


def test_the_windows_client_hangs_up_mid_frame_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pacing, "FRAME_S", 60.0)

    async def script(w: asyncio.StreamWriter) -> None:
        await start_stream(w)
        for i in range(100_000):
            await send(w, delta(f"w{i} "))
            await asyncio.sleep(0.005)

    async def go() -> float:
        async with engine(script) as (stand_in, url), ChatClient(url, None) as client:
            chat = client.stream_chat([{"role": "user", "content": "hi"}])
            async for _event in chat:
                break
            await chat.aclose()  # the window's Stop, or a closed chat
            left = time.monotonic()
            await asyncio.wait_for(stand_in.hung_up.wait(), 30)
            return time.monotonic() - left

    assert asyncio.run(go()) < 30  # well inside the 60 s frame


# --- the local API, every dialect, in front of the stand-in engine --------------------------------------

CHAT = {"messages": HI, "stream": True}
DIALECT_REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "openai": ("/v1/chat/completions", CHAT),
    "lemonade": ("/api/v1/chat/completions", CHAT),
    "anthropic": ("/v1/messages", {**CHAT, "max_tokens": 4000}),
    "ollama": ("/api/chat", CHAT),
}


@pytest.mark.parametrize("dialect", list(DIALECT_REQUESTS))
def test_a_client_that_goes_away_mid_frame_stops_the_engine_at_once(
    dialect: str, standin_settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pacing, "FRAME_S", 60.0)  # the relay is surely inside a frame when the client goes
    path, request = DIALECT_REQUESTS[dialect]

    async def body(router: Router, client: httpx.AsyncClient) -> float:
        (name,) = models(router, tmp_path, "slow", tokens=2000, token_delay_s=0.01)
        raw = b""
        async with client.stream("POST", path, json={**request, "model": name}) as response:
            async for chunk in response.aiter_bytes():
                raw += chunk
                if b"tok0" in raw:
                    break  # the first token: then the connection closes
        left = time.monotonic()
        engine = router.supervisor.engines[name]
        while not any("client closed the connection" in line for line in engine.output):
            assert time.monotonic() - left < 20, "the engine went on generating"
            await asyncio.sleep(0.01)
        return time.monotonic() - left

    assert run_api(standin_settings, body) < 30  # well inside the 60 s frame


def test_the_last_events_before_done_wait_one_interval_at_most(
    standin_settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    interval = 3.0
    monkeypatch.setattr(pacing, "FRAME_S", interval)

    async def body(router: Router, client: httpx.AsyncClient) -> tuple[list[str], float, float, float]:
        (name,) = models(router, tmp_path, "quick", tokens=20, token_delay_s=0.005)
        request = {"model": name, "messages": HI, "stream": True, "stream_options": {"include_usage": True}}
        sent = time.monotonic()
        first = done = 0.0
        raw = b""
        async with client.stream("POST", "/v1/chat/completions", json=request) as response:
            async for chunk in response.aiter_bytes():
                raw += chunk
                now = time.monotonic()
                first = first or (now if b"tok0" in raw else 0.0)
                done = done or (now if b"[DONE]" in raw else 0.0)
        ended = time.monotonic()
        events = [line[6:] for line in raw.decode().split("\n") if line.startswith("data: ")]
        return events, first - sent, done - first, ended - done

    events, to_first, to_done, after_done = run_api(standin_settings, body)
    content = "".join(
        (json.loads(e)["choices"] or [{}])[0].get("delta", {}).get("content") or "" for e in events[:-1]
    )
    assert content == "".join(f"tok{i} " for i in range(20)) and events[-1] == "[DONE]"
    assert '"usage"' in events[-2]  # stream_options still honoured, its usage event last before [DONE]
    assert to_first < interval / 2  # the first token at once, not a frame later
    # The 0.1 s of tokens after the first came with the next frame, not a second one later...
    assert to_done < 2 * interval
    # ...and the stream ended with [DONE], not a frame after it.
    assert after_done < interval / 2


@pytest.mark.parametrize("dialect", ["anthropic", "ollama"])
def test_the_codec_dialects_write_once_a_frame_not_once_an_event(
    dialect: str, standin_settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pacing, "FRAME_S", 0.5)
    writes: list[bytes] = []
    write = web.StreamResponse.write

    async def counted(self: web.StreamResponse, data: bytes | bytearray | memoryview) -> None:
        writes.append(bytes(data))
        await write(self, data)

    monkeypatch.setattr(web.StreamResponse, "write", counted)
    path, request = DIALECT_REQUESTS[dialect]

    async def body(router: Router, client: httpx.AsyncClient) -> bytes:
        (name,) = models(router, tmp_path, "quick", tokens=60, token_delay_s=0.002)
        async with client.stream("POST", path, json={**request, "model": name}) as response:
            assert response.status_code == 200
            return await response.aread()

    raw = run_api(standin_settings, body)
    assert all(f"tok{i} ".encode() in raw for i in range(60))  # the whole reply, in order
    assert raw.index(b"tok59") > raw.index(b"tok0")
    with_text = [w for w in writes if b"tok" in w]
    # 60 tokens in about 0.15 s: the first at once, the rest in a frame or two, not one write each.
    assert len(with_text) <= 5, [w[:60] for w in with_text]
