"""lemon-mlx's ``[TPS]`` stderr lines as a telemetry source for its chat client.

The engine prints its own prompt and generation speed after each request, on stderr, which reaches the
app on another pipe than the reply: the line may come a moment after the reply's last event. A finished
reply waits for it at most ``TPS_WAIT_S`` (it is an event, not a sleep), then keeps the client's figures.
"""

from __future__ import annotations

import asyncio
import contextlib

from app.core.launch import LaunchRequest
from app.core.lemon_mlx import MLX_LM, TpsCollector
from app.core.telemetry import Telemetry

TPS_WAIT_S = 1.0


class TpsTelemetry:
    """Feed it the engine's output lines; ``refine`` puts the request's figures into its telemetry."""

    def __init__(self, wait_s: float = TPS_WAIT_S) -> None:
        self.wait_s = wait_s
        self._lines = TpsCollector()
        self._complete = asyncio.Event()

    def feed(self, line: str) -> None:
        self._lines.feed(line)
        if self._lines.complete:
            self._complete.set()

    def request_started(self) -> None:
        self._lines.reset()
        self._complete.clear()

    async def refine(self, telemetry: Telemetry) -> Telemetry:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._complete.wait(), self.wait_s)
        return self._lines.apply(telemetry)


def telemetry_source(request: LaunchRequest) -> TpsTelemetry | None:
    """lemon-mlx's release engines print ``[TPS]`` lines; llama.cpp and mlx-lm report in the stream."""
    if request.recipe == "lemon-mlx" and request.backend != MLX_LM:
        return TpsTelemetry()
    return None
