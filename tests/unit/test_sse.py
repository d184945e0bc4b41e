"""The SSE parser: the spec's line and field rules, and the same events however the bytes are chunked."""

from __future__ import annotations

import random

import pytest

from app.client.sse import MAX_EVENT_BYTES, EventTooLarge, SSEEvent, SSEParser


def parse(*chunks: bytes) -> list[SSEEvent]:
    parser = SSEParser()
    events = [e for chunk in chunks for e in parser.feed(chunk)]
    return events + parser.close()


STREAM = (
    "\ufeff: a heartbeat comment\n"
    'data: {"choices":[{"delta":{"content":"Grüße, 世界 🍋"}}]}\n\n'
    "event: ping\r\n"
    "id: 7\r\n"
    "data: first line\r\n"
    "data: second line\r\n"
    "\r\n"
    "data:no-space\r\r"
    "retry: 1000\n"
    "data\n"
    "data:  two spaces keep one\n\n"
    ": only a comment, then a blank line\n\n"
    'data: {"error":{"message":"out of memory"}}\n\n'
    "data: [DONE]\n\n"
).encode()

EXPECTED = [
    SSEEvent('{"choices":[{"delta":{"content":"Grüße, 世界 🍋"}}]}'),
    SSEEvent("first line\nsecond line", "ping", "7"),
    SSEEvent("no-space", "message", "7"),
    SSEEvent("\n two spaces keep one", "message", "7"),
    SSEEvent('{"error":{"message":"out of memory"}}', "message", "7"),
    SSEEvent("[DONE]", "message", "7"),
]


def test_whole_stream_in_one_chunk() -> None:
    assert parse(STREAM) == EXPECTED


def test_one_byte_at_a_time() -> None:
    assert parse(*(STREAM[i : i + 1] for i in range(len(STREAM)))) == EXPECTED


@pytest.mark.parametrize("seed", range(300))
def test_fuzzed_chunk_boundaries(seed: int) -> None:
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(STREAM)), rng.randint(1, 40)))
    chunks = [STREAM[a:b] for a, b in zip([0, *cuts], [*cuts, len(STREAM)], strict=True)]
    assert parse(*chunks) == EXPECTED


def test_crlf_split_across_chunks_is_one_line_end() -> None:
    assert parse(b"data: a\r", b"\n", b"\r", b"\ndata: b\r\n\r\n") == [SSEEvent("a"), SSEEvent("b")]


def test_utf8_character_split_across_chunks() -> None:
    raw = "data: 🍋\n\n".encode()
    assert parse(raw[:8], raw[8:]) == [SSEEvent("🍋")]


def test_event_without_a_final_blank_line_is_still_delivered() -> None:
    assert parse(b'data: {"error":"engine died"}') == [SSEEvent('{"error":"engine died"}')]


def test_comments_and_empty_events_yield_nothing() -> None:
    assert parse(b": keep-alive\n\n:\n\nevent: x\n\n") == []


def test_a_line_or_an_event_without_end_is_refused_past_the_cap() -> None:
    parser = SSEParser()
    piece = b"x" * (1 << 20)
    with pytest.raises(EventTooLarge, match="a line went on past 8 MiB"):
        for _ in range(MAX_EVENT_BYTES // len(piece) + 1):
            parser.feed(piece)  # one line that never ends
    parser = SSEParser()
    line = b"data: " + piece + b"\n"
    with pytest.raises(EventTooLarge, match="an event went on past 8 MiB"):
        for _ in range(MAX_EVENT_BYTES // len(piece) + 1):
            parser.feed(line)  # data lines, and no blank line to end the event
    # Just under the cap, an event is an event.
    parser = SSEParser()
    big = "y" * (MAX_EVENT_BYTES - 1)
    assert parser.feed(f"data: {big}\n\n".encode()) == [SSEEvent(big)]


def test_chunks_cut_at_events_ends_read_as_line_by_line() -> None:
    # A paced stream comes in whole events: one-line data events are read in one pass, anything else
    # (another field, two data lines, a comment, CRs) line by line, to the same events either way.
    events = [
        b"id: 3\ndata: a\n\n",
        b'data: {"x": 1}\n\n',
        b"data: \xc3\xa9\n\n",
        b"data: b\ndata: c\n\n",
        b"data: d\n\nevent: y\ndata: z\n\n",
        b": beat\n\ndata: e\n\n",
        b"data: f\r\n\r\n",
        b"data:\n\n",
        b"data: [DONE]\n\n",
    ]
    expected = parse(*(byte for event in events for byte in (event[i : i + 1] for i in range(len(event)))))
    assert [e.data for e in expected] == ["a", '{"x": 1}', "é", "b\nc", "d", "z", "e", "f", "", "[DONE]"]
    assert expected[5] == SSEEvent("z", "y", "3")
    groups = [events[:1], events[1:3], events[3:4], events[4:5], events[5:8], events[8:]]
    assert parse(*(b"".join(group) for group in groups)) == expected
    assert parse(b"".join(events)) == expected


@pytest.mark.parametrize(
    "chunks",
    [
        [STREAM],
        [b'data: {"a": 1}\n\ndata: {"b": 2}\n\n', b"data: [DONE]\n\n"],
        [b"data: a\n\n", b"data: b\n\n\ndata: c\n\n", b"data: d\n\nretry: 5\n\n"],
        [b"data: a\n\n", b"data: b\n\ndata: c\ndata: d\n\n", b"data: e\n\n: beat\n\ndata: f\n\n"],
        [b"data: a\n\n", b"data: \n\ndata: data: x\n\n", b"data: \xff\n\n", b"data:\n\ndata: b\n\n"],
    ],
)
def test_data_gives_the_events_data(chunks: list[bytes]) -> None:
    # ``data`` is ``feed`` for a reader of the data alone: the paced chunks of whole one-line events,
    # split without a line pass, and anything else, give the same events' data.
    by_feed, by_data = SSEParser(), SSEParser()
    for chunk in chunks:
        expected = [event.data for event in by_feed.feed(chunk)]
        assert [data.decode("utf-8", errors="replace") for data in by_data.data(chunk)] == expected
