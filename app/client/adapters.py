"""What each engine accepts, in one place: requests are adapted here and nowhere else.

llama.cpp takes OpenAI requests as they are. lemon-mlx (and mlx-lm serving the same recipe) differs:
it ignores ``max_completion_tokens``, rejects a bare-string ``stop`` and content given as parts, does
not stream ``/v1/completions``, and has no Responses or embeddings route.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from enum import Enum
from typing import Any

from app.core.errors import RequestError, UnsupportedRequestError
from app.core.lemon_mlx import MLX_LM

IMAGE_PARTS = frozenset({"image_url", "input_image", "image"})


class Route(Enum):
    CHAT = "/v1/chat/completions"  # chat completions
    COMPLETIONS = "/v1/completions"  # plain text completions
    RESPONSES = "/v1/responses"  # OpenAI's Responses API
    EMBEDDINGS = "/v1/embeddings"  # embeddings


class RequestAdapter:
    """llama.cpp's adapter: it speaks OpenAI's API as it is, so requests pass through unchanged."""

    engine = "llama.cpp"
    unsupported: frozenset[Route] = frozenset()
    no_streaming: frozenset[Route] = frozenset()

    def check(self, route: Route, stream: bool) -> None:
        """Raise UnsupportedRequestError when this engine cannot answer such a request."""
        if route in self.unsupported:
            raise UnsupportedRequestError(
                f"{self.engine} has no {route.value} endpoint.",
                "Use /v1/chat/completions, or load the model with llama.cpp.",
            )
        if stream and route in self.no_streaming:
            raise UnsupportedRequestError(
                f"{self.engine} cannot stream {route.value}.",
                'Send it with "stream": false, or use /v1/chat/completions, which streams.',
            )

    def adapt(self, route: Route, body: Mapping[str, Any]) -> dict[str, Any]:
        """The request body this engine needs (a copy; the caller's is left alone)."""
        self.check(route, bool(body.get("stream")))
        return copy.deepcopy(dict(body))


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


class LemonMlxAdapter(RequestAdapter):
    engine = "lemon-mlx"
    unsupported = frozenset({Route.RESPONSES, Route.EMBEDDINGS})
    no_streaming = frozenset({Route.COMPLETIONS})

    def adapt(self, route: Route, body: Mapping[str, Any]) -> dict[str, Any]:
        out = super().adapt(route, body)
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

    @staticmethod
    def _one_prompt(prompt: Any) -> str:
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise UnsupportedRequestError(
                f"{LemonMlxAdapter.engine} takes one prompt string per completion request.",
                "Send the prompts one at a time, as text.",
            )
        return prompt


class MlxLmAdapter(LemonMlxAdapter):
    """mlx-lm serving the lemon-mlx recipe: the same rules, and it reports usage when asked."""

    engine = "mlx-lm"

    def adapt(self, route: Route, body: Mapping[str, Any]) -> dict[str, Any]:
        out = super().adapt(route, body)
        if out.get("stream"):
            out["stream_options"] = {**(out.get("stream_options") or {}), "include_usage": True}
        return out


def adapter_for(recipe: str, backend: str) -> RequestAdapter:
    if recipe == "lemon-mlx":
        return MlxLmAdapter() if backend == MLX_LM else LemonMlxAdapter()
    return RequestAdapter()


def sse_error(error: RequestError) -> bytes:
    """An OpenAI-style SSE error event and the end of the stream, for a request that cannot stream.

    Clients see an error (the ``openai`` package raises it) and the stream ends: no hang, no silent
    empty reply.
    """
    payload = {"error": {"message": str(error), "type": "invalid_request_error", "code": "unsupported"}}
    return f"data: {json.dumps(payload)}\n\ndata: [DONE]\n\n".encode()
