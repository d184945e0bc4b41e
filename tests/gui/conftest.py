"""GUI tests run on the app's event loop: a qasync loop marked as running, turned by qtbot's waits."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import qasync
from PySide6.QtWidgets import QApplication


@pytest.fixture
def qt_loop(qapp: QApplication) -> Iterator[qasync.QEventLoop]:
    loop = qasync.QEventLoop(qapp, already_running=True)
    asyncio.set_event_loop(loop)
    yield loop
    # run_forever never ran: undo what already_running did (stop() would call QApplication.exit())
    loop._QEventLoop__is_running = False  # type: ignore[attr-defined]
    loop._after_run_forever()
    loop.close()
    asyncio.set_event_loop(None)
