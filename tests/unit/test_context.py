"""What a chat takes of a model's context (``app.core.context``), the run card's resume line, and the
engine's refusal of a prompt too long for its context read as a ContextError (llama-server's own answer,
served over loopback)."""

from __future__ import annotations

import asyncio
import json

import pytest

from app.client.chat import ChatClient
from app.core.context import (
    ContextCount,
    CountSource,
    Overflow,
    droppable,
    estimate_tokens,
    larger_context,
    reply_share,
    without_oldest,
)
from app.core.errors import ContextError
from app.core.runcard import RunCard
from tests.unit.test_chat_client import collect, engine

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "one"},
    {"role": "assistant", "content": "two"},
    {"role": "user", "content": "three"},
]


def test_a_count_fits_only_with_room_for_the_reply_and_says_how_it_was_counted() -> None:
    fits = ContextCount(400, 512, 100, CountSource.TOKENIZER)
    assert fits.fits and fits.problem() == "" and fits.describe() == "400 of 512 tokens (+100 for the reply)"
    over = ContextCount(450, 512, 100, CountSource.ESTIMATE, larger=1024, leave_out=2)
    assert not over.fits and over.describe().startswith("about 450 of 512")
    assert over.problem() == (
        "This chat needs 450 tokens and 100 kept for the reply, 38 more than the model's context of 512 "
        "tokens. Nothing was sent."
    )
    assert over.ways_out() == [Overflow.RELOAD, Overflow.SUMMARY, Overflow.LEAVE_OUT]
    alone = ContextCount(600, 512, 0, CountSource.TOKENIZER)
    assert not alone.fits and alone.ways_out() == [], "a last message too long alone: no summary helps"
    assert not ContextCount(512, 512, 0, CountSource.TOKENIZER).fits, "the engine needs a token to reply"


def test_leaving_out_keeps_the_system_prompt_and_the_last_message() -> None:
    assert without_oldest(CHAT, 2) == [CHAT[0], CHAT[3]]
    assert droppable(CHAT) == 2 and droppable(CHAT[:2]) == 0
    assert estimate_tokens(CHAT) == 5 + 4 * 4  # 20 characters, then each message's markers
    assert (
        reply_share({"max_tokens": 64}) == 64
        and reply_share({}) == 0
        and reply_share({"max_tokens": True}) == 0
    )


@pytest.mark.parametrize(
    ("current", "needed", "largest", "offered"),
    [
        (512, 600, 100_000, 1024),  # doubled
        (512, 1500, 100_000, 2048),  # doubled twice
        (512, 1500, 1800, 1536),  # doubling is too much: what is needed, in steps of 256
        (512, 1500, 1400, None),  # nothing that holds it fits
        (512, 1500, None, None),  # the memory free is not known
    ],
)
def test_the_larger_context_offered(
    current: int, needed: int, largest: int | None, offered: int | None
) -> None:
    assert larger_context(current, needed, largest) == offered


def test_the_run_card_says_what_a_turn_resumed_from_disk() -> None:
    card = RunCard("m", "a.gguf", "", "llamacpp", "cpu", "b1", 512, "")
    assert "Resume" not in dict(card.lines()), "a card kept from before says nothing of it"
    resumed = RunCard.from_json({**card.to_json(), "restored_tokens": 2980, "resumes": True})
    assert dict(resumed.lines())["Resume"] == "resumed 2,980 tokens from disk"
    elsewhere = RunCard.from_json({**card.to_json(), "recipe": "lemon-mlx", "resumes": False})
    assert dict(elsewhere.lines())["Resume"] == "this chat does not resume from disk on this engine"
    with pytest.raises(ValueError):
        RunCard.from_json({**card.to_json(), "resumes": "yes"})


def test_llama_servers_refusal_of_a_long_prompt_is_a_context_error_in_plain_words() -> None:
    refusal = {
        "error": {
            "code": 400,
            "message": "request (731 tokens) exceeds the available context size (512 tokens), "
            "try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": 731,
            "n_ctx": 512,
        }
    }

    async def refuse(w: asyncio.StreamWriter) -> None:
        body = json.dumps(refusal).encode()
        w.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await w.drain()

    async def go() -> None:
        async with engine(refuse) as (_, url), ChatClient(url, "key") as client:
            with pytest.raises(ContextError) as streamed:
                await collect(client)
            assert (streamed.value.needed, streamed.value.context, streamed.value.status) == (731, 512, 400)
            assert "needs 731 tokens and the model's context holds 512" in str(streamed.value)
            assert "nothing was cut" in str(streamed.value) and "larger context" in str(streamed.value)
            with pytest.raises(ContextError):
                await client.chat([])

    asyncio.run(go())
