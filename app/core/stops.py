"""Stop sequences applied by the app, for an engine that takes them but does not act on them:
lemon-mlx-engine b1050-stable parses a request's ``stop`` and never uses it (docs/lemon-mlx-engine.md).

The cutter works on streamed text as it comes, so a stop string cut across two chunks is still found;
the only text it holds back is a tail that could still become a stop string.
"""

from __future__ import annotations

from collections.abc import Sequence


def _partial(text: str, stop: str) -> int:
    """Length of the longest tail of ``text`` that is a proper start of ``stop``."""
    for size in range(min(len(stop) - 1, len(text)), 0, -1):
        if text.endswith(stop[:size]):
            return size
    return 0


class StopCutter:
    """Feed a reply's text; get back the text before its first stop string. ``hit`` says one came:
    nothing after it is given, and the reply should end there."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""
        self.hit = False

    def feed(self, text: str) -> str:
        if self.hit:
            return ""
        text = self._held + text
        found = [i for i in (text.find(s) for s in self._stops) if i >= 0]
        if found:
            self.hit, self._held = True, ""
            return text[: min(found)]
        keep = max((_partial(text, s) for s in self._stops), default=0)
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep]

    def flush(self) -> str:
        """What is still held back when the reply ends without a stop string."""
        held, self._held = self._held, ""
        return held


def stop_strings(value: object) -> tuple[str, ...]:
    """A request's ``stop`` (one string, or a list of them) as a tuple; anything else, none."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list):
        return tuple(s for s in value if isinstance(s, str))
    return ()


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """A whole reply's text before its first stop string, and whether one was found."""
    cutter = StopCutter(stops)
    head = cutter.feed(text)
    return (head, True) if cutter.hit else (head + cutter.flush(), False)
