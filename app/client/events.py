"""What a chat stream yields: deltas as they arrive, then one ``ChatDone`` with the telemetry (and the
tools the model called, when it did)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.core.telemetry import Telemetry


@dataclass(frozen=True, slots=True)
class ChatDelta:
    content: str = ""  # answer text
    reasoning: str = ""  # "thinking" text (``delta.reasoning_content``, or split out of <think> tags)


@dataclass(frozen=True)
class ToolCall:
    """A tool the model asked for: the call's id, the function's name and its arguments (JSON text, as
    the model wrote it: maybe not JSON at all)."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class ChatDone:
    finish_reason: str | None  # "stop", "length"...: the engine's word, corrected where it errs; None: unsaid
    telemetry: Telemetry
    tool_calls: tuple[ToolCall, ...] = ()  # what the reply asked to run (finish_reason "tool_calls")
    restored: int = 0  # prompt tokens restored from a saved KV cache before it (app.supervisor.resume)


ChatEvent = ChatDelta | ChatDone


@dataclass(frozen=True)
class ChatReply:
    """A whole reply from a non-streaming request."""

    content: str
    reasoning: str
    finish_reason: str | None
    telemetry: Telemetry
    tool_calls: tuple[ToolCall, ...] = ()
