"""Message boxes the app opens: window-modal, deleted once closed, never blocking the event loop."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox, QWidget

Button = QMessageBox.StandardButton


def open_box(
    parent: QWidget,
    icon: QMessageBox.Icon,
    title: str,
    text: str,
    buttons: Button = Button.Ok,
    accept_text: str = "",
) -> QMessageBox:
    """``accept_text``: a button of that name that accepts the box, beside ``buttons`` (then the default)."""
    box = QMessageBox(icon, title, text, buttons, parent)
    if accept_text:
        box.addButton(accept_text, QMessageBox.ButtonRole.AcceptRole)
        box.setDefaultButton(buttons)
    box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    box.open()
    return box
