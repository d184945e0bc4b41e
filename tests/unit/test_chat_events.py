"""The internal reply model the Anthropic and Ollama dialects share: an engine's OpenAI chat stream read
into events, with stop sequences found here across chunk boundaries."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.supervisor.api.chat_events import (
    ChatEvent,
    ChatReader,
    Finish,
    Finished,
    Reasoning,
    Text,
    ToolCallArguments,
    ToolCallStart,
)
from app.supervisor.api.errors import ApiError


def event(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> bytes:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return f"data: {json.dumps({'choices': choices, **extra})}\n\n".encode()


USAGE = event(None, usage={"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15})
DONE = b"data: [DONE]\n\n"


def read(reader: ChatReader, chunks: list[bytes]) -> list[ChatEvent]:
    out: list[ChatEvent] = []
    for chunk in chunks:
        out += reader.feed(chunk)
        if reader.finished is not None:
            return out
    return out + reader.end()


def text_of(events: list[ChatEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, Text))


def test_text_and_reasoning_come_through_and_the_end_carries_the_engines_usage() -> None:
    chunks = [
        event({"role": "assistant", "content": None}),
        event({"reasoning_content": "Think."}),
        event({"content": "Hel"}),
        event({"content": "lo"}),
        event({}, "stop"),
        USAGE,
        DONE,
    ]
    reader = ChatReader()
    events = read(reader, chunks)
    assert events == [Reasoning("Think."), Text("Hel"), Text("lo")]
    assert reader.finished == Finished(Finish.STOP, None, 11, 4)


def test_the_deltas_of_one_read_come_as_one_text_and_one_reasoning_in_their_order() -> None:
    # A paced read holds a frame of tokens: their text is one event (a dialect writes one for it), the
    # tokens still counted one by one when the engine's usage never comes.
    call = {"index": 0, "id": "call_1", "function": {"name": "look", "arguments": "{}"}}
    frame = [
        event({"reasoning_content": "Th"}),
        event({"reasoning_content": "ink."}),
        event({"content": "Hel"}),
        event({"content": "lo"}),
        event({"reasoning_content": "Again."}),
        event({"content": " you"}),
        event({"tool_calls": [call]}),
        event({"content": "!"}),
    ]
    reader = ChatReader()
    assert reader.feed(b"".join(frame)) == [
        Reasoning("Think."),
        Text("Hello"),
        Reasoning("Again."),
        Text(" you"),
        ToolCallStart(0, "call_1", "look"),
        ToolCallArguments(0, "{}"),
        Text("!"),
    ]
    assert reader.feed(b"".join([event({"content": "a"}), event({"content": "b"})])) == [Text("ab")]
    reader.feed(event({}, "stop") + DONE)
    assert reader.finished == Finished(Finish.STOP, None, 0, 10)


def test_a_stop_sequence_split_across_chunks_ends_the_reply_before_it() -> None:
    whole = b"".join([event({"content": "one, two, th"}), event({"content": "ree, four"}), event({}, "stop")])
    for size in (1, 3, 7, len(whole)):  # the same bytes split anywhere
        reader = ChatReader(stop=["three", "nine"])
        events = read(reader, [whole[i : i + size] for i in range(0, len(whole), size)])
        assert text_of(events) == "one, two, "
        assert reader.finished is not None
        assert (reader.finished.reason, reader.finished.stop_sequence) == (Finish.STOP_SEQUENCE, "three")
        assert reader.finished.output_tokens == 2  # the deltas counted: the engine's usage never came


def test_text_held_back_as_a_possible_stop_is_given_when_it_is_not_one() -> None:
    reader = ChatReader(stop=["END"])
    first = reader.feed(event({"content": "the EN"}))
    assert text_of(first) == "the "  # "EN" could begin "END"
    rest = read(reader, [event({"content": "vy of all"}), event({}, "stop"), USAGE, DONE])
    assert text_of(rest) == "ENvy of all"
    assert reader.finished == Finished(Finish.STOP, None, 11, 4)


def test_a_partial_stop_at_the_end_is_text_after_all() -> None:
    reader = ChatReader(stop=["STOP"])
    events = read(reader, [event({"content": "almost ST"}), event({}, "length"), USAGE, DONE])
    assert text_of(events) == "almost ST"
    assert reader.finished == Finished(Finish.LENGTH, None, 11, 4)


def test_tool_calls_stream_as_a_start_and_argument_fragments() -> None:
    call = {"index": 0, "id": "call_7", "type": "function", "function": {"name": "weather", "arguments": ""}}
    chunks = [
        event({"content": "Let me look."}),
        event({"tool_calls": [call]}),
        event({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
        event({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
        event({}, "tool_calls"),
        DONE,
    ]
    reader = ChatReader()
    events = read(reader, chunks)
    assert events == [
        Text("Let me look."),
        ToolCallStart(0, "call_7", "weather"),
        ToolCallArguments(0, '{"city": '),
        ToolCallArguments(0, '"Paris"}'),
    ]
    assert reader.finished is not None and reader.finished.reason is Finish.TOOL_CALLS


@pytest.mark.parametrize(
    ("payload", "status"),
    [
        ({"error": {"message": "images cannot go to this engine", "code": "unsupported"}}, 400),
        ({"error": {"message": "the engine fell over"}}, 502),
        ({"error": "plain words"}, 502),
    ],
)
def test_an_error_event_from_the_engine_is_an_api_error(payload: dict[str, Any], status: int) -> None:
    with pytest.raises(ApiError) as raised:
        ChatReader().feed(f"data: {json.dumps(payload)}\n\n".encode())
    assert raised.value.status == status


def test_a_stream_that_never_finishes_has_no_end_and_garbage_is_a_502() -> None:
    reader = ChatReader()
    read(reader, [event({"content": "cut"})])
    assert reader.finished is None
    with pytest.raises(ApiError) as raised:
        ChatReader().feed(b"data: {not json\n\n")
    assert raised.value.status == 502


def test_an_events_json_is_read_whatever_whitespace_is_around_it_and_nothing_may_follow_it() -> None:
    payload = json.dumps({"choices": [{"index": 0, "delta": {"content": "hi"}}]})
    for data in (payload, f" {payload}", f"{payload} ", f"\t{payload}\t"):
        assert ChatReader().feed(f"data: {data}\n\n".encode()) == [Text("hi")]
    with pytest.raises(ApiError) as raised:
        ChatReader().feed(f"data: {payload} {payload}\n\n".encode())
    assert raised.value.status == 502


@pytest.mark.parametrize(
    ("data", "text"),
    [
        ('{"choices":[{"index":0,"delta":{"content":"\\ud83c"}}]}', "\ud83c"),  # a lone surrogate's escape
        ('{"choices":[{"index":0,"delta":{"content":"x"}}],"timings":{"predicted_per_second":NaN}}', "x"),
    ],
    ids=["lone surrogate", "NaN"],
)
def test_json_that_pythons_reader_takes_is_read_though_the_fast_one_refuses_it(data: str, text: str) -> None:
    assert ChatReader().feed(f"data: {data}\n\n".encode()) == [Text(text)]


def test_a_reply_cut_at_a_stop_sequence_takes_its_figures_from_per_token_timings() -> None:
    timings = {"cache_n": 3, "prompt_n": 8, "predicted_n": 2}
    reader = ChatReader(stop=["three"])
    read(
        reader,
        [event({"content": "one two "}, timings=timings), event({"content": "three"}, timings=timings)],
    )
    assert reader.finished == Finished(Finish.STOP_SEQUENCE, "three", 11, 2)
