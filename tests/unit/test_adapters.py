"""Request adaptation per engine: lemon-mlx's rules, mlx-lm's usage request, llama.cpp untouched."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.client.adapters import (
    LemonMlxAdapter,
    MlxLmAdapter,
    RequestAdapter,
    Route,
    adapter_for,
    sse_error,
)
from app.core.errors import UnsupportedRequestError

MLX = LemonMlxAdapter()


def chat(**kw: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw}


def test_max_completion_tokens_becomes_max_tokens_and_is_removed() -> None:
    out = MLX.adapt(Route.CHAT, chat(max_completion_tokens=64))
    assert out["max_tokens"] == 64 and "max_completion_tokens" not in out
    both = MLX.adapt(Route.CHAT, chat(max_completion_tokens=64, max_tokens=10))
    assert both["max_tokens"] == 10 and "max_completion_tokens" not in both
    nulled = MLX.adapt(Route.CHAT, chat(max_completion_tokens=None))
    assert "max_tokens" not in nulled and "max_completion_tokens" not in nulled


def test_string_stop_becomes_a_list() -> None:
    assert MLX.adapt(Route.CHAT, chat(stop="\n\n"))["stop"] == ["\n\n"]
    assert MLX.adapt(Route.CHAT, chat(stop=["a", "b"]))["stop"] == ["a", "b"]
    assert "stop" not in MLX.adapt(Route.CHAT, chat(stop=None))
    assert MLX.adapt(Route.COMPLETIONS, {"prompt": "x", "stop": "END"})["stop"] == ["END"]


def test_content_parts_become_a_string() -> None:
    body = chat(
        messages=[
            {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]},
            {"role": "assistant", "content": None, "tool_calls": []},
        ]
    )
    out = MLX.adapt(Route.CHAT, body)
    assert [m["content"] for m in out["messages"]] == ["Be brief.", "one\ntwo", ""]
    assert out["messages"][2]["tool_calls"] == []
    assert body["messages"][0]["content"] == [{"type": "text", "text": "Be brief."}]  # caller's copy intact


@pytest.mark.parametrize("kind", ["image_url", "input_image"])
def test_images_are_a_clear_error(kind: str) -> None:
    body = chat(messages=[{"role": "user", "content": [{"type": "text", "text": "what?"}, {"type": kind}]}])
    with pytest.raises(UnsupportedRequestError, match="Message 1 holds an image") as err:
        MLX.adapt(Route.CHAT, body)
    assert "text only" in str(err.value)


def test_streamed_completions_responses_and_embeddings_are_unsupported() -> None:
    with pytest.raises(UnsupportedRequestError, match="cannot stream /v1/completions"):
        MLX.adapt(Route.COMPLETIONS, {"prompt": "x", "stream": True})
    assert MLX.adapt(Route.COMPLETIONS, {"prompt": ["x"], "stream": False})["prompt"] == "x"
    with pytest.raises(UnsupportedRequestError, match="one prompt string"):
        MLX.adapt(Route.COMPLETIONS, {"prompt": ["x", "y"]})
    with pytest.raises(UnsupportedRequestError, match="lemon-mlx has no /v1/responses endpoint"):
        MLX.check(Route.RESPONSES, stream=False)
    with pytest.raises(UnsupportedRequestError, match="no /v1/embeddings endpoint"):
        MLX.adapt(Route.EMBEDDINGS, {"input": "x"})


def test_mlx_lm_also_asks_for_usage_when_streaming() -> None:
    out = MlxLmAdapter().adapt(Route.CHAT, chat(stream=True, max_completion_tokens=5))
    assert out["stream_options"] == {"include_usage": True}
    assert out["max_tokens"] == 5
    assert "stream_options" not in MlxLmAdapter().adapt(Route.CHAT, chat())


def test_llama_cpp_passes_requests_through() -> None:
    body = chat(max_completion_tokens=5, stop="x", stream=True)
    assert RequestAdapter().adapt(Route.CHAT, body) == body
    RequestAdapter().check(Route.COMPLETIONS, stream=True)
    RequestAdapter().check(Route.EMBEDDINGS, stream=False)


def test_adapter_choice() -> None:
    assert type(adapter_for("lemon-mlx", "rocm")) is LemonMlxAdapter
    assert type(adapter_for("lemon-mlx", "mlx-lm")) is MlxLmAdapter
    assert type(adapter_for("llamacpp", "vulkan")) is RequestAdapter


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
