"""The terminal chat's rule for a message that would not fit the model's context: nothing is cut
silently. The chat is counted before each send (``Router.count_context``, with the tools of the run's MCP
servers offered, as the window counts them); one that would not fit is
said in plain words, and the user chooses a way out (or ``run --on-overflow`` chose one beforehand):
reload with a larger context that fits the memory free now, go on from a summary the model writes (which
says so when the chat was too long to summarize whole and its oldest messages were left out of it), or
leave out the oldest turns (the chat keeps them; they are no longer sent)."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from app.core.context import ContextCount, Overflow
from app.supervisor.router import Router

KEYS = {Overflow.RELOAD: "r", Overflow.SUMMARY: "s", Overflow.LEAVE_OUT: "l"}


@dataclass
class TerminalChat:
    """What the terminal chat holds: every message, and how many of the oldest are no longer sent."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    left_out: int = 0

    def sent(self) -> list[dict[str, Any]]:
        return self.messages[self.left_out :]


def _choices(count: ContextCount) -> str:
    said = {
        Overflow.RELOAD: f"load the model again with a context of {count.larger or 0:,} tokens (it fits)",
        Overflow.SUMMARY: "go on from a summary of the chat so far, written by the model",
        Overflow.LEAVE_OUT: f"leave out the {count.leave_out} oldest messages (they are no longer sent)",
    }
    lines = [f"  {KEYS[way]}) {said[way]}" for way in count.ways_out()]
    return "\n".join([*lines, "  c) cancel: this message is not sent"])


async def make_room(
    router: Router,
    name: str,
    chat: TerminalChat,
    ask: Callable[[], Awaitable[str | None]],
    preset: Overflow | None = None,
    servers: Collection[str] = (),
) -> bool:
    """Make the chat's last message fit before it is sent: True when it fits (as it is, or by the way
    out chosen), False when the user cancelled (the message is then not sent). ``servers``: the MCP
    servers whose tools the send offers, counted with it."""
    count = await router.count_context(name, chat.sent(), {}, servers)
    if count is None or count.fits:
        return True
    print(f"\n{count.problem()}", file=sys.stderr)
    ways = count.ways_out()
    way = preset if preset in ways else None
    if preset is not None and way is None:
        print(f"--on-overflow {preset.value} cannot help here.", file=sys.stderr)
    while way is None:
        print(f"{_choices(count)}\nChoose: ", end="", file=sys.stderr, flush=True)
        answer = await ask()
        if answer is None or answer.strip().lower() in ("c", "cancel"):
            return False
        way = next((w for w in ways if KEYS[w] == answer.strip().lower()), None)
    if way is Overflow.RELOAD and count.larger:
        print(f"Loading {name} again with a context of {count.larger:,} tokens…", file=sys.stderr)
        await router.reload_with_context(name, count.larger)
    elif way is Overflow.SUMMARY:
        *before, question = chat.sent()
        opening = (await router.summarize(name, before, {})).opening()
        print(opening, file=sys.stderr)
        chat.messages = [{"role": "assistant", "content": opening}, question]
        chat.left_out = 0
    else:
        chat.left_out += count.leave_out
        print(f"(left out the {count.leave_out} oldest messages)", file=sys.stderr)
    return await make_room(router, name, chat, ask, servers=servers)  # asked, if it still does not fit
