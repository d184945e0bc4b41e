"""Screenshots of the chat pane, to look at, each in the scheme asked for (``SHOT_SCHEME=dark``):
- ``composer``: a sent message with an image and a file, and the composer holding an image and a file
  too large for the context (its choices shown);
- ``context``: the context meter near full, and a send that would not fit held with its ways out;
- ``tools``: a tool call asking permission, below a finished tool round and the text that followed it.
The pane is shown what the bridge would tell it; no engine runs.

Run (a real X server; offscreen works too): xvfb-run -a -s "-screen 0 1600x1000x24" env
QT_QPA_PLATFORM=xcb .venv/bin/python -m tests.bench.chat_screenshots [OUT_DIR]  (default /tmp/chat-shots)
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication

from app.core.attachments import TokenCount
from app.core.chat import ChatMessage
from app.core.context import ContextCount, CountSource
from app.core.tools import ToolCallFinished, ToolOutcome, ToolRequest, ToolsWithheld, tool_support
from app.store.attachments import ingest
from app.ui.chat.pane import ChatPane
from tests.support.documents import long_text, write_image, write_pdf


def _photo(path: Path) -> Path:
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (1200, 800), (70, 130, 180))
    draw = ImageDraw.Draw(image)
    draw.ellipse((850, 80, 1050, 280), fill=(255, 215, 0))
    draw.polygon([(0, 800), (400, 350), (800, 800)], fill=(60, 90, 60))
    draw.polygon([(500, 800), (900, 400), (1200, 700), (1200, 800)], fill=(40, 70, 40))
    image.save(path, "JPEG")
    return path


def _settle(pane: ChatPane) -> None:
    pane.show()
    for _ in range(20):
        QApplication.processEvents()


def composer(pane: ChatPane) -> Iterator[str]:
    files = Path(tempfile.mkdtemp(prefix="attach-shots-"))
    photo = ingest(_photo(files / "mountains.jpg"))
    pdf = ingest(write_pdf(files / "quarterly report.pdf", ["Revenue rose 12%", "Costs fell"]))
    (files / "book.txt").write_text(long_text(200))
    book = ingest(files / "book.txt")
    chart = ingest(write_image(files / "chart.png", 300, 200))

    question = ChatMessage(
        "user", "What does the report say about this picture?", attachments=[photo.ref, pdf.ref]
    )
    answer = ChatMessage(
        "assistant", "The report says revenue rose **12%**; the picture shows mountains at noon."
    )
    pane.show_conversation("shots", "Quarterly review", "", [question, answer])
    for taken in (photo, pdf):
        pane.show_attachment_data(taken.ref.sha256, taken.data)
    pane.set_embedder("nomic-embed-text-v1-GGUF")
    pane.add_attachment(chart, TokenCount(256, exact=False, context=8192))
    pane.add_attachment(book, TokenCount(151_234, exact=True, context=8192))
    pane.composer.setPlainText("Summarise the book and explain the chart")
    yield "attachments"


def context(pane: ChatPane) -> Iterator[str]:
    turns = [
        ChatMessage("user" if n % 2 == 0 else "assistant", text)
        for n, text in enumerate(
            [
                "Here are my notes from the planning meeting; keep them in mind.",
                "Got it: the launch moves to March, design owns the onboarding flow.",
                "What did we decide about the beta list?",
                "Invite the 200 people from the waiting list first, then open it up.",
            ]
        )
    ]
    pane.show_conversation("shots", "Planning notes", "", turns)
    pane.max_tokens.setValue(256)
    pane.guard.meter.show_count(ContextCount(3_790, 4_096, 256, CountSource.TOKENIZER))
    pane.composer.setPlainText("Now draft the announcement email from all of the above.")
    yield "near-full"
    held = ContextCount(4_180, 4_096, 256, CountSource.TOKENIZER, larger=8_192, leave_out=2)
    pane.guard.meter.show_count(held)
    pane.guard.choices.offer(held)
    yield "held"


def tools(pane: ChatPane) -> Iterator[str]:
    question = ChatMessage("user", "What is the weather in Lisbon, and should I pack an umbrella?")
    pane.show_conversation("shots", "Trip", "", [question])
    pane._request_reply()  # the reply the bridge would stream into
    pane.begin_reply()
    forecast = ToolRequest("1:0", "weather", "forecast", {"city": "Lisbon", "days": 2})
    told = '{"today": "rain, 17 °C", "tomorrow": "sun"}'
    pane.show_tool(ToolCallFinished(forecast, ToolOutcome.OK, told, 0.4))
    pane.append_reply("It is raining in Lisbon today (17 °C) and sunny tomorrow.")
    write = ToolRequest("2:0", "files", "write_file", {"path": "~/trip/packing.md", "text": "umbrella"})
    pane.ask_tool(write)
    pane._render_frame()  # what the frame timer would draw
    yield "asking"
    pane.show_tool(ToolCallFinished(write, ToolOutcome.OK, "wrote 8 bytes to ~/trip/packing.md", 0.1))
    pane.append_reply("Yes, pack one: I added an umbrella to your packing list.")
    pane.finish_reply()
    yield "finished"
    pane.composer.setPlainText("And in Porto?")
    pane.submit()
    pane.begin_reply()
    pane.show_tool(ToolsWithheld(tool_support("SmolLM2-135M-Instruct-GGUF", caps={}).why))
    pane.append_reply("I cannot check the weather from here.")
    pane.finish_reply()
    yield "withheld"


SCENES = {"composer": composer, "context": context, "tools": tools}


def shoot(out: Path, scheme: str) -> None:
    for name, scene in SCENES.items():
        pane = ChatPane()
        pane.resize(900, 720)
        for shot in scene(pane):  # each step of the scene is one picture
            _settle(pane)
            path = out / f"{name}-{shot}-{scheme}.png"
            pane.grab().save(str(path))
            print(f"wrote {path}")
        pane.stop_timers()
        pane.close()


def _dark_palette() -> QPalette:
    palette = QPalette()
    role = QPalette.ColorRole
    for which, colour in (
        (role.Window, "#232629"),
        (role.WindowText, "#eff0f1"),
        (role.Base, "#1b1e20"),
        (role.AlternateBase, "#2a2e32"),
        (role.Text, "#eff0f1"),
        (role.Button, "#31363b"),
        (role.ButtonText, "#eff0f1"),
        (role.PlaceholderText, "#8d9398"),
        (role.Highlight, "#3daee9"),
        (role.HighlightedText, "#fcfcfc"),
        (role.Link, "#3daee9"),
        (role.ToolTipBase, "#31363b"),
        (role.ToolTipText, "#eff0f1"),
    ):
        palette.setColor(which, QColor(colour))
    return palette


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/chat-shots")
    out.mkdir(parents=True, exist_ok=True)
    scheme = os.environ.get("SHOT_SCHEME", "light")
    QApplication.setStyle("Fusion")
    app = QApplication([])
    if scheme == "dark":  # as a dark system scheme gives it (Xvfb has no scheme of its own)
        app.setPalette(_dark_palette())
    shoot(out, scheme)
    del app


if __name__ == "__main__":
    main()
