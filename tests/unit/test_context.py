"""What a chat takes of a model's context (``app.core.context``), the run card's resume line, and the
engine's refusal of a prompt too long for its context read as a ContextError (llama-server's own answer,
served over loopback); a summary that left messages out says so; an MLX model's context is its config's
(a folder written here; counting never loads it)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from app.client.chat import ChatClient
from app.core.attachments import AttachmentKind, AttachmentRef
from app.core.context import (
    SUMMARY_HEADING,
    ContextCount,
    CountSource,
    Overflow,
    Summary,
    droppable,
    estimate_tokens,
    larger_context,
    reply_share,
    without_oldest,
)
from app.core.errors import ContextError
from app.core.runcard import RunCard
from app.store.model_options import ModelOptions
from app.store.settings import Settings
from app.supervisor.router import Router
from tests.support.modelfiles import MLX_CONFIG, mlx_files
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


def test_a_summary_that_had_to_leave_out_the_oldest_messages_says_so() -> None:
    assert Summary("The boxes hold marbles.").opening() == f"{SUMMARY_HEADING}: The boxes hold marbles."
    said = Summary("The boxes hold marbles.", left_out=6).opening()
    assert said.startswith(f"{SUMMARY_HEADING}, without its oldest 6 messages (the whole chat was too long")
    assert said.endswith(": The boxes hold marbles.")
    assert "oldest message (" in Summary("x", left_out=1).opening()


def test_an_estimate_counts_attachments_not_read_yet_images_and_the_tools_offered() -> None:
    text = AttachmentRef("a" * 64, "notes.md", AttachmentKind.TEXT, "text/plain", 4000)
    image = AttachmentRef("b" * 64, "p.png", AttachmentKind.IMAGE, "image/png", 90_000)
    plain = [{"role": "user", "content": "hi"}]
    assert estimate_tokens([{**plain[0], "attachments": [text]}]) == estimate_tokens(plain) + 1000 + 24
    assert estimate_tokens([{**plain[0], "attachments": [image]}]) == estimate_tokens(plain) + 256
    parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url"}]}]
    assert estimate_tokens(parts) == estimate_tokens(plain) + 256, "an image's data URL is not text"
    tool = {"type": "function", "function": {"name": "f", "parameters": {}}}
    assert estimate_tokens(plain, [tool]) > estimate_tokens(plain)


def mlx_model(router: Router, folder: Path, **config: object) -> str:
    folder.mkdir()
    for name, data in mlx_files().items():
        (folder / name).write_bytes(data)
    (folder / "config.json").write_text(json.dumps({**MLX_CONFIG, **config}))
    return router.library.import_path(folder).name


def test_an_mlx_model_is_counted_against_the_context_its_config_says_else_an_assumed_one(
    standin_settings: Settings, tmp_path: Path
) -> None:
    """A model not loaded is never loaded to count; lemon-mlx is given no context unless its options
    set one, and takes the model's own (``max_position_embeddings``)."""

    async def go() -> None:
        async with Router(standin_settings) as router:
            long = mlx_model(router, tmp_path / "long", max_position_embeddings=32_768)
            count = await router.count_context(long, CHAT, {})
            assert count is not None and (count.context, count.assumed) == (32_768, False)
            assert (await router.count_tokens(long, "x" * 40)).context == 32_768, "the tray's is the same"
            unsaid = mlx_model(router, tmp_path / "unsaid", max_position_embeddings=None)
            count = await router.count_context(unsaid, CHAT, {})
            assert count is not None and (count.context, count.assumed) == (4096, True)
            assert count.describe() == f"about {count.used} of about 4,096 tokens"
            router.save_options(unsaid, ModelOptions(ctx_size=8192))
            count = await router.count_context(unsaid, CHAT, {})
            assert count is not None and (count.context, count.assumed) == (8192, False)
            assert router.loaded() == []

    asyncio.run(go())
