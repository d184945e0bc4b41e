"""The engine and its client on the window's event loop (``DesktopLoop``, a qasync loop), as the UI
bridge runs them.

qasync installs no async-generator hooks, so a stream left half-read is finalised by the garbage
collector outside the loop; pytest turns the resulting "Exception ignored" reports into failures.
"""

from __future__ import annotations

import asyncio
import gc

import pytest
from PySide6.QtWidgets import QApplication

from app.client.events import ChatDelta, ChatDone
from app.core.engine_state import EngineState
from app.core.hardware import Hardware
from app.core.launch import LaunchRequest
from app.supervisor.engine import Engine
from app.ui.event_loop import DesktopLoop

pytestmark = pytest.mark.integration


def test_start_chat_stop_on_the_qt_loop(
    qapp: QApplication, llama_request: LaunchRequest, cpu_hardware: Hardware
) -> None:
    engine = Engine("smol", llama_request, cpu_hardware)

    async def go() -> tuple[str, ChatDone | None]:
        await engine.start()
        try:
            text, done = "", None
            async with engine.chat_client() as client:
                for _ in range(3):
                    stream = client.stream_chat(
                        [{"role": "user", "content": "What is the capital of France? Answer in one word."}],
                        temperature=0,
                        max_tokens=16,
                    )
                    async for event in stream:
                        if isinstance(event, ChatDelta):
                            text += event.content
                        else:
                            done = event
                    gc.collect()  # finalise anything left half-run now, while the test watches
            return text, done
        finally:
            await engine.stop()

    loop = DesktopLoop(qapp)
    asyncio.set_event_loop(loop)
    try:
        text, done = loop.run_until_complete(go())
    finally:
        loop.close()
        asyncio.set_event_loop(None)
    gc.collect()
    assert text.count("Paris") == 3
    assert done is not None and done.telemetry.decode_tps > 0
    assert engine.state is EngineState.STOPPED
