"""Stop strings applied to an answer the local API passes on, for an engine that takes them but does not
act on them (lemon-mlx-engine b1050-stable). The relay passes the engine's bytes through untouched
unless a request has stop strings; then this rewrites the answer as the engine should have given it:
cut before the first stop string, with ``finish_reason`` "stop", and (streamed) ended right there.
``whole_finish`` corrects the finish reason of a whole answer where the engine misreports it, and
``StreamFinish`` holds a stream's "stop" back until the engine's own figures can tell.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from app.client.sse import SSEEvent, SSEParser
from app.core.stops import StopCutter, cut_at_stop

DONE = b"data: [DONE]\n\n"


def event_bytes(payload: Any) -> bytes:
    """One SSE event of ``payload``, as JSON."""
    return f"data: {json.dumps(payload)}\n\n".encode()


def chat_delta(data: str) -> tuple[Any, dict[str, Any] | None, dict[str, Any] | None]:
    """An SSE event's payload, its first choice and that choice's delta (None where there is none: a
    [DONE], an error, an event that is not JSON)."""
    try:
        payload = json.loads(data)
    except (ValueError, RecursionError):
        payload = None
    choices = payload.get("choices") if isinstance(payload, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices else None
    if not isinstance(choice, dict):
        return payload, None, None
    delta = choice.get("delta")
    return payload, choice, delta if isinstance(delta, dict) else None


class StreamStops:
    """Feed the engine's SSE bytes of a streamed chat; get the bytes to pass on. ``ended`` says a stop
    string ended the reply: what the engine sends after it is not wanted (hang up)."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._parser = SSEParser()
        self._cutter = StopCutter(stops)
        self.ended = False

    def feed(self, chunk: bytes) -> bytes:
        out = bytearray()
        for event in self._parser.feed(chunk):
            if self.ended:
                break
            out += self._pass(event.data)
        return bytes(out)

    def close(self) -> bytes:
        """The end of the engine's stream: what the parser and the cutter still held."""
        out = bytearray()
        for event in self._parser.close():
            if not self.ended:
                out += self._pass(event.data)
        return bytes(out)

    def _pass(self, data: str) -> bytes:
        payload, choice, delta = chat_delta(data)
        if choice is None or delta is None:  # [DONE], an error: as sent
            return f"data: {data}\n\n".encode()
        content = delta.get("content")
        text = self._cutter.feed(content) if isinstance(content, str) else ""
        if not self._cutter.hit and choice.get("finish_reason"):
            text += self._cutter.flush()  # the reply ended without a stop: what was held is its end
        if isinstance(content, str) or text:
            delta["content"] = text
        if not self._cutter.hit:
            return event_bytes(payload)
        self.ended = True
        choice["finish_reason"] = "stop"
        return event_bytes(payload) + DONE


def cut_whole(answer: bytes, stops: tuple[str, ...]) -> bytes:
    """A whole (not streamed) chat or text completion, cut before its first stop string."""
    try:
        payload = json.loads(answer)
        choice = payload["choices"][0]
    except (ValueError, RecursionError, KeyError, IndexError, TypeError):
        return answer  # not an answer this can read: the caller's client sees it as it came
    if not isinstance(choice, dict):
        return answer
    message = choice.get("message")
    holder, key = (message, "content") if isinstance(message, dict) else (choice, "text")
    text = holder.get(key)
    if not isinstance(text, str):
        return answer
    cut, hit = cut_at_stop(text, stops)
    if not hit:
        return answer
    holder[key] = cut
    choice["finish_reason"] = "stop"
    return json.dumps(payload).encode()


def whole_finish(answer: bytes, correct: Callable[[str | None, int], str | None]) -> bytes:
    """A whole chat or text completion with ``correct(said, completion_tokens)`` as its finish reason
    (the engine adapter's ``finish_reason``, given the answer's own token count)."""
    try:
        payload = json.loads(answer)
        choice = payload["choices"][0]
        tokens = payload["usage"]["completion_tokens"]
    except (ValueError, RecursionError, KeyError, IndexError, TypeError):
        return answer
    if not isinstance(choice, dict) or type(tokens) is not int:
        return answer
    said = choice.get("finish_reason")
    finish = correct(said if isinstance(said, str) else None, tokens)
    if finish == said:
        return answer
    choice["finish_reason"] = finish
    return json.dumps(payload).encode()


class StreamFinish:
    """Feed a streamed chat's SSE bytes; get the bytes to pass on, all but its end when the engine says
    "stop" there: that event and what follows are held (``holding``) until ``release`` gives the finish
    reason the engine's figures show (they come after its stream)."""

    def __init__(self) -> None:
        self._parser = SSEParser()
        self._held: list[str] = []  # the events from the one saying "stop" on

    @property
    def holding(self) -> bool:
        return bool(self._held)

    def feed(self, chunk: bytes) -> bytes:
        return self._pass(self._parser.feed(chunk))

    def close(self) -> bytes:
        return self._pass(self._parser.close())

    def _pass(self, events: list[SSEEvent]) -> bytes:
        out = bytearray()
        for event in events:
            if not self._held:
                _, choice, _ = chat_delta(event.data)
                if choice is None or choice.get("finish_reason") != "stop":
                    out += f"data: {event.data}\n\n".encode()
                    continue
            self._held.append(event.data)
        return bytes(out)

    def release(self, finish: str | None) -> bytes:
        """The held end, with ``finish`` as its finish reason."""
        held, self._held = self._held, []
        payload, choice, _ = chat_delta(held[0])
        assert choice is not None
        choice["finish_reason"] = finish
        return event_bytes(payload) + b"".join(f"data: {data}\n\n".encode() for data in held[1:])
