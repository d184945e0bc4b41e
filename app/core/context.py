"""How much of a model's context a chat takes, and what may be done when the next send would not fit.

A count comes from the engine's own tokenizer where it has one (llama-server's ``/apply-template`` and
``/tokenize``: the prompt exactly as the engine will see it, the tools offered with it included), else it
is an estimate from the text's length, labelled as such. The context is the running engine's, else the
one the model would load with: its options', else for llama.cpp the launch's default, else what the model
says it holds (an MLX folder's ``max_position_embeddings``); when nothing says, an assumed default,
labelled as one. The reply's share is ``max_tokens`` when the chat sets one. Nothing is cut silently: a
send that would not fit is held, and the user chooses one of the ``Overflow`` ways out; a summary that
had to leave out the oldest messages says so (``Summary``).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.core.attachments import ATTACHMENT_OVERHEAD, IMAGE_TOKENS_ESTIMATE, AttachmentKind, AttachmentRef

CHARS_PER_TOKEN = 4  # an estimate's rule: English text is about four characters a token
TOKENS_PER_MESSAGE = 4  # an estimate's allowance for a chat template's markers around each message
CONTEXT_STEP = 256  # a context offered for a reload is a multiple of this


class CountSource(enum.Enum):
    TOKENIZER = "tokenizer"  # the engine's own tokenizer counted the rendered prompt
    ESTIMATE = "estimate"  # no tokenizer to ask: the text's length, divided


class Overflow(enum.Enum):
    RELOAD = "reload"  # load the model again with a larger context that fits the memory free now
    SUMMARY = "summary"  # go on in a new chat that starts with a summary the model writes
    LEAVE_OUT = "leave-out"  # leave out the oldest turns (kept in the history, marked as left out)


@dataclass(frozen=True)
class ContextCount:
    """A chat's prompt against the model's context: what it takes, what the reply may take, and, when it
    does not fit, the ways out this model offers."""

    used: int  # the prompt's tokens
    context: int  # the model's context (per engine slot), in tokens
    reply: int  # kept for the reply: the chat's max_tokens (0: no limit set)
    source: CountSource
    larger: int | None = None  # a context that holds it and fits the memory free now (None: none does)
    leave_out: int = 0  # the oldest messages to leave out so it fits (0: leaving out cannot help)
    assumed: bool = False  # the context is a default assumed: neither the engine nor the model says it

    @property
    def needed(self) -> int:
        return self.used + self.reply

    @property
    def fits(self) -> bool:
        return self.used < self.context and self.needed <= self.context

    @property
    def share(self) -> float:
        """The share of the context the prompt and the reply's share take (above 1: over)."""
        return self.needed / self.context if self.context > 0 else 0.0

    def ways_out(self) -> list[Overflow]:
        """What this count allows: a larger context when one fits; a summary, and leaving out the oldest
        turns, when leaving them out makes it fit (else the last message alone is too long, and a
        summary before it would not help)."""
        ways = [Overflow.RELOAD] if self.larger is not None else []
        if self.leave_out > 0:
            ways += [Overflow.SUMMARY, Overflow.LEAVE_OUT]
        return ways

    def describe(self) -> str:
        """``1,234 of 4,096 tokens (+256 for the reply)``, with ``about`` for an estimate and for a context
        assumed."""
        about = "about " if self.source is CountSource.ESTIMATE else ""
        assumed = "about " if self.assumed else ""
        reply = f" (+{self.reply:,} for the reply)" if self.reply else ""
        return f"{about}{self.used:,} of {assumed}{self.context:,} tokens{reply}"

    def problem(self) -> str:
        """Why a send would not fit, in plain words ("" when it fits)."""
        if self.fits:
            return ""
        over = self.needed - self.context
        reply = f" and {self.reply:,} kept for the reply" if self.reply else ""
        return (
            f"This chat needs {self.used:,} tokens{reply}, {over:,} more than the model's context of "
            f"{self.context:,} tokens. Nothing was sent."
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "used": self.used,
            "context": self.context,
            "reply": self.reply,
            "source": self.source.value,
            "larger": self.larger,
            "leave_out": self.leave_out,
            "assumed": self.assumed,
        }


def estimate_tokens(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] = ()) -> int:
    """A prompt's tokens, estimated from its text's length: for engines without a tokenizer to ask. An
    image (an ``image_url`` part, or an attachment not read yet) counts as a small projector's share; a
    file attached and not read yet as the characters it sends; a tool as its definition's JSON."""
    chars, images = 0, 0
    for message in messages:
        content = message.get("content") or ""
        parts = content if isinstance(content, list) else [{"type": "text", "text": str(content)}]
        for part in parts:
            if isinstance(part, dict) and part.get("type") == "text":
                chars += len(str(part.get("text") or ""))
            else:
                images += 1
        for ref in message.get("attachments") or ():
            if isinstance(ref, AttachmentRef) and ref.kind is AttachmentKind.IMAGE:
                images += 1
            elif isinstance(ref, AttachmentRef):
                sent = ref.sent_chars if ref.sent_chars is not None else ref.size
                if ref.sent_spans is not None:
                    sent = sum(end - start for start, end in ref.sent_spans)
                chars += sent + ATTACHMENT_OVERHEAD * CHARS_PER_TOKEN
    chars += sum(len(json.dumps(tool)) for tool in tools)
    return -(-chars // CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE * len(messages) + IMAGE_TOKENS_ESTIMATE * images


def reply_share(params: dict[str, Any]) -> int:
    """The tokens a chat keeps for its reply: its ``max_tokens`` (0 when none is set)."""
    value = params.get("max_tokens")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def without_oldest(messages: Sequence[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """``messages`` less the ``count`` oldest that are not the system prompt."""
    kept: list[dict[str, Any]] = []
    for message in messages:
        if message.get("role") != "system" and count > 0:
            count -= 1
            continue
        kept.append(message)
    return kept


def droppable(messages: Sequence[dict[str, Any]]) -> int:
    """How many of the oldest messages could be left out: all but the system prompt and the last one."""
    return max(sum(1 for m in messages if m.get("role") != "system") - 1, 0)


def larger_context(current: int, needed: int, largest: int | None) -> int | None:
    """The context a reload offers: the current one doubled until it holds ``needed``, else ``needed``
    rounded up to a step, as long as it is within ``largest`` (what fits the memory free; None: none)."""
    if largest is None or needed > largest:
        return None
    size = max(current, CONTEXT_STEP)
    while size < needed:
        size *= 2
    if size <= largest:
        return size
    return min(-(-needed // CONTEXT_STEP) * CONTEXT_STEP, largest)


SUMMARY_REQUEST = (
    "Summarize our conversation so far in a short paragraph: the facts, decisions and open questions "
    "someone needs to go on with it. Write only the summary."
)
SUMMARY_HEADING = "Summary of the earlier chat"


@dataclass(frozen=True)
class Summary:
    """A summary the model wrote of a chat, and how many of the chat's oldest messages it could not
    see: the chat with the request to summarize it did not fit the context whole."""

    text: str
    left_out: int = 0  # the oldest messages (not the system prompt) the summary was written without

    def opening(self) -> str:
        """The new chat's first message: the summary, saying what it leaves out."""
        if not self.left_out:
            return f"{SUMMARY_HEADING}: {self.text}"
        those = "message" if self.left_out == 1 else f"{self.left_out} messages"
        return (
            f"{SUMMARY_HEADING}, without its oldest {those} (the whole chat was too long for the model "
            f"to summarize at once): {self.text}"
        )
