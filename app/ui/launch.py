"""Start the Qt application on a qasync event loop and show the main window."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import Callable

import qasync
from PySide6.QtCore import QSocketNotifier
from PySide6.QtWidgets import QApplication

from app.ui import heap
from app.ui.desktop import DesktopApp
from app.ui.single_instance import SingleInstance


def _quit_on_signals(app: QApplication, quit_app: Callable[[], None]) -> QSocketNotifier:
    """SIGTERM / SIGINT quit the app cleanly; the wakeup fd makes Qt notice them with no polling."""
    reader, writer = socket.socketpair()
    reader.setblocking(False)
    writer.setblocking(False)
    signal.set_wakeup_fd(writer.fileno())
    notifier = QSocketNotifier(reader.fileno(), QSocketNotifier.Type.Read, app)
    notifier.activated.connect(lambda: reader.recv(64))
    notifier.setProperty("sockets", (reader, writer))  # keep both ends alive with the notifier
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: quit_app())
    return notifier


def run_window() -> int:
    app = QApplication.instance() or QApplication(sys.argv)
    assert isinstance(app, QApplication)
    app.setApplicationName("Lemon Desk")
    app.setOrganizationName("lemon-desk")
    instance = SingleInstance()
    try:
        if not instance.claim():
            return 0  # the running instance was asked to show its window
    except OSError as err:
        print(f"warning: {err}; another launch will open a second window.", file=sys.stderr)
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    with loop:
        # The app runs on the loop from the start: its bridge starts tasks as it is built.
        code: int = loop.run_until_complete(_run(app, instance))
    return code


async def _run(app: QApplication, instance: SingleInstance) -> int:
    desktop = DesktopApp(app, instance)
    notifier = _quit_on_signals(app, desktop.quit)  # SIGTERM quits like Quit: every engine is stopped
    window = desktop.window
    window.show()
    loop = asyncio.get_running_loop()
    if os.environ.get("LEMON_DESK_PRINT_READY"):  # for tests and the launch benchmark
        loop.call_soon(lambda: print(f"window shown: {window.windowTitle()}", flush=True))
        instance.activation_requested.connect(lambda: print("asked to show the window", flush=True))
    loop.call_soon(desktop.start)  # after the window's first turn of the loop
    loop.call_soon(heap.settle)  # then the start-up heap leaves the garbage collector's walks
    closed = asyncio.Event()
    app.aboutToQuit.connect(closed.set)
    await closed.wait()
    del notifier
    return 0
