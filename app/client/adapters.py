"""Per-engine request adaptation: the one seam where engines that differ from OpenAI's API are bent into it.

An adapter says which requests its engine cannot answer (``check``), may rewrite the request body
(``adapt_body``), may re-split the streamed deltas (``splitter``), names the stop strings the client
must apply itself (``stops``) and corrects a misreported finish reason (``finish_reason``). llama.cpp
needs one thing: it reads ``tool_choice`` only as a string, and takes OpenAI's choice of one named
function for "auto" (with a warning in its log); it gets "required" with that tool alone. lemon-mlx
(and mlx-lm serving the same recipe) ignores ``max_completion_tokens``, rejects a bare-string ``stop``
and content given as parts, does not stream ``/v1/completions``, has no Responses or embeddings route,
and puts its reasoning inside ``content`` as ``<think>...</think>``; lemon-mlx-engine b1050-stable
also applies no ``stop`` at all and says "stop" for some replies its ``max_tokens`` cut
(docs/lemon-mlx-engine.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Any, Protocol

from app.client.events import ChatDelta
from app.core.errors import RequestError, UnsupportedRequestError
from app.core.reasoning import ReasoningFormat, ThinkSplitter
from app.core.stops import stop_strings

IMAGE_PARTS = frozenset({"image_url", "input_image", "image"})


class Route(Enum):
    CHAT = "/v1/chat/completions"  # chat completions
    COMPLETIONS = "/v1/completions"  # plain text completions
    RESPONSES = "/v1/responses"  # OpenAI's Responses API
    EMBEDDINGS = "/v1/embeddings"  # embeddings
    RERANK = "/v1/rerank"  # reranking (llama-server with --reranking)


class DeltaSplitter(Protocol):
    """Per-stream state that turns the engine's deltas into the app's."""

    def feed(self, delta: ChatDelta) -> Iterable[ChatDelta]: ...

    def flush(self) -> Iterable[ChatDelta]:
        """What is still held back when the stream ends."""
        ...


class EngineAdapter(Protocol):
    # Headers of a streamed request to this engine, beside the key.
    stream_headers: Mapping[str, str]
    # The engine sends a reasoning model's thoughts inside content, as <think>...</think>.
    reasoning_inline: bool

    def check(self, route: Route, stream: bool) -> None:
        """Raise UnsupportedRequestError when the engine cannot answer such a request."""
        ...

    def adapt_body(self, body: dict[str, Any], route: Route = Route.CHAT) -> dict[str, Any]:
        """The request body as this engine wants it (may modify and return ``body``)."""
        ...

    def splitter(self) -> DeltaSplitter | None:
        """A fresh splitter for one stream, or None to pass deltas through untouched."""
        ...

    def stops(self, body: dict[str, Any]) -> tuple[str, ...]:
        """The stop strings of the adapted request ``body`` that the client must apply itself (the
        engine takes them but does not act on them)."""
        ...

    def finish_reason(self, said: str | None, body: dict[str, Any], completion_tokens: int) -> str | None:
        """Why the reply ended, given what the engine ``said``, the adapted request ``body`` and the
        tokens the reply took: the engine's word, corrected where it is known to be wrong."""
        ...

    def reasoning(self, body: dict[str, Any], fmt: ReasoningFormat) -> bool:
        """Ask the engine for the reasoning as ``fmt`` puts it, where it can (may modify the adapted
        ``body``); True: it cannot, and the answer is rewritten (``app.client.reasoning_relay``)."""
        ...


def named_tool(value: Any) -> str | None:
    """The function's name in OpenAI's ``{"type": "function", "function": {"name": ...}}`` (a tool, or a
    ``tool_choice`` naming one), else None."""
    if not isinstance(value, dict) or value.get("type") != "function":
        return None
    function = value.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) else None


class LlamaCppAdapter:
    """llama-server speaks OpenAI's API and streams ``reasoning_content`` itself: nothing to adapt."""

    stream_headers: Mapping[str, str] = {}
    reasoning_inline = False

    def check(self, route: Route, stream: bool) -> None:
        return None

    def stops(self, body: dict[str, Any]) -> tuple[str, ...]:
        return ()

    def finish_reason(self, said: str | None, body: dict[str, Any], completion_tokens: int) -> str | None:
        return said

    def adapt_body(self, body: dict[str, Any], route: Route = Route.CHAT) -> dict[str, Any]:
        name = named_tool(body.get("tool_choice"))
        if route is Route.CHAT and name is not None and isinstance(body.get("tools"), list):
            # Its grammar then allows a call of that tool and nothing else, as OpenAI's choice does.
            body["tools"] = [t for t in body["tools"] if named_tool(t) == name]
            body["tool_choice"] = "required"
        return body

    def splitter(self) -> DeltaSplitter | None:
        return None

    def reasoning(self, body: dict[str, Any], fmt: ReasoningFormat) -> bool:
        # Its own field of the same name: "none" leaves the reasoning in the content; it cannot drop it.
        if fmt is ReasoningFormat.INLINE:
            body["reasoning_format"] = "none"
        return fmt is ReasoningFormat.HIDDEN


class ThinkDeltaSplitter:
    """Moves ``<think>...</think>`` out of ``content`` into ``reasoning``, across chunk boundaries."""

    def __init__(self) -> None:
        self._think = ThinkSplitter()

    def feed(self, delta: ChatDelta) -> Iterable[ChatDelta]:
        split = self._think.feed(delta.content)
        reasoning = delta.reasoning + split.reasoning
        return [ChatDelta(split.content, reasoning)] if split.content or reasoning else []

    def flush(self) -> Iterable[ChatDelta]:
        split = self._think.finish()
        return [ChatDelta(split.content, split.reasoning)] if split else []


def _text_of(content: Any, where: str) -> str:
    """Message content as one string: text parts joined, images refused."""
    if isinstance(content, str) or content is None:
        return content or ""
    if not isinstance(content, list):
        raise RequestError(f"{where}: content must be a string or a list of parts.")
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            texts.append(str(part.get("text", "")))
        elif kind in IMAGE_PARTS:
            raise UnsupportedRequestError(
                f"{where} holds an image, and MLX models here read text only.",
                "Remove the image, or use a vision model with llama.cpp.",
            )
        else:
            raise UnsupportedRequestError(
                f"{where} holds a part of type {kind!r}; only text parts can be sent to this engine."
            )
    return "\n".join(texts)


class LemonMlxAdapter:
    engine = "lemon-mlx"
    # lemon-mlx-engine (b1050-stable) leaves Nagle's algorithm on (cpp-httplib's default): its first
    # event waits for the ACK of the response's head, which a connection out of TCP's quick-ACK mode
    # (a kept-alive one) delays. On a reused connection the first token came 15-25 ms late in most
    # replies; a stream on a connection of its own (closed after it) starts in quick-ACK mode.
    stream_headers: Mapping[str, str] = {"Connection": "close"}
    reasoning_inline = True
    unsupported = frozenset({Route.RESPONSES, Route.EMBEDDINGS, Route.RERANK})
    no_streaming = frozenset({Route.COMPLETIONS})

    def check(self, route: Route, stream: bool) -> None:
        if route in self.unsupported:
            raise UnsupportedRequestError(
                f"{self.engine} has no {route.value} endpoint.",
                "Use /v1/chat/completions, or load a model that runs on llama.cpp.",
            )
        if stream and route in self.no_streaming:
            raise UnsupportedRequestError(
                f"{self.engine} cannot stream {route.value}.",
                'Send it with "stream": false, or use /v1/chat/completions, which streams.',
            )

    def adapt_body(self, body: dict[str, Any], route: Route = Route.CHAT) -> dict[str, Any]:
        self.check(route, bool(body.get("stream")))
        out = dict(body)
        # The engine ignores max_completion_tokens: it becomes max_tokens, and is always removed.
        if "max_completion_tokens" in out:
            limit = out.pop("max_completion_tokens")
            if out.get("max_tokens") is None and limit is not None:
                out["max_tokens"] = limit
        stop = out.get("stop")
        if isinstance(stop, str):
            out["stop"] = [stop]
        elif stop is None:
            out.pop("stop", None)
        if route is Route.CHAT:
            out["messages"] = [
                {**m, "content": _text_of(m.get("content"), f"Message {i + 1}")} if isinstance(m, dict) else m
                for i, m in enumerate(out.get("messages", []))
            ]
        elif route is Route.COMPLETIONS:
            out["prompt"] = self._one_prompt(out.get("prompt"))
        return out

    def splitter(self) -> DeltaSplitter | None:
        return ThinkDeltaSplitter()

    def reasoning(self, body: dict[str, Any], fmt: ReasoningFormat) -> bool:
        return fmt is not ReasoningFormat.INLINE  # its reasoning is inside the content, as <think>

    def stops(self, body: dict[str, Any]) -> tuple[str, ...]:
        # lemon-mlx-engine (b1050-stable) parses "stop" (refusing a bare string) and never uses it.
        return stop_strings(body.get("stop"))

    def finish_reason(self, said: str | None, body: dict[str, Any], completion_tokens: int) -> str | None:
        # lemon-mlx-engine (b1050-stable) decides "length" by counting the text pieces it sent, not
        # the tokens: a token that decodes to no text (the first byte of a two-byte character) makes
        # it say "stop" for a reply the limit cut. Its own token count shows the limit was reached.
        limit = body.get("max_tokens")
        if said == "stop" and type(limit) is int and 0 < limit <= completion_tokens:
            return "length"
        return said

    def _one_prompt(self, prompt: Any) -> str:
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise UnsupportedRequestError(
                f"{self.engine} takes one prompt string per completion request.",
                "Send the prompts one at a time, as text.",
            )
        return prompt


ADAPTERS: dict[str, EngineAdapter] = {"llamacpp": LlamaCppAdapter(), "lemon-mlx": LemonMlxAdapter()}


def adapter_for(recipe: str) -> EngineAdapter:
    """The adapter of a recipe's engine; engines without one get llama.cpp's (plain OpenAI)."""
    return ADAPTERS.get(recipe) or ADAPTERS["llamacpp"]


def sse_error(error: RequestError) -> bytes:
    """An OpenAI-style SSE error event and the end of the stream, for a request that cannot stream.

    Clients see an error (the ``openai`` package raises it) and the stream ends: no hang, no silent
    empty reply.
    """
    payload = {"error": {"message": str(error), "type": "invalid_request_error", "code": "unsupported"}}
    return f"data: {json.dumps(payload)}\n\ndata: [DONE]\n\n".encode()
