"""OpenAI fidelity on the real engine: the official `openai` client against `lemon-desk serve` on the real
llama-server and SmolLM2, for tool calls (streamed, whole, and a round trip; tests/support/tool_calls.py
makes the model call), structured output and the request fields strict clients add."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.store.library import Library
from app.store.model_options import ModelOptions, save_model_options
from app.store.settings import Settings, save_settings
from tests.conftest import profile_path
from tests.integration.conftest import OpenAIs, engines_of
from tests.support.serve import Serving, serving
from tests.support.tool_calls import ARGUMENTS, QUESTION, TEMPLATE_ARGS, forced_call, round_trip

pytestmark = pytest.mark.integration

MODEL = "user.smol"


@pytest.fixture
def served(
    llama_dir: Path, smol_gguf: Path, lemon_home: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Serving]:
    """SmolLM2 as "user.smol" on the real llama-server, with the tool-call template."""
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path("cpu_only_x86")))
    monkeypatch.setenv("LD_LIBRARY_PATH", str(llama_dir))
    settings = Settings(llama_server_path=str(llama_dir / "llama-server"))
    save_settings(settings)
    Library(settings).import_path(smol_gguf, name=MODEL)
    save_model_options({MODEL: ModelOptions(backend="system", ctx_size=4096, args=TEMPLATE_ARGS)})
    with serving() as running:
        yield running
    assert engines_of(lemon_home) == []


def test_tool_calls_whole_and_streamed_then_the_reply_after_the_result(
    served: Serving, openai_api: OpenAIs
) -> None:
    api = openai_api(served.url, timeout=300)
    whole = api.chat.completions.create(model=MODEL, messages=QUESTION, **forced_call())
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.id and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == ARGUMENTS

    chunks = list(api.chat.completions.create(model=MODEL, messages=QUESTION, stream=True, **forced_call()))
    pieces = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
    first, rest = pieces[0], pieces[1:]
    # As OpenAI streams a call: its index, id, type and name first, then its arguments in pieces.
    assert first.index == 0 and first.id and first.type == "function" and first.function is not None
    assert first.function.name == "get_weather"
    assert rest and all(
        p.index == 0 and p.id is None and p.function and p.function.name is None for p in rest
    )
    arguments = "".join((p.function.arguments or "") for p in pieces if p.function)
    assert json.loads(arguments) == ARGUMENTS
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        "tool_calls"
    ]

    after = api.chat.completions.create(
        model=MODEL,
        messages=round_trip(first.id or "", arguments),
        tools=forced_call()["tools"],
        max_tokens=30,
        temperature=0,
    )
    answer = after.choices[0]
    assert answer.message.content and not answer.message.tool_calls
    assert answer.finish_reason in ("stop", "length")


def test_a_json_schema_reply_parses_and_has_the_required_keys(served: Serving, openai_api: OpenAIs) -> None:
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "country": {"type": "string", "maxLength": 20},
        },
        "required": ["city", "country"],
        "additionalProperties": False,
    }
    reply = openai_api(served.url, timeout=300).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Give a city and its country as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": schema}},
        max_tokens=60,
        temperature=0,
    )
    value = json.loads(reply.choices[0].message.content or "")
    assert set(value) == {"city", "country"} and all(isinstance(v, str) for v in value.values())


def test_fields_strict_clients_send_are_accepted(served: Serving) -> None:
    extra = {
        "stream_options": {"include_usage": True},
        "parallel_tool_calls": True,
        "store": False,
        "metadata": {"run": "1"},
        "user": "someone",
        "service_tier": "auto",
        "reasoning_format": "inline",
    }
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, **extra}
    for stream in (False, True):
        answer = httpx.post(
            f"{served.url}/v1/chat/completions", json={**body, "stream": stream}, timeout=300, trust_env=False
        )
        assert answer.status_code == 200, answer.text
        assert (
            ("data: [DONE]" in answer.text) if stream else answer.json()["choices"][0]["message"]["content"]
        )
