"""Who hears of what happens: one list of callbacks, called in order on the loop thread. A listener that
raises is logged and the others still hear the event (one broken window must not stop an engine)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)
E = TypeVar("E")


class Listeners(Generic[E]):
    """The callbacks to call with each event of type ``E``."""

    def __init__(self, what: str) -> None:
        self._what = what  # for the log: whose listener failed
        self._listeners: list[Callable[[E], None]] = []

    def add(self, listener: Callable[[E], None]) -> Callable[[], None]:
        """Call ``listener(event)`` for every event; returns the function that removes it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def emit(self, event: E) -> None:
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:
                log.exception("a listener of %s failed on %s", self._what, event)
