"""A real tool call from the real llama-server on SmolLM2-135M (docs/tool-calls.md tells how it was found).

The model's engine runs with ``TEMPLATE_ARGS`` (a ChatML template that writes calls as
``<tool_call>{...}</tool_call>``, which llama.cpp's tool parser learns from it). A request built by
``forced_call`` then gets a real ``tool_calls`` reply, streamed or whole: ``tool_choice: "required"`` makes
llama-server build a grammar that allows free text before a call; ``logit_bias`` on the tokens of
``<tool_call>`` makes the model start the call at once, and on its end-of-turn token makes it stop after
one call (the grammar allows a second); ``WEATHER``'s arguments schema has one possible value, so the
grammar decides the arguments whole. Bounded by ``max_tokens``, not time (about 20 tokens are needed).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

TEMPLATE = Path(__file__).parent / "templates" / "chatml-tools.jinja"
TEMPLATE_ARGS = f"--chat-template-file {shlex.quote(str(TEMPLATE))}"
END_OF_TURN = 2  # SmolLM2's <|im_end|> (llama-server's /tokenize with "parse_special": true)
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris"]}},
            "required": ["city"],
        },
    },
}
ARGUMENTS = {"city": "Paris"}  # the one call WEATHER's schema allows
RESULT = "Sunny, 20 degrees Celsius."


def forced_call(**extra: Any) -> dict[str, Any]:
    """The fields of a chat request that SmolLM2 answers with one call of ``WEATHER``."""
    # llama-server takes a logit_bias key that is not a token id as text, and biases each of its tokens.
    bias = {"<tool_call>": 100, str(END_OF_TURN): 100}
    return {
        "tools": [WEATHER],
        "tool_choice": "required",
        "logit_bias": bias,
        "temperature": 0,
        "max_tokens": 40,
        **extra,
    }


def round_trip(call_id: str, arguments: str) -> list[dict[str, Any]]:
    """``QUESTION``, the model's call and the tool's result: the messages of the turn after the call."""
    call = {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    return [
        *QUESTION,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": RESULT},
    ]
