"""The context a chat takes, on the real llama-server and SmolLM2 at a context of 512 tokens: the count is
the engine's own (the reply's ``usage.prompt_tokens``), a send that would not fit says how to get out
(a larger context that fits, or how many of the oldest turns to leave out), each way out does what it
says (a summary of a chat too long to summarize whole says what it left out, in ``run``'s terminal too),
and the engine's own refusal reads in plain words."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.commands.overflow import TerminalChat, make_room
from app.core.context import (
    SUMMARY_HEADING,
    SUMMARY_REQUEST,
    ContextCount,
    CountSource,
    Overflow,
    estimate_tokens,
    without_oldest,
)
from app.core.errors import ContextError
from app.store.model_options import ModelOptions
from app.store.settings import Settings
from app.supervisor.router import Router
from tests.integration.test_resume import history, run

pytestmark = pytest.mark.integration

SMALL = ModelOptions(ctx_size=512)
SAMPLING = {"max_tokens": 8, "temperature": 0.0}


@pytest.fixture
def installed(mirror: object) -> None:
    """llama.cpp's cpu backend, installed from the loopback release mirror by the first load."""


def chat_of(turns: int) -> list[dict[str, str]]:
    """A chat of ``turns`` questions and answers of about 40 tokens each, then a last question."""
    messages = [{"role": "system", "content": "You answer in a few words."}]
    for n in range(turns):
        messages.append(
            {
                "role": "user",
                "content": f"Turn {n}: the box number {n} holds {n * 7} red marbles, "
                "three blue pens and a small yellow note.",
            }
        )
        messages.append({"role": "assistant", "content": f"Box {n}: {n * 7} marbles, pens and a note."})
    messages.append({"role": "user", "content": "Which box holds 14 marbles?"})
    return messages


async def count(router: Router, name: str, messages: list[dict[str, str]], **params: object) -> ContextCount:
    counted = await router.count_context(name, messages, dict(params))
    assert counted is not None
    return counted


def test_the_count_is_the_engines_own_and_an_estimate_before_the_load(
    installed: None, smol_gguf: Path
) -> None:
    async def job(router: Router, name: str) -> None:
        messages = history(facts=8)
        before = await count(router, name, messages, **SAMPLING)
        assert before.source is CountSource.ESTIMATE and before.context == 512  # never loads it
        assert before.used == estimate_tokens(messages) and router.loaded() == []

        reply = await router.chat(name, messages, **SAMPLING)
        counted = await count(router, name, messages, **SAMPLING)
        assert counted.source is CountSource.TOKENIZER
        assert counted.used == reply.telemetry.prompt_tokens > 100
        assert (counted.context, counted.reply, counted.fits) == (512, 8, True)
        assert "about" not in counted.describe() and "about" in before.describe()

    run(Settings(), smol_gguf, job, SMALL)


def test_a_chat_that_does_not_fit_offers_a_larger_context_and_leaving_out_turns_that_each_work(
    installed: None, smol_gguf: Path
) -> None:
    async def job(router: Router, name: str) -> None:
        await router.ensure_loaded(name)
        messages = chat_of(12)
        over = await count(router, name, messages, max_tokens=64)
        assert not over.fits and over.used > 512 - 64, over
        assert over.ways_out() == [Overflow.RELOAD, Overflow.SUMMARY, Overflow.LEAVE_OUT]
        assert over.larger is not None and over.larger >= over.needed and over.larger % 256 == 0

        # Leaving out the oldest messages: exactly that many make it fit, one fewer does not.
        kept = without_oldest(messages, over.leave_out)
        assert (await count(router, name, kept, max_tokens=64)).fits
        assert not (
            await count(router, name, without_oldest(messages, over.leave_out - 1), max_tokens=64)
        ).fits
        assert kept[0] == messages[0] and kept[-1] == messages[-1]  # the system prompt and the question stay
        reply = await router.chat(name, kept, max_tokens=64, temperature=0.0)
        assert reply.telemetry.prompt_tokens == (await count(router, name, kept)).used

        # A larger context: the model loads again with it, and the whole chat then fits.
        engine = await router.reload_with_context(name, over.larger)
        assert engine.argv[engine.argv.index("--ctx-size") + 1] == str(over.larger)
        assert router.options(name).ctx_size == over.larger  # kept for later loads
        after = await count(router, name, messages, max_tokens=64)
        assert after.fits and after.context == over.larger
        assert (
            await router.chat(name, messages, max_tokens=64, temperature=0.0)
        ).telemetry.prompt_tokens > 512 - 64

    run(Settings(), smol_gguf, job, SMALL)


def test_the_summary_is_written_by_the_model_even_for_a_chat_that_does_not_fit(
    installed: None, smol_gguf: Path
) -> None:
    async def job(router: Router, name: str) -> None:
        await router.ensure_loaded(name)
        messages = chat_of(14)
        assert not (await count(router, name, messages, max_tokens=48)).fits
        summary = await router.summarize(name, messages, {"max_tokens": 48, "temperature": 0.0})
        assert summary.text, "the model wrote something"
        # Too long to summarize whole: the oldest messages were left out of it, and it says so.
        asked = [*messages, {"role": "user", "content": SUMMARY_REQUEST}]
        whole = await count(router, name, asked, max_tokens=48)
        assert not whole.fits and summary.left_out == whole.leave_out > 0
        assert summary.opening().startswith(f"{SUMMARY_HEADING}, without its oldest {summary.left_out} ")

    run(Settings(), smol_gguf, job, SMALL)


def test_runs_summary_says_what_it_left_out(
    installed: None, smol_gguf: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``run``'s terminal chat (``make_room``, its way out chosen beforehand with ``--on-overflow``)."""

    async def job(router: Router, name: str) -> None:
        await router.ensure_loaded(name)
        chat = TerminalChat(chat_of(14)[1:])  # the terminal chat has no system prompt

        async def nobody() -> str | None:
            raise AssertionError("the way out was chosen beforehand")

        assert await make_room(router, name, chat, nobody, Overflow.SUMMARY)
        [opening, question] = chat.messages
        assert question == chat_of(14)[-1] and opening["content"].startswith(f"{SUMMARY_HEADING}, without")
        assert opening["content"] in capsys.readouterr().err, "said in the terminal"

    run(Settings(), smol_gguf, job, SMALL)


def test_the_engines_refusal_reads_in_plain_words(installed: None, smol_gguf: Path) -> None:
    async def job(router: Router, name: str) -> None:
        with pytest.raises(ContextError) as refused:
            await router.chat(name, chat_of(14), max_tokens=8)
        err = refused.value
        assert err.status == 400 and err.context == 512 and err.needed > 512
        assert f"{err.needed:,} tokens" in str(err) and "512" in str(err)
        assert "leave out" in str(err).lower()  # what to do
        with pytest.raises(ContextError):
            async for _ in router.stream_chat(name, chat_of(14), max_tokens=8):
                pass

    run(Settings(), smol_gguf, job, SMALL)
