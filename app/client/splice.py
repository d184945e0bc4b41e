"""A stream from an engine on this machine, or from a remote over plain HTTP, passed on by a thread of
its own, not by the event loop.

Paced on the loop (``app.client.pacing``), every frame still cost the local API three turns of its
loop (the timer that lets the engine's connection be read again, the read, the relay's task), two
changes to the selector, aiohttp's parser and writer and a chain of async generators: about 0.5 ms of
CPU a frame, 210-240 us per token at the 90 tok/s an engine makes on both cores of these machines,
against the 60 us allowed. A thread that sleeps until the frame is due, reads the engine's socket
once and writes the client's socket once costs the kernel's share of that and little more.

- The request goes out on a socket of its own (``open_stream``), ``Connection: close`` (llama-server
  closes a stream's connection anyway), and its answer's head is read on the loop: a refusal is
  raised there, as ``ChatClient.forward_stream`` raises it.
- Once the client's headers are out (``splice``), the thread takes the engine's socket, blocking, and
  a duplicate of the client's descriptor. It reads as the pacing says (at once until the first token,
  then one read a frame, on the monotonic clock; an engine slower than the frames, whose frame brought
  nothing, is read as its bytes come while they come a frame apart or more: 8 streams at once get
  half a token a frame each here, and relays woken every frame regardless spent 176-207 us of CPU a
  token on them, 141-167 read so, in four runs of serve_overhead.py each), takes the body out of its
  HTTP framing (chunked, a length, or up to the close), cuts it at its events' ends (``Regroup``: the
  order of the bytes never changes, a read that ends inside an event keeps its tail for the next) and
  writes each read's events as one HTTP chunk. The loop's transport does nothing meanwhile: the
  handler waits for the thread.
- ``translate`` sees every read's events in the thread (the API's figures: first token, usage,
  [DONE]) and gives what is written for them: the events as they are, or the Anthropic or Ollama
  dialect's words for them. The caller reads its state once ``splice`` has returned.
- The threads are kept for the next stream (``Workers``, one set for the API's server, ended with it):
  starting one for each stream cost its creation and end, and held the loop until the new thread ran,
  which with an engine on both cores of these machines took 1.2 ms at the median (40 streams): a stall
  of the window's loop, where the API runs beside the chat. Handing a stream to a kept thread takes
  13-21 us at the median; the OS's scheduling still makes one in ten wait 0.6-4 ms.
- Cancelling ``splice`` (the client went away, the app stops) stops the thread at once: its wait ends
  and the engine's socket is shut, which makes the engine stop generating. A client gone shows in the
  thread as a failed write, and ends it the same way.

The window's client reads such a stream the same way, on its loop (``EngineAnswer.read``):
it parses every event, so there is no thread to gain, only the wakes: the socket's low-water mark keeps
the loop from waking for each token, a timer reads what came once a frame, and the engine's close is
read at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import os
import queue
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit

from app.client.pacing import Frame, Pacing, Regroup

if TYPE_CHECKING:
    from aiohttp import web
    from aiohttp.abc import AbstractStreamWriter

CONNECT_TIMEOUT_S = 10.0
HEAD_LIMIT = 64 * 1024  # an engine's answer head is a few hundred bytes
CHUNK_LINE_LIMIT = 1024  # a chunk's size line
CHUNK_LIMIT = 16 << 20  # no engine's event comes near
READ_BYTES = 256 * 1024
# A paced read returns early once this much is in (a frame of tokens is well under 1 KiB).
HELD_BYTES = 64 * 1024
WRITE_WAIT_S = 0.1  # a full client socket is waited on in steps of this, so that a stop is seen
IDLE_S = 60.0  # a relay thread that has had no stream to pass on for this long ends


class BodyError(Exception):
    """An engine's answer that is not HTTP as it should be."""


class Body(Protocol):
    """An HTTP body's framing, taken off as its bytes come."""

    ended: bool

    def feed(self, data: bytes) -> bytes:
        """The body's bytes in ``data`` (what follows the body's end is dropped)."""
        ...

    def eof(self) -> None:
        """The connection closed: raises BodyError when the body was not over."""
        ...


class Chunked:
    """``Transfer-Encoding: chunked``, as llama-server streams."""

    def __init__(self) -> None:
        self.ended = False
        self._buffer = b""
        self._left = 0  # bytes of the chunk being read still to come
        self._after_data = False  # its CRLF is next

    def feed(self, data: bytes) -> bytes:
        buffer = self._buffer + data if self._buffer else data
        at, out = 0, []
        while not self.ended:
            if self._left:
                piece = buffer[at : at + self._left]
                out.append(piece)
                at += len(piece)
                self._left -= len(piece)
                if self._left:
                    break
                self._after_data = True
            if self._after_data:
                if len(buffer) - at < 2:
                    break
                if buffer[at : at + 2] != b"\r\n":
                    raise BodyError("a chunk of the engine's answer did not end where its size said")
                at += 2
                self._after_data = False
            line_end = buffer.find(b"\r\n", at, at + CHUNK_LINE_LIMIT)
            if line_end < 0:
                if len(buffer) - at >= CHUNK_LINE_LIMIT:
                    raise BodyError("a chunk size line of the engine's answer is too long")
                break
            size_text = buffer[at:line_end].split(b";", 1)[0].strip()
            if not size_text or size_text.strip(b"0123456789abcdefABCDEF"):
                raise BodyError("a chunk size of the engine's answer is not a hexadecimal number")
            size = int(size_text, 16)
            if size > CHUNK_LIMIT:
                raise BodyError("a chunk of the engine's answer is too large")
            at = line_end + 2
            if size == 0:
                self.ended = True  # trailers, if any, are dropped with the connection
            self._left = size
        self._buffer = buffer[at:] if not self.ended else b""
        return b"".join(out)

    def eof(self) -> None:
        if not self.ended:
            raise BodyError("the engine closed the connection inside its answer")


class Length:
    """``Content-Length``."""

    def __init__(self, length: int) -> None:
        self._left = length
        self.ended = length == 0

    def feed(self, data: bytes) -> bytes:
        piece = data[: self._left]
        self._left -= len(piece)
        self.ended = self._left == 0
        return piece

    def eof(self) -> None:
        if not self.ended:
            raise BodyError("the engine closed the connection inside its answer")


class UpToClose:
    """No length given: the body is what comes until the engine closes the connection (HTTP/1.0, and
    Python's http.server streaming as mlx-lm's does)."""

    ended = False

    def feed(self, data: bytes) -> bytes:
        return data

    def eof(self) -> None:
        self.ended = True


@dataclass
class EngineAnswer:
    """An engine's answer to one request, its head read: the body is still to come on ``sock``."""

    sock: socket.socket
    status: int
    reason: str
    body: Body
    rest: bytes  # body bytes that came with the head
    data_received: Callable[[], None] | None = None  # called in the thread, with each read
    finished: Callable[[], None] | None = None  # called on the loop, once, when the answer is done with
    _closed: bool = field(default=False, repr=False)
    _reader: _LoopReader | None = field(default=None, repr=False)

    async def read_upto(self, limit: int) -> bytes:
        """The body, up to ``limit`` bytes (a refusal's), read on the loop."""
        loop = asyncio.get_running_loop()
        out = self.body.feed(self.rest)
        while not self.body.ended and len(out) < limit:
            data = await loop.sock_recv(self.sock, READ_BYTES)
            if not data:
                with contextlib.suppress(BodyError):
                    self.body.eof()
                break
            out += self.body.feed(data)
        return out[:limit]

    async def read(self, frame: Frame) -> bytes:
        """The body's next bytes, read on the loop (b"" once it is over): as they come until ``frame``
        is on, then once a frame (``_LoopReader``)."""
        if self._reader is None:
            self._reader = _LoopReader(self.sock)
        while not self.body.ended:
            if self.rest:
                data, self.rest = self.rest, b""
            else:
                paced = frame.on and frame.interval_s > 0
                data = await self._reader.read(frame.due() if paced else None)
                frame.read()
            if not data:
                self.body.eof()  # raises BodyError when the engine broke off
                break
            if out := self.body.feed(data):
                return out
        return b""

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._reader is not None:
            self._reader.close()
        self.sock.close()
        if self.finished is not None:
            self.finished()


class _LoopReader:
    """A socket read on the loop a frame at a time, its reader registered for as long as it is read.

    Paced, the socket's low-water mark (``HELD_BYTES``) keeps it from being readable until far more than
    a frame of tokens is in, or the engine closes the connection (a reply's last events are then read
    at once); a timer takes what came when the frame is due. One wake of the loop a frame, with no
    selector change: a frame without a byte lowers the mark, so the next byte is read as it comes, and
    the ones after it while they come a frame apart or more (an engine slower than the frames: one wake
    a token, not one for an empty frame and one for the token). Unpaced, every byte is read as it comes."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._loop = asyncio.get_running_loop()
        self._got = bytearray()
        self._over = (
            False  # no longer watched: the connection closed or broke (``_error``), or the reader did
        )
        self._error: OSError | None = None
        self._held = 1
        self._slow = False  # a frame came without a byte: bytes are read as they come (``_Relay``'s)
        self._waiter: asyncio.Future[None] | None = None
        self._loop.add_reader(sock.fileno(), self._take)

    async def read(self, due: float | None) -> bytes:
        """What came since the last read, once there is some: at ``due`` (the loop's time), or before
        it when the engine closes the connection; at once with None."""
        if not self._got and not self._over:
            paced = due is not None and not self._slow
            if paced and self._held == 1:
                self._hold(HELD_BYTES)
            elif not paced and self._held != 1:
                self._hold(1)
            self._waiter = self._loop.create_future()
            timer = self._loop.call_at(due, self._due) if paced and due is not None else None
            try:
                await self._waiter
            finally:
                self._waiter = None
                if timer is not None:
                    timer.cancel()
        if self._got:
            if self._slow and due is not None and self._loop.time() < due:
                self._slow = False  # sooner than a frame after the last read: paced again
            data, self._got = bytes(self._got), bytearray()
            return data
        if self._error is not None:
            raise self._error
        return b""

    def close(self) -> None:
        if not self._over:
            self._over = True
            self._loop.remove_reader(self._sock.fileno())

    def _due(self) -> None:
        if not self._take():  # nothing came in the frame: the next byte is read as it comes
            self._slow = True
            self._hold(1)

    def _take(self) -> bool:
        """Read what the socket holds, however little (MSG_DONTWAIT: BSD's kernel, so macOS's, gives a
        non-blocking read nothing below the low-water mark otherwise); False when it held nothing."""
        try:
            data = self._sock.recv(READ_BYTES, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as err:
            self._error, data = err, b""
        if data:
            self._got += data
        else:
            self.close()  # the end: readable from now on, so no longer watched
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        return True

    def _hold(self, held: int) -> None:
        self._held = held
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, held)


def plain_http_address(base_url: str) -> tuple[str, int] | None:
    """The host and port of a server at ``base_url`` that speaks plain HTTP: an engine on this machine's
    loopback, or a remote at an ``http://`` address. Its streams are read from a socket of their own;
    None for anything else (HTTPS: httpx and aiohttp read those)."""
    parts = urlsplit(base_url)
    if parts.scheme != "http" or not parts.hostname:
        return None
    try:
        port = parts.port or 80
    except ValueError:
        return None
    return parts.hostname, port


async def open_stream(
    address: tuple[str, int], path: str, body: bytes, headers: dict[str, str]
) -> EngineAnswer:
    """POST ``body`` (JSON) to ``path`` on a new connection to ``address`` (an IP address, or a host
    name, looked up) and read the answer's head."""
    loop = asyncio.get_running_loop()
    host, port = address
    sock = await asyncio.wait_for(_connect(host, port), CONNECT_TIMEOUT_S)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        named = f"[{host}]" if ":" in host else host
        lines = [
            f"POST {path} HTTP/1.1",
            f"Host: {named}:{port}",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
            "Connection: close",
            *(f"{name}: {value}" for name, value in headers.items() if name.lower() != "connection"),
        ]
        await loop.sock_sendall(sock, ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        data = b""
        while (end := data.find(b"\r\n\r\n")) < 0:
            if len(data) > HEAD_LIMIT:
                raise BodyError("the engine's answer head is too long")
            more = await loop.sock_recv(sock, READ_BYTES)
            if not more:
                raise ConnectionResetError("the engine closed the connection before it answered")
            data += more
        return _answer(sock, data[:end].decode("latin-1"), data[end + 4 :])
    except BaseException:
        sock.close()
        raise


async def _connect(host: str, port: int) -> socket.socket:
    """A non-blocking socket connected to ``host``: an IP address as it is, a name at each address it
    has in turn (as the resolver orders them) until one answers."""
    loop = asyncio.get_running_loop()
    try:
        version = ipaddress.ip_address(host).version
    except ValueError:
        try:
            found = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
        except UnicodeError as err:  # a name no resolver takes (an empty label, one over 63 letters)
            raise OSError(f"{host} is not a host name ({err})") from None
        addresses = [(family, address) for family, _, _, _, address in found]
    else:
        addresses = [(socket.AF_INET6 if version == 6 else socket.AF_INET, (host, port))]
    failure: OSError = OSError(f"{host} has no address")
    for family, address in addresses:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, address)
            return sock
        except OSError as err:
            sock.close()
            failure = err
        except BaseException:
            sock.close()
            raise
    raise failure


def _answer(sock: socket.socket, head: str, rest: bytes) -> EngineAnswer:
    status_line, *lines = head.split("\r\n")
    version, _, said = status_line.partition(" ")
    code, _, reason = said.partition(" ")
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise BodyError("the engine's answer is not HTTP/1")
    fields: dict[str, str] = {}
    for line in lines:
        name, colon, value = line.partition(":")
        if not colon:
            raise BodyError("a header line of the engine's answer has no colon")
        fields[name.strip().lower()] = value.strip()
    body: Body
    if "chunked" in fields.get("transfer-encoding", "").lower():
        body = Chunked()
    elif "content-length" in fields:
        length = fields["content-length"]
        if not length.isdigit():
            raise BodyError("the engine's answer has a Content-Length that is not a number")
        body = Length(int(length))
    else:
        body = UpToClose()
    return EngineAnswer(sock, int(code), reason, body, rest)


class _ClientGone(Exception):
    pass


def _as_it_is(events: bytes) -> bytes:
    return events


def _never() -> bool:
    return False


_Job = tuple[Callable[[], None], Callable[[], None]]  # a job, and what follows it


class Workers:
    """Threads that each run one job at a time and then wait ``idle_s`` for the next: a job goes to an
    idle thread, or to a new one when none is idle, so every job given runs at once. A job's ``then``
    runs in its thread once the thread is idle again (a job that raised ends its thread), so a caller
    told by ``then`` that its job is over finds the thread free for the next. Once closed, the idle
    threads end, and each of the others when its job ends. Daemons, as the thread once started for each
    job was: none holds the app's exit."""

    def __init__(self, name: str, idle_s: float = IDLE_S) -> None:
        self._name = name
        self._idle_s = idle_s
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[_Job | None]] = []  # each idle thread's jobs
        self._closed = False

    def run(self, job: Callable[[], None], then: Callable[[], None]) -> None:
        with self._lock:
            jobs = self._idle.pop() if self._idle else None
        if jobs is None:
            jobs = queue.SimpleQueue()
            threading.Thread(target=self._work, args=(jobs,), name=self._name, daemon=True).start()
        jobs.put((job, then))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for jobs in idle:
            jobs.put(None)

    def _work(self, jobs: queue.SimpleQueue[_Job | None]) -> None:
        while (given := self._next(jobs)) is not None:
            job, then = given
            try:
                job()
            except BaseException:
                then()
                raise
            with self._lock:
                closed = self._closed
                if not closed:
                    self._idle.append(jobs)
            then()
            if closed:
                return

    def _next(self, jobs: queue.SimpleQueue[_Job | None]) -> _Job | None:
        """This thread's next job; None once it has waited ``idle_s`` for one, or when closed."""
        try:
            return jobs.get(timeout=self._idle_s)
        except queue.Empty:
            with self._lock:
                if jobs in self._idle:
                    self._idle.remove(jobs)
                    return None
            return jobs.get()  # ``run`` took this thread as its wait ended: the job is on its way


async def splice(
    answer: EngineAnswer,
    response: web.StreamResponse,
    writer: AbstractStreamWriter,
    pacing: Pacing,
    relays: Workers,
    translate: Callable[[bytes], bytes] = _as_it_is,
    enough: Callable[[], bool] = _never,
) -> bool:
    """Pass ``answer``'s body on to the client of ``response`` (prepared: ``writer`` is what its prepare
    gave), in the response's framing, paced, from a thread of ``relays``; True once the body is over,
    False when the client went away first. ``translate`` makes each read's events (whole) into what is
    written for them, in the thread (the API's figures are read there, and another dialect's words
    written); what it raises is raised here. ``enough`` says, after each read, that the stream is to end
    here (a stop sequence met): the engine's connection then closes, which stops it. ``answer`` is
    closed whatever ends it."""
    loop = asyncio.get_running_loop()
    try:
        transport = writer.transport
        client = transport.get_extra_info("socket") if transport is not None else None
        if transport is None or client is None or transport.is_closing():
            return False
        writer.send_headers()
        # The thread writes the socket itself: what the transport holds goes first (the headers, at
        # once unless the client reads nothing at all).
        deadline = loop.time() + CONNECT_TIMEOUT_S
        while transport.get_write_buffer_size():
            if transport.is_closing() or loop.time() > deadline:
                return False
            await asyncio.sleep(0.005)
        out = os.dup(client.fileno())  # its own descriptor: the loop may close the transport's meanwhile
        chunked = response.headers.get("Transfer-Encoding") == "chunked"  # HTTP/1.1's framing
        relay = _Relay(answer, out, chunked, pacing, translate, enough)
        done: asyncio.Future[bool] = loop.create_future()
        relays.run(relay.run, functools.partial(relay.settle, loop, done))
        try:
            over = await asyncio.shield(done)
        finally:
            if not done.done():  # cancelled: stopped at once, and waited for (``translate``'s state is ours)
                relay.stop()
                with contextlib.suppress(asyncio.CancelledError):
                    await done
        if relay.failed is not None:
            raise relay.failed
        return over
    finally:
        answer.close()


class _Relay:
    """One stream's thread: the engine's socket read as ``pacing`` says, the client's written."""

    def __init__(
        self,
        answer: EngineAnswer,
        out: int,
        chunked: bool,
        pacing: Pacing,
        translate: Callable[[bytes], bytes],
        enough: Callable[[], bool],
    ) -> None:
        self._answer = answer
        self._out = out
        self._chunked = chunked
        self._frame = pacing.frame(time.monotonic)
        self._events = Regroup(pacing, self._frame)
        self._translate = translate
        self._enough = enough
        self._stopped = threading.Event()
        self.failed: Exception | None = None  # what ``translate`` raised
        self.over = False  # the body came to its end

    def stop(self) -> None:
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._answer.sock.shutdown(socket.SHUT_RDWR)  # ends a read under way

    def run(self) -> None:
        try:
            self.over = self._relay()
        except (_ClientGone, BodyError):
            pass
        except Exception as err:  # translate's: raised on the loop, by splice
            self.failed = err
        finally:
            os.close(self._out)

    def settle(self, loop: asyncio.AbstractEventLoop, done: asyncio.Future[bool]) -> None:
        """Tell the loop the relay is over (its thread is free by then: ``Workers``)."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(_settle, done, self.over)

    def _relay(self) -> bool:
        answer, frame, stopped = self._answer, self._frame, self._stopped
        sock = answer.sock
        sock.setblocking(True)
        body, data = answer.body, answer.rest
        poller = select.poll()
        poller.register(self._out, select.POLLOUT)
        wait_s = 0.0  # how long a read waits for a frame's worth (``_pace``): 0, as bytes come
        slow = False  # a frame came without a byte: the engine is slower than the frames
        while not body.ended:
            if not data:
                if (wanted := frame.interval_s if frame.on and not slow else 0.0) != wait_s:
                    wait_s = wanted
                    _pace(sock, wait_s)
                try:
                    data = _read(sock)
                except BlockingIOError:
                    slow = True  # the frame's last read stands: the next byte comes a frame after it
                    continue
                except OSError:
                    data = b""
                if stopped.is_set():
                    return False
                if slow:  # read as they come while they come a frame apart or more
                    slow = frame.clock() >= frame.due()
                frame.read()
                if not data:
                    body.eof()  # raises BodyError when the engine broke off
                    break
            whole = self._events.feed(body.feed(data))
            data = b""
            if whole:
                if answer.data_received is not None:
                    answer.data_received()
                self._write(self._translate(whole), poller)
                if self._enough():
                    return True
        if self._events.held:
            self._write(self._translate(self._events.held), poller)
        return True

    def _write(self, data: bytes, poller: select.poll) -> None:
        if not data:
            return
        framed = b"%x\r\n%b\r\n" % (len(data), data) if self._chunked else data
        view = memoryview(framed)
        while view:
            try:
                view = view[os.write(self._out, view) :]
                continue
            except BlockingIOError:
                pass  # the client's socket is full (the descriptor is the loop's: non-blocking)
            except OSError:
                raise _ClientGone from None
            while not poller.poll(WRITE_WAIT_S * 1000):
                if self._stopped.is_set():
                    raise _ClientGone


def _pace(sock: socket.socket, interval_s: float) -> None:
    """Make a read of ``sock`` wait for a frame's worth: until ``HELD_BYTES`` are in, the interval is
    over, or the engine closes the connection (so a reply's last events, sent with its end, are never
    held), with one wake of the thread, not one per token; 0 reads as bytes come."""
    held = HELD_BYTES if interval_s > 0 else 1
    seconds = int(interval_s)
    timeout = struct.pack("ll", seconds, int((interval_s - seconds) * 1_000_000))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, held)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeout)


def _read(sock: socket.socket) -> bytes:
    """One read of a paced socket. At the frame's end Linux gives what came, however little; a kernel
    whose timed-out read gives nothing while less than ``HELD_BYTES`` came (BSD's can, so macOS may:
    not tried here) says EWOULDBLOCK, and what came is then taken without waiting."""
    try:
        return sock.recv(READ_BYTES)
    except BlockingIOError:
        return sock.recv(READ_BYTES, socket.MSG_DONTWAIT)


def _settle(done: asyncio.Future[bool], over: bool) -> None:
    if not done.done():
        done.set_result(over)
