"""Chat messages as the app handles them, and how a reply's telemetry reads to a person."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from app.core.attachments import AttachmentRef
from app.core.numbers import finite


class MessageState(enum.Enum):
    COMPLETE = "complete"  # a finished message
    STREAMING = "streaming"  # a reply still arriving; found so after a crash, it was interrupted
    STOPPED = "stopped"  # the user stopped the reply before it finished
    FAILED = "failed"  # the reply ended with an error


@dataclass
class ChatMessage:
    role: str  # "user" | "assistant"
    content: str
    reasoning: str = ""
    state: MessageState = MessageState.COMPLETE
    telemetry: dict[str, Any] | None = None  # the Telemetry fields of the reply, by name
    error: str = ""  # why a FAILED reply failed, in words for the user
    run_card: dict[str, Any] | None = None  # the RunCard fields of the reply (app.core.runcard), by name
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # ToolCallFinished.to_json() of each
    attachments: list[AttachmentRef] = field(default_factory=list)  # a user message's files and images
    left_out: bool = False  # left out of what is sent to the model (the chat outgrew its context)


def format_telemetry(telemetry: dict[str, Any]) -> str:
    """``TTFT 0.21 s · prompt 512 tok/s · decode 31.2 tok/s · 420 tokens``: the parts that are known."""
    parts = []
    if (ttft := finite(telemetry.get("ttft_s"))) is not None:
        parts.append(f"TTFT {ttft:.2f} s")
    if (prompt_tps := finite(telemetry.get("prompt_tps"))) is not None:
        parts.append(f"prompt {prompt_tps:,.0f} tok/s")
    if (decode_tps := finite(telemetry.get("decode_tps"))) is not None:
        parts.append(f"decode {decode_tps:,.1f} tok/s")
    if (tokens := finite(telemetry.get("completion_tokens"))) is not None:
        parts.append(f"{tokens:,.0f} tokens")
    return " · ".join(parts)


def title_from(text: str, limit: int = 48) -> str:
    """A conversation title from its first message: the first line, cut at a word near ``limit``."""
    line = next((stripped for raw in text.splitlines() if (stripped := raw.strip())), "")
    if len(line) <= limit:
        return line or "New chat"
    cut = line[:limit].rsplit(" ", 1)[0] if " " in line[:limit] else line[:limit]
    return cut.rstrip(" ,.;:") + "…"
