"""Chat pane rendering under a fast stream, on the app's event loop (``DesktopLoop``, offscreen).

Feeds the pane a synthetic markdown reply (reasoning, paragraphs, lists, tables, code) at 5,000 tok/s up to
20,000 tokens and prints:
- tokens/s rendered: tokens over the time from the first token to the last one on screen;
- the longest event-loop stall: the largest lateness of a 2 ms heartbeat on the same loop; beside it the
  UI thread's CPU time between two beats (in the longest stall, and at most) and, on Linux, the time the
  thread waited for a CPU in the longest stall: on a busy machine a stall can be much longer than the
  work the app did in it;
- per-token cost at 20,000 tokens over the cost at 200: the CPU time each frame takes (render, layout
  and paint, on the UI thread) per token it showed. The reply repeats one section of mixed markdown
  (329 tokens: heading, paragraph, list, table, code, quote), so the cost "at 200" is taken over the
  first section of short replies (median of several) and the cost "at 20,000" over the last three whole
  sections before 20,000 of the long reply: the same text at a different place. A warm-up reply with
  reasoning comes first.
Frame times are printed both as wall-clock and as UI-thread CPU time: on a busy machine the wall-clock
figures (and the stall) include time the OS gave to other processes; the load average is printed too.

With ``--telemetry`` the Telemetry tab is open beside the pane and charting as in the app: it holds 30
minutes of samples (made up from one real sample: the charts' full size) and gets a real one a second
from the app's sampler, in a thread as the router takes it, plus each finished reply's figures.

As in the app, the heap is settled once the widgets are up (``app.ui.heap``: the start-up objects leave
the garbage collector's full passes); the launcher does it once the window shows.

With ``--qasync`` the pane runs on qasync's own loop instead, the app's before ``DesktopLoop``.

Run: QT_QPA_PLATFORM=offscreen .venv/bin/python -m tests.bench.chat_render [--telemetry] [--qasync]
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import os
import re
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import qasync
from PySide6.QtCore import QCoreApplication, QEvent, QObject, Qt
from PySide6.QtWidgets import QApplication

from app.supervisor.sampler import Sampler
from app.ui import heap
from app.ui.chat.pane import ChatPane
from app.ui.event_loop import DesktopLoop
from app.ui.telemetry_view import WINDOW_S, TelemetryView

RATE = 5_000  # tokens per second offered
LONG = 20_000
SHORT_RUNS = 8
END_SECTIONS = 3
HEARTBEAT_S = 0.002
FEED_TICK_S = 0.002

SECTION = """## Step {n}: configure the service

The service reads its settings at start-up. Set **`LISTEN_PORT`** to the port you want and keep the
*defaults* for everything else; the [reference](https://example.com/ref) lists each option, with its
type and a short example of how it is used in practice by people who run it every day.

- Install the package with `pip install service`.
- Create the folder `~/.config/service` and copy the sample file into it.
- Restart the service so it reads the new file, then check its log.

| option | default | meaning |
| --- | --- | --- |
| port | 8080 | where it listens |
| workers | 4 | how many requests at once |

```python
import json
from pathlib import Path


def load_settings(path: Path) -> dict[str, object]:
    \"\"\"Read the settings file, falling back to defaults.\"\"\"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {{"port": 8080, "workers": {n}}}
    return {{**DEFAULTS, **data}}
```

> Note: a change takes effect only after a restart, so plan step {n} for a quiet moment.

"""

REASONING = (
    "The user wants a step-by-step guide. I should explain each setting, show a code sample, and keep "
    "the tone practical. Let me plan the sections first, then write them out in order.\n\n"
)


def _split(text: str) -> list[str]:
    """Deltas of about four characters, like a tokenizer's."""
    return [word[i : i + 4] for word in re.findall(r"\s*\S+|\s+", text) for i in range(0, len(word), 4)]


SECTION_TOKENS = len(_split(SECTION.format(n=1)))


def tokens(count: int, reasoning: bool = False) -> list[tuple[str, str]]:
    """(content, reasoning) deltas."""
    pieces = [("", piece) for piece in _split(REASONING * 4)] if reasoning else []
    n = 0
    while len(pieces) < count:
        n += 1
        pieces += [(piece, "") for piece in _split(SECTION.format(n=n))]
    return pieces[:count]


class _PaintedMarker(QObject):
    """Posted at low priority after a frame: it runs once Qt has laid out and painted that frame."""

    def __init__(self, on_event: Callable[[], None]) -> None:
        super().__init__()
        self._on_event = on_event

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.User:
            self._on_event()
            return True
        return super().event(event)


@dataclass
class Frames:
    """Each frame: (tokens shown before it, tokens it showed, CPU seconds it took including paint)."""

    records: list[tuple[int, int, float]] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)  # each frame's wall-clock seconds
    shown: int = 0
    received: int = 0
    last_shown_at: float = 0.0
    painting: bool = False  # a frame was rendered and its paint has not finished yet


def instrument(pane: ChatPane, frames: Frames) -> None:
    started = [0.0, 0.0]
    batch = [0, 0]

    def painted() -> None:
        now = time.perf_counter()
        frames.records.append((batch[0], batch[1], time.thread_time() - started[1]))
        frames.wall.append(now - started[0])
        frames.last_shown_at = now
        frames.painting = False

    marker = _PaintedMarker(painted)
    render = pane._render_frame

    def timed_render() -> None:
        started[0], started[1] = time.perf_counter(), time.thread_time()
        batch[0], batch[1] = frames.shown, frames.received - frames.shown
        frames.shown = frames.received
        frames.painting = True
        render()
        QCoreApplication.postEvent(marker, QEvent(QEvent.Type.User), Qt.EventPriority.LowEventPriority.value)

    pane._frame.timeout.disconnect(render)
    pane._frame.timeout.connect(timed_render)
    pane.setProperty("bench_marker", marker)


async def stream(pane: ChatPane, deltas: list[tuple[str, str]], frames: Frames) -> tuple[float, float]:
    """Send ``deltas`` at RATE; return (seconds from first token to last one shown, first token time)."""
    pane.composer.setPlainText("Explain how to configure the service.")
    pane.submit()
    pane.begin_reply()
    frames.shown = frames.received = 0
    start = time.perf_counter()
    sent = 0
    while sent < len(deltas):
        await asyncio.sleep(FEED_TICK_S)
        due = min(len(deltas), int((time.perf_counter() - start) * RATE) + 1)
        for content, reasoning in deltas[sent:due]:
            pane.append_reply(content, reasoning)
        frames.received = sent = due
    reply = pane.transcript.views()[-1]
    while reply.has_pending() or frames.painting or frames.last_shown_at < start:
        await asyncio.sleep(FEED_TICK_S)
    elapsed = frames.last_shown_at - start
    pane.finish_reply({"completion_tokens": len(deltas)})
    return elapsed, start


@dataclass
class Beats:
    """For each heartbeat: its lateness, and since the beat before, the UI thread's CPU time (what the
    app itself spent) and its wait for a CPU while runnable (the OS running other work; Linux only)."""

    at: list[float] = field(default_factory=list)  # when it came (time.perf_counter())
    late: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    waited: list[float] = field(default_factory=list)

    def longest(self) -> int:
        return self.late.index(max(self.late))


def run_queue_wait() -> float:
    """Seconds this thread has waited on a run queue (Linux's schedstat), or NaN where not told."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as stat:
            return int(stat.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return math.nan


async def heartbeat(beats: Beats, stop: asyncio.Event) -> None:
    last, last_cpu, last_wait = time.perf_counter(), time.thread_time(), run_queue_wait()
    while not stop.is_set():
        await asyncio.sleep(HEARTBEAT_S)
        now, now_cpu, now_wait = time.perf_counter(), time.thread_time(), run_queue_wait()
        beats.at.append(now)
        beats.late.append(now - last - HEARTBEAT_S)
        beats.cpu.append(now_cpu - last_cpu)
        beats.waited.append(now_wait - last_wait)
        last, last_cpu, last_wait = now, now_cpu, now_wait


def per_token(records: list[tuple[int, int, float]], low: int, high: int) -> float:
    # Frames that only caught up on finished blocks showed no new tokens; their time counts all the same.
    chosen = [(n, s) for before, n, s in records if low <= before < high]
    return sum(s for _, s in chosen) / sum(n for n, _ in chosen)


async def chart(view: TelemetryView, stop: asyncio.Event) -> None:
    """What ``Router.watch_system`` does while the tab is shown: a sample a second, taken in a thread."""
    sampler = Sampler()
    first = await asyncio.to_thread(sampler.sample, {"self": os.getpid()})
    for age in range(WINDOW_S, 0, -1):  # a full 30 minutes behind it
        view.add_sample(dataclasses.replace(first, at=first.at - age))
        if age % 60 == 0:
            view.add_request(first.at - age, {"decode_tps": 150.0, "prompt_tps": 900.0, "ttft_s": 0.05})
    while not stop.is_set():
        view.add_sample(await asyncio.to_thread(sampler.sample, {"self": os.getpid()}))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


def time_slices(view: TelemetryView, wall: list[float], cpu: list[float]) -> None:
    """Each chart slice's wall-clock and UI-thread CPU time (update and paint of one chart)."""
    draw = view._draw_next

    def timed() -> None:
        started, started_cpu = time.perf_counter(), time.thread_time()
        draw()
        wall.append(time.perf_counter() - started)
        cpu.append(time.thread_time() - started_cpu)

    view._slicer.timeout.disconnect(draw)
    view._slicer.timeout.connect(timed)


async def main(pane: ChatPane, view: TelemetryView | None = None) -> None:
    slice_wall: list[float] = []
    slice_cpu: list[float] = []
    if view is not None:
        time_slices(view, slice_wall, slice_cpu)
    charting_stop = asyncio.Event()
    charting = asyncio.ensure_future(chart(view, charting_stop)) if view is not None else None
    if view is not None:
        pane.reply_finished.connect(lambda _c, _m: view.add_request(time.time(), {"decode_tps": 5000.0}))
    frames = Frames()
    instrument(pane, frames)
    await stream(pane, tokens(2 * SECTION_TOKENS, reasoning=True), frames)  # warm-up: fonts, lexers
    short_costs = []
    for _ in range(SHORT_RUNS):
        pane.new_conversation()
        frames.records.clear()
        frames.wall.clear()
        await stream(pane, tokens(SECTION_TOKENS), frames)
        short_costs.append(per_token(frames.records, 0, SECTION_TOKENS))
    pane.new_conversation()
    frames.records.clear()
    frames.wall.clear()
    beats = Beats()
    stop = asyncio.Event()
    slice_wall.clear()  # the chart slices reported: those during the long reply, as the stall is
    slice_cpu.clear()
    beat = asyncio.ensure_future(heartbeat(beats, stop))
    elapsed, _ = await stream(pane, tokens(LONG), frames)
    stop.set()
    await beat
    end = LONG // SECTION_TOKENS * SECTION_TOKENS
    long_cost = per_token(frames.records, end - END_SECTIONS * SECTION_TOKENS, end)
    short_cost = statistics.median(short_costs)
    cpu = sorted(s for _, _, s in frames.records)
    wall = sorted(frames.wall)
    print(f"load average (1 min)    : {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(f"offered rate            : {RATE:,} tok/s, {LONG:,} tokens, {len(frames.records)} frames")
    print(f"tokens/s rendered       : {LONG / elapsed:,.0f} (target: keeps up with {RATE:,})")
    print(f"longest event-loop stall: {max(beats.late) * 1000:.1f} ms (target <= 8 ms, a frame at 120 Hz)")
    longest, most = beats.longest(), max(beats.cpu) * 1000
    print(
        f"UI-thread CPU in a stall: {beats.cpu[longest] * 1000:.1f} ms in the longest, {most:.1f} ms at most"
    )
    print(f"waiting for a CPU in it : {beats.waited[longest] * 1000:.1f} ms (other work on the machine)")
    print(f"frame wall p50 / max    : {wall[len(wall) // 2] * 1000:.2f} / {wall[-1] * 1000:.2f} ms")
    print(f"frame CPU  p50 / max    : {cpu[len(cpu) // 2] * 1000:.2f} / {cpu[-1] * 1000:.2f} ms")
    print(f"per-token cost at 200   : {short_cost * 1e6:.1f} us (median of {SHORT_RUNS} replies)")
    print(f"per-token cost at 20,000: {long_cost * 1e6:.1f} us")
    print(f"ratio 20,000 / 200      : {long_cost / short_cost:.2f} (target <= 2)")
    if view is not None and charting is not None:
        charting_stop.set()
        await charting
        points = sum(c.points() for c in view.charts.values())
        print(
            f"telemetry view          : open and charting, {view.samples:,} samples, {points:,} points held"
        )
        wall, cpu = sorted(slice_wall) or [0.0], sorted(slice_cpu) or [0.0]
        print(
            f"chart slices in the reply: wall p50/max {wall[len(wall) // 2] * 1000:.2f} / "
            f"{wall[-1] * 1000:.2f} ms, "
            f"CPU p50/max {cpu[len(cpu) // 2] * 1000:.2f} / {cpu[-1] * 1000:.2f} ms ({len(wall)} slices)"
        )


def run() -> int:
    app = QApplication.instance() or QApplication(sys.argv)
    pane = ChatPane()
    pane.resize(900, 800)
    pane.show()
    heap.settle()  # as the app's launcher does once its window is up
    view = None
    if "--telemetry" in sys.argv:
        view = TelemetryView()
        view.resize(380, 900)
        view.show()
    loop = qasync.QEventLoop(app) if "--qasync" in sys.argv else DesktopLoop(app)
    asyncio.set_event_loop(loop)
    with loop:
        loop.run_until_complete(main(pane, view))
    return 0


if __name__ == "__main__":
    raise SystemExit(run())
