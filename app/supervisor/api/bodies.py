"""Request bodies checked where they enter: JSON that is an object, and the fields the API reads (or
passes on to an engine) of the types OpenAI and Lemonade give them, whole numbers within what the engine
takes. Anything else is a 400 that names the field; a body is never half-read into a 500.

Fields the API does not know (``tools``, ``response_format``, llama.cpp's own samplers) pass through to
the engine untouched.
"""

from __future__ import annotations

import json
import math
from typing import Any

from app.client.adapters import named_tool
from app.supervisor.api.errors import bad_request

# Deeper than any request's JSON (a response schema's included) and far inside what Python's json can
# write again: a body that only just parses (about 930 deep) failed as a 500 when it was sent on.
MAX_DEPTH = 200


def parse_object(raw: bytes) -> dict[str, Any]:
    """A request body as a JSON object (an empty body is an empty object)."""
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise bad_request("The request body is not valid JSON.", "invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.", "invalid_json")
    if _deeper_than(body, MAX_DEPTH):
        raise bad_request(f"The request body is nested more than {MAX_DEPTH} deep.", "invalid_json")
    return body


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests objects and arrays more than ``limit`` deep (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, dict | list):
                if depth >= limit:
                    return True
                stack.append((child, depth + 1))
    return False


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _expect(body: dict[str, Any], field: str, ok: bool, what: str) -> None:
    if not ok:
        raise bad_request(f"'{field}' must be {what}.")


def optional(body: dict[str, Any], field: str, kind: str) -> Any:
    """``body[field]`` when present and not null, checked against ``kind``; else None."""
    value = body.get(field)
    if value is None:
        return None
    checks = {
        "str": (isinstance(value, str), "a string"),
        "bool": (isinstance(value, bool), "true or false"),
        "int": (_is_int(value), "a whole number"),
        "number": (_is_number(value), "a number"),
        "object": (isinstance(value, dict), "an object"),
        "list": (isinstance(value, list), "a list"),
    }
    ok, what = checks[kind]
    _expect(body, field, ok, what)
    return value


def _whole_number(body: dict[str, Any], field: str, low: int, high: int) -> None:
    """``body[field]``, when present and not null, is a whole number from ``low`` to ``high``."""
    value = body.get(field)
    if value is not None:
        ok = _is_int(value) and low <= value <= high
        _expect(body, field, ok, f"a whole number from {low} to {high}")


def required_str(body: dict[str, Any], field: str) -> str:
    value = body.get(field)
    if value is None:
        raise bad_request(f"'{field}' is required.", "missing_field")
    _expect(body, field, isinstance(value, str) and bool(value), "a non-empty string")
    return str(value)


# What OpenAI's generation routes take, by type; checked before the engine sees the body.
_GENERATION_FIELDS = {
    "stream": "bool",
    "temperature": "number",
    "top_p": "number",
    "presence_penalty": "number",
    "frequency_penalty": "number",
    "stream_options": "object",
    "tools": "list",
    "response_format": "object",
    "repeat_penalty": "number",  # llama.cpp's, which Lemonade documents
    "echo": "bool",
}
# The whole numbers, in the range llama-server takes. It reads them as C ints: a larger number wraps, and
# is refused as another ("between -1 <= value <= 2147483647, but got -2147483648") or, for top_k, used as
# one. n's top is the engine's slot count, which it names itself. A seed may be any of OpenAI's 64-bit
# ones (llama-server keeps 32 bits of it).
C_INT_MAX = 2**31 - 1
_WHOLE_NUMBERS = {
    "max_tokens": (0, C_INT_MAX),
    "max_completion_tokens": (0, C_INT_MAX),
    "max_output_tokens": (0, C_INT_MAX),  # the Responses API's max_tokens
    "n": (1, C_INT_MAX),
    "top_k": (-C_INT_MAX - 1, C_INT_MAX),
    "seed": (-(2**63), 2**63 - 1),
}


def _check_inputs(body: dict[str, Any], route: str) -> None:
    """An embeddings body's ``input``; a reranking body's ``query`` and ``documents``."""
    if route == "embeddings":
        value = body.get("input")
        if value is None:
            raise bad_request("'input' is required.", "missing_field")
        ok = isinstance(value, str) or (isinstance(value, list) and bool(value))
        _expect(body, "input", ok, "a string or a non-empty list")
        optional(body, "encoding_format", "str")
        return
    required_str(body, "query")
    documents = body.get("documents")
    if documents is None:
        raise bad_request("'documents' is required.", "missing_field")
    ok = isinstance(documents, list) and bool(documents) and all(isinstance(d, str) for d in documents)
    _expect(body, "documents", ok, "a non-empty list of strings")
    _whole_number(body, "top_n", 0, C_INT_MAX)


def _check_tool_choice(body: dict[str, Any]) -> None:
    """A ``tool_choice`` that is an object names a function of ``tools``, as OpenAI's must."""
    choice = body.get("tool_choice")
    if not isinstance(choice, dict):
        return  # a string is the engine's to read ("auto", "none", "required")
    name = named_tool(choice)
    if name is None:
        raise bad_request(
            '\'tool_choice\' must be "auto", "none", "required" or {"type": "function", "function": '
            '{"name": ...}}.'
        )
    if name not in [named_tool(t) for t in body.get("tools") or []]:
        raise bad_request(f"'tool_choice' names the function {name!r}, which is not one of 'tools'.")


def check_generation(body: dict[str, Any], route: str) -> None:
    """Check a request body before the engine sees it (``route``: chat, completions, responses,
    embeddings or reranking); raises a 400 naming the bad field."""
    if route in ("embeddings", "reranking"):
        _check_inputs(body, route)
        return
    for field, kind in _GENERATION_FIELDS.items():
        optional(body, field, kind)
    for field, (low, high) in _WHOLE_NUMBERS.items():
        _whole_number(body, field, low, high)
    options = body.get("stream_options")
    if isinstance(options, dict):
        optional(options, "include_usage", "bool")
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str):
        ok = isinstance(stop, list) and all(isinstance(s, str) for s in stop)
        _expect(body, "stop", ok, "a string or a list of strings")
    if route == "chat":
        _check_tool_choice(body)
        messages = body.get("messages")
        if messages is None:
            raise bad_request("'messages' is required.", "missing_field")
        ok = isinstance(messages, list) and bool(messages) and all(isinstance(m, dict) for m in messages)
        _expect(body, "messages", ok, "a non-empty list of message objects")
        for i, message in enumerate(messages):
            role = message.get("role")
            if not isinstance(role, str):
                raise bad_request(f"'messages[{i}].role' must be a string.")
            content = message.get("content")
            if content is not None and not isinstance(content, str | list):
                raise bad_request(f"'messages[{i}].content' must be a string or a list of parts.")
    elif route == "completions":
        prompt = body.get("prompt")
        if prompt is None:
            raise bad_request("'prompt' is required.", "missing_field")
        ok = isinstance(prompt, str) or (isinstance(prompt, list) and bool(prompt))
        _expect(body, "prompt", ok, "a string or a list")
    elif route == "responses" and body.get("input") is None:
        raise bad_request("'input' is required.", "missing_field")
