"""Instant resume on the real llama-server and SmolLM2: a chat keeps its prompt cache across turns and,
through an unload and a reload, processes only its new tokens (the engine's own ``timings.prompt_n``);
a saved file for another model or context is never restored, a damaged one falls back to a prefill, the
disk budget drops the oldest first, and the local API's requests get slots as fairly as chats do."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.client.events import ChatDone
from app.core.telemetry import Telemetry
from app.store.model_options import ModelOptions
from app.store.settings import Settings
from app.supervisor.api import ApiServer
from app.supervisor.router import Router
from tests.integration.conftest import Mirror

pytestmark = pytest.mark.integration

# Few new tokens: the new user message and the chat template's markers around it.
NEW_TOKENS_AT_MOST = 60
SAMPLING = {"max_tokens": 8, "temperature": 0.0}


def history(facts: int = 40) -> list[dict[str, str]]:
    """A conversation of about 16 tokens a fact, as the chat pane sends it."""
    colours = ("red", "green", "blue", "yellow", "white")
    text = " ".join(f"Fact {n}: the {colours[n % 5]} box holds {n * 7} marbles." for n in range(facts))
    return [
        {"role": "system", "content": "You answer questions about boxes in a few words."},
        {"role": "user", "content": f"Remember these facts. {text}"},
    ]


def processed(telemetry: Telemetry) -> int:
    """The prompt tokens the engine processed (``prompt_n``), not those it took from its cache."""
    return telemetry.prompt_tokens - telemetry.cached_tokens


class Chat:
    """One window chat: its id and messages, each turn sent as the bridge sends it."""

    def __init__(self, router: Router, name: str, conversation: str, facts: int = 40) -> None:
        self.router, self.name, self.conversation = router, name, conversation
        self.messages = history(facts)

    async def turn(self, text: str | None = None) -> Telemetry:
        if text is not None:
            self.messages.append({"role": "user", "content": text})
        reply, done = "", None
        async for event in self.router.stream_chat(
            self.name, self.messages, conversation=self.conversation, **SAMPLING
        ):
            if isinstance(event, ChatDone):
                done = event
            else:
                reply += event.content
        assert done is not None
        self.messages.append({"role": "assistant", "content": reply})
        return done.telemetry


@pytest.fixture
def kvcache(lemon_home: Path) -> Path:
    return lemon_home / "kvcache"


@pytest.fixture
def installed(mirror: Mirror) -> None:
    """llama.cpp's cpu backend, installed from the loopback release mirror by the first load."""


def saved_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.bin"))


def run(
    settings: Settings, gguf: Path, job: Any, options: ModelOptions | None = None, name: str = "smol"
) -> None:
    """``job(router, name)`` in a router of its own, as one run of the app, with the model ``gguf``
    imported as ``name`` (once: the app's home keeps it) and its options saved."""

    async def go() -> None:
        async with Router(settings) as router:
            model = router.library.models().get(f"user.{name}") or router.library.import_path(gguf, name)
            router.save_options(model.name, options or ModelOptions())
            await job(router, model.name)

    asyncio.run(go())


def test_a_chat_resumed_after_an_unload_processes_only_its_new_tokens(
    installed: None, smol_gguf: Path, kvcache: Path
) -> None:
    async def job(router: Router, name: str) -> None:
        chat = Chat(router, name, "chat-one")
        first = await chat.turn()
        assert first.prompt_tokens > 400 and processed(first) > 400
        warm = await chat.turn("Which box holds 14 marbles?")
        assert processed(warm) <= NEW_TOKENS_AT_MOST  # the prompt cache kept across turns

        engine = router.engines.get(name)
        assert engine is not None and "--slot-save-path" in engine.argv
        await router.unload(name)
        [saved] = saved_files(kvcache)
        sidecar = json.loads(saved.with_suffix(".json").read_text())
        assert sidecar["key"]["conversation"] == "chat-one" and sidecar["tokens"] >= warm.prompt_tokens

        resumed = await chat.turn("Which box holds 21 marbles?")  # loads the model again on demand
        assert resumed.prompt_tokens > 400 and processed(resumed) <= NEW_TOKENS_AT_MOST

        # Without a saved file the same turn processes the whole prompt: the file made the difference.
        other = Chat(router, name, "chat-two")
        other.messages = [*chat.messages[:-1]]
        await router.unload(name)
        assert processed(await other.turn()) > 400

    run(Settings(), smol_gguf, job)


def test_a_chat_resumes_after_the_app_quits_and_starts_again(
    installed: None, smol_gguf: Path, kvcache: Path
) -> None:
    chat: Chat | None = None

    async def before_quitting(router: Router, name: str) -> None:
        nonlocal chat
        chat = Chat(router, name, "chat-one")
        assert processed(await chat.turn()) > 400  # then the router shuts down with the model loaded

    async def after_starting_again(router: Router, name: str) -> None:
        assert chat is not None
        chat.router = router
        assert processed(await chat.turn("Which box holds 14 marbles?")) <= NEW_TOKENS_AT_MOST

    run(Settings(), smol_gguf, before_quitting)
    assert len(saved_files(kvcache)) == 1
    run(Settings(), smol_gguf, after_starting_again)


def test_a_file_for_another_model_or_context_is_never_restored(
    installed: None, smol_gguf: Path, kvcache: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "app")
    twin = tmp_path / "twin" / smol_gguf.name
    twin.parent.mkdir()
    shutil.copyfile(smol_gguf, twin)  # the same bytes at another path: another model file to its key

    async def save_one(router: Router, name: str) -> None:
        chat = Chat(router, name, "chat-one")
        await chat.turn()
        await router.unload(name)

    run(Settings(), smol_gguf, save_one, ModelOptions(ctx_size=4096))
    [saved] = saved_files(kvcache)

    async def other_context(router: Router, name: str) -> None:
        assert processed(await Chat(router, name, "chat-one").turn()) > 400

    run(Settings(), smol_gguf, other_context, ModelOptions(ctx_size=2048))
    run(Settings(), twin, other_context, ModelOptions(ctx_size=4096), name="twin")
    assert saved.exists() and "resumed" not in caplog.text  # kept for its own model, never restored


def test_a_truncated_or_damaged_file_falls_back_to_a_prefill_and_says_so(
    installed: None, smol_gguf: Path, kvcache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "app")

    async def job(router: Router, name: str) -> None:
        chat = Chat(router, name, "chat-one")
        await chat.turn()
        await router.unload(name)
        [saved] = saved_files(kvcache)
        saved.write_bytes(saved.read_bytes()[: saved.stat().st_size // 2])
        truncated = await chat.turn("Which box holds 14 marbles?")
        assert processed(truncated) > 400
        assert "truncated or damaged" in caplog.text and "the prompt is processed again" in caplog.text

        # Bytes the engine cannot read, with a sidecar that vouches for them: the engine refuses them.
        await router.unload(name)
        [saved] = saved_files(kvcache)
        junk = os.urandom(saved.stat().st_size)
        saved.write_bytes(junk)
        sidecar_path = saved.with_suffix(".json")
        sidecar = json.loads(sidecar_path.read_text())
        sidecar["sha256"] = hashlib.sha256(junk).hexdigest()
        sidecar_path.write_text(json.dumps(sidecar))
        refused = await chat.turn("Which box holds 21 marbles?")
        assert processed(refused) > 400 and refused.completion_tokens > 0
        assert "refused the saved KV cache of a chat" in caplog.text

    run(Settings(), smol_gguf, job)


def test_the_disk_budget_drops_the_oldest_saved_chat_first(
    installed: None, smol_gguf: Path, kvcache: Path
) -> None:
    async def job(router: Router, name: str) -> None:
        chats = [Chat(router, name, f"chat-{n}", facts=40) for n in range(3)]
        for chat in chats:
            await chat.turn()
        await router.unload(name)  # saves chat-0, chat-1, chat-2 in that order, under the budget
        [kept] = saved_files(kvcache)  # room for one: the last saved stayed
        assert 12 * 2**20 < kept.stat().st_size < 20 * 2**20
        assert processed(await chats[2].turn("Which box holds 14 marbles?")) <= NEW_TOKENS_AT_MOST
        assert processed(await chats[0].turn("Which box holds 14 marbles?")) > 400

    # SmolLM2's KV cache takes 23 kB a token: each chat's ~660 tokens about 15 MB, so 24 MB holds one.
    run(Settings(kv_cache_budget_gb=0.024), smol_gguf, job)


def test_a_chat_displaced_from_the_only_slot_is_saved_and_restored(
    installed: None, smol_gguf: Path, kvcache: Path
) -> None:
    async def job(router: Router, name: str) -> None:
        first, second = Chat(router, name, "chat-one"), Chat(router, name, "chat-two", facts=30)
        await first.turn()
        await second.turn()  # one slot: the first chat's is saved, then given to the second
        assert len(saved_files(kvcache)) == 1
        assert processed(await first.turn("Which box holds 14 marbles?")) <= NEW_TOKENS_AT_MOST

    run(Settings(), smol_gguf, job, ModelOptions(args="-np 1"))


def test_api_requests_get_slots_fairly_and_never_take_a_chats_unsaved(
    installed: None, smol_gguf: Path, kvcache: Path
) -> None:
    """Two slots. An API request (no conversation) that shares the start of a chat's prompt, which
    llama-server alone would put on that chat's slot, goes to the free one; when both are held by
    chats, it takes the least recently used chat's, saved first: that chat's next turn resumes. The
    engine's own prompt cache in RAM (``--cache-ram``, which would hide a lost slot while the engine
    runs) is off: the slots alone are tested."""

    async def job(router: Router, name: str) -> None:
        server = ApiServer(router, "127.0.0.1", 0)
        await server.start()
        try:
            async with httpx.AsyncClient(base_url=server.url, trust_env=False, timeout=600) as api:

                async def request(messages: list[dict[str, str]]) -> None:
                    asked = {"model": name, "messages": messages, **SAMPLING}
                    answer = await api.post("/v1/chat/completions", json=asked)
                    assert answer.status_code == 200, answer.text

                first = Chat(router, name, "chat-one")
                await first.turn()
                # The chat's system prompt and first facts, then other text: a prefix llama-server's own
                # choice of slot goes by.
                facts = first.messages[1]["content"]
                start = facts[: len(facts) // 3]
                await request([first.messages[0], {"role": "user", "content": start + " apple" * 200}])
                assert processed(await first.turn("Which box holds 14 marbles?")) <= NEW_TOKENS_AT_MOST

                second = Chat(router, name, "chat-two", facts=30)
                await second.turn()  # the free slot: both are held by chats now
                assert saved_files(kvcache) == []
                await request([{"role": "user", "content": "pear " * 400}])
                assert processed(await first.turn("Which box holds 21 marbles?")) <= NEW_TOKENS_AT_MOST
                [saved] = saved_files(kvcache)  # the least recently used chat's, before it was taken
                assert json.loads(saved.with_suffix(".json").read_text())["key"]["conversation"] == "chat-one"
                assert processed(await second.turn("Which box holds 7 marbles?")) <= NEW_TOKENS_AT_MOST
        finally:
            await server.stop()

    run(Settings(), smol_gguf, job, ModelOptions(args="-np 2 --cache-ram 0"))


def test_api_requests_go_back_to_the_slot_that_holds_their_prompt(
    installed: None, smol_gguf: Path, kvcache: Path
) -> None:
    """Two slots, no chat, two agents taking turns: one's conversation, the other's, the other's next
    turn (its conversation, the reply, a new question), then the first's. Each next turn goes to the
    slot that holds its conversation, so the engine processes only what it adds (``timings.prompt_n``).
    The first free slot would give both to one slot, and the least recently used slot would give the
    second agent's next turn the first's: either way a whole prompt processed again. The engine's
    prompt cache in RAM, which would hide a lost slot, is off."""

    async def job(router: Router, name: str) -> None:
        server = ApiServer(router, "127.0.0.1", 0)
        await server.start()
        try:
            async with httpx.AsyncClient(base_url=server.url, trust_env=False, timeout=600) as api:

                async def turn(messages: list[dict[str, str]], question: str | None = None) -> int:
                    if question is not None:
                        messages.append({"role": "user", "content": question})
                    asked = {"model": name, "messages": messages, **SAMPLING}
                    answer = await api.post("/v1/chat/completions", json=asked)
                    assert answer.status_code == 200, answer.text
                    body = answer.json()
                    messages.append(
                        {"role": "assistant", "content": body["choices"][0]["message"]["content"]}
                    )
                    return int(body["timings"]["prompt_n"])

                one = history()
                two = [
                    {"role": "system", "content": "You count the pears in a text."},
                    {"role": "user", "content": "How many pears? " + "pear apple " * 200},
                ]
                assert await turn(one) > 500 and await turn(two) > 300  # whole, the first time
                again = [await turn(two, "And apples?"), await turn(one, "Which box holds 14 marbles?")]
                assert max(again) <= NEW_TOKENS_AT_MOST, f"tokens processed again: {again}"
        finally:
            await server.stop()

    run(Settings(), smol_gguf, job, ModelOptions(args="-np 2 --cache-ram 0"))
