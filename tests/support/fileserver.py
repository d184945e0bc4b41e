"""A loopback HTTP file server with Range support that can misbehave on purpose.

Faults are armed per path and fire once each: cut the connection after N bytes, stall, send wrong
bytes, answer an HTTP error, ignore Range, or hold the connection open after N bytes. Every request is
logged for assertions. ``routes`` answer from the query string (for APIs such as a search).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote


@dataclass
class Fault:
    cut_after: int | None = None  # close the connection after this many body bytes
    stall_s: float = 0.0  # sleep this long before the first body byte
    corrupt: bool = False  # flip the bytes of the body
    status: int | None = None  # answer this status with no body (or a ``status_body``)
    status_body: int = 0  # with ``status``: a body of this many zero bytes, in pieces counted in ``sent``
    status_headers: dict[str, str] = field(default_factory=dict)  # with ``status``: headers (Retry-After)
    ignore_range: bool = False  # answer 200 with the whole file
    hold_after: int | None = None  # send this many body bytes, then keep the connection open, silent
    no_length: bool = False  # send no Content-Length: the body ends when the connection closes


@dataclass
class Served:
    files: dict[str, bytes] = field(default_factory=dict)
    faults: dict[str, list[Fault]] = field(default_factory=dict)
    log: list[tuple[str, str | None]] = field(default_factory=list)  # (path, Range header)
    # Per GET body: [path, first byte, bytes written so far (kept up to date), Range header].
    sent: list[list[object]] = field(default_factory=list)
    authorizations: list[str | None] = field(default_factory=list)  # each request's Authorization header
    throttle: dict[str, int] = field(default_factory=dict)  # bytes a second for a path, until removed
    # Headers a path requires: a missing one is answered 401, a wrong one 403.
    required_headers: dict[str, dict[str, str]] = field(default_factory=dict)
    routes: dict[str, Callable[[dict[str, list[str]]], bytes]] = field(default_factory=dict)
    headers: dict[str, dict[str, str]] = field(default_factory=dict)  # extra response headers per path
    lock: threading.Lock = field(default_factory=threading.Lock)
    release: threading.Event = field(default_factory=threading.Event)  # ends every hold and stall

    def arm(self, path: str, fault: Fault) -> None:
        with self.lock:
            self.faults.setdefault(path, []).append(fault)

    def take_fault(self, path: str) -> Fault:
        with self.lock:
            queue = self.faults.get(path) or []
            return queue.pop(0) if queue else Fault()

    def bytes_sent(self, path: str) -> list[str | None]:
        return [rng for p, rng in self.log if p == path]


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        return

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def do_GET(self) -> None:
        self._answer(head=False)

    def _answer(self, head: bool) -> None:
        served = self.server.served
        path, _, query = self.path.partition("?")
        path = unquote(path)
        rng = self.headers.get("Range")
        with served.lock:
            served.log.append((path, rng))
            served.authorizations.append(self.headers.get("Authorization"))
        for name, value in served.required_headers.get(path, {}).items():
            if self.headers.get(name) != value:
                self._status(401 if self.headers.get(name) is None else 403)
                return
        route = served.routes.get(path)
        body = route(parse_qs(query)) if route else served.files.get(path)
        if body is None:
            self._status(404)
            return
        fault = served.take_fault(path)
        if fault.status:
            # A redirect takes its Location from the path's extra headers.
            extra = served.headers.get(path, {}) if 300 <= fault.status < 400 else {}
            extra = {**extra, **fault.status_headers}
            self._status(fault.status, extra, fault.status_body, path, rng)
            return
        start, end = 0, len(body)
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", rng or "")
        if match and not fault.ignore_range:
            start = int(match.group(1))
            end = min(int(match.group(2)) + 1, len(body)) if match.group(2) else len(body)
            if start >= len(body):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(body)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(body)}")
        else:
            self.send_response(200)
        payload: bytes | memoryview = memoryview(body)[start:end]
        if fault.corrupt:
            payload = bytes(b ^ 0xFF for b in payload)
        if fault.no_length:
            self.close_connection = True
        else:
            self.send_header("Content-Length", str(len(payload)))
        self.send_header("Accept-Ranges", "bytes")
        for name, value in served.headers.get(path, {}).items():
            self.send_header(name, value)
        self.end_headers()
        if head:
            return
        record: list[object] = [path, start, 0, rng]
        with served.lock:
            served.sent.append(record)
        if fault.stall_s:
            served.release.wait(fault.stall_s)  # the server's shutdown ends a stall too
        if fault.hold_after is not None:
            self.wfile.write(payload[: fault.hold_after])
            self.wfile.flush()
            served.release.wait()
            self.close_connection = True
            return
        if fault.cut_after is not None:
            self.wfile.write(payload[: fault.cut_after])
            self.wfile.flush()
            self.close_connection = True
            return
        rate_bps = served.throttle.get(path)
        if rate_bps:
            self._write_slowly(record, payload, rate_bps)
            return
        self.wfile.write(payload)
        record[2] = len(payload)

    def _write_slowly(self, record: list[object], payload: bytes | memoryview, rate_bps: int) -> None:
        """Small pieces at ``rate_bps``, each counted in ``record`` once written; a client that goes
        away (killed) ends it quietly."""
        served = self.server.served
        piece = 16 << 10
        began = time.monotonic()
        for offset in range(0, len(payload), piece):
            try:
                self.wfile.write(payload[offset : offset + piece])
                self.wfile.flush()
            except OSError:
                self.close_connection = True
                return
            record[2] = offset + len(payload[offset : offset + piece])
            ahead = began + (offset + piece) / rate_bps - time.monotonic()
            if ahead > 0 and served.release.wait(ahead):
                self.close_connection = True
                return

    def _status(
        self,
        status: int,
        headers: dict[str, str] | None = None,
        length: int = 0,
        path: str = "",
        rng: str | None = None,
    ) -> None:
        """An answer of ``status`` alone; or, given a ``length``, with a body of that many zero bytes,
        each piece counted in ``sent`` once written (a redirect that goes on and on)."""
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(length))
        self.end_headers()
        if length:
            record: list[object] = [path, 0, 0, rng]
            with self.server.served.lock:
                self.server.served.sent.append(record)
            self._write_slowly(record, bytes(length), self.server.served.throttle.get(path, 1 << 40))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    served: Served


@contextmanager
def serve(served: Served) -> Iterator[str]:
    """Serve ``served`` on 127.0.0.1; yields the base URL."""
    server = _Server(("127.0.0.1", 0), _Handler)
    server.served = served
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        served.release.set()
        server.shutdown()
        server.server_close()
        thread.join()
