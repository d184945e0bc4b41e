"""Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``, under every prefix): a
codec over the OpenAI chat path. A request becomes an OpenAI chat body and goes through
``OpenAIRoutes.engine_call`` (the same routing, loading and telemetry as ``/v1/chat/completions``),
always streamed from the engine; the engine's events (``chat_events``) become Anthropic's stream events,
or its whole message.

Request fields: ``system`` (a string or text blocks), ``messages`` (text, image, ``tool_use`` and
``tool_result`` blocks; ``thinking`` blocks of earlier turns are dropped, as the engines take none),
``max_tokens`` (required, as Anthropic requires it), ``stop_sequences``, ``temperature``, ``top_p``,
``top_k``, ``tools`` (custom tools; Anthropic's server tools cannot run here: a 400), ``tool_choice``,
``thinking`` (``enabled`` / ``disabled``: the chat template's ``enable_thinking``), ``metadata``
(accepted, unused). Beyond Anthropic's fields, llama.cpp's sampling extras (``ENGINE_SAMPLING``: what a
client sends through the ``anthropic`` package's ``extra_body``) go on to the engine as the OpenAI
routes pass them; llama-server's own ``/v1/messages`` drops them. Other fields are ignored. The key
comes as ``x-api-key`` or as a bearer token; ``anthropic-version`` is accepted whatever it says.

Errors take Anthropic's shape, ``{"type": "error", "error": {"type", "message"}}``, and its statuses:
a model that cannot run now (an engine that failed, a remote away) is 529 ``overloaded_error``, a
conflict with the loading policy 400, a failure behind the API 500 ``api_error``.
"""

from __future__ import annotations

import json
import secrets
from typing import TYPE_CHECKING, Any

from aiohttp import web

from app.client.tokens import count_prompt
from app.core.errors import RequestError
from app.core.remotes import is_remote_model
from app.supervisor.api.bodies import check_generation, optional, parse_object, required_str
from app.supervisor.api.chat_events import (
    ChatEvent,
    Finish,
    Finished,
    Reasoning,
    Text,
    ToolCallArguments,
    ToolCallStart,
)
from app.supervisor.api.codec import function_call, image_part, reply, tool_arguments
from app.supervisor.api.errors import ApiError, bad_gateway, bad_request
from app.supervisor.api.openai import SSE_HEADERS, find_model

if TYPE_CHECKING:
    from app.supervisor.api.openai import OpenAIRoutes


PATHS = ("/messages", "/messages/count_tokens")
# Anthropic's error types by the statuses it uses.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
# llama.cpp's sampling fields that Anthropic has no name for, passed on as given (the engine checks them).
ENGINE_SAMPLING = ("logit_bias", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty", "seed")
STOP_REASONS = {
    Finish.STOP: "end_turn",
    Finish.LENGTH: "max_tokens",
    Finish.TOOL_CALLS: "tool_use",
    Finish.STOP_SEQUENCE: "stop_sequence",
}


def is_anthropic_path(path: str) -> bool:
    """A route of Anthropic's, or one under it (unknown there, and answered in Anthropic's shape)."""
    return path.endswith(PATHS) or "/messages/" in path


def anthropic_status(status: int) -> int:
    """The status Anthropic would use for one of ours."""
    if status in ERROR_TYPES or status == 405:
        return status
    if status == 503:  # an engine that failed, a remote away, a busy Hub: try again later
        return 529
    return 500 if status >= 500 else 400


def error_json(error: ApiError) -> dict[str, Any]:
    kind = ERROR_TYPES.get(anthropic_status(error.status), "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": error.message}}


def error_response(error: ApiError) -> web.Response:
    return web.json_response(error_json(error), status=anthropic_status(error.status))


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


_DELTA = (
    b'event: content_block_delta\ndata: {"type": "content_block_delta", "index": %d, '
    b'"delta": {"type": "%b", "%b": %b}}\n\n'
)


# --- requests -------------------------------------------------------------------------------------------


def _text_blocks(value: Any, where: str) -> str:
    """A ``system`` or ``tool_result`` content: a string, or text blocks joined."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise bad_request(f"'{where}' must be a string or a list of text blocks.")
    texts = []
    for i, block in enumerate(value):
        if (
            not isinstance(block, dict)
            or block.get("type") != "text"
            or not isinstance(block.get("text"), str)
        ):
            raise bad_request(f'\'{where}[{i}]\' must be a text block ({{"type": "text", "text": ...}}).')
        texts.append(block["text"])
    return "\n".join(texts)


def _image_part(block: dict[str, Any], where: str) -> dict[str, Any]:
    source = block.get("source")
    if not isinstance(source, dict):
        raise bad_request(f"'{where}.source' must be an object.")
    if source.get("type") == "base64":
        media, data = source.get("media_type"), source.get("data")
        if not isinstance(media, str) or not isinstance(data, str):
            raise bad_request(f"'{where}.source' needs 'media_type' and 'data' as strings.")
        return image_part(f"data:{media};base64,{data}")
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        return image_part(source["url"])
    raise bad_request(f"'{where}.source.type' must be 'base64' or 'url'.")


def _user_messages(content: list[Any], where: str) -> list[dict[str, Any]]:
    """A user turn's blocks: its tool results as OpenAI ``tool`` messages (first: they answer the turn
    before), then the rest as one user message."""
    tools: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for i, block in enumerate(content):
        at = f"{where}.content[{i}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image":
            parts.append(_image_part(block, at))
        elif kind == "tool_result":
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str) or not call_id:
                raise bad_request(f"'{at}.tool_use_id' must be a non-empty string.")
            result = _text_blocks(block.get("content", ""), f"{at}.content")
            if block.get("is_error") is True:
                result = f"Error: {result}"
            tools.append({"role": "tool", "tool_call_id": call_id, "content": result})
        else:
            raise bad_request(f"'{at}' is a block of type {kind!r}, which a user turn here cannot hold.")
    return tools + ([{"role": "user", "content": parts}] if parts else [])


def _assistant_message(content: list[Any], where: str) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for i, block in enumerate(content):
        at = f"{where}.content[{i}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use":
            call_id, name, arguments = block.get("id"), block.get("name"), block.get("input", {})
            if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, dict):
                raise bad_request(f"'{at}' needs 'id' and 'name' as strings and 'input' as an object.")
            calls.append(function_call(call_id, name, json.dumps(arguments)))
        elif kind not in ("thinking", "redacted_thinking"):
            raise bad_request(f"'{at}' is a block of type {kind!r}, which an assistant turn cannot hold.")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        message["tool_calls"] = calls
    return message


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list.", "missing_field")
    out: list[dict[str, Any]] = []
    if body.get("system") is not None:
        out.append({"role": "system", "content": _text_blocks(body["system"], "system")})
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise bad_request(f"'{where}' must be an object whose 'role' is 'user' or 'assistant'.")
        content = message.get("content")
        if isinstance(content, str):
            out.append({"role": message["role"], "content": content})
        elif isinstance(content, list):
            if message["role"] == "user":
                out += _user_messages(content, where)
            else:
                out.append(_assistant_message(content, where))
        else:
            raise bad_request(f"'{where}.content' must be a string or a list of blocks.")
    return out


def _tools(body: dict[str, Any]) -> list[dict[str, Any]]:
    tools = optional(body, "tools", "list") or []
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise bad_request(f"'tools[{i}]' must be an object with a 'name'.")
        if tool.get("type") not in (None, "custom"):
            raise bad_request(
                f"'tools[{i}]' is Anthropic's server tool {tool.get('type')!r}, which cannot run here: "
                "give it as a custom tool (name, description, input_schema) and run it yourself."
            )
        schema = tool.get("input_schema", {"type": "object"})
        if not isinstance(schema, dict):
            raise bad_request(f"'tools[{i}].input_schema' must be an object.")
        function = {
            "name": tool["name"],
            "description": str(tool.get("description") or ""),
            "parameters": schema,
        }
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any, body: dict[str, Any]) -> None:
    """Anthropic's ``tool_choice`` as OpenAI's, into ``body``."""
    if not isinstance(choice, dict):
        raise bad_request('\'tool_choice\' must be an object such as {"type": "auto"}.')
    kind = choice.get("type")
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise bad_request("'tool_choice.name' must name a tool.")
        body["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    elif kind in ("auto", "any", "none"):
        body["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    else:
        raise bad_request("'tool_choice.type' must be 'auto', 'any', 'tool' or 'none'.")
    if choice.get("disable_parallel_tool_use") is True:
        body["parallel_tool_calls"] = False


def chat_body(body: dict[str, Any], *, counting: bool = False) -> tuple[dict[str, Any], list[str]]:
    """An Anthropic request as an OpenAI chat body (streamed, with usage), and its stop sequences."""
    chat: dict[str, Any] = {"model": required_str(body, "model"), "messages": _messages(body)}
    if not counting:
        limit = body.get("max_tokens")
        if limit is None:
            raise bad_request("'max_tokens' is required.", "missing_field")
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise bad_request("'max_tokens' must be a whole number of at least 1.")
        chat.update(max_tokens=limit, stream=True, stream_options={"include_usage": True})
    for field in ("temperature", "top_p", "top_k", *ENGINE_SAMPLING):
        if body.get(field) is not None:
            chat[field] = body[field]
    if not isinstance(body.get("logit_bias"), dict | list | None):
        raise bad_request("'logit_bias' must be an object of token (or text) to bias, or a list of pairs.")
    stops = optional(body, "stop_sequences", "list") or []
    if not all(isinstance(s, str) for s in stops):
        raise bad_request("'stop_sequences' must be a list of strings.")
    if tools := _tools(body):
        chat["tools"] = tools
    if body.get("tool_choice") is not None:
        _tool_choice(body["tool_choice"], chat)
    thinking = optional(body, "thinking", "object")
    if thinking is not None and thinking.get("type") in ("enabled", "disabled"):
        chat["chat_template_kwargs"] = {"enable_thinking": thinking["type"] == "enabled"}
    optional(body, "metadata", "object")
    return chat, stops


# --- replies --------------------------------------------------------------------------------------------


class _Message:
    """One assistant message built from the internal events: its content blocks, and the stream events
    that build it (Anthropic's order: one block open at a time, each started, filled and stopped)."""

    def __init__(self, model: str) -> None:
        self.id = f"msg_{secrets.token_hex(12)}"
        self.model = model
        self.blocks: list[dict[str, Any]] = []
        self._open: str | None = None  # the type of the block being filled
        self._tool: int | None = None  # the tool call (its index) the open tool_use block is
        self._arguments: list[str] = []  # the open tool_use block's argument fragments
        self._raw_arguments: list[str] = []  # each finished tool_use block's arguments, in order
        self._pieces: list[str] = []  # the open text or thinking block's text

    def start(self) -> bytes:
        message: dict[str, Any] = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},  # the real figures come in message_delta
        }
        return _sse("message_start", {"type": "message_start", "message": message}) + _sse(
            "ping", {"type": "ping"}
        )

    def feed(self, events: list[ChatEvent]) -> bytes:
        return b"".join([self._event(event) for event in events])

    def _event(self, event: ChatEvent) -> bytes:
        if isinstance(event, Text):
            return self._into("text", {"type": "text", "text": ""}, "text", event.text)
        if isinstance(event, Reasoning):
            block = {"type": "thinking", "thinking": "", "signature": ""}
            return self._into("thinking", block, "thinking", event.text)
        if isinstance(event, ToolCallStart):
            out = self._stop_block()
            self._tool = event.index
            self._arguments = []
            return out + self._begin(
                "tool_use", {"type": "tool_use", "id": event.id, "name": event.name, "input": {}}
            )
        if isinstance(event, ToolCallArguments) and self._open == "tool_use" and event.index == self._tool:
            self._arguments.append(event.fragment)
            return self._delta("input_json_delta", "partial_json", event.fragment)
        return b""

    def _into(self, kind: str, block: dict[str, Any], key: str, text: str) -> bytes:
        out = b"" if self._open == kind else self._stop_block() + self._begin(kind, block)
        self._pieces.append(text)
        return out + self._delta(f"{key}_delta", key, text)

    def _delta(self, delta_type: str, key: str, text: str) -> bytes:
        """The open block's content_block_delta event: ``_sse``'s bytes for it, formatted rather than
        built and encoded as a dict (this is once a token, and the dict's encoding was most of it)."""
        return _DELTA % (len(self.blocks) - 1, delta_type.encode(), key.encode(), json.dumps(text).encode())

    def _begin(self, kind: str, block: dict[str, Any]) -> bytes:
        self._open = kind
        self._pieces = []
        self.blocks.append(dict(block))
        start = {"type": "content_block_start", "index": len(self.blocks) - 1, "content_block": block}
        return _sse("content_block_start", start)

    def _stop_block(self) -> bytes:
        if self._open is None:
            return b""
        if self._open == "tool_use":
            self._raw_arguments.append("".join(self._arguments))
        else:
            self.blocks[-1][self._open] = "".join(self._pieces)
        self._open = None
        return _sse("content_block_stop", {"type": "content_block_stop", "index": len(self.blocks) - 1})

    def error(self, error: ApiError) -> bytes:
        return _sse("error", error_json(error))

    def finish(self, end: Finished) -> bytes:
        out = self._stop_block()
        delta = {"stop_reason": STOP_REASONS[end.reason], "stop_sequence": end.stop_sequence}
        usage = {"input_tokens": end.input_tokens, "output_tokens": end.output_tokens}
        out += _sse("message_delta", {"type": "message_delta", "delta": delta, "usage": usage})
        return out + _sse("message_stop", {"type": "message_stop"})

    def whole(self, end: Finished) -> dict[str, Any]:
        self._stop_block()
        calls = iter(self._raw_arguments)
        for block in self.blocks:
            if block["type"] == "tool_use":
                block["input"] = tool_arguments(next(calls), block["name"])
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": self.blocks,
            "stop_reason": STOP_REASONS[end.reason],
            "stop_sequence": end.stop_sequence,
            "usage": {"input_tokens": end.input_tokens, "output_tokens": end.output_tokens},
        }


class AnthropicRoutes:
    """``messages`` and ``count_tokens``, over the OpenAI routes' chat path."""

    def __init__(self, openai: OpenAIRoutes) -> None:
        self.openai = openai
        self.router = openai.router

    def add_to(self, app: web.Application, prefix: str) -> None:
        app.router.add_post(f"{prefix}/messages", self.messages)
        app.router.add_post(f"{prefix}/messages/count_tokens", self.count_tokens)

    async def messages(self, request: web.Request) -> web.StreamResponse:
        body = parse_object(await request.read())
        chat, stops = chat_body(body)
        message = _Message(chat["model"])
        headers = {**SSE_HEADERS, **_request_id()} if optional(body, "stream", "bool") else None
        end = await reply(self.openai, request, chat, stops, message, headers)
        if isinstance(end, web.StreamResponse):
            return end
        return web.json_response(message.whole(end), headers=_request_id())

    async def count_tokens(self, request: web.Request) -> web.Response:
        """The prompt's tokens as the engine counts them: its chat template applied (llama-server's
        ``/apply-template``), then tokenized (``/tokenize``); the model loads if it is not running."""
        chat, _ = chat_body(parse_object(await request.read()), counting=True)
        check_generation(chat, "chat")
        name = chat.pop("model")
        if is_remote_model(name):
            raise bad_request(
                f"{name} is a model of a remote server: count its tokens there.", "remote_model"
            )
        model = find_model(self.router, name)
        if model.recipe != "llamacpp":
            raise bad_request(
                f"{name} runs on {model.recipe}, which cannot count tokens; only llama.cpp models can.",
                "unsupported",
            )
        async with self.router.client(name) as client:
            try:
                counted = await count_prompt(client, chat)
            except RequestError as err:
                if err.status is not None:  # the engine refused: said as every refusal is
                    raise
                raise bad_gateway(err.message) from None
        return web.json_response({"input_tokens": counted}, headers=_request_id())


def _request_id() -> dict[str, str]:
    return {"request-id": f"req_{secrets.token_hex(12)}"}
