"""Server-sent events, parsed incrementally from network chunks (WHATWG ``text/event-stream`` rules).

Chunks may split an event, a line, a ``\\r\\n`` pair or a UTF-8 character anywhere: bytes are split into
lines first and each line is decoded whole. Comments (heartbeats) are dropped. Unlike a browser, an
event still pending when the stream ends is delivered, so an engine's last words are not lost. A line
or an event longer than ``MAX_EVENT_BYTES`` is refused (``EventTooLarge``): a server that never ends
one (a remote is another machine's) would otherwise fill the memory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import orjson

_BOM = b"\xef\xbb\xbf"
MAX_EVENT_BYTES = 8 << 20  # an engine's events hold a token, or a reply's last figures: far less


class EventTooLarge(ValueError):
    """A line or an event went on past ``MAX_EVENT_BYTES``."""


@dataclass(frozen=True, slots=True)
class SSEEvent:
    data: str
    event: str = "message"
    id: str | None = None


class SSEParser:
    def __init__(self) -> None:
        self._rest = b""  # an unfinished line
        self._skip_lf = False  # the last chunk ended in "\r": a "\n" first in the next one ends that line
        self._started = False
        self._data: list[str] = []
        self._size = 0  # the pending event's data, in characters
        self._event = ""
        self._id: str | None = None

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """The events completed by ``chunk``."""
        if (parts := self._simple(chunk)) is not None:
            return [SSEEvent(part.decode("utf-8", errors="replace"), "message", self._id) for part in parts]
        return self._events(chunk)

    def data(self, chunk: bytes) -> list[bytes]:
        """The data of the events completed by ``chunk`` (``feed``'s, read as UTF-8 with errors
        replaced), for a reader that needs nothing else of them (an engine's chat stream): an engine's
        paced read is split as it is, with no object or text made for each of its events."""
        if (parts := self._simple(chunk)) is not None:
            return parts
        return [event.data.encode() for event in self._events(chunk)]

    def _events(self, chunk: bytes) -> list[SSEEvent]:
        if not self._started and chunk:
            buf = self._rest + chunk
            if len(buf) < len(_BOM) and _BOM.startswith(buf):
                self._rest = buf
                return []
            self._started = True
            chunk, self._rest = buf.removeprefix(_BOM), b""
        if self._skip_lf and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._skip_lf = False
        events: list[SSEEvent] = []
        pieces = (self._rest + chunk).splitlines(keepends=True)
        self._rest = b""
        for piece in pieces:
            if piece.endswith((b"\n", b"\r")):
                self._line(piece.rstrip(b"\r\n"), events)
            else:
                self._rest = piece
        self._skip_lf = not self._rest and bool(pieces) and pieces[-1].endswith(b"\r")
        if len(self._rest) > MAX_EVENT_BYTES:
            raise EventTooLarge(f"a line went on past {MAX_EVENT_BYTES >> 20} MiB")
        return events

    def _simple(self, chunk: bytes) -> list[bytes] | None:
        """``chunk``'s events' data when it is nothing but whole one-line ``data: `` events and none is
        pending, as an engine's paced stream comes (``app.client.pacing``); None for anything else, which
        is read line by line. The same events either way, for a fraction of the work a token."""
        if self._rest or self._data or self._skip_lf or not self._started:
            return None
        if not chunk.startswith(b"data: ") or not chunk.endswith(b"\n\n") or b"\r" in chunk:
            return None
        if len(chunk) > MAX_EVENT_BYTES:
            return None
        parts = chunk[6:-2].split(b"\n\ndata: ")
        # Each part's event is one line when the chunk has no line ends but the events' blank lines.
        return parts if chunk.count(b"\n") == 2 * len(parts) else None

    def close(self) -> list[SSEEvent]:
        """End of stream: the last unterminated line, and an event that was never followed by a blank line."""
        events: list[SSEEvent] = []
        if self._rest:
            self._line(self._rest, events)
            self._rest = b""
        self._line(b"", events)
        return events

    def _line(self, raw: bytes, events: list[SSEEvent]) -> None:
        if not raw:
            if self._data:
                events.append(SSEEvent("\n".join(self._data), self._event or "message", self._id))
            self._data, self._size, self._event = [], 0, ""
            return
        if raw[:1] == b":":
            return  # a comment, e.g. a heartbeat
        line = raw.decode("utf-8", errors="replace")
        name, colon, value = line.partition(":")
        if colon and value[:1] == " ":
            value = value[1:]
        if name == "data":
            self._data.append(value)
            self._size += len(value)
            if self._size > MAX_EVENT_BYTES:
                raise EventTooLarge(f"an event went on past {MAX_EVENT_BYTES >> 20} MiB")
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._id = value


def event_json(data: bytes) -> Any:
    """An event's data read as JSON, as ``json.loads`` reads it (its text decoded as the parser decodes
    it), in half its time by orjson: this is once a token. What orjson refuses and ``json`` reads (a
    lone surrogate's escape, NaN, a byte that is no UTF-8) and the words for what is no JSON come from
    ``json``."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data.decode("utf-8", errors="replace"))
