"""Ollama's ``chat`` and ``generate`` in the terms of the OpenAI chat path: the request's messages and
options as an OpenAI chat body (``chat_messages``, ``sampling``), and the internal events (``chat_events``)
as Ollama's reply (``Reply``: NDJSON lines, or one object). The routes that use them are ``ollama``.
"""

from __future__ import annotations

import functools
import json
import math
import time
from datetime import UTC, datetime
from typing import Any

from app.supervisor.api.bodies import optional
from app.supervisor.api.chat_events import (
    ChatEvent,
    Finish,
    Finished,
    Reasoning,
    Text,
    ToolCallArguments,
    ToolCallStart,
)
from app.supervisor.api.codec import function_call, image_part, tool_arguments
from app.supervisor.api.errors import ApiError, bad_request

# Ollama's options that have an OpenAI name; others (num_ctx among them: the model's own ctx_size
# option decides its context) are ignored, as Ollama ignores what a model cannot use.
OPTIONS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "seed": "seed",
    "repeat_penalty": "repeat_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}
NDJSON = "application/x-ndjson"
IMAGE_MAGIC = {"iVBOR": "image/png", "/9j/": "image/jpeg", "R0lG": "image/gif", "UklGR": "image/webp"}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def now() -> str:
    """This moment as Ollama writes it (RFC 3339 in UTC, to the microsecond). A stream asks once a
    read: the date and time of day are worked out once a second."""
    moment = time.time()
    second = int(moment)
    return f"{_second(second)}.{int((moment - second) * 1e6):06d}Z"


@functools.lru_cache(maxsize=1)
def _second(second: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))


def iso(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).isoformat().replace("+00:00", "Z")


def ndjson_line(data: dict[str, Any]) -> bytes:
    return json.dumps(data).encode() + b"\n"


def _encoded(text: str) -> bytes:
    return json.dumps(text).encode()


def _image_part(data: Any, where: str) -> dict[str, Any]:
    if not isinstance(data, str) or not data:
        raise bad_request(f"'{where}' must be base64 image data.")
    media = next((m for magic, m in IMAGE_MAGIC.items() if data.startswith(magic)), "image/jpeg")
    return image_part(f"data:{media};base64,{data}")


def user_content(text: str, images: Any, where: str) -> str | list[dict[str, Any]]:
    if images is None:
        return text
    if not isinstance(images, list):
        raise bad_request(f"'{where}.images' must be a list of base64 images.")
    parts = [_image_part(image, f"{where}.images[{i}]") for i, image in enumerate(images)]
    return [{"type": "text", "text": text}, *parts] if text else parts


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise bad_request(f"'{where}.tool_calls' must be a list.")
    out = []
    for i, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise bad_request(f"'{where}.tool_calls[{i}]' must hold a function with a name.")
        arguments = function.get("arguments", {})
        text = arguments if isinstance(arguments, str) else json.dumps(arguments)
        call_id = call.get("id") if isinstance(call.get("id"), str) else f"call_{i}"
        out.append(function_call(call_id, function["name"], text))
    return out


def chat_messages(raw: Any) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise bad_request("'messages' must be a list of message objects.")
    out = []
    for i, message in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad_request(f"'{where}' must be an object with a 'role'.")
        content = message.get("content") or ""
        if not isinstance(content, str):
            raise bad_request(f"'{where}.content' must be a string.")
        role = message["role"]
        converted: dict[str, Any] = {
            "role": role,
            "content": user_content(content, message.get("images"), where),
        }
        if message.get("tool_calls") is not None:
            converted["tool_calls"] = _tool_calls(message["tool_calls"], where)
        if role == "tool" and isinstance(message.get("tool_call_id"), str):
            converted["tool_call_id"] = message["tool_call_id"]
        out.append(converted)
    return out


def sampling(body: dict[str, Any], chat: dict[str, Any]) -> list[str]:
    """``options``, ``format``, ``tools`` and ``think`` into the OpenAI body; gives the stop sequences."""
    options = optional(body, "options", "object") or {}
    for ours, theirs in OPTIONS.items():
        value = options.get(ours)
        if value is None:
            continue
        if ours == "seed" and not _is_int(value):
            raise bad_request("'options.seed' must be a whole number.")
        if not (_is_int(value) or isinstance(value, float)) or not math.isfinite(value):
            raise bad_request(f"'options.{ours}' must be a finite number.")
        chat[theirs] = value
    limit = options.get("num_predict")
    if limit is not None:
        if not _is_int(limit) or limit < -2:
            raise bad_request(
                "'options.num_predict' must be a whole number of tokens, -1 (no limit) or -2 "
                "(fill the context)."
            )
        if limit >= 0:  # -1 and -2 are the engine's own default: no max_tokens
            chat["max_tokens"] = limit
    stops = options.get("stop") or []
    if isinstance(stops, str):
        stops = [stops]
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad_request("'options.stop' must be a list of strings.")
    fmt = body.get("format")
    if fmt == "json":
        chat["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        chat["response_format"] = {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
    elif fmt not in (None, ""):
        raise bad_request("'format' must be \"json\" or a JSON schema.")
    if body.get("tools") is not None:
        chat["tools"] = optional(body, "tools", "list")
    think = body.get("think")
    if think is not None:
        chat["chat_template_kwargs"] = {"enable_thinking": think not in (False, "false", "none")}
    return stops


class Reply:
    """A chat or generate reply built from the internal events: Ollama's NDJSON lines, or its whole
    object. Tool calls come whole, as Ollama sends them: each once its arguments are complete."""

    def __init__(self, model: str, chat: bool, sent: float) -> None:
        self.model = model
        self.chat = chat
        self.sent = sent
        self.first: float | None = None
        self.text: list[str] = []
        self.thinking: list[str] = []
        self.calls: list[tuple[str, list[str]]] = []  # (name, argument fragments) by index

    def feed(self, events: list[ChatEvent]) -> bytes:
        """The lines for one read's events: they came together, so their lines say one ``created_at``."""
        if not events:
            return b""
        self.first = self.first or time.perf_counter()
        head, out = b"", []
        for event in events:
            if isinstance(event, Text | Reasoning):
                head = head or b'{"model": %b, "created_at": %b, ' % (_encoded(self.model), _encoded(now()))
                if isinstance(event, Text):
                    self.text.append(event.text)
                    out.append(self._streamed(head, event.text, ""))
                else:
                    self.thinking.append(event.text)
                    out.append(self._streamed(head, "", event.text))
            elif isinstance(event, ToolCallStart):
                self.calls.append((event.name, []))
            elif isinstance(event, ToolCallArguments) and self.calls:
                self.calls[-1][1].append(event.fragment)
        return b"".join(out)

    def _streamed(self, head: bytes, content: str, thinking: str) -> bytes:
        """``_piece``'s line for a token (``head``: its model and time), formatted rather than built
        and encoded as a dict: this is once a token, and the dict's encoding was most of it."""
        thought = b', "thinking": %b' % _encoded(thinking) if thinking else b""
        if self.chat:
            return head + b'"message": {"role": "assistant", "content": %b%b}, "done": false}\n' % (
                _encoded(content),
                thought,
            )
        return head + b'"response": %b%b, "done": false}\n' % (_encoded(content), thought)

    def _piece(self, content: str = "", thinking: str = "", **extra: Any) -> dict[str, Any]:
        data: dict[str, Any] = {"model": self.model, "created_at": now()}
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if thinking:
                message["thinking"] = thinking
            if extra.get("tool_calls"):
                message["tool_calls"] = extra.pop("tool_calls")
            data["message"] = message
        else:
            data["response"] = content
            if thinking:
                data["thinking"] = thinking
        data["done"] = False
        return {**data, **extra}

    def _tool_calls(self) -> list[dict[str, Any]]:
        out = []
        for index, (name, fragments) in enumerate(self.calls):
            arguments = tool_arguments("".join(fragments), name)
            out.append({"function": {"index": index, "name": name, "arguments": arguments}})
        return out

    def _figures(self, end: Finished) -> dict[str, Any]:
        now = time.perf_counter()
        first = self.first or now
        return {
            "done": True,
            "done_reason": "length" if end.reason is Finish.LENGTH else "stop",
            "total_duration": int((now - self.sent) * 1e9),
            "load_duration": 0,
            "prompt_eval_count": end.input_tokens,
            "prompt_eval_duration": int((first - self.sent) * 1e9),
            "eval_count": end.output_tokens,
            "eval_duration": int((now - first) * 1e9),
        }

    def start(self) -> bytes:
        return b""

    def error(self, error: ApiError) -> bytes:
        return ndjson_line({"error": error.message})

    def finish(self, end: Finished) -> bytes:
        calls = self._tool_calls()
        lines = ndjson_line(self._piece(tool_calls=calls)) if calls else b""
        return lines + ndjson_line(self._piece(**self._figures(end)))

    def whole(self, end: Finished) -> dict[str, Any]:
        figures = self._figures(end)
        return self._piece(
            "".join(self.text), "".join(self.thinking), tool_calls=self._tool_calls(), **figures
        )
