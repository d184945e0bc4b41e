"""Attachments in the chat pane: chips (a thumbnail or a file's name, its token count) in the composer's
tray and under a sent message, and the tray's check that what is attached fits the context.

What the tray holds was read and counted by the bridge (``Bridge.attach``); a chip in the transcript
gets its bytes from the bridge too (``Bridge.read_attachments``): a widget reads no file. Nothing is cut
silently: when the attachments do not fit, the tray says by how much and offers the two ways out (send
the part that fits, named as such in the message, or a larger context); the message waits until one is
taken or an attachment removed.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QPixmap
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSizePolicy,
    QStyle,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.core.attachments import (
    AttachmentKind,
    AttachmentRef,
    TokenCount,
    Unreadable,
    fit_in_context,
    unreadable_note,
)
from app.store.attachments import Ingested
from app.ui.chat.markdown_view import current_theme
from app.ui.look import human_size, is_dark

COMPOSER_THUMB = 40  # px
TRANSCRIPT_THUMB = 160
ERROR_COLOURS = ("#c0392b", "#ff7b6b")  # light, dark: readable on either palette


def _error_colour() -> str:
    return ERROR_COLOURS[is_dark()]


@dataclass
class Pending:
    """An attachment in the composer: what was read, its count, and the reference the message gets
    (a part of it, once the user chose to send the part that fits), or the characters its chunks most
    related to the question may take (once the user chose retrieval)."""

    taken: Ingested
    count: TokenCount
    ref: AttachmentRef
    budget: int | None = None

    @property
    def cut(self) -> bool:
        """The user chose what of it goes."""
        return self.ref.sent_chars is not None or self.budget is not None


def _detail(ref: AttachmentRef, count: TokenCount | None, budget: int | None = None) -> str:
    if ref.kind is AttachmentKind.IMAGE:
        return "image"
    size = f"{ref.size:,} bytes" if ref.size < 1000 else human_size(ref.size)
    text = count.label() if count is not None else f"text, {size}"
    if ref.sent_chars is not None:
        text += f" · only the part that fits: first {ref.sent_chars:,} characters"
    elif budget is not None:
        text += f" · only its parts most related to the question: {budget:,} characters at most"
    elif ref.sent_spans is not None:
        text += f" · only {len(ref.sent_spans)} parts, found by retrieval"
    return text


class AttachmentChip(QFrame):
    """One attachment: its thumbnail or name, its size in tokens; a remove button in the composer."""

    remove_clicked = Signal(QObject)  # this chip

    def __init__(
        self,
        ref: AttachmentRef,
        *,
        count: TokenCount | None = None,
        data: bytes | None = None,
        removable: bool = False,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.ref = ref
        self._thumb_side = COMPOSER_THUMB if removable else TRANSCRIPT_THUMB
        self.setObjectName("attachmentChip")
        muted = current_theme().muted
        self.setStyleSheet(f"#attachmentChip {{ border: 1px solid {muted}; border-radius: 6px; }}")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(6, 4, 6, 4)
        layout.setSpacing(6)
        self.setSizePolicy(QSizePolicy.Policy.Maximum, QSizePolicy.Policy.Maximum)
        self.thumbnail = QLabel(self)
        self.thumbnail.hide()
        layout.addWidget(self.thumbnail, 0, Qt.AlignmentFlag.AlignTop)
        self.icon = QLabel(self)  # a file's icon; an image shows its thumbnail once its bytes are here
        kind = QStyle.StandardPixmap.SP_FileIcon
        if ref.kind is AttachmentKind.IMAGE:
            kind = QStyle.StandardPixmap.SP_FileDialogContentsView
        side = self.style().pixelMetric(QStyle.PixelMetric.PM_SmallIconSize)
        self.icon.setPixmap(self.style().standardIcon(kind).pixmap(side, side))
        layout.addWidget(self.icon, 0, Qt.AlignmentFlag.AlignTop)
        names = QVBoxLayout()
        names.setSpacing(0)
        self.name = QLabel(ref.name, self)
        self.name.setTextFormat(Qt.TextFormat.PlainText)
        self.detail = QLabel(_detail(ref, count), self)
        self.detail.setStyleSheet(f"color: {muted}; font-size: 11px;")
        self.detail.setWordWrap(True)
        names.addWidget(self.name)
        names.addWidget(self.detail)
        names.addStretch(1)
        layout.addLayout(names)
        self.remove_button = QToolButton(self)
        self.remove_button.setText("✕")
        self.remove_button.setToolTip(f"Remove {ref.name} from the message")
        self.remove_button.setAutoRaise(True)
        self.remove_button.clicked.connect(lambda: self.remove_clicked.emit(self))
        self.remove_button.setVisible(removable)
        layout.addWidget(self.remove_button, 0, Qt.AlignmentFlag.AlignTop)
        if data is not None:
            self.set_data(data)

    def set_data(self, data: bytes | Unreadable) -> None:
        """The attachment's bytes as kept (a thumbnail for an image), or why they cannot be read."""
        if isinstance(data, Unreadable):
            self.detail.setText(unreadable_note(self.ref, data))
            self.detail.setStyleSheet(f"color: {_error_colour()}; font-size: 11px;")
            self.thumbnail.hide()
            self.icon.show()
            return
        if self.ref.kind is not AttachmentKind.IMAGE:
            return
        pixmap = QPixmap()
        if not pixmap.loadFromData(data):
            self.set_data(Unreadable.DAMAGED)
            return
        side = self._thumb_side
        self.thumbnail.setPixmap(
            pixmap.scaled(
                side, side, Qt.AspectRatioMode.KeepAspectRatio, Qt.TransformationMode.SmoothTransformation
            )
        )
        self.thumbnail.show()
        self.icon.hide()

    def set_count(self, count: TokenCount | None, budget: int | None = None) -> None:
        self.detail.setText(_detail(self.ref, count, budget))


class ChipRow(QWidget):
    """Chips side by side (wrapping is not needed: a message carries a few)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._layout = QHBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.setSpacing(6)
        self._layout.addStretch(1)
        self.chips: list[AttachmentChip] = []

    def add(self, chip: AttachmentChip) -> None:
        self._layout.insertWidget(self._layout.count() - 1, chip, 0, Qt.AlignmentFlag.AlignTop)
        self.chips.append(chip)

    def remove(self, chip: AttachmentChip) -> None:
        self.chips.remove(chip)
        self._layout.removeWidget(chip)
        chip.deleteLater()

    def show_data(self, sha256: str, data: bytes | Unreadable) -> None:
        for chip in self.chips:
            if chip.ref.sha256 == sha256:
                chip.set_data(data)


class AttachmentTray(QWidget):
    """The composer's attachments, with what the user is told about them and the overflow choices."""

    changed = Signal()  # an attachment came, went, or is now sent only in part
    larger_context_wanted = Signal(int)  # the context (tokens) the message with its attachments needs

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.items: list[Pending] = []
        self._needed = 0  # the context the message would need (tokens), once it did not fit
        self._room = 0  # the tokens left for the attachments then
        self.row = ChipRow(self)
        self.notice = QLabel(self)
        self.notice.setWordWrap(True)
        self.notice.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.notice.hide()
        self.fit_button = QPushButton("Send the part that fits", self)
        self.fit_button.setToolTip("Send only the start of the file that fits; the message says so")
        self.fit_button.clicked.connect(self.send_part)
        self.larger_button = QPushButton("Use a larger context", self)
        self.larger_button.setToolTip("Reload the model with a context the whole message fits in")
        self.larger_button.clicked.connect(lambda: self.larger_context_wanted.emit(self._needed))
        self.retrieve_button = QPushButton("Send the parts related to the question", self)
        self.retrieve_button.clicked.connect(self.send_related)
        self.retrieve_button.hide()
        self.embedder = ""  # the embeddings model retrieval uses; "" when there is none on disk
        choices = QHBoxLayout()
        choices.setContentsMargins(0, 0, 0, 0)
        choices.addWidget(self.fit_button)
        choices.addWidget(self.retrieve_button)
        choices.addWidget(self.larger_button)
        choices.addStretch(1)
        self._choices = QWidget(self)
        self._choices.setLayout(choices)
        self._choices.hide()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(4)
        layout.addWidget(self.row)
        layout.addWidget(self.notice)
        layout.addWidget(self._choices)
        self.row.hide()

    def add(self, taken: Ingested, count: TokenCount) -> None:
        if any(p.ref.sha256 == taken.ref.sha256 for p in self.items):
            self.say(f"{taken.ref.name} is attached already.", error=False)
            return
        pending = Pending(taken, count, taken.ref)
        self.items.append(pending)
        chip = AttachmentChip(taken.ref, count=count, data=taken.data, removable=True, parent=self.row)
        chip.remove_clicked.connect(self._remove_chip)
        self.row.add(chip)
        self.row.show()
        self.say("")
        self.changed.emit()

    def set_count(self, sha256: str, count: TokenCount) -> bool:
        """A new count for an attachment (its part to send, if any, is chosen again); False when it is
        no longer here."""
        for pending, chip in zip(self.items, self.row.chips, strict=True):
            if pending.ref.sha256 == sha256:
                pending.count, pending.ref, pending.budget = count, pending.taken.ref, None
                chip.ref = pending.ref
                chip.set_count(count)
                self.say("")
                return True
        return False

    def clear(self) -> None:
        for chip in list(self.row.chips):
            self.row.remove(chip)
        self.items.clear()
        self.row.hide()
        self.say("")

    def say(self, text: str, *, error: bool = True) -> None:
        """Tell the user something about the attachments ("" hides it); the overflow choices go."""
        self._choices.hide()
        self.notice.setText(text)
        self.notice.setStyleSheet(f"color: {_error_colour() if error else current_theme().muted};")
        self.notice.setVisible(bool(text))

    def overflow(self, used: int) -> str:
        """ "" when the attachments fit the context beside ``used`` tokens (the chat so far, the text
        being written, room for the reply); else what does not fit, said, with the choices shown."""
        context = next((p.count.context for p in self.items if p.count.context), None)
        whole = [p for p in self.items if not p.cut]
        if context is None or not whole:
            return ""
        tokens = sum(p.count.tokens for p in self.items)
        if fit_in_context(TokenCount(tokens, exact=True), 1, context - used) is None:
            return ""
        self._needed, self._room = used + tokens, context - used
        exact = all(p.count.exact for p in self.items if p.ref.kind is AttachmentKind.TEXT)
        counted = (
            f"{tokens:,} tokens" if exact else f"≈{tokens:,} tokens (an estimate: the model is not loaded)"
        )
        text = (
            f"The attachments are {counted}; with this chat and room for the reply, "
            f"{tokens - max(self._room, 0):,} of them do not fit the {context:,}-token context. "
            "Nothing is cut unless you choose:"
        )
        self.say(text)
        self.fit_button.setEnabled(self._text_room() > 0)
        self.retrieve_button.setEnabled(self._text_room() > 0)
        self.retrieve_button.setVisible(bool(self.embedder))
        self.retrieve_button.setToolTip(
            f"Send the chunks of the file most related to your message, found with {self.embedder}"
            " (loaded for it under the loading policy); the message says so"
        )
        self._choices.show()
        return text

    def send_part(self) -> None:
        """Send of each text attachment the share that fits (images go whole); the chips say so."""
        if self._choose(related=False):
            self.say("Only the part that fits will be sent; the message names it as such.", error=False)

    def send_related(self) -> None:
        """Send of each text attachment its chunks most related to the question, as many as fit."""
        if self._choose(related=True):
            self.say(
                f"Only the parts most related to your message will be sent, found with {self.embedder}"
                " when you send it; the message names them as such.",
                error=False,
            )

    def _choose(self, *, related: bool) -> bool:
        room = self._text_room()
        tokens = sum(p.count.tokens for p in self.items if p.ref.kind is AttachmentKind.TEXT)
        if room <= 0 or not tokens:
            return False
        for pending, chip in zip(self.items, self.row.chips, strict=True):
            if pending.ref.kind is AttachmentKind.TEXT:
                fit = fit_in_context(
                    pending.count, len(pending.taken.text), pending.count.tokens * room // tokens
                )
                if fit is not None:
                    whole = pending.taken.ref
                    pending.ref = whole if related else whole.partial(fit.fitting_chars)
                    pending.budget = fit.fitting_chars if related else None
                    chip.ref = pending.ref
                    chip.set_count(pending.count, pending.budget)
        self.changed.emit()
        return True

    def _text_room(self) -> int:
        images = sum(p.count.tokens for p in self.items if p.ref.kind is AttachmentKind.IMAGE)
        return self._room - images

    def _remove_chip(self, chip: QObject) -> None:
        assert isinstance(chip, AttachmentChip)
        index = self.row.chips.index(chip)
        del self.items[index]
        self.row.remove(chip)
        self.row.setVisible(bool(self.items))
        self.say("")
        self.changed.emit()
