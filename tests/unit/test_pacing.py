"""Frame pacing (app/client/pacing.py): over a real loopback HTTP stream read with aiohttp, and in the
window's client (httpx) against a scripted loopback engine: nothing reordered, events passed on whole,
the first token at once and the rest with the next frame, and a client that goes away mid-frame hangs
up at once."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from app.client import pacing
from app.client.adapters import LemonMlxAdapter
from app.client.chat import ChatClient
from app.client.events import ChatDelta, ChatDone, ChatEvent
from app.client.pacing import UNPACED, Pacing, paced
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


def test_pacing_starts_at_the_first_text_shown_not_at_a_tag_the_client_takes_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """lemon-mlx sends its reasoning inline: "<think>" is the first text delta, and the window shows
    nothing of it. Held a frame after it, the first word the user sees was late by a frame."""
    monkeypatch.setattr(pacing, "FRAME_S", 3.0)
    sent: list[float] = []

    async def script(w: asyncio.StreamWriter) -> None:
        await start_stream(w)
        await send(w, delta("<think>"))
        await asyncio.sleep(0.2)
        sent.append(time.monotonic())
        await send(w, delta("Let"))
        await asyncio.sleep(0.2)
        for word in (" me", " think", "</think>", "Sure"):
            await send(w, delta(word))
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
    assert shown[0][0] - sent[0] < 1.5  # at once, not a 3 s frame after "<think>"
    assert shown[1][0] - shown[0][0] >= 2.0  # the rest waited for the frame that "Let" started


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
