"""The tool loop: a chat turn whose reply ends in tool calls has them run on the MCP servers, their
results fed back as ``tool`` messages, and the reply continued, up to ``tool_rounds`` rounds.

Each call asks first through the front end's ``ask`` (allow once, always for this tool, deny), unless
the user allowed the tool always; a denied call, one that fails, and one that does not answer within
``tool_timeout_s`` go back to the model as an error result. Cancelling the stream (Stop) cancels the
call in flight. The stream yields the reply's deltas, a ``ToolCallStarted`` and ``ToolCallFinished``
per call, and one ``ChatDone``: the last round's (the earlier rounds' figures are counted as requests).

Tools go only to a model that can call them (``app.supervisor.router.tool_support``); to another, the
stream says why first (``ToolsWithheld``) and the reply goes without them. One round runs at most
``MAX_CALLS_PER_ROUND`` calls; the model is told the rest were not run.

The window and ``lemon-desk run`` use it; the local API does not (its clients run their own tools).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol

from app.client.chat import Messages
from app.client.events import ChatDelta, ChatDone, ChatEvent, ToolCall
from app.core.errors import LemonDeskError
from app.core.tools import (
    MAX_CALLS_PER_ROUND,
    Ask,
    Permission,
    ToolCallFinished,
    ToolCallStarted,
    ToolEvent,
    ToolOutcome,
    ToolRequest,
    ToolSupport,
    ToolsWithheld,
    bounded,
)
from app.store.settings import Settings
from app.supervisor.mcp import McpCallError, McpHost, OfferedTool


class Stream(Protocol):
    def __call__(
        self, name: str, messages: Messages, *, conversation: str | None = None, **params: Any
    ) -> AsyncIterator[ChatEvent]: ...


def _arguments(call: ToolCall) -> dict[str, Any]:
    """A call's arguments as the object a tool takes; ValueError saying why they are not one."""
    try:
        value = json.loads(call.arguments) if call.arguments.strip() else {}
    except ValueError:
        raise ValueError(f"The arguments of {call.name} are not JSON: {call.arguments[:200]!r}.") from None
    if not isinstance(value, dict):
        raise ValueError(f"The arguments of {call.name} are not a JSON object.")
    return value


def _named(call: ToolCall, offered: dict[str, OfferedTool]) -> ToolRequest:
    """A call as the user is told of it when it is not run: its server and tool when they are known."""
    tool = offered.get(call.name)
    try:
        arguments = _arguments(call)
    except ValueError:
        arguments = {}
    if tool is None:
        return ToolRequest(call.id, "", call.name, arguments)
    return ToolRequest(call.id, tool.server, tool.tool.name, arguments)


class ToolLoop:
    def __init__(
        self,
        *,
        stream: Stream,
        host: Callable[[], McpHost],
        settings: Callable[[], Settings],
        support: Callable[[str], Awaitable[ToolSupport]],
    ) -> None:
        self._stream = stream
        self._host = host
        self._settings = settings
        self._support = support

    async def chat(
        self,
        name: str,
        messages: Messages,
        *,
        ask: Ask,
        servers: Iterable[str] | None = None,
        conversation: str | None = None,
        first_round: Mapping[str, Any] | None = None,
        **params: Any,
    ) -> AsyncIterator[ChatEvent | ToolEvent]:
        """A streamed reply that may call the tools of the READY servers (of ``servers``, when given).
        ``first_round``: request fields of its first round alone, such as a call forced to start the
        reply (``tool_choice: "required"``, a ``logit_bias``); the rounds after its tools ran go without
        them, or the model could never answer in text."""
        offered = {tool.name: tool for tool in self._host().offered(servers)}
        if offered:
            support = await self._support(name)
            if support.can:
                params = {**params, "tools": [tool.to_openai() for tool in offered.values()]}
            else:
                yield ToolsWithheld(support.why)
                offered = {}
        history = list(messages)
        limit = self._settings().tool_rounds
        rounds = 0
        while True:
            text: list[str] = []
            done: ChatDone | None = None
            asked = {**params, **(first_round or {})} if rounds == 0 else params
            async for event in self._stream(name, history, conversation=conversation, **asked):
                if isinstance(event, ChatDelta):
                    text.append(event.content)
                    yield event
                else:
                    done = event
            assert done is not None  # a stream ends with ChatDone or raises
            if not done.tool_calls or not offered:
                yield done
                return
            history.append(
                {
                    "role": "assistant",
                    "content": "".join(text),
                    "tool_calls": [c.to_openai() for c in done.tool_calls],
                }
            )
            for index, call in enumerate(done.tool_calls):
                # Told to the user under an id of this round's: an engine that gives none numbers each
                # round's calls from 0 again, and the question must not land on an earlier call's view.
                shown = dataclasses.replace(call, id=f"{rounds + 1}:{call.id}")
                why = ""
                if rounds >= limit:
                    why = f"Not run: this reply reached its limit of {limit} tool rounds (Settings)."
                elif index >= MAX_CALLS_PER_ROUND:
                    why = f"Not run: a reply may make at most {MAX_CALLS_PER_ROUND} tool calls at once."
                if why:
                    yield ToolCallFinished(_named(shown, offered), ToolOutcome.NOT_RUN, why)
                    history.append({"role": "tool", "tool_call_id": call.id, "content": why})
                    continue
                async for step in self._run(shown, offered, ask):
                    yield step
                    if isinstance(step, ToolCallFinished):
                        history.append({"role": "tool", "tool_call_id": call.id, "content": step.result})
            if rounds >= limit:
                yield done
                return
            rounds += 1

    async def _run(
        self, call: ToolCall, offered: dict[str, OfferedTool], ask: Ask
    ) -> AsyncIterator[ToolCallStarted | ToolCallFinished]:
        tool = offered.get(call.name)
        if tool is None:
            request = ToolRequest(call.id, "", call.name, {})
            known = ", ".join(offered)
            yield ToolCallFinished(
                request, ToolOutcome.ERROR, f"Error: there is no tool {call.name!r} ({known})."
            )
            return
        try:
            arguments = _arguments(call)
        except ValueError as err:
            request = ToolRequest(call.id, tool.server, tool.tool.name, {})
            yield ToolCallFinished(request, ToolOutcome.ERROR, f"Error: {err}")
            return
        request = ToolRequest(call.id, tool.server, tool.tool.name, arguments)
        host = self._host()
        if not host.permissions.allowed(tool.server, tool.tool.name):
            answer = await ask(request)
            if answer is Permission.DENY:
                yield ToolCallFinished(request, ToolOutcome.DENIED, "The user denied this tool call.")
                return
            if answer is Permission.ALWAYS:
                await host.permissions.allow_always(tool.server, tool.tool.name)
        yield ToolCallStarted(request)
        timeout_s = self._settings().tool_timeout_s
        started = time.monotonic()
        try:
            async with asyncio.timeout(timeout_s):
                output = await host.server(tool.server).call(tool.tool.name, arguments)
        except TimeoutError:
            result, outcome = f"Error: the tool did not answer within {timeout_s:g} s.", ToolOutcome.TIMED_OUT
        except (McpCallError, LemonDeskError) as err:  # broken, or the server removed meanwhile
            result, outcome = f"Error: {err}", ToolOutcome.ERROR
        else:
            outcome = ToolOutcome.ERROR if output.is_error else ToolOutcome.OK
            result = bounded(f"Error: {output.text}" if output.is_error else output.text)
        yield ToolCallFinished(request, outcome, result, time.monotonic() - started)
