"""Hugging Face search in the window: a search box, then each repo found (downloads, likes, last update,
gated) with its recipe badge and its variants, each with its size and fit at the chosen context. *Add*
registers the chosen ``org/repo:VARIANT`` and starts its download. Fed ``HubResult``s by the bridge."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QStyle,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.core.fit import DEFAULT_CONTEXT
from app.core.refs import GGUF_RECIPE, MLX_RECIPE
from app.ui.look import (
    SPACING,
    BadgeDelegate,
    add_search_icon,
    fit_colour,
    fit_text,
    fit_tip,
    human_size,
    icon,
    muted_colour,
)

if TYPE_CHECKING:
    from app.supervisor.hubsearch import HubResult, HubVariant

REF_ROLE = Qt.ItemDataRole.UserRole
START_TEXT = (
    "Search Hugging Face for GGUF and MLX models: type a name such as “qwen” or “llama” and press "
    "Enter. Each result lists its variants with their size and whether they fit this machine."
)
COLUMNS = ["Model", "Recipe", "Size", "Fit"]


def _count(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}k" if n >= 1e3 else str(n)


class HubSearch(QWidget):
    search_requested = Signal(str, object, int)  # query, recipe or None, context
    add_requested = Signal(str)  # org/repo:VARIANT, or org/repo for MLX

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.query = QLineEdit(self)
        self.query.setPlaceholderText("Search Hugging Face")
        self.query.setClearButtonEnabled(True)
        add_search_icon(self.query)
        self.query.returnPressed.connect(self.run_search)
        self.recipe = QComboBox(self)
        self.recipe.addItem("GGUF and MLX", None)
        self.recipe.addItem("GGUF (llama.cpp)", GGUF_RECIPE)
        self.recipe.addItem("MLX (lemon-mlx)", MLX_RECIPE)
        self.context = QSpinBox(self)
        self.context.setRange(512, 1_048_576)
        self.context.setSingleStep(1024)
        self.context.setValue(DEFAULT_CONTEXT)
        self.context.setSuffix(" tokens")
        self.context.setToolTip("The context size the fit is estimated at")
        self.status = QLabel(START_TEXT, self)
        self.status.setWordWrap(True)
        self.status.setStyleSheet(f"color: {muted_colour()};")
        self.tree = QTreeWidget(self)
        self.tree.setHeaderLabels(COLUMNS)
        self.tree.setUniformRowHeights(True)
        self.tree.setItemDelegateForColumn(1, BadgeDelegate(self.tree))
        self.tree.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        header = self.tree.header()
        header.setStretchLastSection(False)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for column in (1, 2, 3):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        self.tree.currentItemChanged.connect(lambda *_: self._update_add())
        self.tree.itemDoubleClicked.connect(lambda *_: self.add())
        self.tree.hide()
        self.add_button = QPushButton("Add", self)
        self.add_button.setIcon(icon("list-add", QStyle.StandardPixmap.SP_ArrowDown))
        self.add_button.setToolTip("Add the chosen variant to your models and download it")
        self.add_button.clicked.connect(self.add)
        self.add_button.setEnabled(False)
        self.chosen = QLabel("", self)
        self.chosen.setStyleSheet(f"color: {muted_colour()};")

        options = QHBoxLayout()
        options.setSpacing(SPACING)
        options.addWidget(self.recipe, 1)
        options.addWidget(self.context, 1)
        actions = QHBoxLayout()
        actions.addWidget(self.chosen, 1)
        actions.addWidget(self.add_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(SPACING, SPACING, SPACING, SPACING // 2)
        layout.setSpacing(SPACING)
        layout.addWidget(self.query)
        layout.addLayout(options)
        layout.addWidget(self.status)
        layout.addWidget(self.tree, 1)
        layout.addLayout(actions)
        self._results: list[HubResult] = []

    # Intents

    def run_search(self) -> None:
        text = self.query.text().strip()
        if not text:
            return
        self.status.setText(f"Searching Hugging Face for “{text}”…")
        self.status.show()
        self.search_requested.emit(text, self.recipe.currentData(), self.context.value())

    def add(self) -> None:
        ref = self.selected_ref()
        if ref:
            self.add_requested.emit(ref)
            self.chosen.setText(f"Added {ref}: its download is in Downloads.")

    # Fed by the bridge

    def set_results(self, query: str, results: list[HubResult]) -> None:
        self._results = results
        self.tree.clear()
        if not results:
            self.status.setText(
                f"Nothing found for “{query}” in GGUF or MLX. Try a shorter name, or another spelling."
            )
            self.status.show()
            self.tree.hide()
            self._update_add()
            return
        self.status.hide()
        self.tree.show()
        for result in results:
            item = self._repo_item(result)
            self.tree.addTopLevelItem(item)
            # The repo's line spans the row: its name and numbers whole; the variants fill the columns.
            item.setFirstColumnSpanned(True)
            item.setExpanded(True)
        self._update_add()

    def set_failed(self, query: str, message: str) -> None:
        self.status.setText(f"The search for “{query}” failed: {message}")
        self.status.show()

    def selected_ref(self) -> str:
        item = self.tree.currentItem()
        return str(item.data(0, REF_ROLE) or "") if item is not None else ""

    def items(self) -> list[QTreeWidgetItem]:
        found = [self.tree.topLevelItem(i) for i in range(self.tree.topLevelItemCount())]
        return [item for item in found if item is not None]

    def choose(self, ref: str) -> None:
        for top in self.items():
            for item in (top, *(top.child(i) for i in range(top.childCount()))):
                if item is not None and item.data(0, REF_ROLE) == ref:
                    self.tree.setCurrentItem(item)
                    return

    # Inside

    def _repo_item(self, result: HubResult) -> QTreeWidgetItem:
        hit = result.hit
        item = QTreeWidgetItem([hit.repo_id, hit.recipe or "", "", ""])
        facts = [f"↓ {_count(hit.downloads)}", f"♥ {_count(hit.likes)}"]
        if hit.last_modified:
            facts.append(f"updated {hit.last_modified[:10]}")
        if hit.gated:
            facts.append("gated: needs a token")
        tip = [hit.repo_id, " · ".join(facts)]
        if result.error:
            tip.append(result.error)
        elif result.fit_error:
            tip.append(f"No fit estimate: {result.fit_error}")
        item.setText(0, "    ".join([hit.repo_id, *facts]))
        for column in range(len(COLUMNS)):
            item.setToolTip(column, "\n".join(tip))
        if result.error:
            item.setForeground(0, QColor(fit_colour(None)))
        for variant in result.variants:
            child = QTreeWidgetItem([variant.name, hit.recipe or "", "", ""])
            self._fill_variant(child, variant)
            item.addChild(child)
        return item

    @staticmethod
    def _fill_variant(item: QTreeWidgetItem, variant: HubVariant) -> None:
        item.setData(0, REF_ROLE, variant.ref)
        item.setText(2, human_size(variant.size_bytes))
        item.setTextAlignment(2, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        fit = variant.fit
        item.setText(3, fit_text(fit, True) or "?")
        if fit is not None:
            item.setForeground(3, QColor(fit_colour(fit.verdict)))
        tip = fit_tip(fit, True) if fit else "The fit is not known: the model's header could not be read."
        item.setToolTip(3, f"{variant.ref}\n{tip}")
        item.setToolTip(2, "\n".join(variant.files))
        item.setToolTip(0, variant.ref)

    def _update_add(self) -> None:
        ref = self.selected_ref()
        self.add_button.setEnabled(bool(ref))
        self.chosen.setText(ref if ref else ("Choose a variant to add" if self._results else ""))
