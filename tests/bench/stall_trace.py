"""What ran in the longest event-loop stalls of tests/bench/chat_render.py.

Runs chat_render as it is, with every Qt event dispatch timed (wall clock and UI-thread CPU), each
asyncio callback named and each garbage-collector pass timed, and prints the longest stalls of the long
reply with what ran in them: the events Qt delivered at the top (depth 0) and the ones they sent on
(depth 1, 2). "CPU" is the UI thread's own time: a stall much longer than the CPU in it was the machine
running something else. The timing adds some tens of microseconds an event, so stalls here run a
little longer than in chat_render.

Run: QT_QPA_PLATFORM=offscreen .venv/bin/python -m tests.bench.stall_trace [--telemetry] [--top N]
     [--by-cpu]  (the stalls with the most UI-thread CPU in them, rather than the longest)
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QEvent, QObject
from PySide6.QtWidgets import QApplication

from tests.bench import chat_render

MIN_EVENT_S = 0.0002  # shorter events are not listed
MAX_DEPTH = 2


@dataclass
class Span:
    start: float
    end: float
    cpu: float
    depth: int
    what: str


class TimedApplication(QApplication):
    def __init__(self, argv: list[str]) -> None:
        super().__init__(argv)
        self.spans: list[Span] = []
        self._depth = 0

    def notify(self, receiver: QObject, event: QEvent) -> bool:
        started, started_cpu = time.perf_counter(), time.thread_time()
        self._depth += 1
        try:
            return super().notify(receiver, event)
        finally:
            self._depth -= 1
            ended = time.perf_counter()
            if ended - started >= MIN_EVENT_S and self._depth <= MAX_DEPTH:
                name = type(receiver).__name__
                self.spans.append(
                    Span(
                        started,
                        ended,
                        time.thread_time() - started_cpu,
                        self._depth,
                        f"{event.type().name} {name}",
                    )
                )


def main() -> int:
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 6
    app = TimedApplication(sys.argv)
    spans = app.spans
    collecting: list[float] = []

    def collected(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            collecting[:] = [time.perf_counter(), time.thread_time()]
        else:
            gen = info["generation"]
            spans.append(
                Span(
                    collecting[0],
                    time.perf_counter(),
                    time.thread_time() - collecting[1],
                    1,
                    f"GC pass, gen {gen}",
                )
            )

    gc.callbacks.append(collected)
    run_handle = asyncio.Handle._run

    def named_handle(handle: asyncio.Handle) -> None:  # which asyncio callback the loop ran
        started, started_cpu = time.perf_counter(), time.thread_time()
        run_handle(handle)
        if time.perf_counter() - started >= MIN_EVENT_S:
            what = f"asyncio {getattr(handle, '_callback', handle)!r}"[:120]
            spans.append(Span(started, time.perf_counter(), time.thread_time() - started_cpu, 1, what))

    asyncio.Handle._run = named_handle  # type: ignore[method-assign]
    kept: list[chat_render.Beats] = []
    beat = chat_render.heartbeat

    async def heartbeat(beats: chat_render.Beats, stop: asyncio.Event) -> None:  # keeps the long reply's
        kept.append(beats)
        await beat(beats, stop)

    chat_render.heartbeat = heartbeat
    chat_render.run()
    beats = [
        (at - chat_render.HEARTBEAT_S - late, at) for at, late in zip(kept[0].at, kept[0].late, strict=True)
    ]

    def cpu_in(start: float, end: float) -> float:
        return sum(s.cpu for s in spans if s.depth == 0 and s.end > start and s.start < end)

    ranked = sorted(beats, key=lambda b: cpu_in(*b) if "--by-cpu" in sys.argv else b[1] - b[0], reverse=True)
    print()
    for start, end in ranked[:top]:
        stall = (end - start - chat_render.HEARTBEAT_S) * 1000
        print(f"stall {stall:.1f} ms, UI-thread CPU in it {cpu_in(start, end) * 1000:.1f} ms:")
        for s in sorted((s for s in spans if s.end > start and s.start < end), key=lambda s: s.start):
            print(
                f"  +{(s.start - start) * 1000:5.1f} ms  {(s.end - s.start) * 1000:5.2f} ms wall"
                f"  {s.cpu * 1000:5.2f} ms CPU  {'  ' * s.depth}{s.what}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
