"""The window's shared look: colours that work on light and dark palettes, recipe badges, fit marks,
icons (the desktop's icon theme where it has one, Qt's own standard icons otherwise), one-line labels
that elide."""

from __future__ import annotations

from PySide6.QtCore import QModelIndex, QPersistentModelIndex, QRect, QSize, Qt
from PySide6.QtGui import QColor, QGuiApplication, QIcon, QPainter, QPaintEvent, QPalette, QResizeEvent
from PySide6.QtWidgets import (
    QApplication,
    QLabel,
    QLineEdit,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QWidget,
)

from app.core.fit import FitEstimate, Verdict
from app.core.units import GB

# The recipe's format as people know it, and its badge colour (readable with white text on both themes).
RECIPE_BADGES = {"llamacpp": ("GGUF", "#2563eb"), "lemon-mlx": ("MLX", "#c2410c")}
FIT_COLOURS = {  # light, dark
    Verdict.FITS: ("#15803d", "#4ade80"),
    Verdict.TIGHT: ("#b45309", "#fbbf24"),
    Verdict.WONT_FIT: ("#b91c1c", "#f87171"),
}
ERROR_COLOURS = ("#b91c1c", "#f87171")
FIT_WORDS = {Verdict.FITS: "fits", Verdict.TIGHT: "tight", Verdict.WONT_FIT: "won't fit"}
SPACING = 8  # between controls; panels use twice this at their edges
ROW_PADDING = 10  # a list row's height over its text's


def is_dark() -> bool:
    return QGuiApplication.palette().color(QPalette.ColorRole.Window).lightness() < 128


def muted_colour() -> str:
    return "#a0a6ae" if is_dark() else "#5f6670"


def fit_colour(verdict: Verdict | None) -> str:
    """The verdict's colour; None: the error colour."""
    light, dark = FIT_COLOURS[verdict] if verdict is not None else ERROR_COLOURS
    return dark if is_dark() else light


def fit_text(fit: FitEstimate | None, exact: bool) -> str:
    """The fit mark in a row: ``● fits``, ``● tight``, ``● won't fit``; a hollow ``○`` while it is by
    size alone; empty when not known."""
    if fit is None:
        return ""
    return ("● " if exact else "○ ") + FIT_WORDS[fit.verdict]


def fit_tip(fit: FitEstimate | None, exact: bool, note: str = "") -> str:
    """The numbers behind a fit mark."""
    if fit is None:
        return "The fit is not known yet: the hardware is still being probed."
    lines = [
        f"{fit.verdict.value.capitalize()} at {fit.context:,} tokens of context:",
        f"  weights {fit.weights / GB:.2f} GB",
        f"  KV cache {fit.kv_cache / GB:.2f} GB" if exact else "  KV cache not counted yet",
        f"  overhead {fit.overhead / GB:.2f} GB",
        f"  needs {fit.need / GB:.2f} GB of {fit.budget.usable / GB:.1f} GB {fit.budget.kind.value}"
        + (f" ({fit.budget.device})" if fit.budget.device else ""),
    ]
    if exact and fit.max_context:
        lines.append(f"Largest context that fits: {fit.max_context:,} tokens")
    if not exact:
        lines.append("○: by size alone. Select the row to read the model's header from the Hub")
        lines.append("(its layers and heads): the KV cache is then counted too.")
    if note:
        lines.append(note)
    return "\n".join(lines)


def add_search_icon(line: QLineEdit) -> None:
    """A magnifier at the start of a search box, where the desktop's theme has one (Qt has none)."""
    if QIcon.hasThemeIcon("edit-find"):
        line.addAction(QIcon.fromTheme("edit-find"), QLineEdit.ActionPosition.LeadingPosition)


def icon(theme_name: str, fallback: QStyle.StandardPixmap, tint: bool = True) -> QIcon:
    """The desktop theme's icon, else Qt's standard one (always present, also offscreen). Qt's own are
    drawn black, which vanishes on a dark palette: ``tint`` repaints them in the palette's text colour."""
    if QIcon.hasThemeIcon(theme_name):
        return QIcon.fromTheme(theme_name)
    standard = QApplication.style().standardIcon(fallback)
    if not tint or not is_dark():
        return standard
    colour = QGuiApplication.palette().color(QPalette.ColorRole.ButtonText)
    tinted = QIcon()
    for size in (16, 24, 32):
        pixmap = standard.pixmap(size, size)
        painter = QPainter(pixmap)
        painter.setCompositionMode(QPainter.CompositionMode.CompositionMode_SourceIn)
        painter.fillRect(pixmap.rect(), colour)
        painter.end()
        tinted.addPixmap(pixmap)
    return tinted


def human_size(n: int) -> str:
    """``1.23 GB`` from a gigabyte up, ``456 MB`` below."""
    return f"{n / GB:.2f} GB" if n >= GB else f"{n / 1e6:.0f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"


class BadgeDelegate(QStyledItemDelegate):
    """Paints a column's text (a recipe: ``llamacpp``, ``lemon-mlx``) as a small coloured pill."""

    def paint(
        self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex
    ) -> None:
        recipe = str(index.data(Qt.ItemDataRole.DisplayRole) or "")
        badge = RECIPE_BADGES.get(recipe)
        if badge is None:
            super().paint(painter, option, index)
            return
        text, colour = badge
        widget: QWidget | None = option.widget
        style = widget.style() if widget is not None else QApplication.style()
        blank = QStyleOptionViewItem(option)
        self.initStyleOption(blank, index)
        blank.text = ""
        style.drawControl(QStyle.ControlElement.CE_ItemViewItem, blank, painter, widget)
        rect: QRect = option.rect
        metrics = option.fontMetrics
        width = metrics.horizontalAdvance(text) + 12
        height = metrics.height() + 2
        pill = QRect(rect.left() + 4, rect.center().y() - height // 2 + 1, width, height)
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(QColor(colour))
        painter.drawRoundedRect(pill, height / 2, height / 2)
        painter.setPen(QColor("white"))
        font = painter.font()
        font.setBold(True)
        painter.setFont(font)
        painter.drawText(pill, Qt.AlignmentFlag.AlignCenter, text)
        painter.restore()

    def sizeHint(self, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex) -> QSize:
        hint = super().sizeHint(option, index)
        hint.setHeight(max(hint.height(), option.fontMetrics.height() + ROW_PADDING))  # rows with air
        badge = RECIPE_BADGES.get(str(index.data(Qt.ItemDataRole.DisplayRole) or ""))
        if badge is not None:
            metrics = option.fontMetrics
            hint.setWidth(metrics.horizontalAdvance(badge[0]) + 20)
        return hint


class ElidedLabel(QLabel):
    """One line of plain text that shows what fits and ends in "…", the whole text in its tooltip when
    cut. It asks for no width of its own: a long text (a chat's title, an engine's error) never widens
    the window or squeezes what sits beside it. Its first line only: the rest is for the tooltip."""

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(text, parent)
        self.setTextFormat(Qt.TextFormat.PlainText)
        self._tip()

    def setText(self, text: str) -> None:
        super().setText(text)
        self._tip()

    def minimumSizeHint(self) -> QSize:
        return QSize(0, super().minimumSizeHint().height())

    def shown_text(self) -> str:
        """What the label shows at its width now."""
        line = self.text().split("\n", 1)[0]
        width = self.contentsRect().width()
        return self.fontMetrics().elidedText(line, Qt.TextElideMode.ElideRight, width)

    def paintEvent(self, event: QPaintEvent) -> None:
        painter = QPainter(self)
        self.style().drawItemText(
            painter,
            self.contentsRect(),
            self.alignment(),
            self.palette(),
            self.isEnabled(),
            self.shown_text(),
            self.foregroundRole(),
        )

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._tip()

    def _tip(self) -> None:
        self.setToolTip(self.text() if self.shown_text() != self.text() else "")
