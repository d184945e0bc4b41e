"""A chat's tool calls as front ends see them (``ToolCallStarted``, ``ToolCallFinished``: events in the
reply's stream, beside its deltas; ``ToolsWithheld`` when the model gets none), the user's answer when
one asks first (``Permission``), whether a model can call tools (``tool_support``), and the bounds on
what a reply's tools may do. Pure: the loop that runs them is ``app.supervisor.router.tools``.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

MAX_RESULT_CHARS = 32_000  # of one tool's answer, kept and sent back to the model
MAX_CALLS_PER_ROUND = 8  # calls one reply's round may run; the rest are told to the model as not run
TOOL_LABEL = "tool-calling"  # the catalog's (and Lemonade's) label of a model that calls tools
_NAMES_TOOLS = re.compile(r"\btools\b")


class Permission(Enum):
    ALLOW_ONCE = "once"  # run this call; ask again next time
    ALWAYS = "always"  # run it, and every later call of this tool of this server (saved)
    DENY = "deny"  # do not run it; the model is told


class ToolOutcome(Enum):
    OK = "ok"  # the tool answered
    ERROR = "error"  # the tool answered with an error, or could not be called (no such tool, bad arguments)
    DENIED = "denied"  # the user said no
    TIMED_OUT = "timed_out"  # no answer within the time limit per call
    NOT_RUN = "not_run"  # the reply reached its limit of tool rounds, or of calls in one round


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


@dataclass(frozen=True)
class ToolsWithheld:
    """The chat's tools were not offered to the model: ``why``, in one line saying what to do."""

    why: str


ToolEvent = ToolCallStarted | ToolCallFinished | ToolsWithheld
TOOL_EVENTS = (ToolCallStarted, ToolCallFinished, ToolsWithheld)  # for isinstance
Ask = Callable[[ToolRequest], Awaitable[Permission]]  # what a front end gives: ask the user about a call


def bounded(text: str, limit: int = MAX_RESULT_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how much was cut: never cut silently."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[... {len(text) - limit} more characters were cut: the answer was too long.]"


@dataclass(frozen=True)
class ToolSupport:
    """Whether a model is offered tools, and, when not, the line that says why and what to do."""

    can: bool
    why: str = ""


def tool_support(
    model: str,
    *,
    caps: Mapping[str, object] | None = None,
    template: str | None = None,
    labels: Collection[str] = (),
    remote: bool = False,
) -> ToolSupport:
    """Whether ``model`` can call tools, from the best word there is: a remote's model is offered them
    (its server applies its own template, as it takes or refuses an image); llama-server's own reading
    of the chat template it runs (``/props``'s ``chat_template_caps``: the template lists the tools and
    writes the model's calls) decides a model it serves, whatever its labels say; else the model's
    ``tool-calling`` label; else its own chat template's text (an MLX folder's), which must name
    ``tools``. None of these: not offered."""
    if remote:
        return ToolSupport(True)
    if caps is not None:
        if caps.get("supports_tools") is True and caps.get("supports_tool_calls") is True:
            return ToolSupport(True)
        return ToolSupport(
            False,
            f"No tools for {model}: its chat template does not take tools. Choose a model that calls "
            "tools, or give this one a template that does (--chat-template-file in its options).",
        )
    if TOOL_LABEL in labels or (template is not None and _NAMES_TOOLS.search(template)):
        return ToolSupport(True)
    said = "its chat template names no tools" if template is not None else "its engine does not say"
    return ToolSupport(
        False,
        f"No tools for {model}: it is not known to call tools ({said}, and it has no {TOOL_LABEL} "
        "label). Choose a model that calls tools for this chat.",
    )
