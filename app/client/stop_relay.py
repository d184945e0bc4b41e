"""Stop strings applied to an answer the local API passes on, for an engine that takes them but does not
act on them (lemon-mlx-engine b1050-stable). The relay passes the engine's bytes through untouched
unless a request has stop strings; then this rewrites the answer as the engine should have given it:
cut before the first stop string, with ``finish_reason`` "stop", and (streamed) ended right there.
"""

from __future__ import annotations

import json
from typing import Any

from app.client.sse import SSEParser
from app.core.stops import StopCutter, cut_at_stop

DONE = b"data: [DONE]\n\n"


def _event(payload: Any) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


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
        try:
            payload = json.loads(data)
        except (ValueError, RecursionError):
            payload = None
        choices = payload.get("choices") if isinstance(payload, dict) else None
        choice = choices[0] if isinstance(choices, list) and choices else None
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if not isinstance(choice, dict) or not isinstance(delta, dict):  # [DONE], an error: as sent
            return f"data: {data}\n\n".encode()
        content = delta.get("content")
        text = self._cutter.feed(content) if isinstance(content, str) else ""
        if not self._cutter.hit and choice.get("finish_reason"):
            text += self._cutter.flush()  # the reply ended without a stop: what was held is its end
        if isinstance(content, str) or text:
            delta["content"] = text
        if not self._cutter.hit:
            return _event(payload)
        self.ended = True
        choice["finish_reason"] = "stop"
        return _event(payload) + DONE


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
