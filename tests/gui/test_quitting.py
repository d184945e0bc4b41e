"""Quitting runs in stages, in order, each bounded and logged: a stage that hangs or fails is left
behind and the next one runs, so quitting always ends; the first stage runs inside ``quit()``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest
from pytestqt.qtbot import QtBot

from app.ui.desktop import DesktopApp
from app.ui.quitting import Quitter, Stage

STAGES = ["stop accepting", "cancel streams", "save", "stop engines", "close"]


def test_the_stages_run_in_order_and_one_that_hangs_or_fails_is_left_behind(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ran: list[str] = []
    hung = asyncio.Event()  # never set

    async def hangs() -> None:
        ran.append("hangs")
        await hung.wait()

    async def fails() -> None:
        ran.append("fails")
        raise OSError("the disk is gone")

    async def last() -> None:
        ran.append("last")

    async def main() -> Quitter:
        quitter = Quitter(
            [
                Stage("first", lambda: ran.append("first"), 1.0),
                Stage("hangs", hangs, 0.2),  # it never ends: any bound shows it is left behind
                Stage("fails", fails, 30.0),
                Stage("last", last, 30.0),
            ]
        )
        task = quitter.quit()
        assert ran == ["first"], "the first stage ran inside quit(), before it returned"
        assert quitter.quit() is task, "a second quit() is the first one"
        await task
        return quitter

    with caplog.at_level(logging.INFO, logger="app.ui.quitting"):
        quitter = asyncio.run(main())
    assert ran == ["first", "hangs", "fails", "last"]
    assert quitter.is_shutting_down and quitter.overrun == ["hangs"]
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("quitting: hangs took over") and m.endswith("going on without it") for m in said)
    assert "quitting: fails failed; going on" in said
    assert any(m.startswith("quitting: last done in") for m in said)


def test_the_desktop_quits_in_its_five_stages_in_order(
    qtbot: QtBot, desktop: Callable[[], DesktopApp], caplog: pytest.LogCaptureFixture
) -> None:
    app = desktop()
    with caplog.at_level(logging.INFO, logger="app.ui.quitting"):
        app.quit()
        assert not app.window.isVisible() and app.bridge.signalsBlocked()  # stage one: at once
        qtbot.waitUntil(lambda: app.finished, timeout=60_000)
    began = [m.removeprefix("quitting: ") for r in caplog.records if " done in " not in (m := r.getMessage())]
    done = [
        m.removeprefix("quitting: ").split(" done in ")[0]
        for r in caplog.records
        if " done in " in (m := r.getMessage())
    ]
    assert began == STAGES and done == STAGES
    assert app.bridge.shut_down and app.quitting
