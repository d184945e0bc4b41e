"""Resumable HTTP downloads: the one way the app fetches engines and models.

A download streams into ``<dest>.part`` (a stable name, so a new process resumes it after a crash),
asks for the rest with a Range request, retries resets, 5xx and stalls with backoff, verifies SHA-256,
and only then renames the file into place. Cancelling keeps the partial file: that is "pause".

The bytes move in a worker thread with a blocking ``httpx.Client``: receiving, writing and hashing
all release the GIL there, where the event loop would spend more time scheduling 64 KiB reads than
moving data (about a third of curl's speed on loopback, against better than curl's this way). Once
httpx has read the head of a plain HTTP/1.1 response with a Content-Length, the body is read
straight from its socket into one reused 1 MiB buffer; anything else goes through httpx. The
coroutine owns the thread: cancelling it stops the thread (shutting its socket if it waits) and
waits for it before returning, so nothing writes to the partial file afterwards.

A bandwidth cap (``max_bps``, for big downloads on unified memory) is kept in the same thread: after
each piece the thread waits until the bytes so far are within the cap (a wait a stop ends at once).
TCP's flow control slows the sender meanwhile. Without a cap the loop pays one ``None`` check a piece.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import io
import os
import queue
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from app.client.capped import stream_following_sync
from app.core.errors import ChecksumError, DownloadError

if TYPE_CHECKING:
    import httpx

CHUNK = 1 << 20
PROGRESS_INTERVAL_S = 0.1
SPEED_WINDOW_S = 3.0
RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
LOCAL_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EFBIG})


@dataclass(frozen=True)
class Progress:
    done: int  # bytes on disk, resumed bytes included
    total: int | None  # None while the server has not said
    speed_bps: float  # over the last few seconds
    eta_s: float | None

    @property
    def fraction(self) -> float | None:
        return self.done / self.total if self.total else None


ProgressCallback = Callable[[Progress], None]


def partial_path(dest: Path) -> Path:
    return dest.with_name(dest.name + ".part")


class _Meter:
    """Speed over a sliding window, and throttled progress reports."""

    def __init__(self, on_progress: ProgressCallback | None) -> None:
        self.on_progress = on_progress
        self.samples: list[tuple[float, int]] = []
        self.last_report = 0.0

    def update(self, done: int, total: int | None, force: bool = False) -> None:
        now = time.monotonic()
        self.samples.append((now, done))
        while len(self.samples) > 2 and now - self.samples[0][0] > SPEED_WINDOW_S:
            self.samples.pop(0)
        if self.on_progress is None or (not force and now - self.last_report < PROGRESS_INTERVAL_S):
            return
        self.last_report = now
        (t0, d0), (t1, d1) = self.samples[0], self.samples[-1]
        speed = (d1 - d0) / (t1 - t0) if t1 > t0 else 0.0
        eta = (total - done) / speed if total and speed > 0 else None
        self.on_progress(Progress(done, total, speed, eta))


def _total_from(response: httpx.Response, offset: int) -> int | None:
    if response.status_code in (206, 416):
        content_range = response.headers.get("content-range", "")
        total = content_range.rpartition("/")[2]
        # isascii too: str.isdigit() takes "²", which int() refuses; "*" (unknown) is None as well.
        return int(total) if total.isascii() and total.isdigit() else None
    length = response.headers.get("content-length")
    return int(length) + offset if length and length.isascii() and length.isdigit() else None


@dataclass
class _State:
    """What is on disk so far: the partial file's length and the running digest of its bytes."""

    hasher: hashlib._Hash
    offset: int
    total: int | None = None

    @classmethod
    def resume(cls, part: Path) -> _State:
        hasher = hashlib.sha256()
        offset = 0
        if part.exists():
            with part.open("rb") as f:
                while block := f.read(CHUNK * 4):
                    hasher.update(block)
                    offset += len(block)
        return cls(hasher, offset)

    def restart(self) -> None:
        self.hasher, self.offset = hashlib.sha256(), 0


@dataclass
class _Control:
    """Shared by the coroutine and its worker thread: a stop flag, and the socket to shut on stop."""

    stop: threading.Event = field(default_factory=threading.Event)
    sock: socket.socket | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def halt(self) -> None:
        with self.lock:
            self.stop.set()
            if self.sock is not None:
                with suppress(OSError):
                    self.sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in recv

    def watch(self, sock: socket.socket | None) -> None:
        with self.lock:
            self.sock = sock
            if sock is not None and self.stop.is_set():
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


async def fetch(
    client: httpx.Client,
    url: str,
    dest: Path,
    *,
    sha256: str | None = None,
    headers: dict[str, str] | None = None,
    on_progress: ProgressCallback | None = None,
    retries: int = 5,
    stall_timeout_s: float = 30.0,
    backoff_s: float = 0.5,
    max_bps: float | None = None,
) -> str:
    """Download ``url`` to ``dest``; returns the SHA-256 hex digest of what was written.

    ``max_bps``: at most this many bytes a second (None: as fast as the link goes).

    ``retries`` counts consecutive attempts that made no progress, so a connection that keeps
    breaking but moves forward each time still finishes.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = partial_path(dest)
    meter = _Meter(on_progress)
    state = await asyncio.to_thread(_State.resume, part)  # re-hashing gigabytes takes a while
    loop = asyncio.get_running_loop()

    last_report = 0.0

    def report(done: int, total: int | None) -> None:
        # From the worker thread: wake the loop only as often as progress is shown.
        nonlocal last_report
        now = time.monotonic()
        if now - last_report >= PROGRESS_INTERVAL_S:
            last_report = now
            loop.call_soon_threadsafe(meter.update, done, total)

    failures = 0
    while True:
        before = state.offset
        try:
            await _in_thread(client, url, part, state, headers, report, stall_timeout_s, max_bps)
            break
        except _Retryable as err:
            failures = 0 if state.offset > before else failures + 1
            if failures > retries:
                raise DownloadError(
                    f"Download of {url} failed after {retries} retries: {err}.",
                    "Check the connection and try again; the download will resume where it stopped.",
                ) from None
            await asyncio.sleep(min(backoff_s * 2 ** max(failures - 1, 0), 30.0))
    meter.update(state.offset, state.total, force=True)
    digest = state.hasher.hexdigest()
    if sha256 and digest != sha256.lower():
        part.unlink(missing_ok=True)
        raise ChecksumError(
            f"{dest.name} is corrupt: its SHA-256 is {digest}, expected {sha256.lower()}.",
            "The damaged file was deleted; try again.",
        )
    os.replace(part, dest)
    return digest


class _Retryable(Exception):
    """A failure worth another attempt: a reset, a stall, a 5xx."""


async def _in_thread(
    client: httpx.Client,
    url: str,
    part: Path,
    state: _State,
    headers: dict[str, str] | None,
    report: Callable[[int, int | None], None],
    stall_timeout_s: float,
    max_bps: float | None = None,
) -> None:
    """One attempt in a worker thread; cancelling stops the thread and waits for it."""
    control = _Control()
    throttle = _Throttle(max_bps, control.stop) if max_bps else None
    worker = asyncio.ensure_future(
        asyncio.to_thread(
            _attempt, client, url, part, state, headers, report, stall_timeout_s, control, throttle
        )
    )
    try:
        await asyncio.shield(worker)
    except asyncio.CancelledError:
        control.halt()
        await asyncio.wait([worker])
        if not worker.cancelled():
            worker.exception()  # retrieved: a failure after a stop is no news
        raise


def _attempt(
    client: httpx.Client,
    url: str,
    part: Path,
    state: _State,
    headers: dict[str, str] | None,
    report: Callable[[int, int | None], None],
    stall_timeout_s: float,
    control: _Control,
    throttle: _Throttle | None = None,
) -> None:
    import httpx

    # identity: the bytes on disk (and their SHA-256) are the file's, never a compressed form of it.
    request_headers = {"Accept-Encoding": "identity", **(headers or {})}
    if state.offset:
        request_headers["Range"] = f"bytes={state.offset}-"
    timeout = httpx.Timeout(stall_timeout_s, connect=min(stall_timeout_s, 15.0))
    try:
        with stream_following_sync(client, "GET", url, headers=request_headers, timeout=timeout) as response:
            if response.status_code == 416 and state.offset:
                if _total_from(response, 0) == state.offset:
                    state.total = state.offset  # already whole: the last run stopped before the rename
                    return
                # The partial file is no prefix of what the server has: start over.
                part.unlink(missing_ok=True)
                state.restart()
                raise _Retryable("the server refused to resume; starting over")
            if response.status_code in RETRYABLE_STATUS:
                raise _Retryable(f"HTTP {response.status_code}")
            if response.status_code >= 400:
                raise DownloadError(
                    f"Download of {url} failed: HTTP {response.status_code}.", status=response.status_code
                )
            if state.offset and response.status_code != 206:
                state.restart()  # the server ignored Range: take the whole file
            state.total = _total_from(response, state.offset)
            # Unbuffered: what was received is on disk at once, for a resume after a crash.
            with (
                part.open("r+b" if state.offset else "wb", buffering=0) as f,
                _HashPipe(state.hasher) as hashing,
            ):
                f.seek(state.offset)
                f.truncate()
                for chunk in _body(response, stall_timeout_s, control, hashing):
                    _write_all(f, chunk)
                    hashing.add(chunk)
                    state.offset += len(chunk)
                    report(state.offset, state.total)
                    if throttle is not None:
                        throttle.after(len(chunk))
                    if control.stop.is_set():
                        return
    except (httpx.HTTPError, OSError) as err:
        if control.stop.is_set():
            return
        if isinstance(err, httpx.TooManyRedirects):
            # The server answers the same way each time: another attempt would only loop again.
            raise DownloadError(
                f"Download of {url} failed: the server redirects it in a loop ({type(err).__name__}).",
                "Check the address, or try again later: the server may be misconfigured for now.",
            ) from None
        if isinstance(err, OSError) and err.errno in LOCAL_WRITE_ERRNOS:
            # The disk, not the network: another attempt would fail the same way.
            raise DownloadError(
                f"Could not write {part.name} in {part.parent}: {err.strerror}.",
                "Free some disk space there (or make it writable), then start again: the download "
                "resumes where it stopped.",
            ) from None
        raise _Retryable(type(err).__name__) from None
    if control.stop.is_set():
        return
    if state.total is not None and state.offset < state.total:
        raise _Retryable(f"the connection closed at {state.offset} of {state.total} bytes")


class _Throttle:
    """Keeps one attempt's bytes within ``bps``: waits after a piece that got ahead of the cap."""

    def __init__(self, bps: float, stop: threading.Event) -> None:
        self.bps = bps
        self.stop = stop
        self.start = time.monotonic()
        self.bytes = 0

    def after(self, n: int) -> None:
        self.bytes += n
        ahead = self.bytes / self.bps - (time.monotonic() - self.start)
        if ahead > 0:
            self.stop.wait(ahead)


def _write_all(f: io.RawIOBase, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[f.write(view) or 0 :]


class _HashPipe:
    """SHA-256 on a second thread, a few buffers behind the writes, so hashing overlaps receiving.

    Socket reads go into buffers lent by the pipe; a buffer comes back once it is hashed. Leaving
    the ``with`` block waits until everything added is hashed, so the digest always covers exactly
    the bytes written.
    """

    SLOTS = 4

    def __init__(self, hasher: hashlib._Hash) -> None:
        self.hasher = hasher
        self.free: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
        for _ in range(self.SLOTS):
            self.free.put(bytearray(CHUNK))
        self.todo: queue.SimpleQueue[bytes | memoryview | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="sha256", daemon=True)

    def __enter__(self) -> _HashPipe:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.todo.put(None)
        self.thread.join()

    def borrow(self) -> bytearray:
        return self.free.get()

    def add(self, data: bytes | memoryview) -> None:
        self.todo.put(data)

    def _run(self) -> None:
        while (data := self.todo.get()) is not None:
            self.hasher.update(data)
            if isinstance(data, memoryview) and isinstance(data.obj, bytearray):
                self.free.put(data.obj)  # a lent buffer: it can be filled again


def _body(
    response: httpx.Response, stall_timeout_s: float, control: _Control, hashing: _HashPipe
) -> Iterator[bytes | memoryview]:
    """The response body in pieces of at most CHUNK bytes."""
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    control.watch(sock)
    raw = response.iter_raw()
    length = response.headers.get("Content-Length", "")
    if (
        stream is None
        or not isinstance(sock, socket.socket)
        # Through TLS the socket must be the one that decrypts (not TLS inside a proxy's tunnel).
        or (stream.get_extra_info("ssl_object") is not None and not isinstance(sock, ssl.SSLSocket))
        or response.http_version != "HTTP/1.1"
        or not (length.isascii() and length.isdigit())
    ):
        yield from raw
        return
    # The first piece is what httpx buffered with the head; after it the socket holds the rest.
    first = next(raw, b"")
    yield first
    remaining = int(length) - len(first)
    sock.settimeout(stall_timeout_s)
    while remaining > 0:
        view = memoryview(hashing.borrow())
        n = sock.recv_into(view[: min(CHUNK, remaining)])
        if n == 0:
            return  # closed early: the caller sees a short file and tries again
        remaining -= n
        yield view[:n]
