"""Start the Qt application, show the main window, then run the app on a qasync event loop.

On Linux, before Qt starts, the app checks that there is a display to open the window on (over SSH there
often is none, and Qt then aborts blaming a library that is installed), and loads Qt's X11 platform plugin
once to see that the system libraries it needs are there: without one (``libxcb-cursor0`` is often
missing) Qt aborts with a list of plugins and no word of which library it lacked. The app says which, and
how to install it, instead.

The window is built and painted before asyncio and qasync are imported (about 20 ms of imports): nothing
it needs runs on the loop. What does (the bridge with the router and the local API, the single-instance
server, quitting) starts once the loop runs.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import socket
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from PySide6.QtCore import QEventLoop, QLibraryInfo, QObject, QSocketNotifier
from PySide6.QtWidgets import QApplication

from app.core.errors import UnsupportedError
from app.ui import heap
from app.ui.desktop import DesktopApp
from app.ui.single_instance import SingleInstance

NO_SINGLE_INSTANCE = "another launch will open a second window"


class QuitOnSignals:
    """SIGTERM / SIGINT quit the app like Quit does (every engine is stopped). Quitting runs on the event
    loop: a signal that comes before the loop runs (while the window paints and the loop's modules load)
    is acted on once it does. The wakeup fd makes Qt notice a signal with no polling."""

    def __init__(self, owner: QObject, quit_app: Callable[[], None]) -> None:
        self._quit_app = quit_app
        self._loop_running = False
        self._asked = False
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)
        self._previous_fd = signal.set_wakeup_fd(self._writer.fileno())
        self._notifier = QSocketNotifier(self._reader.fileno(), QSocketNotifier.Type.Read, owner)
        self._notifier.activated.connect(self._drain)
        self._previous = {sig: signal.signal(sig, self._signalled) for sig in (signal.SIGTERM, signal.SIGINT)}

    def close(self) -> None:
        """Put back the handlers and the wakeup fd that were there before."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(self._previous_fd)
        self._notifier.setEnabled(False)
        self._reader.close()
        self._writer.close()

    def loop_runs(self) -> None:
        self._loop_running = True
        if self._asked:
            self._quit_app()

    def _drain(self) -> None:
        self._reader.recv(64)

    def _signalled(self, _signum: int, _frame: object) -> None:
        if self._loop_running:
            self._quit_app()
        else:
            self._asked = True


def x11_plugin() -> Path:
    return Path(QLibraryInfo.path(QLibraryInfo.LibraryPath.PluginsPath)) / "platforms" / "libqxcb.so"


def check_x11_libraries(plugin: Path, environ: Mapping[str, str]) -> None:
    """Refuse to start Qt on X11 when ``plugin`` (its X11 platform plugin) cannot load: an
    UnsupportedError naming the missing library and the Debian package that usually holds it. Nothing
    is checked where Qt would not use X11 (another platform asked for, a Wayland session, no display)."""
    platform = environ.get("QT_QPA_PLATFORM", "")
    if sys.platform != "linux" or platform not in ("", "xcb") or not environ.get("DISPLAY"):
        return
    if not platform and environ.get("WAYLAND_DISPLAY"):
        return  # Qt may well use Wayland, which needs none of these
    try:
        ctypes.CDLL(str(plugin))
    except OSError as err:
        missing = re.search(r"([\w.+-]+\.so(?:\.\d+)*): cannot open shared object file", str(err))
        if missing is None:
            raise UnsupportedError(
                f"The window cannot open: Qt's X11 support ({plugin.name}) does not load ({err}).",
                f"Without the window: {HEADLESS}",
            ) from None
        library = missing[1]
        stem, _, version = library.partition(".so")
        version = version.lstrip(".")
        package = f"{stem}{'-' if stem[-1:].isdigit() else ''}{version}" if version else stem
        raise UnsupportedError(
            f"The window cannot open: Qt's X11 support needs the system library {library}, which is "
            "not installed.",
            f"On Debian or Ubuntu: sudo apt install {package} (other systems name the package after "
            f"the library too). {HEADLESS}",
        ) from None


HEADLESS = (
    "The commands work without one: lemon-desk serve (the local API for other apps), "
    "lemon-desk run MODEL (chat in the terminal), lemon-desk models, lemon-desk --help."
)
# Qt platforms that draw to no screen, so need no display.
SCREENLESS = ("offscreen", "minimal", "minimalegl", "vnc", "vkkhrdisplay", "eglfs", "linuxfb")


def check_display(environ: Mapping[str, str]) -> None:
    """Refuse to start Qt on Linux when it has no display to open the window on: neither ``DISPLAY`` (X11)
    nor ``WAYLAND_DISPLAY`` is set and no screenless platform is asked for (``QT_QPA_PLATFORM``)."""
    platform = environ.get("QT_QPA_PLATFORM", "").split(":")[0]
    if sys.platform != "linux" or platform in SCREENLESS:
        return
    both = ("DISPLAY", "WAYLAND_DISPLAY")
    wanted = {"xcb": both[:1], "wayland": both[1:]}.get(platform, both)
    if not any(environ.get(name) for name in wanted):
        raise UnsupportedError(
            f"The window cannot open: there is no display ({' and '.join(wanted)} not set; "
            "started over SSH or from a service?).",
            HEADLESS,
        )


def run_window() -> int:
    if QApplication.instance() is None:
        check_display(os.environ)
        check_x11_libraries(x11_plugin(), os.environ)
    app = QApplication.instance() or QApplication(sys.argv)
    assert isinstance(app, QApplication)
    app.setApplicationName("Lemon Desk")
    app.setOrganizationName("lemon-desk")
    instance = SingleInstance()
    try:
        if not instance.claim():
            return 0  # the running instance was asked to show its window
    except OSError as err:
        print(f"warning: {err}; {NO_SINGLE_INSTANCE}.", file=sys.stderr)
    desktop = DesktopApp(app, instance)
    signals = QuitOnSignals(app, desktop.quit)
    window = desktop.window
    window.show()
    # One turn of Qt's loop paints the window. Input (closing it included) waits for the app's loop.
    app.processEvents(QEventLoop.ProcessEventsFlag.ExcludeUserInputEvents)
    if os.environ.get("LEMON_DESK_PRINT_READY"):  # for tests and the launch benchmark
        print(f"window shown: {window.windowTitle()}", flush=True)
        instance.activation_requested.connect(lambda: print("asked to show the window", flush=True))
    import asyncio

    from app.ui.event_loop import DesktopLoop

    loop = DesktopLoop(app)
    asyncio.set_event_loop(loop)
    with loop:
        code: int = loop.run_until_complete(_run(app, desktop, instance, signals))
    signals.close()
    return code


def _listen(instance: SingleInstance) -> None:
    try:
        instance.listen()
    except OSError as err:
        print(f"warning: {err}; {NO_SINGLE_INSTANCE}.", file=sys.stderr)


async def _run(
    app: QApplication, desktop: DesktopApp, instance: SingleInstance, signals: QuitOnSignals
) -> int:
    import asyncio

    closed = asyncio.Event()
    app.aboutToQuit.connect(closed.set)
    signals.loop_runs()  # a signal that came while the window was being shown quits now
    if not desktop.quitting:
        loop = asyncio.get_running_loop()
        loop.call_soon(_listen, instance)  # the lock holds back another launch until this listens
        loop.call_soon(desktop.start_or_explain)
        loop.call_soon(heap.settle)  # then the start-up heap leaves the garbage collector's walks
    await closed.wait()
    return 0
