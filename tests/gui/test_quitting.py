"""Quitting runs in stages, in order, each bounded and logged: a stage that hangs or fails is left
behind and the next one runs, so quitting always ends; the first stage runs inside ``quit()``; quitting
in the middle of a reply stops and reaps its engine (the stand-in engine, a real child process)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from pytestqt.qtbot import QtBot

from app.core.chat import MessageState
from app.store.history import History
from app.store.settings import Settings, save_settings
from app.ui.desktop import DesktopApp
from app.ui.quitting import Quitter, Stage
from tests.support.standin import make_standin_model

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


def test_quitting_mid_reply_stops_and_reaps_the_engine(
    qtbot: QtBot, desktop: Callable[[], DesktopApp], standin_settings: Settings, tmp_path: Path
) -> None:
    save_settings(dataclasses.replace(standin_settings, api_enabled=False))
    app = desktop()
    bridge = app.bridge
    with qtbot.waitSignal(bridge.model_added) as added:
        bridge.import_model(str(make_standin_model(tmp_path, "long", tokens=100_000, token_delay_s=0.01)))
    name = added.args[0]
    bridge.save_options(name, dataclasses.replace(bridge.options(name), backend="system"))
    app.window.models.select(name)
    chat = app.window.chat
    chat.composer.setPlainText("talk for ever")
    with qtbot.waitSignal(bridge.reply_delta, timeout=120_000):  # the reply streams
        chat.submit()
    engine = bridge.router.engines.get(name)
    assert engine is not None and engine.pid is not None
    process = psutil.Process(engine.pid)
    app.quit()
    qtbot.waitUntil(lambda: app.finished, timeout=60_000)
    assert not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    assert bridge.router.engines.get(name) is None
    history = History()
    conversation = history.conversation(chat.conversation_id)
    history.close()
    assert conversation is not None
    kept = conversation.messages[-1]
    assert kept.state is MessageState.STREAMING and kept.content, "the reply so far, as interrupted"
