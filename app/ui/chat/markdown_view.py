"""A markdown text shown as a column of block widgets, rendered incrementally while it streams.

Finished blocks are rendered once into their own widget and never touched again; only the tail block's
widget is re-rendered when text arrives, and only when the owner calls ``show_pending()`` (once per frame).
The blocks are placed by hand (``BlockColumn``) rather than by a QLayout: a box layout asks every
word-wrapped label for its height on each change, which lays out the text of the whole reply again and
makes each token cost more as the reply grows. Here a change re-places only the blocks below it.

Showing is cut into steps, each laid out as it is shown: one block, opening a code block's frame and
header (its code follows in the next step), or highlighting a finished piece of code (it is set and
laid out in the next step: the two halves cost about the same, and together they were the longest
step). ``show_pending(until=...)`` stops before a step that would likely end past a time on the
thread's CPU clock, judging by the last cost of a step of that kind (``_STEP_COST``), so that one turn
of the event loop renders about a millisecond and a half instead of a frame's worth of blocks (3-7 ms
when a code block opened, in tests/bench/chat_render.py); a step is never cut. A column is
not laid out before its parent has given it its width: a new code block used to be, at Qt's default
100 px, which wraps every line of it, and then again at its real width.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import TypeVar

from PySide6.QtCore import QSize, Qt, QTimer
from PySide6.QtGui import QGuiApplication, QPalette, QResizeEvent
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSizePolicy, QToolButton, QWidget

from app.ui.chat.blocks import Block, BlockKind, BlockSplitter
from app.ui.chat.render import DARK, LIGHT, Theme, code_html, markdown_html

COPIED_FEEDBACK_MS = 1500
BLOCKS_PER_FRAME = 3

_W = TypeVar("_W", bound=QWidget)


def current_theme() -> Theme:
    """Light or dark, following the application's palette (which follows the system's scheme)."""
    return DARK if QGuiApplication.palette().color(QPalette.ColorRole.Window).lightness() < 128 else LIGHT


def _rich_label(parent: QWidget) -> QLabel:
    label = QLabel(parent)
    label.setTextFormat(Qt.TextFormat.RichText)
    label.setWordWrap(True)
    label.setOpenExternalLinks(True)
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)
    return label


class BlockColumn(QWidget):
    """Children stacked top to bottom at the column's width, each as tall as its content."""

    def __init__(self, spacing: int, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._spacing = spacing
        self._items: list[QWidget] = []
        self._bottoms: list[int] = []  # where each placed item ends
        self._placed_width = -1
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self.setFixedHeight(self._chrome_height())

    def add(self, widget: _W) -> _W:
        widget.setParent(self)
        self._items.append(widget)
        widget.show()
        return widget

    def remove(self, widget: QWidget) -> None:
        index = self._items.index(widget)
        del self._items[index]
        del self._bottoms[index:]
        widget.hide()
        widget.deleteLater()

    def index(self, widget: QWidget) -> int:
        return self._items.index(widget)

    def count(self) -> int:
        return len(self._items)

    def height_for(self, width: int) -> int:
        """The column's height at ``width``, without placing anything."""
        if width == self._placed_width and len(self._bottoms) == len(self._items):
            return self.height()
        inner = width - self.contentsMargins().left() - self.contentsMargins().right()
        heights = [_height_of(item, inner) for item in self._items]
        return self._chrome_height() + sum(heights) + self._spacing * max(len(heights) - 1, 0)

    def relayout(self, start: int = 0) -> None:
        """Place the items from ``start`` on (those above it have not changed) and fit the height."""
        width = self.width()
        if width <= 0 or not self.testAttribute(Qt.WidgetAttribute.WA_Resized):
            return  # not given its size yet: resizeEvent places everything (at the real width, once)
        if width != self._placed_width:
            start = 0
        start = min(start, len(self._bottoms))
        margins = self.contentsMargins()
        inner = width - margins.left() - margins.right()
        y = self._bottoms[start - 1] + self._spacing if start else margins.top()
        del self._bottoms[start:]
        for item in self._items[start:]:
            height = _height_of(item, inner)
            item.setGeometry(margins.left(), y, inner, height)
            self._bottoms.append(y + height)
            y += height + self._spacing
        self._placed_width = width
        bottom = self._bottoms[-1] if self._bottoms else margins.top()
        height = bottom + margins.bottom()
        if height != self.height():
            self.setFixedHeight(height)

    def _chrome_height(self) -> int:
        return self.contentsMargins().top() + self.contentsMargins().bottom()

    def sizeHint(self) -> QSize:
        return QSize(super().sizeHint().width(), self.height())

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        if event.size().width() != self._placed_width:
            self.relayout(0)


_STEP_COST: dict[str, float] = {}  # the recent CPU seconds of a step, by kind (text, code, open, light, none)


def _fits(kind: str, until: float | None) -> bool:
    """A step of this kind would likely end before ``until`` (always, without one)."""
    return until is None or time.thread_time() + _STEP_COST.get(kind, 0.0) < until


def _height_of(widget: QWidget, width: int) -> int:
    if isinstance(widget, BlockColumn):
        return widget.height_for(width)
    return widget.heightForWidth(width) if widget.hasHeightForWidth() else widget.sizeHint().height()


class CodeBlockView(BlockColumn):
    """A fenced code block: language, a Copy button, and the highlighted code (in pieces while it streams)."""

    def __init__(self, lang: str, theme: Theme, parent: QWidget | None = None) -> None:
        super().__init__(0, parent)
        self.setObjectName("codeBlock")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground)
        self.setStyleSheet(
            f"#codeBlock {{ background-color: {theme.code_background}; border: 1px solid {theme.border};"
            " border-radius: 6px; }"
        )
        self.setContentsMargins(10, 2, 10, 8)
        self._theme, self._lang = theme, lang
        self._pieces: list[str] = []  # the code of the finished pieces
        self._tail_code = ""
        self._lit = ("", "")  # code highlighted for the next show_tail, and its rich text
        header = QWidget(self)
        row = QHBoxLayout(header)
        row.setContentsMargins(0, 0, 0, 0)
        language = QLabel(lang or "code", header)
        language.setStyleSheet(f"color: {theme.muted}; font-size: 11px;")
        self.copy_button = QToolButton(header)
        self.copy_button.setText("Copy")
        self.copy_button.setToolTip("Copy this code")
        self.copy_button.setAutoRaise(True)
        self.copy_button.setCursor(Qt.CursorShape.PointingHandCursor)
        self.copy_button.clicked.connect(self._copy)
        row.addWidget(language)
        row.addStretch(1)
        row.addWidget(self.copy_button)
        self.add(header)
        self._tail = self._piece_label()

    def code(self) -> str:
        return "".join(self._pieces) + self._tail_code

    def lit(self, code: str) -> bool:
        """``code`` is highlighted (``light``) or shown already."""
        return code == self._lit[0] or self._shows(code)

    def _shows(self, code: str) -> bool:
        return code == self._tail_code and bool(self._tail.text())

    def light(self, code: str) -> None:
        """Highlight ``code`` for the next ``show_tail``, which then only sets and lays it out."""
        self._lit = (code, code_html(code.removesuffix("\n"), self._lang, self._theme))

    def show_tail(self, code: str) -> None:
        if self._shows(code):
            return
        if code != self._lit[0]:
            self.light(code)
        self._tail_code = code
        self._tail.setText(self._lit[1])
        self._lit = ("", "")
        self.relayout(self.count() - 1)

    def finish_piece(self, code: str) -> None:
        """The tail piece is final; later code goes into a new piece below it."""
        self.show_tail(code)
        self._pieces.append(code)
        self._tail_code = ""
        self._tail = self._piece_label()

    def _piece_label(self) -> QLabel:
        label = _rich_label(self)
        label.setOpenExternalLinks(False)
        return self.add(label)

    def _copy(self) -> None:
        QGuiApplication.clipboard().setText(self.code().removesuffix("\n"))
        self.copy_button.setText("Copied")
        QTimer.singleShot(COPIED_FEEDBACK_MS, self, self._copied_shown)  # dropped if the block goes first

    def _copied_shown(self) -> None:
        self.copy_button.setText("Copy")


class MarkdownView(BlockColumn):
    """Markdown as block widgets. ``append`` is cheap; ``show_pending`` shows what was appended."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(6, parent)
        # Drawn top-down with no background of its own: growing, it repaints only what is new.
        self.setAttribute(Qt.WidgetAttribute.WA_StaticContents)
        self._splitter = BlockSplitter()
        self._pending: list[str] = []
        self._backlog: deque[Block] = deque()  # finished blocks not shown yet
        self._tail_label: QLabel | None = None  # the text tail's widget
        self._tail_source = ""  # the markdown the tail label shows
        self._open_code: CodeBlockView | None = None  # the code block that is still streaming
        self._dirty = 0  # the first block changed since the last placement
        self._tail_stale = False  # text arrived since the tail was last shown
        self._theme = current_theme()

    def text(self) -> str:
        return self._splitter.text + "".join(self._pending)

    def has_pending(self) -> bool:
        """Text appended, finished blocks, or a tail that changed, not shown yet."""
        return bool(self._pending or self._backlog or self._tail_stale)

    def append(self, text: str) -> None:
        self._pending.append(text)

    def show_pending(self, max_blocks: int | None = BLOCKS_PER_FRAME, until: float | None = None) -> None:
        """Show what was appended: finished blocks once (at most ``max_blocks``; None: all), then the
        tail. With ``until``, a time on the thread's CPU clock (``time.thread_time()``), it stops before
        a step that would likely end past it, after the first step: the rest waits for the next call, so
        a call that has to catch up stays short. A step is one block, opening a code block's view or
        highlighting a finished piece of code."""
        if self._pending:
            text = "".join(self._pending)
            self._pending.clear()
            self._backlog.extend(self._splitter.feed(text))
            self._tail_stale = True
        steps = shown = 0
        while self._backlog and shown != max_blocks:
            block = self._backlog[0]
            kind, show = self._next_step(block)
            if steps and not _fits(kind, until):
                return
            if show == self._show_final:
                self._backlog.popleft()
                shown += 1
            self._step(kind, show, block)
            steps += 1
        if not self._tail_stale or self._backlog:
            return
        tail = self._splitter.tail()
        if self._opens_code(tail):
            if steps and not _fits("open", until):
                return
            self._step("open", self._open_code_view, tail)
            steps += 1
        kind = tail.kind.value if tail is not None else "none"
        if steps and not _fits(kind, until):
            return
        self._step(kind, self._show_tail, tail)
        self._tail_stale = False

    def _opens_code(self, block: Block | None) -> bool:
        return block is not None and block.kind is BlockKind.CODE and self._open_code is None

    def _next_step(self, block: Block) -> tuple[str, Callable[[Block | None], None]]:
        """The kind and the call of the next step in showing a finished ``block``."""
        if self._opens_code(block):
            return "open", self._open_code_view
        if self._unlit(block):
            return "light", self._light
        return block.kind.value, self._show_final

    def _unlit(self, block: Block) -> bool:
        """A finished piece of code not highlighted yet (the tail's is not: it changes with each token)."""
        code = self._open_code
        return code is not None and block.kind is BlockKind.CODE and not code.lit(block.text)

    def _step(self, kind: str, show: Callable[[Block | None], None], block: Block | None) -> None:
        """One step, and the placing of what it changed (the layout work is part of its cost)."""
        started = time.thread_time()
        self._dirty = self.count()
        show(block)
        self.relayout(self._dirty)
        _STEP_COST[kind] = (_STEP_COST.get(kind, 0.0) + time.thread_time() - started) / 2

    def _open_code_view(self, block: Block | None) -> None:
        """A code block's frame and header on their own: its code follows in the next step."""
        assert block is not None
        self._touch(self._code_view(block))

    def _light(self, block: Block | None) -> None:
        assert block is not None and self._open_code is not None
        self._open_code.light(block.text)

    def finish(self) -> None:
        """The text is complete: render the rest and make the tail final."""
        self.show_pending(max_blocks=None)
        self._dirty = self.count()
        for block in self._splitter.finish():
            self._show_final(block)
        self._show_tail(None)
        self.relayout(self._dirty)

    def code_blocks(self) -> list[CodeBlockView]:
        return self.findChildren(CodeBlockView)

    def _touch(self, widget: QWidget) -> None:
        self._dirty = min(self._dirty, self.index(widget))

    def _show_text(self, label: QLabel, source: str) -> None:
        """Render ``source`` into ``label`` unless it shows that already (a tail that became final)."""
        if label is self._tail_label and source == self._tail_source:
            return
        label.setText(markdown_html(source, self._theme))
        self._touch(label)

    def _show_final(self, block: Block | None) -> None:
        assert block is not None
        if block.kind is BlockKind.TEXT:
            label = self._tail_label or self.add(_rich_label(self))
            self._show_text(label, block.text)
            self._tail_label, self._tail_source = None, ""
            return
        view = self._code_view(block)
        if block.closed:
            view.show_tail(block.text)
            self._open_code = None
        else:
            view.finish_piece(block.text)
        self._touch(view)

    def _show_tail(self, block: Block | None) -> None:
        if block is None or block.kind is BlockKind.CODE:
            self._drop_tail_label()
            if block is not None:
                view = self._code_view(block)
                view.show_tail(block.text)
                self._touch(view)
            return
        if self._tail_label is None:
            self._tail_label = self.add(_rich_label(self))
        self._show_text(self._tail_label, block.text)
        self._tail_source = block.text

    def _code_view(self, block: Block) -> CodeBlockView:
        if self._open_code is None:
            self._drop_tail_label()
            self._open_code = self.add(CodeBlockView(block.lang, self._theme, self))
        return self._open_code

    def _drop_tail_label(self) -> None:
        """The tail label showed the start of a fence line, or only blanks: it goes."""
        if self._tail_label is not None:
            self._dirty = min(self._dirty, self.index(self._tail_label))
            self.remove(self._tail_label)
            self._tail_label, self._tail_source = None, ""
