"""The two paths of the MLX streaming benches (``mlx_stream_overhead.py`` on mlx-lm,
``lemon_mlx_stream_overhead.py`` on the real lemon-mlx engine): the app's client, and raw httpx reading
the SSE lines itself, sending the same request and counted alike.

Both count the same thing the same way: a piece of the reply's text as a reader gets it, reasoning
included and the ``<think>``/``</think>`` tags not (the app's client takes them out; the direct path
takes them out with the same splitter, ``ThinkSplitter``: a few microseconds a piece, next to
milliseconds a token). TTFT is the time to the first such piece, decode speed the pieces after it over
the time to the last, the client's CPU time is per piece (``Pieces``). Counted otherwise the ratio is
skewed: on the tiny Qwen3 the raw content's first piece is ``<think>``, a token before the app's
first, and its ``</think>`` is one piece more than the app shows.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import httpx

from app.client.events import ChatDelta, ChatDone
from app.core.reasoning import ThinkSplitter
from app.supervisor.engine import Engine
from tests.bench.stream_overhead import PathFn, Timing, timing

Params = Callable[[int], dict[str, object]]  # a request's sampling fields for a reply of N tokens


class Pieces:
    """When the reply's pieces of text came (the first, the last, how many), from the moment it is made
    (the request's start) on, with this process's CPU time over that span."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last = 0.0
        self.count = 0
        self._cpu = time.process_time()
        self._sent = time.perf_counter()

    def saw(self, text: str) -> None:
        if text:
            self.last = time.perf_counter()
            self.first = self.first or self.last
            self.count += 1

    def told(self, tokens: int) -> None:
        """The reply's end says how many tokens came (the app's deltas hold a read's tokens each)."""
        self.count = tokens or self.count

    def timing(self) -> Timing:
        return timing(self._sent, self.first, self.last, self.count, time.process_time() - self._cpu)


def paths(params: Params) -> tuple[PathFn, PathFn]:
    """The app's path and the direct one, each sending ``params(tokens)`` with the prompt."""

    async def through_app(engine: Engine, prompt: str, tokens: int) -> Timing:
        messages = [{"role": "user", "content": prompt}]
        async with engine.chat_client() as client:
            pieces = Pieces()
            async for event in client.stream_chat(messages, **params(tokens)):
                if isinstance(event, ChatDelta):
                    pieces.saw(event.content + event.reasoning)
                elif isinstance(event, ChatDone):
                    pieces.told(event.telemetry.completion_tokens)
        return pieces.timing()

    async def direct(engine: Engine, prompt: str, tokens: int) -> Timing:
        payload = {
            "messages": [{"role": "user", "content": prompt}],
            **params(tokens),
            "stream": True,
            "stream_options": {"include_usage": True},  # as the app's client asks
        }
        think = ThinkSplitter()
        async with httpx.AsyncClient(base_url=engine.base_url, trust_env=False) as client:
            pieces = Pieces()
            async with client.stream("POST", "/v1/chat/completions", json=payload, timeout=None) as response:
                async for line in response.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    event = json.loads(line[6:])
                    delta = (event.get("choices") or [{}])[0].get("delta") or {}
                    split = think.feed(delta.get("content") or "")
                    pieces.saw(split.content + split.reasoning + (delta.get("reasoning_content") or ""))
                    pieces.told((event.get("usage") or {}).get("completion_tokens") or 0)
            held = think.finish()  # a tail that never became a tag, as the app's client gives it at the end
            pieces.saw(held.content + held.reasoning)
        return pieces.timing()

    return through_app, direct
