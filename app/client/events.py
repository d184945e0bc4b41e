"""What a chat stream yields: deltas as they arrive, then one ``ChatDone`` with the telemetry."""

from __future__ import annotations

from dataclasses import dataclass

from app.core.telemetry import Telemetry


@dataclass(frozen=True, slots=True)
class ChatDelta:
    content: str = ""  # answer text
    reasoning: str = ""  # "thinking" text (``delta.reasoning_content``, or split out of <think> tags)


@dataclass(frozen=True)
class ChatDone:
    finish_reason: str | None  # "stop", "length"...: the engine's word, corrected where it errs; None: unsaid
    telemetry: Telemetry
    restored: int = 0  # prompt tokens restored from a saved KV cache before it (app.supervisor.resume)


ChatEvent = ChatDelta | ChatDone


@dataclass(frozen=True)
class ChatReply:
    """A whole reply from a non-streaming request."""

    content: str
    reasoning: str
    finish_reason: str | None
    telemetry: Telemetry
