"""Anthropic's Messages API against the stand-in engine (a real child process that answers like
llama-server), with raw httpx: the stream's event sequence, the whole message, stop sequences, the key
as x-api-key, every error status in Anthropic's shape, and hostile bodies. The official `anthropic`
client on the real engine is in tests/integration/test_api_dialects.py."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.store.settings import Settings
from app.supervisor.api.anthropic import _Message, _sse, chat_body
from app.supervisor.api.chat_events import Finish, Finished, Reasoning, Text, ToolCallArguments, ToolCallStart
from app.supervisor.api.errors import ApiError
from app.supervisor.router import RequestFinished, RequestSource, Router, RouterEvent
from tests.support.standin import control
from tests.unit.test_api import models, run_api

HI = [{"role": "user", "content": "hi"}]


def anthropic_error(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    assert "Traceback" not in response.text
    return dict(body["error"])


def sse_events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in raw.decode().split("\n\n"):
        if block.strip():
            lines = dict(line.split(": ", 1) for line in block.split("\n"))
            out.append((lines["event"], json.loads(lines["data"])))
    return out


def test_a_streamed_message_has_anthropics_event_sequence_and_feeds_telemetry(
    standin_settings: Settings, tmp_path: Path
) -> None:
    async def body(router: Router, client: httpx.AsyncClient) -> tuple[bytes, list[RouterEvent]]:
        (name,) = models(router, tmp_path, "alpha", tokens=4)
        seen: list[RouterEvent] = []
        router.subscribe(seen.append)
        request = {"model": name, "max_tokens": 50, "messages": HI, "stream": True, "system": "Be brief."}
        async with client.stream("POST", "/v1/messages", json=request) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            raw = await response.aread()
        return raw, [e for e in seen if isinstance(e, RequestFinished)]

    raw, finished = run_api(standin_settings, body)
    events = sse_events(raw)
    names = [name for name, _ in events]
    pieces = names.count("content_block_delta")  # the tokens of one read of the engine's are one delta
    assert 1 <= pieces <= 4
    assert names == [
        "message_start",
        "ping",
        "content_block_start",
        *["content_block_delta"] * pieces,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert all(data["type"] == name for name, data in events)
    start = events[0][1]["message"]
    assert start["role"] == "assistant" and start["content"] == [] and start["id"].startswith("msg_")
    deltas = [data["delta"] for name, data in events if name == "content_block_delta"]
    assert "".join(d["text"] for d in deltas) == "tok0 tok1 tok2 tok3 "
    assert {d["type"] for d in deltas} == {"text_delta"}
    end = events[-2][1]
    # The stand-in counts a prompt's words as its tokens: "Be brief." and "hi".
    assert end["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert end["usage"] == {"input_tokens": 3, "output_tokens": 4}
    assert [(f.source, f.telemetry.completion_tokens) for f in finished] == [(RequestSource.API, 4)]


def test_a_whole_message_with_a_stop_sequence_and_the_token_limit(
    standin_settings: Settings, tmp_path: Path
) -> None:
    async def body(router: Router, client: httpx.AsyncClient) -> list[dict[str, Any]]:
        (name,) = models(router, tmp_path, "alpha", reply="The answer is Paris. Done here and more")
        ask = {"model": name, "max_tokens": 50, "messages": HI}
        replies = []
        for extra in ({}, {"stop_sequences": ["Done", "never"]}, {"max_tokens": 2}):
            response = await client.post("/api/v1/messages", json={**ask, **extra})
            assert response.status_code == 200, response.text
            assert response.headers["request-id"].startswith("req_")
            replies.append(response.json())
        return replies

    whole, stopped, cut = run_api(standin_settings, body)
    assert whole["type"] == "message" and whole["role"] == "assistant"
    assert whole["content"] == [{"type": "text", "text": "The answer is Paris. Done here and more"}]
    assert (whole["stop_reason"], whole["stop_sequence"]) == ("end_turn", None)
    assert whole["usage"] == {"input_tokens": 1, "output_tokens": 8}
    assert stopped["content"] == [{"type": "text", "text": "The answer is Paris. "}]
    assert (stopped["stop_reason"], stopped["stop_sequence"]) == ("stop_sequence", "Done")
    assert stopped["usage"]["output_tokens"] == 5  # the deltas before the stop sequence
    assert cut["stop_reason"] == "max_tokens" and cut["usage"]["output_tokens"] == 2


def test_each_failure_has_anthropics_status_and_shape(standin_settings: Settings, tmp_path: Path) -> None:
    async def body(router: Router, client: httpx.AsyncClient) -> dict[str, tuple[int, str]]:
        (name,) = models(router, tmp_path, "alpha")
        ok = {"model": name, "max_tokens": 10, "messages": HI}
        server_tool = {"type": "web_search_20250305", "name": "web_search"}
        cases: dict[str, httpx.Response] = {
            "malformed": await client.post("/v1/messages", content=b'{"model": '),
            "no max_tokens": await client.post("/v1/messages", json={"model": name, "messages": HI}),
            "no messages": await client.post("/v1/messages", json={"model": name, "max_tokens": 5}),
            "bad role": await client.post(
                "/v1/messages", json={**ok, "messages": [{"role": "system", "content": "x"}]}
            ),
            "server tool": await client.post("/v1/messages", json={**ok, "tools": [server_tool]}),
            "bad tool_choice": await client.post("/v1/messages", json={**ok, "tool_choice": {"type": "x"}}),
            "unknown model": await client.post("/v1/messages", json={**ok, "model": "nope"}),
            "count unknown model": await client.post(
                "/v1/messages/count_tokens", json={"model": "nope", "messages": HI}
            ),
            "wrong method": await client.get("/v1/messages"),
            "too large": await client.post("/v1/messages", content=b" " * (33 << 20)),
        }
        return {k: (r.status_code, anthropic_error(r)["type"]) for k, r in cases.items()}

    assert run_api(standin_settings, body) == {
        "malformed": (400, "invalid_request_error"),
        "no max_tokens": (400, "invalid_request_error"),
        "no messages": (400, "invalid_request_error"),
        "bad role": (400, "invalid_request_error"),
        "server tool": (400, "invalid_request_error"),
        "bad tool_choice": (400, "invalid_request_error"),
        "unknown model": (404, "not_found_error"),
        "count unknown model": (404, "not_found_error"),
        "wrong method": (405, "invalid_request_error"),
        "too large": (413, "request_too_large"),
    }


def test_the_key_may_come_as_x_api_key(standin_settings: Settings, tmp_path: Path) -> None:
    async def body(router: Router, client: httpx.AsyncClient) -> list[tuple[int, str | None]]:
        (name,) = models(router, tmp_path, "alpha")
        ask = {"model": name, "max_tokens": 5, "messages": HI}
        out = []
        right = {"x-api-key": "s3cret", "anthropic-version": "2023-06-01"}
        for headers in ({}, {"x-api-key": "wrong"}, right):
            response = await client.post("/v1/messages", json=ask, headers=headers)
            kind = anthropic_error(response)["type"] if response.is_error else None
            out.append((response.status_code, kind))
        models_with_x_key = await client.get("/v1/models", headers={"x-api-key": "s3cret"})
        out.append((models_with_x_key.status_code, None))
        return out

    assert run_api(standin_settings, body, key="s3cret") == [
        (401, "authentication_error"),
        (401, "authentication_error"),
        (200, None),
        (200, None),
    ]


def turn(body: dict[str, Any], role: str, block: dict[str, Any]) -> bytes:
    return json.dumps({**body, "messages": [{"role": role, "content": [block]}]}).encode()


def test_hostile_bodies_get_a_4xx_in_anthropics_shape(standin_settings: Settings, tmp_path: Path) -> None:
    async def body(router: Router, client: httpx.AsyncClient) -> tuple[list[int], int]:
        (name,) = models(router, tmp_path, "alpha")
        ok: dict[str, Any] = {"model": name, "max_tokens": 5}
        hostile: list[bytes] = [
            b"\xff\xfe\x00garbage",
            b"[" * 100_000 + b"]" * 100_000,
            json.dumps({**ok, "messages": "hi"}).encode(),
            json.dumps({**ok, "messages": [5]}).encode(),
            json.dumps({**ok, "messages": [{"role": "user", "content": 5}]}).encode(),
            turn(ok, "user", {"type": "document"}),
            turn(ok, "user", {"type": "image", "source": 1}),
            turn(ok, "user", {"type": "image", "source": {"type": "file", "file_id": "../x"}}),
            turn(ok, "user", {"type": "tool_result"}),
            turn(ok, "assistant", {"type": "tool_use"}),
            turn(ok, "assistant", {"type": "tool_use", "id": "t", "name": "f", "input": []}),
            json.dumps({**ok, "messages": HI, "system": [{"type": "image"}]}).encode(),
            json.dumps({**ok, "messages": HI, "max_tokens": -1}).encode(),
            json.dumps({**ok, "messages": HI, "max_tokens": True}).encode(),
            json.dumps({**ok, "messages": HI, "stop_sequences": [1]}).encode(),
            json.dumps({**ok, "messages": HI, "temperature": "hot"}).encode(),
            json.dumps({**ok, "messages": HI, "top_k": 2**40}).encode(),
            json.dumps({**ok, "messages": HI, "tools": [{"name": "f", "input_schema": []}]}).encode(),
            json.dumps({**ok, "messages": HI, "tool_choice": {"type": "tool", "name": "nowhere"}}).encode(),
            json.dumps({**ok, "messages": HI, "tool_choice": {"type": "tool", "name": 5}}).encode(),
            json.dumps({**ok, "messages": HI, "tool_choice": "any"}).encode(),
            json.dumps({**ok, "messages": HI, "stream": "yes"}).encode(),
            b'{"model": NaN}',
        ]
        codes = []
        for raw in hostile:
            for path in ("/v1/messages", "/v1/messages/count_tokens"):
                response = await client.post(path, content=raw)
                anthropic_error(response)
                codes.append(response.status_code)
        return codes, (await client.get("/api/v1/health")).status_code

    codes, health = run_api(standin_settings, body)
    assert all(400 <= c < 500 for c in codes), codes
    assert health == 200


WEATHER = {"name": "weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}
WEATHER_TOOL = {
    "name": "weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def test_a_tool_call_streams_as_a_tool_use_block_and_comes_whole_with_its_input(
    standin_settings: Settings, tmp_path: Path
) -> None:
    async def body(router: Router, client: httpx.AsyncClient) -> tuple[bytes, dict[str, Any], dict[str, Any]]:
        (name,) = models(router, tmp_path, "alpha", reply="Looking.", tool_call=WEATHER)
        ask = {"model": name, "max_tokens": 50, "messages": HI, "tools": [WEATHER_TOOL]}
        async with client.stream("POST", "/v1/messages", json={**ask, "stream": True}) as response:
            raw = await response.aread()
        whole = (await client.post("/v1/messages", json={**ask, "tool_choice": {"type": "any"}})).json()
        # The round trip: the call and its result sent back, as a client does next.
        answer = [
            *HI,
            {"role": "assistant", "content": whole["content"]},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": whole["content"][1]["id"],
                        "content": "Sunny, 21 C",
                    }
                ],
            },
        ]
        after = (await client.post("/v1/messages", json={**ask, "messages": answer})).json()
        return raw, whole, after

    raw, whole, after = run_api(standin_settings, body)
    events = sse_events(raw)
    starts = [data["content_block"] for name, data in events if name == "content_block_start"]
    assert [b["type"] for b in starts] == ["text", "tool_use"]
    assert starts[1] == {"type": "tool_use", "id": "call_standin", "name": "weather", "input": {}}
    fragments = [
        data["delta"]["partial_json"]
        for name, data in events
        if name == "content_block_delta" and data["delta"]["type"] == "input_json_delta"
    ]
    assert len(fragments) > 1 and "".join(fragments) == WEATHER["arguments"]
    assert all(data["index"] == 1 for name, data in events if name == "content_block_delta" and data["index"])
    assert [name for name, _ in events].count("content_block_stop") == 2
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    assert whole["stop_reason"] == "tool_use"
    assert whole["content"] == [
        {"type": "text", "text": "Looking."},
        {
            "type": "tool_use",
            "id": "call_standin",
            "name": "weather",
            "input": {"city": "Paris", "unit": "celsius"},
        },
    ]
    assert after["type"] == "message"  # the tool_use and tool_result blocks went to the engine as OpenAI's


def test_an_engine_crash_mid_stream_ends_with_an_error_event_in_each_dialect(
    standin_settings: Settings, tmp_path: Path
) -> None:
    async def body(router: Router, client: httpx.AsyncClient) -> tuple[list[str], list[str]]:
        names = models(router, tmp_path, "fragile", "brittle", tokens=2000, token_delay_s=0.01)
        ends = []
        requests = [
            ("/v1/messages", {"model": names[0], "max_tokens": 4000, "messages": HI, "stream": True}),
            ("/api/chat", {"model": names[1], "messages": HI}),  # Ollama's: streamed unless told not to
        ]
        for name, (path, request) in zip(names, requests, strict=True):
            lines: list[str] = []
            async with client.stream("POST", path, json=request) as response:
                async for line in response.aiter_lines():
                    if len(lines) == 6:  # a few tokens in
                        await control(router.supervisor.engines[name].base_url, "crash")
                    if line:
                        lines.append(line)
            ends.append(lines)
        return ends[0], ends[1]

    anthropic_lines, ollama_lines = run_api(standin_settings, body)
    # The engine's crash is named once the supervisor has seen the process go (on a loaded machine,
    # after the stream broke): either way the reply is said to be cut short.
    said = re.compile(r"crash|before finishing")
    assert anthropic_lines[-2] == "event: error"
    error = json.loads(anthropic_lines[-1].removeprefix("data: "))
    assert error["type"] == "error" and said.search(error["error"]["message"])
    assert "message_stop" not in "".join(anthropic_lines)
    last = json.loads(ollama_lines[-1])
    assert set(last) == {"error"} and said.search(last["error"])


def test_llama_cpps_sampling_extras_go_on_to_the_engine_and_other_fields_do_not() -> None:
    """What a client puts in the anthropic package's ``extra_body`` for the engine (a logit bias, min_p,
    a seed) reaches the OpenAI body; a field of neither API does not, and a bias of the wrong type is
    refused."""
    extras = {"logit_bias": {"<tool_call>": 100, "2": 100}, "min_p": 0.1, "seed": 7, "repeat_penalty": 1.1}
    ask = {"model": "m", "max_tokens": 5, "messages": HI, "container": "x", **extras}
    chat, _ = chat_body(ask)
    assert {k: chat[k] for k in extras} == extras and "container" not in chat
    with pytest.raises(ApiError) as refused:
        chat_body({**ask, "logit_bias": "<tool_call>"})
    assert refused.value.status == 400 and "'logit_bias'" in refused.value.message


def test_each_streamed_event_is_its_dicts_json_and_the_whole_message_holds_every_piece() -> None:
    message = _Message("m")
    batches = [
        [Reasoning("so"), Reasoning(' "hm"')],
        [Text("Grüße\n"), Text("🍋")],
        [ToolCallStart(0, "call_1", "get"), ToolCallArguments(0, '{"a"'), ToolCallArguments(0, ": 1}")],
    ]
    raw = b"".join(message.feed(batch) for batch in batches) + message.finish(
        Finished(Finish.TOOL_CALLS, None, 3, 5)
    )
    events = sse_events(raw)
    # Formatted, not encoded from a dict: the same bytes the dict would have been.
    assert raw == b"".join(_sse(name, data) for name, data in events)
    deltas = [(data["index"], data["delta"]) for name, data in events if name == "content_block_delta"]
    assert deltas == [
        (0, {"type": "thinking_delta", "thinking": "so"}),
        (0, {"type": "thinking_delta", "thinking": ' "hm"'}),
        (1, {"type": "text_delta", "text": "Grüße\n"}),
        (1, {"type": "text_delta", "text": "🍋"}),
        (2, {"type": "input_json_delta", "partial_json": '{"a"'}),
        (2, {"type": "input_json_delta", "partial_json": ": 1}"}),
    ]
    content = message.whole(Finished(Finish.TOOL_CALLS, None, 3, 5))["content"]
    assert content == [
        {"type": "thinking", "thinking": 'so "hm"', "signature": ""},
        {"type": "text", "text": "Grüße\n🍋"},
        {"type": "tool_use", "id": "call_1", "name": "get", "input": {"a": 1}},
    ]
