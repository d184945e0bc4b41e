"""A chat front end in its own process, for killing: it loads a stand-in model through the router and
writes each turn through ``app.store.history`` the way the window does (the user's message, then the
reply appended as STREAMING and updated as it grows, then COMPLETE). It prints ``engine PID`` once the
engine is ready and ``done N`` after each finished turn.

    python -m tests.chaos.chat_driver LLAMA_SERVER MODEL CONVERSATION TURNS
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from app.client.events import ChatDelta
from app.core.chat import MessageState
from app.store.history import History
from app.store.model_options import ModelOptions
from app.store.settings import Settings
from app.supervisor.router import Router

UPDATE_EVERY = 4  # pieces between history updates (the window throttles them too)


async def chat(binary: str, model_path: str, conversation: str, turns: int) -> None:
    history = History()
    history.create_conversation(conversation)
    async with Router(Settings(llama_server_path=binary)) as router:
        name = f"user.{Path(model_path).stem}"
        known = name in router.library.models()
        model = router.library.resolve(name) if known else router.library.import_path(Path(model_path))
        router.save_options(model.name, ModelOptions(backend="system"))
        engine = await router.load(model.name)
        print(f"engine {engine.pid}", flush=True)
        for turn in range(turns):
            history.append_message(conversation, "user", f"question {turn}")
            reply = history.append_message(conversation, "assistant", "", state=MessageState.STREAMING)
            text, pieces = "", 0
            async for event in router.stream_chat(model.name, [{"role": "user", "content": "go"}]):
                if isinstance(event, ChatDelta) and event.content:
                    text += event.content
                    pieces += 1
                    if pieces % UPDATE_EVERY == 0:
                        history.update_message(reply, text)
            history.update_message(reply, text, state=MessageState.COMPLETE)
            print(f"done {turn}", flush=True)
    history.close()


if __name__ == "__main__":
    asyncio.run(chat(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
