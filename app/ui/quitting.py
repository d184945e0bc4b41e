"""Quitting in stages, each bounded and logged (the shape of qutebrowser's ``misc/quitter.py``):

1. stop accepting, at once, inside ``quit()``: the window and the tray go, the bridge passes nothing on
   and starts nothing new;
2. cancel streams: the local API stops, every task the bridge started is cancelled (a reply closes its
   stream), unloads under way are waited for;
3. save: the reply in flight is written to the history as it is, the window's state (in a worker
   thread);
4. stop engines: the router shuts down (every engine stopped and reaped, downloads paused);
5. close: the chat history and the single-instance server close, and the app exits.

A stage that overruns its bound is logged and left behind, and the next one runs: quitting always ends.
An engine still running then dies with the app all the same (PDEATHSIG or the reaper, ``child.py``).
Only the first ``quit()`` counts (``is_shutting_down``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from PySide6.QtGui import QGuiApplication

if TYPE_CHECKING:
    from app.ui.desktop import DesktopApp

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Stage:
    name: str  # for the log
    run: Callable[[], Awaitable[object] | None]  # a coroutine function, or a plain function
    bound_s: float  # how long it may take before quitting goes on without it


# Generous: they bound a stage that hangs, not a slow machine. Stopping engines allows for each engine's
# own terminate-then-kill grace (app.supervisor.child), run side by side.
CANCEL_S = 30.0
SAVE_S = 15.0
ENGINES_S = 90.0
CLOSE_S = 15.0


class Quitter:
    """Runs ``stages`` in order, once."""

    def __init__(self, stages: Sequence[Stage]) -> None:
        self.stages = tuple(stages)
        self.is_shutting_down = False
        self.overrun: list[str] = []  # the stages that were left behind, by name
        self.task: asyncio.Task[None] | None = None

    def quit(self) -> asyncio.Task[None]:
        """Start quitting: the first stage runs now (a plain function), the others in the task returned
        (a second call returns the first one's task)."""
        if self.task is None:
            self.is_shutting_down = True
            first, *rest = self.stages
            began = time.monotonic()
            log.info("quitting: %s", first.name)
            try:
                first.run()
            except Exception:
                log.exception("quitting: %s failed; going on", first.name)
            else:
                log.info("quitting: %s done in %.2f s", first.name, time.monotonic() - began)
            self.task = asyncio.ensure_future(self._run(rest))
        return self.task

    async def _run(self, stages: Sequence[Stage]) -> None:
        for stage in stages:
            await self._run_stage(stage)

    async def _run_stage(self, stage: Stage) -> None:
        began = time.monotonic()
        log.info("quitting: %s", stage.name)
        try:
            outcome = stage.run()
            if outcome is not None:
                await asyncio.wait_for(_awaited(outcome), stage.bound_s)
        except TimeoutError:
            self.overrun.append(stage.name)
            log.warning("quitting: %s took over %.0f s; going on without it", stage.name, stage.bound_s)
            return
        except Exception:  # a stage that fails must not keep the app from ending
            log.exception("quitting: %s failed; going on", stage.name)
            return
        log.info("quitting: %s done in %.2f s", stage.name, time.monotonic() - began)


async def _awaited(outcome: Awaitable[object]) -> object:
    return await outcome


def desktop_quitter(app: DesktopApp) -> Quitter:
    """The desktop app's stages."""
    from app.ui.desktop import window_state_store

    state: dict[str, object] = {}  # the window's, taken before it goes

    def stop_accepting() -> None:
        # The style hints outlive the app object (they are the process's): stop hearing from them.
        QGuiApplication.styleHints().colorSchemeChanged.disconnect(app.scheme_changed)
        if app.started:
            app.bridge.blockSignals(True)  # the window is going: what the engines do now is for no one
            app.bridge.stop_accepting()
        app.window.chat.stop_timers()
        state.update(app.window.state())
        app.tray.hide()
        app.window.hide()

    async def cancel_streams() -> None:
        if app.started:
            await app.bridge.stop_api()
            await app.bridge.cancel_tasks()

    def write_window_state() -> None:
        store = window_state_store()
        for key, value in state.items():
            store.setValue(key, value)
        store.sync()

    async def save() -> None:
        if app.started:
            app.keeper.flush()
        await asyncio.to_thread(write_window_state)

    async def stop_engines() -> None:
        if app.started:
            await app.bridge.stop_router()

    def close() -> None:
        try:
            if app.started:
                app.history.close()
            if app.instance is not None:
                app.instance.close()
        finally:
            app.finished = True
            app.exit_app()

    return Quitter(
        [
            Stage("stop accepting", stop_accepting, CLOSE_S),
            Stage("cancel streams", cancel_streams, CANCEL_S),
            Stage("save", save, SAVE_S),
            Stage("stop engines", stop_engines, ENGINES_S),
            Stage("close", close, CLOSE_S),
        ]
    )
