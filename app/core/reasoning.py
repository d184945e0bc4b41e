"""``<think>...</think>`` in streamed content, split out as reasoning.

lemon-mlx has no ``reasoning_content`` field: a reasoning model's thoughts arrive inside ``content``.
The splitter works on deltas as they come, so a tag cut across two chunks (``"<th"`` + ``"ink>"``) is
still found; the only text it holds back is a tail that could still become a tag.

``ReasoningFormat`` is where a reply's reasoning goes in the local API's answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

OPEN = "<think>"
CLOSE = "</think>"


@dataclass(frozen=True)
class Split:
    content: str = ""
    reasoning: str = ""

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning)


def _partial_tag(text: str, tag: str) -> int:
    """Length of the longest tail of ``text`` that is a proper start of ``tag``."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0


class ThinkSplitter:
    """Feed content deltas; get back what is content and what is reasoning so far."""

    def __init__(self) -> None:
        self._inside = False
        self._held = ""

    def feed(self, delta: str) -> Split:
        text = self._held + delta
        content: list[str] = []
        reasoning: list[str] = []
        while True:
            tag = CLOSE if self._inside else OPEN
            out = reasoning if self._inside else content
            at = text.find(tag)
            if at < 0:
                keep = _partial_tag(text, tag)
                out.append(text[: len(text) - keep])
                self._held = text[len(text) - keep :]
                break
            out.append(text[:at])
            text = text[at + len(tag) :]
            self._inside = not self._inside
        return Split("".join(content), "".join(reasoning))

    def finish(self) -> Split:
        """End of stream: a held tail that never became a tag is plain text after all."""
        held, self._held = self._held, ""
        return Split(reasoning=held) if self._inside else Split(content=held)


def split_think(text: str) -> Split:
    """The whole-text split, for text that is not streamed."""
    splitter = ThinkSplitter()
    first, last = splitter.feed(text), splitter.finish()
    return Split(first.content + last.content, first.reasoning + last.reasoning)


class ReasoningFormat(Enum):
    SEPARATE = "separate"  # in its own field, reasoning_content (as llama-server and DeepSeek send it)
    INLINE = "inline"  # inside content, as <think>...</think> before the answer
    HIDDEN = "hidden"  # left out of the answer


# llama-server's own names for its request field of the same name (``reasoning_format``), for clients
# written for it: "none" leaves the reasoning unparsed in the content, "auto" and "deepseek" split it out.
LLAMA_SERVER_NAMES = {
    "none": ReasoningFormat.INLINE,
    "auto": ReasoningFormat.SEPARATE,
    "deepseek": ReasoningFormat.SEPARATE,
}


def reasoning_format(name: str) -> ReasoningFormat | None:
    """The format a request or a saved option names (ours, or llama-server's name for it); None: not one."""
    try:
        return ReasoningFormat(name)
    except ValueError:
        return LLAMA_SERVER_NAMES.get(name)
