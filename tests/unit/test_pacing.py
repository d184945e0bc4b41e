"""Frame pacing (app/client/pacing.py): over a real loopback HTTP stream read with aiohttp, through the
local API in front of the stand-in engine (a real child process that answers like llama-server), and in
the window's client (httpx) against a scripted loopback engine: nothing reordered, events passed on
whole, the first token at once, a client that goes away mid-frame stops the engine at once, and the end
of a reply never waits a second interval."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import httpx
import pytest
from aiohttp import web

from app.client import pacing
from app.client.chat import ChatClient
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


async def read_paced(writes: list[bytes], gap_s: float, how: Pacing) -> list[bytes]:
    """Serve ``writes`` on loopback as one chunked HTTP body (``gap_s`` apart) and read it paced."""

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        for piece in writes:
            await response.write(piece)
            await asyncio.sleep(gap_s)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/") as response:
            return [chunk async for chunk in paced(response.content.iter_any(), how)]
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("seed", [1, 2])
def test_events_are_never_reordered_and_split_events_are_joined(seed: int) -> None:
    writes = pieces(STREAM, seed)
    got = asyncio.run(read_paced(writes, 0.0005, Pacing(interval_s=0.02)))
    assert b"".join(got) == STREAM
    assert all(chunk.endswith(b"\n\n") for chunk in got)  # no event cut in two
    assert len(got) < len(writes) / 4  # grouped: far fewer reads than writes


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


def test_a_client_that_goes_away_mid_frame_stops_the_engine_at_once(
    standin_settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pacing, "FRAME_S", 60.0)  # the relay is surely waiting for its next frame

    async def body(router: Router, client: httpx.AsyncClient) -> float:
        (name,) = models(router, tmp_path, "slow", tokens=2000, token_delay_s=0.01)
        request = {"model": name, "messages": HI, "stream": True}
        async with client.stream("POST", "/v1/chat/completions", json=request) as response:
            async for chunk in response.aiter_bytes():
                if b'"content"' in chunk:
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

    async def body(router: Router, client: httpx.AsyncClient) -> tuple[list[str], float, float]:
        (name,) = models(router, tmp_path, "quick", tokens=20, token_delay_s=0.005)
        request = {"model": name, "messages": HI, "stream": True, "stream_options": {"include_usage": True}}
        first = done = 0.0
        raw = b""
        async with client.stream("POST", "/v1/chat/completions", json=request) as response:
            async for chunk in response.aiter_bytes():
                raw += chunk
                now = time.monotonic()
                first = first or (now if b'"content"' in raw else 0.0)
                done = done or (now if b"[DONE]" in raw else 0.0)
        ended = time.monotonic()
        events = [line[6:] for line in raw.decode().split("\n") if line.startswith("data: ")]
        return events, done - first, ended - done

    events, to_done, after_done = run_api(standin_settings, body)
    content = "".join(
        (json.loads(e)["choices"] or [{}])[0].get("delta", {}).get("content") or "" for e in events[:-1]
    )
    assert content == "".join(f"tok{i} " for i in range(20)) and events[-1] == "[DONE]"
    assert '"usage"' in events[-2]  # stream_options still honoured, its usage event last before [DONE]
    # The 0.1 s of tokens after the first came with the next frame, not a second one later...
    assert to_done < 2 * interval
    # ...and the stream ended with [DONE], not a frame after it.
    assert after_done < interval / 2


# --- the window's client (httpx, whose anyio stream pauses its transport while nobody reads) -----------


def test_the_windows_client_gets_the_first_token_at_once_then_a_frame_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pacing, "FRAME_S", 0.5)
    words = [f"w{i} " for i in range(40)]

    async def script(w: asyncio.StreamWriter) -> None:
        await start_stream(w)
        await send(w, delta(words[0]))
        await asyncio.sleep(0.05)
        for word in words[1:]:  # as fast as the loop writes them: far inside one frame
            await send(w, delta(word))
        await send(w, delta(finish="stop") + sse("[DONE]"))
        await end(w)

    async def go() -> list[tuple[float, ChatEvent]]:
        async with engine(script) as (_stand_in, url), ChatClient(url, None) as client:
            chat = client.stream_chat([{"role": "user", "content": "hi"}])
            return [(time.monotonic(), event) async for event in chat]

    got = asyncio.run(go())
    texts = [e.content for _, e in got if isinstance(e, ChatDelta)]
    assert texts == words and isinstance(got[-1][1], ChatDone)
    times = [t for t, e in got if isinstance(e, ChatDelta)]
    # The first token came alone, the rest (sent well inside a frame) together with the next frame.
    assert times[1] - times[0] >= 0.3
    assert times[-1] - times[1] < 0.25


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
