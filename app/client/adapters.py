"""Per-engine request adaptation: the one seam where engines that differ from OpenAI's API are bent into it.

An adapter may rewrite the request body (e.g. rename fields an engine does not know) and may re-split the
streamed deltas (e.g. move ``<think>`` text into ``reasoning``). llama.cpp needs neither.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from app.client.events import ChatDelta


class DeltaSplitter(Protocol):
    """Per-stream state that turns the engine's deltas into the app's."""

    def feed(self, delta: ChatDelta) -> Iterable[ChatDelta]: ...

    def flush(self) -> Iterable[ChatDelta]:
        """What is still held back when the stream ends."""
        ...


class EngineAdapter(Protocol):
    def adapt_body(self, body: dict[str, Any]) -> dict[str, Any]:
        """The request body as this engine wants it (may modify and return ``body``)."""
        ...

    def splitter(self) -> DeltaSplitter | None:
        """A fresh splitter for one stream, or None to pass deltas through untouched."""
        ...


class LlamaCppAdapter:
    """llama-server speaks OpenAI's API and streams ``reasoning_content`` itself: nothing to adapt."""

    def adapt_body(self, body: dict[str, Any]) -> dict[str, Any]:
        return body

    def splitter(self) -> DeltaSplitter | None:
        return None


ADAPTERS: dict[str, EngineAdapter] = {"llamacpp": LlamaCppAdapter()}


def adapter_for(recipe: str) -> EngineAdapter:
    """The adapter of a recipe's engine; engines without one get llama.cpp's (plain OpenAI)."""
    return ADAPTERS.get(recipe) or ADAPTERS["llamacpp"]
