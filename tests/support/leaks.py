"""Find what a test left running: asyncio tasks, Qt timers, threads (napari's ``dangling_qtimers`` is
the model). ``tests/conftest.py`` runs ``LeakWatch`` around every test and fails the test that leaks,
naming each thing left and where it was made.

- Tasks: every task made during the test is recorded with where it was created (``asyncio.Task`` is
  swapped for a recording subclass; loops look the class up when they make a task). A task is left
  behind when it is still pending at the end of the test (its loop closed or dropped under it), or when
  ``asyncio.run`` had to cancel it because the test's main coroutine returned without ending it.
- Qt timers (only when PySide6 is imported): ``QTimer.start`` and ``QTimer.singleShot`` are recorded;
  a timer still active, or a single shot that has not fired, at the end is left behind.
- Threads: threads started during the test and still alive after a short join grace. Threads that
  Python did not start (``_DummyThread``: Qt's worker threads once they run Python code) are Qt's to
  account for, not this check's.

A test that must leave something running says why with ``@pytest.mark.leaves_running("why")``.
"""

from __future__ import annotations

import asyncio
import asyncio.base_events
import asyncio.runners
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
THIS = str(Path(__file__).resolve())
THREAD_JOIN_GRACE_S = 2.0
# Process-wide daemon threads that libraries start once, on first use, and keep on purpose.
LIBRARY_DAEMONS = frozenset({"tqdm_monitor"})
SITE_FRAMES = 3  # frames of our own code quoted for where a thing was made


def _ours(frame: traceback.FrameSummary) -> bool:
    return frame.filename.startswith(str(ROOT)) and frame.filename != THIS and ".venv" not in frame.filename


def _site(frame: FrameType | None) -> str:
    """Where something was made: the innermost frames of the app's or the tests' own code."""
    stack = traceback.StackSummary.extract(traceback.walk_stack(frame), limit=40, lookup_lines=False)
    own = [f for f in stack if _ours(f)][:SITE_FRAMES] or list(stack)[:1]
    return " <- ".join(f"{_short(f.filename)}:{f.lineno} {f.name}" for f in own) or "?"


def _short(filename: str) -> str:
    path = Path(filename)
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def _suspended_at(task: asyncio.Task[Any]) -> str:
    frames = task.get_stack()
    if not frames:
        return ""
    inner = frames[-1]
    return f", waiting in {inner.f_code.co_qualname} ({Path(inner.f_code.co_filename).name}:{inner.f_lineno})"


def _describe_task(task: asyncio.Task[Any], site: str, suspended: str = "") -> str:
    coro = task.get_coro()
    name = getattr(coro, "__qualname__", None) or (
        "the aclose() of an async generator dropped unfinished (read it to the end or close it)"
        if type(coro).__name__ == "async_generator_athrow"
        else repr(coro)
    )
    return f"task {task.get_name()!r} running {name}{suspended or _suspended_at(task)}; created at {site}"


class LeakWatch:
    """Records what a test starts; ``leaks()`` lists what is still running at its end."""

    def __init__(self) -> None:
        self.tasks: list[tuple[asyncio.Task[Any], str]] = []
        self.cancelled_at_exit: list[str] = []
        self.thread_sites: weakref.WeakKeyDictionary[threading.Thread, str] = weakref.WeakKeyDictionary()
        self.threads_before = set(threading.enumerate())
        self.timers: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self.single_shots: dict[int, str] = {}
        self.shot_contexts: dict[int, Any] = {}  # the QObject a single shot dies with, if it has one
        self._next_shot = 0
        self._finalizing = ""  # the async generator whose aclose() task is being made, if any

    @contextmanager
    def watching(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[LeakWatch]:
        self._patch_tasks(monkeypatch)
        self._patch_threads(monkeypatch)
        if "PySide6" in sys.modules:
            self._patch_qt(monkeypatch)
        yield self

    # --- asyncio ---

    def _patch_tasks(self, monkeypatch: pytest.MonkeyPatch) -> None:
        watch = self

        class RecordedTask(asyncio.Task):  # type: ignore[type-arg]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                site = _site(sys._getframe(1))
                if watch._finalizing:
                    site = f"{watch._finalizing}, dropped at {site}"
                watch.tasks.append((self, site))

        finalize = asyncio.base_events.BaseEventLoop._asyncgen_finalizer_hook  # type: ignore[attr-defined]

        def finalize_recorded(loop: asyncio.AbstractEventLoop, agen: Any) -> None:
            """Name the async generator whose aclose() the loop schedules when the GC drops it."""
            frame = agen.ag_frame
            where = f" at {_short(frame.f_code.co_filename)}:{frame.f_lineno}" if frame else ""
            watch._finalizing = f"async generator {agen.__qualname__}{where}"
            try:
                finalize(loop, agen)
            finally:
                watch._finalizing = ""

        cancel_all = asyncio.runners._cancel_all_tasks  # type: ignore[attr-defined]

        def cancel_all_recorded(loop: asyncio.AbstractEventLoop) -> None:
            sites = dict((id(t), s) for t, s in watch.tasks)
            for task in asyncio.all_tasks(loop):
                if not task.done():
                    site = sites.get(id(task), "?")
                    watch.cancelled_at_exit.append(_describe_task(task, site))
            cancel_all(loop)

        monkeypatch.setattr(asyncio.tasks, "Task", RecordedTask)
        monkeypatch.setattr(asyncio.runners, "_cancel_all_tasks", cancel_all_recorded)
        monkeypatch.setattr(asyncio.base_events.BaseEventLoop, "_asyncgen_finalizer_hook", finalize_recorded)

    # --- threads ---

    def _patch_threads(self, monkeypatch: pytest.MonkeyPatch) -> None:
        start = threading.Thread.start
        watch = self

        def recorded_start(thread: threading.Thread) -> None:
            watch.thread_sites[thread] = _site(sys._getframe(1))
            start(thread)

        monkeypatch.setattr(threading.Thread, "start", recorded_start)

    def _threads_left(self) -> list[str]:
        new = [
            t
            for t in threading.enumerate()
            if t not in self.threads_before
            and not isinstance(t, threading._DummyThread)  # type: ignore[attr-defined]
            and not (t.daemon and t.name in LIBRARY_DAEMONS)
        ]
        deadline = time.monotonic() + THREAD_JOIN_GRACE_S
        for thread in new:
            thread.join(max(0.0, deadline - time.monotonic()))
        left = []
        for thread in new:
            if thread.is_alive():
                target = getattr(thread, "_target", None)
                runs = f" running {getattr(target, '__qualname__', target)}" if target else ""
                site = self.thread_sites.get(thread, "?")
                left.append(f"thread {thread.name!r}{runs} (daemon={thread.daemon}); started at {site}")
        return left

    # --- Qt ---

    def _patch_qt(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from PySide6.QtCore import QObject, QTimer

        watch = self
        start = QTimer.start
        single_shot = QTimer.singleShot

        def recorded_start(timer: QTimer, *args: Any) -> None:
            watch.timers[timer] = _site(sys._getframe(1))
            start(timer, *args)

        def recorded_single_shot(*args: Any) -> None:
            *rest, last = args
            if not callable(last):  # a slot named by a string: cannot be followed
                single_shot(*args)
                return
            shot = watch._next_shot
            watch._next_shot += 1
            watch.single_shots[shot] = _site(sys._getframe(1))
            contexts = [a for a in rest if isinstance(a, QObject)]
            if contexts:  # Qt drops the shot when its context object goes: then nothing is left
                watch.shot_contexts[shot] = contexts[0]

            def fire(*fired: Any) -> None:
                watch.single_shots.pop(shot, None)
                last(*fired)

            single_shot(*rest, fire)

        monkeypatch.setattr(QTimer, "start", recorded_start)
        monkeypatch.setattr(QTimer, "singleShot", staticmethod(recorded_single_shot))

    def _timers_left(self) -> list[str]:
        if "PySide6" not in sys.modules:
            return []
        import shiboken6

        left = []
        for timer, site in list(self.timers.items()):
            if shiboken6.isValid(timer) and timer.isActive():
                name = timer.objectName() or type(timer).__name__
                left.append(f"QTimer {name!r} ({timer.interval()} ms) still active; started at {site}")
        left += [
            f"QTimer.singleShot not fired yet; set at {site}"
            for shot, site in self.single_shots.items()
            if shot not in self.shot_contexts or shiboken6.isValid(self.shot_contexts[shot])
        ]
        return left

    # --- the verdict ---

    def leaks(self) -> list[str]:
        pending = [_describe_task(t, site) for t, site in self.tasks if not t.done()]
        left = [*(f"{p} (pending at the end)" for p in pending)]
        left += [f"{c} (cancelled by asyncio.run at exit)" for c in self.cancelled_at_exit]
        left += self._timers_left()
        left += self._threads_left()
        return left


def check(watch: LeakWatch, fail: Callable[[str], object]) -> None:
    left = watch.leaks()
    if left:
        fail("The test left these running:\n  " + "\n  ".join(left))
