"""The window's asyncio loop: qasync's, with the callbacks that are due now run together in one turn.

qasync runs every ``call_soon`` as a Qt timer of its own: a timer started, a timer event dispatched
through PySide to Python, the timer killed, and before all that an ``inspect`` check of the callback
(``iscoroutinefunction``) that asyncio's own loop makes only in debug mode. A task that wakes on a
future costs two or three such timers; the idle window with the Telemetry tab shown ran about eight a
second (488 in a minute's profile). Here, as in asyncio's own loop, the callbacks due now wait in one
queue, and one zero timer, which runs while any are due, runs them in order once a turn of Qt's loop;
what they schedule runs in the next turn, after Qt's own events, as it did under qasync. Callbacks with
a delay keep qasync's timers, without the check.

``tests/bench/event_loop.py`` measures the UI thread's CPU per callback, per hand-off to a thread and
back, and per socket read against qasync's: 0.4-0.65 times qasync's here.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from contextvars import Context
from typing import Any

import qasync
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication


class DesktopLoop(qasync.QEventLoop):  # type: ignore[misc]
    def __init__(self, app: QApplication | None = None, already_running: bool = False) -> None:
        self._due: collections.deque[asyncio.Handle] = collections.deque()
        self._turn = QTimer()  # runs while callbacks are due: once a turn of Qt's loop
        self._turn.setInterval(0)
        self._turn.timeout.connect(self._run_due)
        super().__init__(app, already_running=already_running)

    def call_soon(
        self, callback: Callable[..., Any], *args: Any, context: Context | None = None
    ) -> asyncio.Handle:
        handle = asyncio.Handle(callback, args, self, context)
        self._due.append(handle)
        if not self._turn.isActive():
            self._turn.start()
        return handle

    def call_later(
        self, delay: float, callback: Callable[..., Any], *args: Any, context: Context | None = None
    ) -> asyncio.Handle:
        if delay <= 0:
            return self.call_soon(callback, *args, context=context)
        return self._add_callback(asyncio.Handle(callback, args, self, context), delay)  # type: ignore[no-any-return]

    def _run_due(self) -> None:
        """Run the callbacks that were due when this turn began, in the order they were scheduled."""
        due = self._due
        try:
            for _ in range(len(due)):
                handle = due.popleft()
                if not handle._cancelled:  # noqa: SLF001 - asyncio's own loop reads it so
                    handle._run()  # noqa: SLF001 - it reports a callback's exception to the loop
        finally:
            if not due:
                self._turn.stop()

    def close(self) -> None:
        self._turn.stop()
        self._due.clear()
        super().close()
