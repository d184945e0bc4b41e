"""The app's event loop (``DesktopLoop``): the callbacks due now run together, in order, without keeping
Qt's own events waiting; errors, cancels, threads and timers behave as on asyncio's own loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from app.ui.event_loop import DesktopLoop


@pytest.fixture
def loop(qapp: QApplication) -> Iterator[DesktopLoop]:
    loop = DesktopLoop(qapp)
    asyncio.set_event_loop(loop)
    try:
        yield loop
    finally:
        loop.close()
        asyncio.set_event_loop(None)


def test_callbacks_run_in_the_order_they_were_scheduled(loop: DesktopLoop) -> None:
    ran: list[str] = []

    async def go() -> None:
        for name in "abc":
            loop.call_soon(ran.append, name)
        loop.call_later(0, ran.append, "d")  # no delay: due now, after the ones before it
        loop.call_later(0.01, ran.append, "late")
        loop.call_soon(lambda: loop.call_soon(ran.append, "scheduled by a callback"))
        await asyncio.sleep(0.05)

    loop.run_until_complete(go())
    assert ran == ["a", "b", "c", "d", "scheduled by a callback", "late"]


def test_a_callback_that_always_schedules_another_does_not_keep_qt_waiting(loop: DesktopLoop) -> None:
    """What a turn's callbacks schedule runs in the next turn, so Qt's events (paints, input, its own
    timers) get their turn in between, as under qasync."""
    turns = 0

    def again() -> None:
        nonlocal turns
        turns += 1
        loop.call_soon(again)

    async def go() -> int:
        qt_timer_fired = asyncio.Event()
        loop.call_soon(again)
        QTimer.singleShot(0, qt_timer_fired.set)
        await asyncio.wait_for(qt_timer_fired.wait(), timeout=30)
        return turns

    assert loop.run_until_complete(go()) >= 1


def test_a_cancelled_callback_does_not_run(loop: DesktopLoop) -> None:
    ran: list[str] = []

    async def go() -> None:
        loop.call_soon(ran.append, "cancelled").cancel()
        loop.call_soon(ran.append, "kept")
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    loop.run_until_complete(go())
    assert ran == ["kept"]


def test_a_failing_callback_is_reported_and_the_rest_of_the_turn_runs(loop: DesktopLoop) -> None:
    reported: list[dict[str, Any]] = []
    ran: list[str] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))

    def fails() -> None:
        raise ValueError("from a callback")

    async def go() -> None:
        loop.call_soon(fails)
        loop.call_soon(ran.append, "after")
        await asyncio.sleep(0.01)

    loop.run_until_complete(go())
    assert ran == ["after"]
    assert [type(c.get("exception")) for c in reported] == [ValueError]


def test_work_handed_to_a_thread_comes_back_on_the_loop(loop: DesktopLoop) -> None:
    async def go() -> tuple[bool, bool]:
        in_worker = await asyncio.to_thread(lambda: threading.current_thread() is not threading.main_thread())
        return in_worker, threading.current_thread() is threading.main_thread()

    assert loop.run_until_complete(go()) == (True, True)


def test_closing_drops_what_was_due(qapp: QApplication) -> None:
    loop = DesktopLoop(qapp)
    ran: list[str] = []
    loop.call_soon(ran.append, "never")
    loop.close()
    qapp.processEvents()
    assert ran == []
