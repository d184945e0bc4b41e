"""The relay's rewrites of an engine's answer: lemon-mlx's ``<think>`` taken out of ``content`` (into
``reasoning_content``, or dropped), llama-server's ``reasoning_content`` dropped, and lemon-mlx's "stop"
for a reply its ``max_tokens`` cut corrected from the answer's usage."""

from __future__ import annotations

import json
from typing import Any

from app.client.adapters import LemonMlxAdapter, LlamaCppAdapter
from app.client.reasoning_relay import StreamReasoning, whole_reasoning
from app.client.stop_relay import StreamFinish, whole_finish
from app.core.reasoning import ReasoningFormat

SEPARATE, INLINE, HIDDEN = ReasoningFormat.SEPARATE, ReasoningFormat.INLINE, ReasoningFormat.HIDDEN


def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
    payload = {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(payload)}\n\n".encode()


def lemon_mlx_stream() -> bytes:
    pieces = ["<th", "ink>I should ", "greet.</thi", "nk>Hel", "lo"]
    return (
        b"".join(
            [
                event({"role": "assistant", "content": ""}),
                *(event({"content": p}) for p in pieces),
                event({}, "stop"),
            ]
        )
        + b"data: [DONE]\n\n"
    )


def relayed(raw: bytes, placer: StreamReasoning, size: int) -> list[dict[str, Any] | str]:
    """``raw`` fed in chunks of ``size`` bytes; the events passed on."""
    out = b"".join(placer.feed(raw[at : at + size]) for at in range(0, len(raw), size)) + placer.close()
    events = [e.removeprefix("data: ") for e in out.decode().split("\n\n") if e]
    return [e if e == "[DONE]" else json.loads(e) for e in events]


def joined(events: list[dict[str, Any] | str], field: str) -> str:
    return "".join(
        e["choices"][0]["delta"].get(field) or "" for e in events if isinstance(e, dict) and e["choices"]
    )


def test_lemon_mlx_thinking_is_split_out_across_any_chunking_or_dropped() -> None:
    raw = lemon_mlx_stream()
    for size in (1, 7, len(raw)):
        kept = relayed(raw, StreamReasoning(SEPARATE, split=True), size)
        assert joined(kept, "content") == "Hello" and joined(kept, "reasoning_content") == "I should greet."
        assert kept[-1] == "[DONE]" and kept[-2]["choices"][0]["finish_reason"] == "stop"  # type: ignore[index]
        dropped = relayed(raw, StreamReasoning(HIDDEN, split=True), size)
        assert joined(dropped, "content") == "Hello" and joined(dropped, "reasoning_content") == ""
        # An event that held only thinking is not passed on empty.
        assert len(dropped) < len(kept)


def test_llama_servers_reasoning_content_is_dropped_when_hidden() -> None:
    raw = event({"reasoning_content": "hmm"}) + event({"content": "Hi"}) + event({}, "stop")
    events = relayed(raw, StreamReasoning(HIDDEN, split=False), 5)
    assert joined(events, "content") == "Hi" and joined(events, "reasoning_content") == ""
    assert len(events) == 2


def test_a_whole_answer_is_placed_too() -> None:
    answer = json.dumps({"choices": [{"message": {"role": "assistant", "content": "<think>so</think>Yes"}}]})
    message = json.loads(whole_reasoning(answer.encode(), SEPARATE, split=True))["choices"][0]["message"]
    assert (message["content"], message["reasoning_content"]) == ("Yes", "so")
    message = json.loads(whole_reasoning(answer.encode(), HIDDEN, split=True))["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "Yes"}
    assert whole_reasoning(b"not json", SEPARATE, split=True) == b"not json"


def test_each_engine_is_asked_for_what_it_can_do_itself() -> None:
    body: dict[str, Any] = {}
    assert LlamaCppAdapter().reasoning(body, INLINE) is False and body == {"reasoning_format": "none"}
    assert LlamaCppAdapter().reasoning({}, SEPARATE) is False  # its default
    assert LlamaCppAdapter().reasoning({}, HIDDEN) is True
    assert LemonMlxAdapter().reasoning({}, INLINE) is False  # its own way
    assert (
        LemonMlxAdapter().reasoning({}, SEPARATE) is True and LemonMlxAdapter().reasoning({}, HIDDEN) is True
    )


def test_lemon_mlxs_stop_at_the_limit_becomes_length_in_a_whole_answer() -> None:
    adapter, body = LemonMlxAdapter(), {"max_tokens": 8}

    def answer(finish: str, tokens: int) -> bytes:
        payload = {
            "choices": [{"message": {"content": "x"}, "finish_reason": finish}],
            "usage": {"completion_tokens": tokens},
        }
        return json.dumps(payload).encode()

    def finish_of(raw: bytes) -> str:
        fixed = whole_finish(raw, lambda said, n: adapter.finish_reason(said, body, n))
        return str(json.loads(fixed)["choices"][0]["finish_reason"])

    assert finish_of(answer("stop", 8)) == "length"
    assert finish_of(answer("stop", 5)) == "stop"
    assert whole_finish(answer("stop", 5), lambda said, n: said) == answer("stop", 5)  # unchanged: as sent


def test_a_streams_stop_is_held_until_released_with_the_finish_the_figures_show() -> None:
    finisher = StreamFinish()
    raw = event({"content": "Hi"}) + event({}, "stop") + b"data: [DONE]\n\n"
    passed = b"".join(finisher.feed(raw[at : at + 9]) for at in range(0, len(raw), 9)) + finisher.close()
    assert passed == event({"content": "Hi"}) and finisher.holding
    end = finisher.release("length").decode().split("\n\n")
    assert json.loads(end[0].removeprefix("data: "))["choices"][0]["finish_reason"] == "length"
    assert end[1] == "data: [DONE]" and not finisher.holding

    other = StreamFinish()
    ended = event({}, "tool_calls") + b"data: [DONE]\n\n"
    assert other.feed(ended) == ended and not other.holding  # only a "stop" can be wrong
