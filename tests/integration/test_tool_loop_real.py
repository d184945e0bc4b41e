"""The tool loop on the real engine: SmolLM2 on the real llama-server makes a real tool call
(tests/support/tool_calls.py: the tool-call template, a call forced in the first round only, the bias
that starts it), the router runs it on a real MCP server over stdio (tests/support/mcp_server.py's
get_weather, whose one possible argument the engine's grammar writes whole), and the result goes back
to the engine in a ``tool`` message; unforced, the model answers in text. With its own chat template
(``/props`` says it takes no tools) the model is offered none, and the reply says why. Bounded by
max_tokens and one tool round, not by time.

The stand-in engine's tests (tests/unit/test_tool_loop.py) cover the rest: permissions, timeouts,
crashes, huge answers, Stop, the cap on calls in one round."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from app.client.events import ChatDelta, ChatDone
from app.core.tools import Permission, ToolCallFinished, ToolOutcome, ToolRequest, ToolsWithheld
from app.supervisor.router import Router
from tests.integration.conftest import engines_of
from tests.support.tool_calls import QUESTION, TEMPLATE_ARGS, forced_call
from tests.support.tool_setup import real_engine_settings, tool_home

pytestmark = pytest.mark.integration
MODEL = "user.smol"


def test_a_real_call_runs_on_a_real_mcp_server_and_the_model_answers_its_result_in_text(
    llama_dir: Path, smol_gguf: Path, lemon_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = real_engine_settings(llama_dir, monkeypatch, tool_rounds=1)
    home = tool_home(
        settings, smol_gguf, tmp_path, name=MODEL, server="weather", args=TEMPLATE_ARGS, ctx_size=4096
    )
    asked: list[ToolRequest] = []

    async def ask(request: ToolRequest) -> Permission:
        asked.append(request)
        return Permission.ALLOW_ONCE

    async def go() -> list[Any]:
        async with Router(settings) as router:
            router.mcp.start()
            assert await router.mcp.wait_ready([home.server], 120)
            forced = forced_call()
            # The call is forced in the first round only; the round after the tool ran goes as asked.
            first = {k: forced[k] for k in ("tool_choice", "logit_bias")}
            params = {"temperature": 0, "max_tokens": 30}
            stream = router.chat_with_tools(MODEL, QUESTION, ask=ask, first_round=first, **params)
            return [e async for e in stream]

    events = asyncio.run(go())
    assert [(r.server, r.tool, r.arguments) for r in asked] == [("weather", "get_weather", {"city": "Paris"})]
    finished = [e for e in events if isinstance(e, ToolCallFinished)]
    assert [(f.outcome, f.result) for f in finished] == [(ToolOutcome.OK, "Sunny, 20 degrees Celsius.")]
    calls = [json.loads(line) for line in home.calls.read_text().splitlines()]
    assert calls == [{"tool": "get_weather", "arguments": {"city": "Paris"}}]
    # The engine took the call and its result back (a second request, its prompt the first's, cached,
    # and the new messages), unforced, and answered in text.
    after = events[events.index(finished[0]) + 1 :]
    text = "".join(e.content for e in after if isinstance(e, ChatDelta))
    done = events[-1]
    assert isinstance(done, ChatDone) and done.finish_reason in ("stop", "length") and not done.tool_calls
    assert text.strip(), events
    assert done.telemetry.cached_tokens and done.telemetry.prompt_tokens > done.telemetry.cached_tokens
    assert engines_of(lemon_home) == []


def test_a_model_whose_own_template_takes_no_tools_is_offered_none_and_the_reply_says_why(
    llama_dir: Path, smol_gguf: Path, lemon_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SmolLM2's own chat template describes no tools: the real llama-server's ``/props`` says
    ``supports_tools: false``, so the loop offers none (the engine would have taken them and put them
    in a prompt the model never learned), says why, and the reply comes in text."""
    settings = real_engine_settings(llama_dir, monkeypatch)
    home = tool_home(settings, smol_gguf, tmp_path, name=MODEL, server="weather", ctx_size=2048)
    asked: list[ToolRequest] = []

    async def ask(request: ToolRequest) -> Permission:
        asked.append(request)
        return Permission.ALLOW_ONCE

    async def go() -> list[Any]:
        async with Router(settings) as router:
            router.mcp.start()
            assert await router.mcp.wait_ready([home.server], 120)
            params = {"max_tokens": 8, "temperature": 0}
            return [e async for e in router.chat_with_tools(MODEL, QUESTION, ask=ask, **params)]

    events = asyncio.run(go())
    withheld = events[0]
    assert isinstance(withheld, ToolsWithheld)
    assert withheld.why.startswith(f"No tools for {MODEL}: its chat template does not take tools.")
    assert asked == [] and not home.calls.exists()
    done = events[-1]
    assert isinstance(done, ChatDone) and done.tool_calls == () and done.telemetry.completion_tokens > 0
    assert engines_of(lemon_home) == []
