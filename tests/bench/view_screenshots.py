"""Screenshots of the Telemetry tab and the Bench window during real runs (the real llama-server and
SmolLM2, offscreen), to look at: ``widget.grab().save(...)``.

Run: QT_QPA_PLATFORM=offscreen .venv/bin/python -m tests.bench.view_screenshots [OUT_DIR]
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ["LEMON_DESK_HOME"] = tempfile.mkdtemp(prefix="lemon-shots-")

from PySide6.QtWidgets import QApplication

from app.core.chat import MessageState
from app.store.settings import Settings, save_settings
from app.ui.desktop import DesktopApp
from app.ui.event_loop import DesktopLoop
from tests.support.llama import build_llama_server, fetch_smollm_gguf

NAME = "user.SmolLM2-135M-Instruct.Q4_1"


async def until(check: Callable[[], bool], timeout: float = 300.0) -> None:
    end = time.monotonic() + timeout
    while not check():
        if time.monotonic() > end:
            raise TimeoutError
        await asyncio.sleep(0.05)


async def shoot(qapp: QApplication, out: Path) -> None:
    save_settings(Settings(llama_server_path=str(build_llama_server(print) / "llama-server")))
    app = DesktopApp(qapp)
    app.exit_app = lambda: None
    window = app.window
    window.resize(1440, 900)
    window.splitter.setSizes([330, 610, 500])
    window.show()
    app.start()
    await until(lambda: app.bridge.info is not None)
    app.bridge.import_model(str(fetch_smollm_gguf(print)))
    await until(lambda: window.models.row(NAME) is not None)
    app.bridge.load(NAME)
    await until(lambda: app.bridge.loaded() == [NAME])
    window.side.setCurrentWidget(window.telemetry)
    chat = window.chat
    for prompt in ("Write a haiku about the sea.", "Tell me a long story about a lighthouse keeper."):
        chat.max_tokens.setValue(120)
        chat.composer.setPlainText(prompt)
        chat.submit()
        await until(lambda: chat.messages()[-1].state is not MessageState.STREAMING)
    chat.composer.setPlainText("Tell me another long story, about a baker this time.")
    chat.submit()
    await asyncio.sleep(4)
    window.grab().save(str(out / "telemetry-window.png"))
    window.side.grab().save(str(out / "telemetry-tab.png"))
    await until(lambda: chat.messages()[-1].state is not MessageState.STREAMING)
    chat.transcript.views()[-1].toggle_card()
    await asyncio.sleep(0.3)
    chat.grab().save(str(out / "run-card.png"))

    window.bench_action.trigger()
    bench = app.bench
    assert bench is not None
    bench.select([NAME], ["llamacpp:system"])
    bench.prompt_tokens.setValue(128)
    bench.gen_tokens.setValue(32)
    bench.repetitions.setValue(3)
    bench.run_button.click()
    await until(lambda: "repetition 2" in bench.status.text())
    bench.grab().save(str(out / "bench-running.png"))
    await until(lambda: bench.run_button.isEnabled())
    bench.run_button.click()
    await until(lambda: bench.run_button.isEnabled())
    bench.compare.setCurrentIndex(1)
    await asyncio.sleep(0.3)
    bench.grab().save(str(out / "bench-done.png"))
    app.quit()
    await until(lambda: app.finished)


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "shots")
    out.mkdir(parents=True, exist_ok=True)
    qapp = QApplication.instance() or QApplication(sys.argv)
    loop = DesktopLoop(qapp)
    asyncio.set_event_loop(loop)
    with loop:
        loop.run_until_complete(shoot(qapp, out))  # type: ignore[arg-type]
    print(f"screenshots in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
