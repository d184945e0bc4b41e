"""A tool call round trip with the official `anthropic` client against `lemon-desk serve` on the real
llama-server and SmolLM2 (with the tool-call template: tests/support/tool_calls.py). Round 1: the model
calls ``get_weather``, whole and streamed (a ``tool_use`` block, its input in ``input_json_delta``
pieces, ``stop_reason: "tool_use"``). Round 2: the call and its ``tool_result`` sent back, and the
model answers in text.

Forcing the tiny model needs llama.cpp's ``logit_bias`` (see tool_calls.py), which Anthropic's API has
no field for: the client sends it in ``extra_body``, and the Anthropic dialect passes llama.cpp's
sampling extras on to the engine (``app.supervisor.api.anthropic.ENGINE_SAMPLING``). Round 2 goes
without the bias and without ``tool_choice``, as a client's next turn does."""

from __future__ import annotations

import anthropic
import pytest

from tests.integration.test_api_openai_tools import MODEL, served  # noqa: F401
from tests.support.serve import Serving
from tests.support.tool_calls import ARGUMENTS, QUESTION, RESULT, WEATHER, forced_call

pytestmark = pytest.mark.integration

TOOL = {
    "name": WEATHER["function"]["name"],
    "description": WEATHER["function"]["description"],
    "input_schema": WEATHER["function"]["parameters"],
}


def test_a_tool_use_whole_and_streamed_then_a_text_answer_to_its_result(
    served: Serving,  # noqa: F811
) -> None:
    bias = {"logit_bias": forced_call()["logit_bias"], "temperature": 0}
    ask = {"model": MODEL, "max_tokens": 40, "messages": QUESTION, "tools": [TOOL]}
    with anthropic.Anthropic(base_url=served.url, api_key="unused", max_retries=0, timeout=300) as api:
        whole = api.messages.create(**ask, tool_choice={"type": "any"}, extra_body=bias)  # type: ignore[arg-type]
        with api.messages.stream(**ask, tool_choice={"type": "any"}, extra_body=bias) as stream:  # type: ignore[arg-type]
            events = list(stream)
            streamed = stream.get_final_message()

        assert whole.stop_reason == "tool_use"
        (call,) = [b for b in whole.content if b.type == "tool_use"]
        assert call.name == "get_weather" and call.id and call.input == ARGUMENTS

        starts = [e.content_block for e in events if e.type == "content_block_start"]
        assert [b.type for b in starts][-1] == "tool_use"
        pieces = [
            e.delta.partial_json
            for e in events
            if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
        ]
        assert pieces and streamed.stop_reason == "tool_use"
        (streamed_call,) = [b for b in streamed.content if b.type == "tool_use"]
        assert streamed_call.input == ARGUMENTS and streamed_call.id == starts[-1].id  # type: ignore[union-attr]

        after = api.messages.create(
            model=MODEL,
            max_tokens=30,
            tools=[TOOL],  # type: ignore[list-item]
            messages=[
                *QUESTION,  # type: ignore[list-item]
                {"role": "assistant", "content": streamed.content},  # type: ignore[typeddict-item]
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": streamed_call.id,
                            "content": [{"type": "text", "text": RESULT}],
                        }
                    ],
                },
            ],
            extra_body={"temperature": 0},
        )
    assert after.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in after.content] == ["text"] and after.content[0].text.strip()  # type: ignore[union-attr]
