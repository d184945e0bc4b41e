"""The one internal reply model the Anthropic and Ollama dialects are codecs over: an engine's OpenAI
chat stream read into events (text, reasoning, tool calls, the end with its reason and usage).

    reader = ChatReader(stop=["\\n\\n"])
    for event in reader.feed(chunk): ...    # raw SSE bytes, split anywhere
    reader.finished                         # the Finished event once the reply has ended

Stop sequences are found here, not by the engine: an engine that stops on one strips it and says only
``finish_reason: "stop"``, as it does at its end-of-sequence token, and Anthropic's ``stop_reason`` /
``stop_sequence`` and Ollama's ``done_reason`` must tell which. Text that could be the start of a stop
sequence is held back until it is known not to be; a reply that meets one ends there (the caller closes
the engine stream, which stops the generation), before the engine's usage: its figures are then
llama-server's per-token ``timings`` when it sends them (``timings_per_token``), else the deltas
counted and no input tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from app.client.sse import EventTooLarge, SSEParser, event_json
from app.supervisor.api.errors import ApiError, bad_gateway, bad_request


class Finish(Enum):
    STOP = "stop"  # the model ended its reply (its end-of-sequence token)
    LENGTH = "length"  # the token limit was reached
    TOOL_CALLS = "tool_calls"  # the reply is a call of one or more tools
    STOP_SEQUENCE = "stop_sequence"  # one of the request's stop sequences came


@dataclass(frozen=True, slots=True)
class Text:
    text: str


@dataclass(frozen=True, slots=True)
class Reasoning:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    index: int  # the call's place in the reply (OpenAI's tool_calls[].index)
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class ToolCallArguments:
    index: int
    fragment: str  # a piece of the arguments' JSON text, as the engine streams it


@dataclass(frozen=True, slots=True)
class Finished:
    reason: Finish
    stop_sequence: str | None
    input_tokens: int  # 0 when the engine did not say (a reply cut at a stop sequence here)
    output_tokens: int


ChatEvent = Text | Reasoning | ToolCallStart | ToolCallArguments


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class ChatReader:
    """Reads one engine chat stream. ``feed`` gives the events a chunk completes; once ``finished`` is
    set the reply is over (the engine's ``[DONE]`` may still follow, and means nothing more). It keeps
    the figures the API's telemetry takes from a stream (``events``, ``done``, ``usage``, ``timings``),
    so the stream is read once.

    The text of a chunk's deltas in a row comes as one ``Text`` (and their reasoning as one
    ``Reasoning``): a paced read holds a frame of tokens, and a dialect writes one event for it, not one
    a token (the same text, for a fraction of the work)."""

    def __init__(self, stop: list[str] | None = None) -> None:
        self._parser = SSEParser()
        self._stop = [s for s in stop or [] if s]
        self._held = ""  # text that may be the start of a stop sequence
        self._finish: Finish | None = None
        self.events = 0  # the SSE events read
        self.done = False  # the engine's [DONE] came
        self.usage: dict[str, Any] = {}
        self.timings: dict[str, Any] = {}  # llama-server's figures so far, when it sends them per token
        self._deltas = 0  # token-bearing deltas: the output tokens, when the engine's usage never comes
        self._tool_ids: dict[int, str] = {}
        self._run: list[str] = []  # the pieces of the Text or Reasoning being gathered
        self._run_kind: type[Text] | type[Reasoning] = Text
        self.finished: Finished | None = None

    def feed(self, chunk: bytes) -> list[ChatEvent]:
        try:
            events = self._parser.data(chunk)
        except EventTooLarge as err:
            raise bad_gateway(f"The engine sent an event too large to read ({err}).") from None
        self.events += len(events)
        out: list[ChatEvent] = []
        for data in events:
            if self.finished is None:
                self._event(data, out)
        self._gathered(out)
        return out

    def end(self) -> list[ChatEvent]:
        """The engine's stream ended: what was held back, and the end (an error if it never ended)."""
        out: list[ChatEvent] = []
        for event in self._parser.close():
            if self.finished is None:
                self._event(event.data.encode(), out)
        if self.finished is None and self._finish is not None:
            self._text("", out, final=True)
            self._close(self._finish, None)
        self._gathered(out)
        return out

    def _event(self, data: bytes, out: list[ChatEvent]) -> None:
        if data == b"[DONE]":
            self.done = True
            if self._finish is not None:
                self._text("", out, final=True)
                self._close(self._finish, None)
            return
        try:
            payload = event_json(data)
        except (ValueError, RecursionError):
            raise bad_gateway("The engine sent an event that is not JSON.") from None
        if not isinstance(payload, dict):
            return
        if "error" in payload:
            raise _engine_error(payload["error"])
        if isinstance(payload.get("usage"), dict):
            self.usage = payload["usage"]
        if isinstance(payload.get("timings"), dict):
            self.timings = payload["timings"]
        choices = payload.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return
        choice = choices[0]
        delta = choice.get("delta")
        if isinstance(delta, dict):
            self._delta(delta, out)
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and self.finished is None:
            self._finish = {"length": Finish.LENGTH, "tool_calls": Finish.TOOL_CALLS}.get(reason, Finish.STOP)

    def _delta(self, delta: dict[str, Any], out: list[ChatEvent]) -> None:
        reasoning = delta.get("reasoning_content")
        if isinstance(reasoning, str) and reasoning:
            self._deltas += 1
            self._gather(Reasoning, reasoning, out)
        content = delta.get("content")
        if isinstance(content, str) and content:
            self._deltas += 1
            self._text(content, out, final=False)
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            for call in calls:
                if isinstance(call, dict):
                    self._tool_call(call, out)

    def _tool_call(self, call: dict[str, Any], out: list[ChatEvent]) -> None:
        index = _int(call.get("index")) or 0
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        assert isinstance(function, dict)
        if index not in self._tool_ids:
            self._text("", out, final=True)  # text held back before the call is text after all
            call_id = call.get("id") if isinstance(call.get("id"), str) and call.get("id") else None
            self._tool_ids[index] = call_id or f"call_{index}"
            self._gathered(out)
            out.append(ToolCallStart(index, self._tool_ids[index], str(function.get("name") or "")))
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            self._deltas += 1
            self._gathered(out)
            out.append(ToolCallArguments(index, arguments))

    def _text(self, text: str, out: list[ChatEvent], *, final: bool) -> None:
        """Pass text on, holding back what could begin a stop sequence; end the reply at one."""
        if not self._stop:
            if text:
                self._gather(Text, text, out)
            return
        held = self._held + text
        found = [(held.find(s), s) for s in self._stop if s in held]
        if found:
            at, sequence = min(found)
            self._held = ""
            if at:
                self._gather(Text, held[:at], out)
            self._close(Finish.STOP_SEQUENCE, sequence)
            return
        keep = 0 if final else _partial_stop(held, self._stop)
        self._held = held[len(held) - keep :] if keep else ""
        if len(held) > keep:
            self._gather(Text, held[: len(held) - keep], out)

    def _gather(self, kind: type[Text] | type[Reasoning], text: str, out: list[ChatEvent]) -> None:
        """Add ``text`` to the Text or Reasoning being gathered (another kind's is put out first)."""
        if kind is not self._run_kind:
            self._gathered(out)
            self._run_kind = kind
        self._run.append(text)

    def _gathered(self, out: list[ChatEvent]) -> None:
        """Put out the Text or Reasoning gathered so far, if any."""
        if self._run:
            out.append(self._run_kind("".join(self._run)))
            self._run = []

    def _close(self, reason: Finish, sequence: str | None) -> None:
        prompt = _int(self.usage.get("prompt_tokens")) if self.usage else None
        completion = _int(self.usage.get("completion_tokens")) if self.usage else None
        if reason is Finish.STOP_SEQUENCE:
            # The engine's usage never came; its timings so far count the prompt (cached and read) and
            # the tokens made, the stop sequence's among them.
            prompt_n, cache_n = _int(self.timings.get("prompt_n")), _int(self.timings.get("cache_n"))
            prompt = prompt_n + (cache_n or 0) if prompt_n is not None else None
            completion = _int(self.timings.get("predicted_n"))
        self.finished = Finished(reason, sequence, prompt or 0, completion or self._deltas)


def _partial_stop(text: str, stops: list[str]) -> int:
    """How many characters at the end of ``text`` could be the start of a stop sequence."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest


def _engine_error(error: Any) -> ApiError:
    """An error event in the engine's stream (an adapter's refusal, the engine's own failure)."""
    if isinstance(error, dict):
        message = str(error.get("message") or "The engine failed the request.")
        if error.get("code") == "unsupported":
            return bad_request(message, "unsupported")
        return bad_gateway(message)
    return bad_gateway(str(error) or "The engine failed the request.")
