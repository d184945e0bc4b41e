"""A chat on an engine without llama-server's slot API (the stand-in here; lemon-mlx, mlx-lm and older
builds alike) goes as before: no slot, nothing saved, one log line for the engine, not one per turn.
(Resume itself, on the real llama-server, is tests/integration/test_resume.py.)"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from app.client.events import ChatDone
from app.store.settings import Settings
from app.supervisor.router import Router
from tests.support.standin import make_standin_model
from tests.unit.test_router import SYSTEM


def test_an_engine_without_the_slot_api_answers_chats_and_saves_nothing(
    standin_settings: Settings, tmp_path: Path, lemon_home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "app.supervisor.resume")

    async def go() -> list[str]:
        async with Router(standin_settings) as router:
            name = router.library.import_path(make_standin_model(tmp_path, "plain", reply="Hello there")).name
            router.save_options(name, SYSTEM)
            replies = []
            for text in ("hi", "and again"):
                reply = ""
                messages = [{"role": "user", "content": text}]
                async for event in router.stream_chat(name, messages, conversation="chat-one"):
                    reply += "" if isinstance(event, ChatDone) else event.content
                replies.append(reply)
            await router.unload(name)
            return replies

    assert asyncio.run(go()) == ["Hello there", "Hello there"]
    assert caplog.text.count("its slots cannot be read") == 1
    assert list((lemon_home / "kvcache").iterdir()) == []
