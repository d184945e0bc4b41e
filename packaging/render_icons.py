"""Render the PNG sizes of the app icon from lemon-desk.svg (run after editing the SVG, then commit).

QT_QPA_PLATFORM=offscreen .venv/bin/python packaging/render_icons.py
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer

SIZES = (16, 32, 48, 64, 128, 256)
ICONS = Path(__file__).parent / "icons"


def main() -> None:
    app = QGuiApplication([])
    renderer = QSvgRenderer(str(ICONS / "lemon-desk.svg"))
    for size in SIZES:
        image = QImage(size, size, QImage.Format.Format_ARGB32)
        image.fill(Qt.GlobalColor.transparent)
        painter = QPainter(image)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        renderer.render(painter)
        painter.end()
        image.save(str(ICONS / f"lemon-desk-{size}.png"))
    del app


if __name__ == "__main__":
    main()
