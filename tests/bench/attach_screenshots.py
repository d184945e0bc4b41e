"""Screenshots of the chat pane with attachments, light and dark, to look at: a sent message with an image
and a file, and the composer holding an image and a file too large for the context (its choices shown).

Run (a real X server; offscreen works too): xvfb-run -a -s "-screen 0 1600x1000x24" env
QT_QPA_PLATFORM=xcb .venv/bin/python -m tests.bench.attach_screenshots [OUT_DIR]  (default /tmp/attach-shots)
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication

from app.core.attachments import TokenCount
from app.core.chat import ChatMessage
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


def shoot(out: Path, scheme: str) -> None:
    files = Path(tempfile.mkdtemp(prefix="attach-shots-"))
    photo = ingest(_photo(files / "mountains.jpg"))
    pdf = ingest(write_pdf(files / "quarterly report.pdf", ["Revenue rose 12%", "Costs fell"]))
    (files / "book.txt").write_text(long_text(200))
    book = ingest(files / "book.txt")
    chart = ingest(write_image(files / "chart.png", 300, 200))

    pane = ChatPane()
    pane.resize(900, 720)
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
    pane.show()
    for _ in range(20):
        QApplication.processEvents()
    pane.grab().save(str(out / f"composer-{scheme}.png"))
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
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/attach-shots")
    out.mkdir(parents=True, exist_ok=True)
    scheme = os.environ.get("SHOT_SCHEME", "light")
    QApplication.setStyle("Fusion")
    app = QApplication([])
    if scheme == "dark":  # as a dark system scheme gives it (Xvfb has no scheme of its own)
        app.setPalette(_dark_palette())
    shoot(out, scheme)
    print(f"wrote {out}/composer-{scheme}.png")
    del app


if __name__ == "__main__":
    main()
