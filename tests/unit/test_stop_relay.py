"""Stop strings applied to answers the local API passes on from an engine that ignores them."""

from __future__ import annotations

import json
from typing import Any

from app.client.sse import SSEParser
from app.client.stop_relay import StreamStops, cut_whole


def chunk(content: str | None, finish: str | None = None) -> bytes:
    delta = {} if content is None else {"content": content}
    payload = {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return f"data: {json.dumps(payload)}\n\n".encode()


def events(raw: bytes) -> list[Any]:
    parser = SSEParser()
    return [e.data if e.data == "[DONE]" else json.loads(e.data) for e in parser.feed(raw) + parser.close()]


def contents(raw: bytes) -> str:
    return "".join(e["choices"][0]["delta"].get("content", "") for e in events(raw) if e != "[DONE]")


def test_a_stream_is_cut_before_its_stop_string_and_ended_there() -> None:
    stops = StreamStops((" lemon",))
    sent = chunk("Sure, a") + chunk(" lem")[:20]  # an event cut across two reads
    out = stops.feed(sent) + stops.feed(chunk(" lem")[20:] + chunk("on!"))
    assert stops.ended
    assert contents(out) == "Sure, a"
    assert events(out)[-2]["choices"][0]["finish_reason"] == "stop" and events(out)[-1] == "[DONE]"
    assert stops.feed(chunk("more")) == b""  # nothing after the end


def test_a_stream_without_its_stop_string_keeps_every_word() -> None:
    stops = StreamStops(("END",))
    out = stops.feed(chunk("one E") + chunk("Z") + chunk(" E")) + stops.feed(
        chunk(None, "stop") + b"data: [DONE]\n\n"
    )
    assert not stops.ended and stops.close() == b""
    assert contents(out) == "one EZ E"  # the held "E" goes out with the finish chunk
    assert events(out)[-1] == "[DONE]"


def test_a_whole_answer_is_cut_chat_or_text() -> None:
    chat = {
        "choices": [
            {"message": {"role": "assistant", "content": "Sure, é lemon!"}, "finish_reason": "length"}
        ]
    }
    cut = json.loads(cut_whole(json.dumps(chat).encode(), (" lemon",)))
    assert cut["choices"][0] == {
        "message": {"role": "assistant", "content": "Sure, é"},
        "finish_reason": "stop",
    }
    text = {"choices": [{"text": "a b c", "finish_reason": "stop"}]}
    assert json.loads(cut_whole(json.dumps(text).encode(), (" b",)))["choices"][0]["text"] == "a"
    untouched = json.dumps(text).encode()
    assert cut_whole(untouched, ("zz",)) is untouched and cut_whole(b"not json", ("a",)) == b"not json"
