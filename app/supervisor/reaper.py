"""The reaper: a helper process beside each engine where the OS cannot kill the engine with the app.

On Linux an engine gets SIGKILL when the app dies (``PR_SET_PDEATHSIG``, ``process.die_with_parent``).
Elsewhere (macOS) the app starts itself in a helper mode beside each engine::

    python -P -m app --reap-engine ENGINE_PID APP_PID     (a frozen bundle: <bundle> --reap-engine ...)

It waits for either side to end: kqueue ``NOTE_EXIT`` on both pids where ``select.kqueue`` exists, else
a poll every ``POLL_S`` (the app is gone when the reaper's parent changes). If the app went first, it
kills the engine's process group with SIGKILL, as PDEATHSIG would; either way it then exits, so it is
never left behind itself. It leads its own session, so a Ctrl-C meant for the app does not end it.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from collections.abc import Sequence

import psutil

from app.supervisor.process import signal_group

FLAG = "--reap-engine"
POLL_S = 0.5


def reaper_command(engine_pid: int) -> list[str]:
    """The command line that starts a reaper for ``engine_pid`` on behalf of this process.

    ``-P``: the current folder must not be able to put another ``app`` package in its place.
    """
    me = [sys.executable] if getattr(sys, "frozen", False) else [sys.executable, "-P", "-m", "app"]
    return [*me, FLAG, str(engine_pid), str(os.getpid())]


def _app_went_first_kqueue(engine_pid: int, app_pid: int) -> bool:
    if sys.platform == "linux" or sys.platform == "win32":  # tells the type checker, too
        raise RuntimeError("no kqueue here")
    kq = select.kqueue()
    try:
        for pid in (app_pid, engine_pid):
            event = select.kevent(
                pid,
                filter=select.KQ_FILTER_PROC,
                flags=select.KQ_EV_ADD | select.KQ_EV_ONESHOT,
                fflags=select.KQ_NOTE_EXIT,
            )
            try:
                kq.control([event], 0)
            except ProcessLookupError:  # already gone
                return pid == app_pid
        if os.getppid() != app_pid:  # it went before we watched, and its pid is another's now
            return True
        return any(fired.ident == app_pid for fired in kq.control(None, 2))
    finally:
        kq.close()


def _app_went_first_polling(engine: psutil.Process, app_pid: int, poll_s: float) -> bool:
    while os.getppid() == app_pid:
        if not engine.is_running():  # also false for a later process that got the engine's pid
            return False
        time.sleep(poll_s)
    return True


def reap(engine_pid: int, app_pid: int, poll_s: float = POLL_S) -> bool:
    """Wait until the app or the engine ends; if the app went first, kill the engine's process group.

    Returns True when it killed the engine.
    """
    try:
        engine = psutil.Process(engine_pid)
    except psutil.NoSuchProcess:
        return False
    if hasattr(select, "kqueue"):
        app_went_first = _app_went_first_kqueue(engine_pid, app_pid)
    else:
        app_went_first = _app_went_first_polling(engine, app_pid, poll_s)
    if not app_went_first or not engine.is_running():
        return False
    signal_group(engine_pid, signal.SIGKILL)
    return True


def main(argv: Sequence[str]) -> int:
    """``--reap-engine ENGINE_PID APP_PID``: the helper mode, before any of the app's other imports."""
    if len(argv) != 2 or not all(arg.isascii() and arg.isdigit() for arg in argv):  # isdigit takes "²"
        print(f"usage: {FLAG} ENGINE_PID APP_PID", file=sys.stderr)
        return 2
    reap(int(argv[0]), int(argv[1]))
    return 0
