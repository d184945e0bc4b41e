"""Frame pacing: a stream read at most once per display frame after its first token, not once per token.

An engine writes one event per token; read as they come, every token costs the reader a wake of the
event loop, a socket read, a parse and a write (about 0.2 ms of CPU here), and on a machine whose
cores the engine uses, that time is taken from the engine. Nobody reads faster than a screen redraws,
so after the first token (passed on at once: the time to first token is unchanged) the socket is left
alone for ``FRAME_S`` and then read once: everything that arrived meanwhile comes in one read and
goes on in one write. Wakes per second are then bounded by the frame rate, not by the engine's speed.

The kernel holds what arrives meanwhile, so the loop does not even look at the socket. The window's
client reads a local engine's socket itself, once a frame (``app.client.splice``); under httpx (a
remote), anyio's streams pause their transport whenever nobody is reading, and the connection's reads
wait for the frame (``paced_network``). The local API passes a local engine's stream on from a thread
that reads it once a frame (``app.client.splice``); over aiohttp (``ChatClient.forward_stream``: its relay
to a remote, and of a stream it rewrites) a ``TransportValve`` pauses the connection's transport after
each read and a loop timer resumes it when the next frame is due; the relay's task is not held, it
simply waits for data, so a client that goes away cancels it at once. The valve only ever pauses a
connection that is still its response's: once aiohttp has read a body's end it puts the connection
back in its pool, and a transport paused there holds the next request sent on it for a frame; and it
never resumes a transport aiohttp's own flow control paused (its parser may hold a tail that only
aiohttp's resume reads).

Events are passed on whole: a read that ends inside an event keeps its tail for the next read (a
client that takes each chunk for whole events is not broken by pacing), and what is left when the
stream ends is passed on as it is. The order of the bytes never changes; only their grouping does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

# 25 reads a second: the rate at which text still reads as smooth, and at the 150-500 tok/s these
# engines reach 6-20 times fewer wakes than one per token. The window's client on the real llama-server
# (stream_overhead.py, CPU per token): 168 us before it read the socket itself, then 81 at 25 ms and 56
# at 40 ms. A local engine's stream, in the window or spliced by the local API, is read at once when
# the engine closes it, so a reply's last tokens are not held for the frame; a remote's (and a stream
# the API rewrites) may be, which a client timing a 1-2 s reply sees as up to 2-4% less decode speed.
# 0 turns pacing off.
FRAME_S = 0.040
# An event this long is passed on in pieces rather than held whole (no engine's event comes near).
HELD_LIMIT = 1 << 20
# A delta with text in it, as llama-server writes JSON (no spaces) and as Python's json module does; a
# Responses API stream's deltas are strings ("delta":"..."), a chat stream's objects ("delta":{...}).
TOKEN_MARKS = tuple(
    f'"{key}"{colon}"'.encode()
    for key in ("content", "text", "reasoning_content", "delta")
    for colon in (":", ": ")
)


def has_text_delta(data: bytes) -> bool:
    """``data`` holds an OpenAI event with a token in it (a non-empty text delta)."""
    for mark in TOKEN_MARKS:
        at = data.find(mark)
        if at >= 0 and data[at + len(mark) : at + len(mark) + 1] != b'"':
            return True
    return False


def never(_data: bytes) -> bool:
    return False


@dataclass(frozen=True, slots=True)
class Pacing:
    """How one dialect's stream is paced: where its events end, what counts as its first token (pacing
    starts after it), and what says the stream is over (read at once: nothing more is coming but the end)."""

    boundary: bytes = b"\n\n"  # SSE's blank line; NDJSON's is b"\n"
    started: Callable[[bytes], bool] = has_text_delta
    finished: Callable[[bytes], bool] = never
    interval_s: float | None = None  # None: FRAME_S as it is when the stream starts

    def frame(self, clock: Callable[[], float] | None = None) -> Frame:
        """The pacing of one stream, about to start (``clock``: as ``Frame``'s)."""
        interval = FRAME_S if self.interval_s is None else self.interval_s
        return Frame(interval) if clock is None else Frame(interval, clock)


def openai_done(data: bytes) -> bool:
    return data.endswith(b"data: [DONE]\n\n")


OPENAI_SSE = Pacing(finished=openai_done)  # chat and completions streams, and the Responses API's
# The same, started by its reader (``Frame.start``) at the first text it shows: a delta whose text the
# reader takes out (lemon-mlx's "<think>" tag) is not the first token, and a frame's wait after it was
# all of lemon-mlx's time to first token through the window's client (+27 ms over 10 replies).
OPENAI_SSE_SHOWN = Pacing(started=never, finished=openai_done)
UNPACED = Pacing(interval_s=0)  # every chunk passed on as it comes


def loop_time() -> float:
    return asyncio.get_running_loop().time()


class Frame:
    """When a stream's next read may be: at once until its first token has gone by, then no sooner than
    an interval after the last read, until its end is in (``on`` is the pacing's switch). Times are the
    running loop's, or ``clock``'s for a reader in a thread of its own (``app.client.splice``)."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = loop_time) -> None:
        self.interval_s = interval_s
        self.on = False
        self.clock = clock
        self._read_at = 0.0

    def due(self) -> float:
        """When the next read may be, in the clock's time."""
        return self._read_at + self.interval_s

    def delay(self) -> float:
        """How long the next read waits from now (0 when pacing is off or the interval is over)."""
        return max(self.due() - self.clock(), 0.0) if self.on else 0.0

    async def wait(self) -> None:
        """Until the next read is due."""
        if delay := self.delay():
            await asyncio.sleep(delay)

    def read(self) -> None:
        """A read of the network ended now."""
        self._read_at = self.clock()

    def start(self) -> None:
        """The first token has gone by (for a reader whose pacing's ``started`` never says so itself):
        the next read waits an interval from now."""
        self.on = True
        self.read()


class Regroup:
    """A stream's bytes cut at its events' ends: ``feed`` gives back the events a read completed and
    keeps the tail of one it ended inside (``held``, passed on as it is when the stream ends); it
    starts ``frame`` at the first token and stops it at the end (only the end is then to come)."""

    def __init__(self, pacing: Pacing, frame: Frame) -> None:
        self.pacing = pacing
        self.frame = frame
        self.held = b""

    def feed(self, chunk: bytes) -> bytes:
        pacing, frame = self.pacing, self.frame
        data = self.held + chunk if self.held else chunk
        cut = data.rfind(pacing.boundary) + len(pacing.boundary)
        if cut >= len(pacing.boundary):
            whole, self.held = data[:cut], data[cut:]
        elif len(data) >= HELD_LIMIT:
            whole, self.held = data, b""
        else:
            whole, self.held = b"", data
        if whole and not frame.on and pacing.started(whole):
            frame.start()  # the first token's read: the next one waits a frame from now
        if whole and pacing.finished(whole):
            frame.on = False  # only the end is to come: read at once
        return whole


class Valve(Protocol):
    """What holds back one connection's reads between frames."""

    def hold(self, until: float) -> None:
        """Read nothing more until ``until`` (the loop's time), if the connection is still the reader's."""
        ...

    def release(self) -> None:
        """Read again now (the stream is over, or its reader went away)."""
        ...


class TransportValve:
    """Holds back an asyncio transport's reading: paused by ``hold``, resumed by a loop timer at the time
    given, or by ``release``. ``ours`` says whether the transport may be paused now (still the reader's,
    and not paused by its own flow control, which resumes it itself); a pause is resumed only by its
    own valve, so the valve never undoes a pause it did not make."""

    def __init__(self, transport: ReadTransport, ours: Callable[[], bool]) -> None:
        self._transport = transport
        self._ours = ours
        self._timer: asyncio.TimerHandle | None = None

    def hold(self, until: float) -> None:
        if self._timer is not None or not self._ours() or not self._transport.is_reading():
            return
        self._transport.pause_reading()
        self._timer = asyncio.get_running_loop().call_at(until, self.release)

    def release(self) -> None:
        if self._timer is None:
            return
        self._timer.cancel()
        self._timer = None
        if not self._transport.is_closing():
            self._transport.resume_reading()


class ReadTransport(Protocol):
    """An asyncio transport's reading side."""

    def is_reading(self) -> bool: ...

    def is_closing(self) -> bool: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class NetworkStream(Protocol):
    """httpcore's network stream: what one connection reads from."""

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes: ...


@contextlib.contextmanager
def paced_network(stream: NetworkStream, frame: Frame) -> Iterator[None]:
    """Make the reads of one response's connection (httpx: ``response.extensions["network_stream"]``)
    wait for ``frame``, while the response is read. httpx hands a read's HTTP chunks over one at a time,
    so pacing them would hold back chunks that are already here; pacing the reads holds back none."""
    read = stream.read

    async def paced_read(max_bytes: int, timeout: float | None = None) -> bytes:
        await frame.wait()
        try:
            return await read(max_bytes, timeout)
        finally:
            frame.read()

    stream.read = paced_read  # type: ignore[method-assign]
    try:
        yield
    finally:
        stream.read = read  # type: ignore[method-assign]


async def paced(
    chunks: AsyncIterator[bytes],
    pacing: Pacing = OPENAI_SSE,
    frame: Frame | None = None,
    reads_wait: bool = False,
    valve: Valve | None = None,
) -> AsyncGenerator[bytes, None]:
    """``chunks`` in the same order, regrouped: read at once until the first token has gone by, then at
    most once per interval, each group ending at an event's end. ``reads_wait``: the network reads
    behind ``chunks`` wait for ``frame`` themselves (httpx: ``paced_network``), so nothing waits here;
    a ``valve`` (aiohttp) holds the connection's reads from each read to the next frame, so nothing
    waits here either. Otherwise the wait is here. Cancelling (a client that went away) ends a wait at
    once; the valve is released whatever ends the stream."""
    frame = frame or pacing.frame()
    source = aiter(chunks)
    if frame.interval_s <= 0:
        async for chunk in source:
            yield chunk
        return
    events = Regroup(pacing, frame)
    waits = not reads_wait and valve is None
    try:
        while True:
            if waits:
                await frame.wait()
            try:
                chunk = await anext(source)
            except StopAsyncIteration:
                break
            if not reads_wait:
                frame.read()
            whole = events.feed(chunk)
            if valve is not None and frame.on:
                valve.hold(frame.due())  # the kernel keeps what comes until the next frame
            if whole:
                yield whole
        if events.held:
            yield events.held
    finally:
        if valve is not None:
            valve.release()
        if isinstance(source, AsyncGenerator):  # closed on the loop, not by the garbage collector
            await source.aclose()
