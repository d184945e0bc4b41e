"""The window's event loop (``app.ui.event_loop.DesktopLoop``) against qasync's own: the UI thread's CPU
time per step of the work the app's loop does all day, each loop in turn, several rounds (offscreen).

- a task that yields (``await asyncio.sleep(0)``): one callback a step;
- a task woken by a future another callback resolves: two;
- work handed to a thread and back (``asyncio.to_thread``, as the samplers do): the thread's answer comes
  back through ``call_soon_threadsafe``;
- a loopback socket's ping-pong through asyncio streams: the socket readiness callbacks, as a reply's
  stream is read.

Prints the median per step for each loop and the ratio app / qasync (lower is better).

    QT_QPA_PLATFORM=offscreen .venv/bin/python tests/bench/event_loop.py [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import qasync
from PySide6.QtWidgets import QApplication

from app.ui.event_loop import DesktopLoop


async def yields(steps: int) -> None:
    for _ in range(steps):
        await asyncio.sleep(0)


async def woken(steps: int) -> None:
    loop = asyncio.get_running_loop()
    for _ in range(steps):
        future = loop.create_future()
        loop.call_soon(future.set_result, None)
        await future


async def threads(steps: int) -> None:
    for _ in range(steps):
        await asyncio.to_thread(int)


async def ping_pong(steps: int) -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(64):
            writer.write(data)
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(steps):
        writer.write(b"x")
        await reader.readexactly(1)
    writer.close()
    await writer.wait_closed()
    server.close()
    await server.wait_closed()


WORK: dict[str, tuple[Callable[[int], Awaitable[None]], int]] = {
    "a task that yields": (yields, 20_000),
    "a task woken by a future": (woken, 20_000),
    "work in a thread and back": (threads, 2_000),
    "a socket ping-pong": (ping_pong, 2_000),
}
MakeLoop = Callable[[QApplication], qasync.QEventLoop]
LOOPS: dict[str, MakeLoop] = {"qasync": qasync.QEventLoop, "app": DesktopLoop}


def per_step(app: QApplication, make: MakeLoop, name: str) -> float:
    work, steps = WORK[name]
    loop = make(app)
    asyncio.set_event_loop(loop)
    try:
        started = time.thread_time()
        loop.run_until_complete(work(steps))
        return (time.thread_time() - started) / steps
    finally:
        loop.close()
        asyncio.set_event_loop(None)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    app = QApplication.instance() or QApplication(sys.argv)
    assert isinstance(app, QApplication)
    print(f"UI-thread CPU per step, median of {args.rounds} rounds, the loops in turn")
    print(f"{'':28}{'qasync us':>11}{'app us':>9}{'app / qasync':>14}")
    for name in WORK:
        times: dict[str, list[float]] = {loop: [] for loop in LOOPS}
        for _ in range(args.rounds):
            for loop, make in LOOPS.items():
                times[loop].append(per_step(app, make, name))
        stock, ours = (statistics.median(times[loop]) * 1e6 for loop in LOOPS)
        print(f"{name:28}{stock:>11.1f}{ours:>9.1f}{ours / stock:>14.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
