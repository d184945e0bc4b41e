"""The router's tool loop against the stand-in engine (a real child process answering like llama-server;
its ``tool_call`` behaviour streams a call as llama-server does) and a real MCP server over stdio
(tests/support/mcp_server.py, written with the SDK): calls run with permission (once, always, deny),
their results fed back and the reply continued; bounded rounds, a time limit per call, a crash, a huge
answer, Stop mid-call.

The stand-in stands in for a model that calls tools: SmolLM2 on the real llama-server does not call
one yet (docs/tool-calls.md). Once it does, the allow-once round trip moves to tests/integration."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from app.client.events import ChatDelta, ChatDone
from app.core.mcp import McpState
from app.core.tools import (
    MAX_CALLS_PER_ROUND,
    MAX_RESULT_CHARS,
    Permission,
    ToolCallFinished,
    ToolCallStarted,
    ToolOutcome,
    ToolRequest,
    ToolsWithheld,
)
from app.store.mcp_servers import load_always_allowed
from app.store.model_options import ModelOptions
from app.store.settings import Settings, load_settings, save_settings, settings_path
from app.supervisor.api import ApiServer
from app.supervisor.router import Router
from tests.support.mcp_servers import SERVER, stdio_spec
from tests.support.standin import make_standin_model

T = TypeVar("T")
Events = list[object]


class Asker:
    """The front end's permission prompt: answers as told, and notes what it was asked."""

    def __init__(self, *answers: Permission) -> None:
        self.answers = list(answers)
        self.asked: list[ToolRequest] = []

    async def __call__(self, request: ToolRequest) -> Permission:
        self.asked.append(request)
        return self.answers.pop(0)


def run(
    settings: Settings, tmp_path: Path, body: Callable[[Router, str], Awaitable[T]], **behaviour: Any
) -> T:
    """``body(router, model)`` with the MCP server ``t`` ready and a stand-in model that calls tools."""

    async def go() -> T:
        async with Router(settings) as router:
            await router.mcp.put(stdio_spec("t", calls=tmp_path / "calls.jsonl"))
            router.mcp.start()
            assert await router.mcp.wait_ready(["t"], 60)
            model = router.library.import_path(make_standin_model(tmp_path, "caller", tokens=2, **behaviour))
            router.save_options(model.name, ModelOptions(backend="system"))
            return await body(router, model.name)

    return asyncio.run(go())


def calling(tool: str, arguments: dict[str, Any] | str, rounds: int | None = 1) -> dict[str, Any]:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"tool_call": {"name": f"t__{tool}", "arguments": text}, "tool_rounds": rounds}


async def turn(router: Router, model: str, ask: Asker, text: str = "go") -> Events:
    stream = router.chat_with_tools(model, [{"role": "user", "content": text}], ask=ask)
    return [event async for event in stream]


def reply_text(events: Events) -> str:
    return "".join(e.content for e in events if isinstance(e, ChatDelta))


def finished(events: Events) -> list[ToolCallFinished]:
    return [e for e in events if isinstance(e, ToolCallFinished)]


def calls_made(tmp_path: Path) -> list[dict[str, Any]]:
    log = tmp_path / "calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_an_allowed_call_runs_its_result_goes_back_and_the_reply_continues(
    standin_settings: Settings, tmp_path: Path
) -> None:
    ask = Asker(Permission.ALLOW_ONCE, Permission.ALLOW_ONCE)

    async def body(router: Router, model: str) -> tuple[Events, Events]:
        return await turn(router, model, ask), await turn(router, model, ask)

    first, second = run(standin_settings, tmp_path, body, **calling("echo", {"text": "hi"}))
    started = [e for e in first if isinstance(e, ToolCallStarted)]
    assert [s.request for s in started] == [ToolRequest("1:call_standin", "t", "echo", {"text": "hi"})]
    [result] = finished(first)
    assert (result.outcome, result.result) == (ToolOutcome.OK, "echo: hi")
    assert first.index(started[0]) < first.index(result)
    assert reply_text(first).endswith("tool said: echo: hi")  # the model was given the result
    done = first[-1]
    assert isinstance(done, ChatDone) and done.finish_reason == "stop"
    assert len(ask.asked) == 2  # allowed once: the next turn asks again
    assert calls_made(tmp_path) == [{"tool": "echo", "arguments": {"text": "hi"}}] * 2
    assert finished(second)[0].outcome is ToolOutcome.OK


def test_a_tool_allowed_always_asks_no_more_and_is_remembered(
    standin_settings: Settings, tmp_path: Path
) -> None:
    ask = Asker(Permission.ALWAYS)

    async def body(router: Router, model: str) -> list[ToolOutcome]:
        outcomes = [finished(await turn(router, model, ask))[0].outcome for _ in range(2)]
        return outcomes

    assert run(standin_settings, tmp_path, body, **calling("add", {"a": 1, "b": 2})) == [ToolOutcome.OK] * 2
    assert len(ask.asked) == 1
    assert load_always_allowed().items == {"t": frozenset({"add"})}


def test_a_server_replaced_by_another_program_asks_again(standin_settings: Settings, tmp_path: Path) -> None:
    """Always allowed, then the server's definition names another program (an edit, an mcp.json
    imported over it): its tools ask again; the same program put again keeps the grant."""
    ask = Asker(Permission.ALWAYS, Permission.ALLOW_ONCE)

    async def body(router: Router, model: str) -> int:
        await turn(router, model, ask)
        await router.mcp.put(stdio_spec("t", calls=tmp_path / "calls.jsonl"))  # the same again
        assert await router.mcp.wait_ready(["t"], 60)
        await turn(router, model, ask)
        asked = len(ask.asked)
        other = tmp_path / "other-server.py"
        other.write_text(SERVER.read_text())
        await router.mcp.put(stdio_spec("t", calls=tmp_path / "calls.jsonl", script=other))
        assert await router.mcp.wait_ready(["t"], 60)
        await turn(router, model, ask)
        return asked

    assert run(standin_settings, tmp_path, body, **calling("add", {"a": 1, "b": 2})) == 1
    assert len(ask.asked) == 2


def test_a_denied_call_is_not_run_and_the_model_is_told(standin_settings: Settings, tmp_path: Path) -> None:
    ask = Asker(Permission.DENY)

    async def body(router: Router, model: str) -> Events:
        return await turn(router, model, ask)

    events = run(standin_settings, tmp_path, body, **calling("echo", {"text": "secret"}))
    [result] = finished(events)
    assert result.outcome is ToolOutcome.DENIED
    assert not [e for e in events if isinstance(e, ToolCallStarted)]
    assert calls_made(tmp_path) == []
    assert reply_text(events).endswith("tool said: The user denied this tool call.")


def test_rounds_are_bounded_by_the_setting(standin_settings: Settings, tmp_path: Path) -> None:
    settings = Settings(**{**standin_settings.__dict__, "tool_rounds": 2})
    ask = Asker(Permission.ALWAYS)

    async def body(router: Router, model: str) -> Events:
        return await turn(router, model, ask)

    events = run(settings, tmp_path, body, **calling("echo", {"text": "again"}, rounds=None))
    assert [r.outcome for r in finished(events)] == [ToolOutcome.OK, ToolOutcome.OK, ToolOutcome.NOT_RUN]
    assert "limit of 2 tool rounds" in finished(events)[-1].result
    # Each round's call is told under an id of its own, though the engine gives every round's the same.
    assert len({r.request.call_id for r in finished(events)}) == 3
    assert len(calls_made(tmp_path)) == 2
    done = events[-1]
    assert isinstance(done, ChatDone) and done.finish_reason == "tool_calls"


def test_one_round_runs_at_most_the_cap_of_calls_and_the_model_is_told_the_rest_were_not(
    standin_settings: Settings, tmp_path: Path
) -> None:
    ask = Asker(Permission.ALWAYS)

    async def body(router: Router, model: str) -> Events:
        return await turn(router, model, ask)

    many = MAX_CALLS_PER_ROUND + 3
    events = run(standin_settings, tmp_path, body, **calling("echo", {"text": "x"}), calls_at_once=many)
    outcomes = [r.outcome for r in finished(events)]
    assert outcomes == [ToolOutcome.OK] * MAX_CALLS_PER_ROUND + [ToolOutcome.NOT_RUN] * 3
    assert all(f"at most {MAX_CALLS_PER_ROUND} tool calls" in r.result for r in finished(events)[-3:])
    assert len(calls_made(tmp_path)) == MAX_CALLS_PER_ROUND
    # Every call had its answer: the last one (not run) is what the model was told last.
    told = f"tool said: Not run: a reply may make at most {MAX_CALLS_PER_ROUND} tool calls at once."
    assert reply_text(events).endswith(told)


def test_a_model_whose_template_takes_no_tools_is_offered_none_and_the_chat_says_why(
    standin_settings: Settings, tmp_path: Path
) -> None:
    ask = Asker()

    async def body(router: Router, model: str) -> Events:
        return await turn(router, model, ask)

    caps = {"supports_tools": False, "supports_tool_calls": False}
    events = run(standin_settings, tmp_path, body, **calling("echo", {"text": "hi"}), template_caps=caps)
    withheld = events[0]
    assert isinstance(withheld, ToolsWithheld)
    assert withheld.why.startswith("No tools for user.caller: its chat template does not take tools.")
    assert "--chat-template-file" in withheld.why
    # The model (the stand-in calls whatever it is offered) asked for a call; none ran, none was asked.
    assert finished(events) == [] and ask.asked == [] and calls_made(tmp_path) == []
    assert isinstance(events[-1], ChatDone)


def test_a_call_that_does_not_answer_in_time_goes_back_as_an_error(
    standin_settings: Settings, tmp_path: Path
) -> None:
    settings = Settings(**{**standin_settings.__dict__, "tool_timeout_s": 1.0})

    async def body(router: Router, model: str) -> tuple[Events, McpState]:
        events = await turn(router, model, Asker(Permission.ALLOW_ONCE))
        return events, router.mcp.server("t").state

    events, state = run(settings, tmp_path, body, **calling("hang", {}))
    [result] = finished(events)
    assert result.outcome is ToolOutcome.TIMED_OUT and "did not answer within 1 s" in result.result
    assert "tool said: Error: the tool did not answer" in reply_text(events)
    assert state is McpState.READY


def test_a_server_that_crashes_mid_call_is_an_error_result(
    standin_settings: Settings, tmp_path: Path
) -> None:
    async def body(router: Router, model: str) -> Events:
        return await turn(router, model, Asker(Permission.ALLOW_ONCE))

    [result] = finished(run(standin_settings, tmp_path, body, **calling("crash", {})))
    assert result.outcome is ToolOutcome.ERROR and result.result.startswith("Error: ")


def test_a_huge_answer_is_cut_saying_so_before_it_is_kept_or_sent(
    standin_settings: Settings, tmp_path: Path
) -> None:
    async def body(router: Router, model: str) -> Events:
        return await turn(router, model, Asker(Permission.ALLOW_ONCE))

    [result] = finished(run(standin_settings, tmp_path, body, **calling("huge", {"chars": 2_000_000})))
    assert result.outcome is ToolOutcome.OK
    assert len(result.result) < MAX_RESULT_CHARS + 200
    assert result.result.endswith(
        f"[... {2_000_000 - MAX_RESULT_CHARS} more characters were cut: the answer was too long.]"
    )


@pytest.mark.parametrize("arguments", ["not json", "[1, 2]"])
def test_arguments_that_are_no_json_object_are_an_error_without_asking(
    standin_settings: Settings, tmp_path: Path, arguments: str
) -> None:
    ask = Asker()

    async def body(router: Router, model: str) -> Events:
        return await turn(router, model, ask)

    [result] = finished(run(standin_settings, tmp_path, body, **calling("echo", arguments)))
    assert result.outcome is ToolOutcome.ERROR and "arguments of t__echo are not" in result.result
    assert ask.asked == [] and calls_made(tmp_path) == []


def test_stop_cancels_the_call_in_flight_and_the_server_stays_usable(
    standin_settings: Settings, tmp_path: Path
) -> None:
    async def body(router: Router, model: str) -> tuple[bool, str]:
        running = asyncio.Event()

        async def consume() -> None:
            async for event in router.chat_with_tools(
                model, [{"role": "user", "content": "go"}], ask=Asker(Permission.ALLOW_ONCE)
            ):
                if isinstance(event, ToolCallStarted):
                    running.set()

        task = asyncio.create_task(consume())
        await running.wait()
        while not calls_made(tmp_path):  # the call reached the server
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        while len(calls_made(tmp_path)) < 2:  # the server was told, and cancelled the call
            await asyncio.sleep(0.02)
        server = router.mcp.server("t")
        return server.state is McpState.READY, (await server.call("echo", {"text": "after"})).text

    assert run(standin_settings, tmp_path, body, **calling("hang", {})) == (True, "echo: after")
    assert [c["tool"] for c in calls_made(tmp_path)] == ["hang", "hang-cancelled", "echo"]


def test_the_local_api_hands_tool_calls_to_its_client_and_runs_none(
    standin_settings: Settings, tmp_path: Path
) -> None:
    async def body(router: Router, model: str) -> dict[str, Any]:
        server = ApiServer(router, "127.0.0.1", 0, None)
        await server.start()
        try:
            async with httpx.AsyncClient(base_url=server.url, trust_env=False, timeout=60) as client:
                ask = {"model": model, "messages": [{"role": "user", "content": "go"}]}
                response = await client.post("/v1/chat/completions", json=ask)
                return dict(response.json())
        finally:
            await server.stop()

    answer = run(standin_settings, tmp_path, body, **calling("echo", {"text": "hi"}))
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "t__echo"
    assert calls_made(tmp_path) == []  # the MCP server of the app was not called for the client


def test_a_whole_reply_carries_the_tool_calls_the_model_made(
    standin_settings: Settings, tmp_path: Path
) -> None:
    async def body(router: Router, model: str) -> Any:
        return await router.chat(model, [{"role": "user", "content": "go"}])

    reply = run(standin_settings, tmp_path, body, **calling("add", {"a": 1, "b": 2}))
    assert reply.finish_reason == "tool_calls"
    assert [c.to_openai() for c in reply.tool_calls] == [
        {
            "id": "call_standin",
            "type": "function",
            "function": {"name": "t__add", "arguments": '{"a": 1, "b": 2}'},
        }
    ]


@pytest.mark.parametrize("field", ["tool_rounds", "tool_timeout_s"])
def test_the_tool_settings_refuse_nothing_or_less(field: str) -> None:
    save_settings(Settings())
    data = json.loads(settings_path().read_text())
    settings_path().write_text(json.dumps({**data, field: 0}))
    loaded = load_settings()
    assert f"'{field}' must be more than 0" in loaded.warning and loaded.settings == Settings()
