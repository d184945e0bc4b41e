"""A chat's tool calls as front ends see them (``ToolCallStarted``, ``ToolCallFinished``: events in the
reply's stream, beside its deltas), the user's answer when one asks first (``Permission``), and the
bound on what a tool's answer may put in the app and in the model's context. Pure: the loop that runs
them is ``app.supervisor.router.tools``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

MAX_RESULT_CHARS = 32_000  # of one tool's answer, kept and sent back to the model


class Permission(Enum):
    ALLOW_ONCE = "once"  # run this call; ask again next time
    ALWAYS = "always"  # run it, and every later call of this tool of this server (saved)
    DENY = "deny"  # do not run it; the model is told


class ToolOutcome(Enum):
    OK = "ok"  # the tool answered
    ERROR = "error"  # the tool answered with an error, or could not be called (no such tool, bad arguments)
    DENIED = "denied"  # the user said no
    TIMED_OUT = "timed_out"  # no answer within the time limit per call
    NOT_RUN = "not_run"  # the reply reached its limit of tool rounds


@dataclass(frozen=True)
class ToolRequest:
    """A call the model asked for, as the user is asked about it."""

    call_id: str
    server: str
    tool: str  # the server's own name for it
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolCallStarted:
    """A call is running (it was allowed)."""

    request: ToolRequest


@dataclass(frozen=True)
class ToolCallFinished:
    """A call ended (or was never run); ``result`` is what the model was told."""

    request: ToolRequest
    outcome: ToolOutcome
    result: str
    elapsed_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        r = self.request
        return {
            "call_id": r.call_id,
            "server": r.server,
            "tool": r.tool,
            "arguments": r.arguments,
            "outcome": self.outcome.value,
            "result": self.result,
            "elapsed_s": round(self.elapsed_s, 3),
        }


ToolEvent = ToolCallStarted | ToolCallFinished
Ask = Callable[[ToolRequest], Awaitable[Permission]]  # what a front end gives: ask the user about a call


def bounded(text: str, limit: int = MAX_RESULT_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how much was cut: never cut silently."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[... {len(text) - limit} more characters were cut: the answer was too long.]"
