"""Request adaptation per engine: lemon-mlx's rules, mlx-lm's usage request, llama.cpp untouched but for
a tool_choice naming one function."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.client.adapters import LemonMlxAdapter, LlamaCppAdapter, Route, adapter_for, sse_error
from app.client.events import ChatDelta
from app.core.errors import UnsupportedRequestError

MLX = LemonMlxAdapter()


def chat(**kw: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw}


def test_max_completion_tokens_becomes_max_tokens_and_is_removed() -> None:
    out = MLX.adapt_body(route=Route.CHAT, body=chat(max_completion_tokens=64))
    assert out["max_tokens"] == 64 and "max_completion_tokens" not in out
    both = MLX.adapt_body(route=Route.CHAT, body=chat(max_completion_tokens=64, max_tokens=10))
    assert both["max_tokens"] == 10 and "max_completion_tokens" not in both
    nulled = MLX.adapt_body(route=Route.CHAT, body=chat(max_completion_tokens=None))
    assert "max_tokens" not in nulled and "max_completion_tokens" not in nulled


def test_string_stop_becomes_a_list() -> None:
    assert MLX.adapt_body(route=Route.CHAT, body=chat(stop="\n\n"))["stop"] == ["\n\n"]
    assert MLX.adapt_body(route=Route.CHAT, body=chat(stop=["a", "b"]))["stop"] == ["a", "b"]
    assert "stop" not in MLX.adapt_body(route=Route.CHAT, body=chat(stop=None))
    assert MLX.adapt_body(route=Route.COMPLETIONS, body={"prompt": "x", "stop": "END"})["stop"] == ["END"]


def test_content_parts_become_a_string() -> None:
    body = chat(
        messages=[
            {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]},
            {"role": "assistant", "content": None, "tool_calls": []},
        ]
    )
    out = MLX.adapt_body(route=Route.CHAT, body=body)
    assert [m["content"] for m in out["messages"]] == ["Be brief.", "one\ntwo", ""]
    assert out["messages"][2]["tool_calls"] == []
    assert body["messages"][0]["content"] == [{"type": "text", "text": "Be brief."}]  # caller's copy intact


@pytest.mark.parametrize("kind", ["image_url", "input_image"])
def test_images_are_a_clear_error(kind: str) -> None:
    body = chat(messages=[{"role": "user", "content": [{"type": "text", "text": "what?"}, {"type": kind}]}])
    with pytest.raises(UnsupportedRequestError, match="Message 1 holds an image") as err:
        MLX.adapt_body(route=Route.CHAT, body=body)
    assert "text only" in str(err.value)


def test_streamed_completions_responses_and_embeddings_are_unsupported() -> None:
    with pytest.raises(UnsupportedRequestError, match="cannot stream /v1/completions"):
        MLX.adapt_body(route=Route.COMPLETIONS, body={"prompt": "x", "stream": True})
    assert MLX.adapt_body(route=Route.COMPLETIONS, body={"prompt": ["x"], "stream": False})["prompt"] == "x"
    with pytest.raises(UnsupportedRequestError, match="one prompt string"):
        MLX.adapt_body(route=Route.COMPLETIONS, body={"prompt": ["x", "y"]})
    with pytest.raises(UnsupportedRequestError, match="lemon-mlx has no /v1/responses endpoint"):
        MLX.check(Route.RESPONSES, stream=False)
    with pytest.raises(UnsupportedRequestError, match="no /v1/embeddings endpoint"):
        MLX.adapt_body(route=Route.EMBEDDINGS, body={"input": "x"})


def test_a_stop_the_token_count_shows_was_the_limit_is_corrected_to_length() -> None:
    # lemon-mlx-engine b1050-stable says "stop" when max_tokens cut a reply holding a token with no
    # text of its own; its token count shows the limit was reached.
    assert MLX.finish_reason("stop", chat(max_tokens=8), completion_tokens=8) == "length"
    assert MLX.finish_reason("stop", chat(max_tokens=8), completion_tokens=7) == "stop"
    assert MLX.finish_reason("stop", chat(), completion_tokens=2048) == "stop"  # no limit known
    assert MLX.finish_reason("tool_calls", chat(max_tokens=8), completion_tokens=8) == "tool_calls"
    assert MLX.finish_reason(None, chat(max_tokens=8), completion_tokens=8) is None
    assert MLX.finish_reason("stop", chat(max_tokens=True), completion_tokens=8) == "stop"
    assert LlamaCppAdapter().finish_reason("stop", chat(max_tokens=8), completion_tokens=8) == "stop"


def test_llama_cpp_passes_requests_through() -> None:
    body = chat(max_completion_tokens=5, stop="x", stream=True)
    assert LlamaCppAdapter().adapt_body(dict(body)) == body
    LlamaCppAdapter().check(Route.COMPLETIONS, stream=True)
    LlamaCppAdapter().check(Route.EMBEDDINGS, stream=False)
    assert LlamaCppAdapter().splitter() is None


def test_llama_cpp_gets_a_choice_of_one_named_function_as_required_with_that_tool_alone() -> None:
    """llama-server reads tool_choice as a string only: an object was taken for "auto" (its log: "Wrong
    type supplied for parameter 'tool_choice', using default value"), and no grammar held the reply."""
    tools = [{"type": "function", "function": {"name": n, "parameters": {}}} for n in ("a", "b")]
    named = chat(tools=tools, tool_choice={"type": "function", "function": {"name": "b"}})
    out = LlamaCppAdapter().adapt_body(named)
    assert out["tool_choice"] == "required" and out["tools"] == tools[1:]
    for choice in ("auto", "required", "none"):
        assert LlamaCppAdapter().adapt_body(chat(tools=tools, tool_choice=choice))["tools"] == tools


def test_adapter_choice() -> None:
    assert type(adapter_for("lemon-mlx")) is LemonMlxAdapter
    assert type(adapter_for("llamacpp")) is LlamaCppAdapter


def test_lemon_mlx_stream_splits_think_tags_into_reasoning() -> None:
    splitter = MLX.splitter()
    assert splitter is not None
    out: list[ChatDelta] = []
    for piece in ["<thi", "nk>I should gr", "eet.</th", "ink>\nHel", "lo <", "b>"]:
        out.extend(splitter.feed(ChatDelta(content=piece)))
    out.extend(splitter.flush())
    assert "".join(d.reasoning for d in out) == "I should greet."
    assert "".join(d.content for d in out) == "\nHello <b>"
    assert all(d.content or d.reasoning for d in out)
    # reasoning_content from the engine (mlx-lm may send it) passes through.
    assert list(MLX.splitter().feed(ChatDelta(reasoning="hmm"))) == [ChatDelta("", "hmm")]  # type: ignore[union-attr]


def test_sse_error_is_an_error_event_then_the_end() -> None:
    try:
        MLX.check(Route.COMPLETIONS, stream=True)
    except UnsupportedRequestError as err:
        events = sse_error(err).decode().split("\n\n")
    assert events[2:] == [""]
    assert events[1] == "data: [DONE]"
    payload = json.loads(events[0].removeprefix("data: "))
    assert "cannot stream /v1/completions" in payload["error"]["message"]
    assert payload["error"]["code"] == "unsupported"
