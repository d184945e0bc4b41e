"""GUI tests run on the app's event loop (``DesktopLoop``, a qasync loop) marked as running, turned by
qtbot's waits."""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import Callable, Iterator

import pytest
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot, _WaitWidgetContextManager
from pytestqt.wait_signal import CheckParamsCb, SignalBlocker

from app.store.settings import settings_path
from app.ui.desktop import DesktopApp
from app.ui.event_loop import DesktopLoop

# pytest-qt's waits give up after 5 s unless told otherwise. A wait is a deadline, not a timing: a state
# that comes in half a second here may take five on a machine ten times slower, so an unbounded wait
# (one that names no timeout) waits this long.
WAIT_MS = 30_000


class PatientQtBot(QtBot):
    """qtbot with WAIT_MS as the default deadline of waitUntil, waitSignal and waitExposed."""

    def waitUntil(self, callback: Callable[[], bool | None], *, timeout: int = WAIT_MS) -> None:
        super().waitUntil(callback, timeout=timeout)

    def waitSignal(
        self,
        signal: object,
        *,
        timeout: int = WAIT_MS,
        raising: bool | None = None,
        check_params_cb: CheckParamsCb | None = None,
    ) -> SignalBlocker:
        return super().waitSignal(signal, timeout=timeout, raising=raising, check_params_cb=check_params_cb)

    def waitExposed(self, widget: object, *, timeout: int = WAIT_MS) -> _WaitWidgetContextManager:
        return super().waitExposed(widget, timeout=timeout)


@pytest.fixture
def qtbot(qtbot: QtBot) -> QtBot:
    """pytest-qt's qtbot (which also reports exceptions raised in Qt's callbacks), made patient."""
    qtbot.__class__ = PatientQtBot
    return qtbot


@pytest.fixture(autouse=True)
def no_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    """A window reads model headers from the Hub when a row is selected: by default no Hub answers (a
    closed loopback port, refused at once); tests that want one start the loopback Hub over this."""
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")


@pytest.fixture
def qt_loop(qapp: QApplication) -> Iterator[DesktopLoop]:
    loop = DesktopLoop(qapp, already_running=True)
    asyncio.set_event_loop(loop)
    yield loop
    # run_forever never ran: undo what already_running did (stop() would call QApplication.exit())
    loop._QEventLoop__is_running = False  # type: ignore[attr-defined]
    asyncio.events._set_running_loop(None)  # else a later asyncio.run() in this process finds it running
    loop._after_run_forever()
    loop.close()
    asyncio.set_event_loop(None)


@pytest.fixture
def desktop(qtbot: QtBot, qapp: QApplication, qt_loop: object) -> Iterator[Callable[[], DesktopApp]]:
    """Makes the app as a launch does (once its models and backends are known); quits each at the end,
    waiting until every engine has stopped."""
    made: list[DesktopApp] = []

    def make() -> DesktopApp:
        local_api_off_unless_set()
        app = DesktopApp(qapp)
        app.exit_app = lambda: None  # the test process's QApplication lives on for the next test
        qtbot.addWidget(app.window)
        app.window.show()
        qtbot.waitExposed(app.window)
        app.start()
        qtbot.waitUntil(lambda: app.bridge.info is not None, timeout=30_000)
        made.append(app)
        return app

    yield make
    for app in made:
        quit_and_wait(qtbot, app)
    made.clear()
    # Collect the apps' reference cycles here, on the Qt thread: left to a later collection, that can run
    # in any thread that allocates (a download's, a probe's), and a QObject destroyed off its thread
    # leaves its timers registered, to fire on freed memory (a segfault in a later test).
    gc.collect()


def local_api_off_unless_set() -> None:
    """The window serves the local API by default; in tests it is off (and on any free port, so that
    tests never collide) unless the test's settings say otherwise. A settings file a test made
    unreadable on purpose is left as it is."""
    path = settings_path()
    try:
        data = json.loads(path.read_text()) if path.exists() else {}
    except ValueError:
        return
    if isinstance(data, dict) and "api_port" not in data:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**data, "api_port": 0, "api_enabled": False}))


def quit_and_wait(qtbot: QtBot, app: DesktopApp) -> None:
    app.quit()
    qtbot.waitUntil(lambda: app.finished, timeout=60_000)
