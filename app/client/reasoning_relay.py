"""A reply's reasoning put where the request wants it (``ReasoningFormat``), in an answer the local API
passes on: the relay passes the engine's bytes through untouched unless the engine cannot do it itself.

llama-server splits the reasoning into ``reasoning_content`` (its default) or leaves it in ``content``
(its ``reasoning_format: "none"``), but cannot leave it out; lemon-mlx always sends it inside ``content``
as ``<think>...</think>``. This rewrites an answer for the two cases the engine leaves: reasoning taken
out of ``content`` (``split``) into ``reasoning_content`` or dropped, and ``reasoning_content`` dropped.
"""

from __future__ import annotations

import json
from typing import Any

from app.client.sse import SSEParser
from app.client.stop_relay import chat_delta, event_bytes
from app.core.reasoning import ReasoningFormat, Split, ThinkSplitter, split_think

FIELD = "reasoning_content"


def _place(holder: dict[str, Any], reasoning: str, fmt: ReasoningFormat) -> None:
    if fmt is ReasoningFormat.SEPARATE and reasoning:
        holder[FIELD] = reasoning
    else:
        holder.pop(FIELD, None)


class StreamReasoning:
    """Feed the engine's SSE bytes of a streamed chat; get the bytes to pass on. ``split``: the engine
    sends its reasoning inside ``content``; ``fmt``: where it goes (SEPARATE or HIDDEN)."""

    def __init__(self, fmt: ReasoningFormat, *, split: bool) -> None:
        self._parser = SSEParser()
        self._think = ThinkSplitter() if split else None
        self._fmt = fmt

    def feed(self, chunk: bytes) -> bytes:
        return b"".join(self._pass(event.data) for event in self._parser.feed(chunk))

    def close(self) -> bytes:
        return b"".join(self._pass(event.data) for event in self._parser.close())

    def _pass(self, data: str) -> bytes:
        payload, choice, delta = chat_delta(data)
        if choice is None or delta is None:  # [DONE], an error, the usage: as sent
            return f"data: {data}\n\n".encode()
        content, reasoning = delta.get("content"), delta.get(FIELD)
        text = content if isinstance(content, str) else ""
        thought = reasoning if isinstance(reasoning, str) else ""
        if self._think is not None:
            split = self._think.feed(text)
            if choice.get("finish_reason"):  # the end: a held tail that never became a tag is text
                last = self._think.finish()
                split = Split(split.content + last.content, split.reasoning + last.reasoning)
            text, thought = split.content, thought + split.reasoning
        if isinstance(content, str) or text:
            delta["content"] = text
        _place(delta, thought, self._fmt)
        carried = bool(content or reasoning)
        if carried and not (
            text or delta.get(FIELD) or delta.get("tool_calls") or choice.get("finish_reason")
        ):
            return b""  # an event that held only what is left out (or held back): not passed on
        return event_bytes(payload)


def whole_reasoning(answer: bytes, fmt: ReasoningFormat, *, split: bool) -> bytes:
    """A whole (not streamed) chat completion with its reasoning where ``fmt`` puts it."""
    try:
        payload = json.loads(answer)
        message = payload["choices"][0]["message"]
    except (ValueError, RecursionError, KeyError, IndexError, TypeError):
        return answer  # not an answer this can read: the caller's client sees it as it came
    if not isinstance(message, dict):
        return answer
    content, reasoning = message.get("content"), message.get(FIELD)
    thought = reasoning if isinstance(reasoning, str) else ""
    if split and isinstance(content, str):
        parts = split_think(content)
        message["content"], thought = parts.content, thought + parts.reasoning
    _place(message, thought, fmt)
    return json.dumps(payload).encode()
