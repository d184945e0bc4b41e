"""The Model Manager: every catalog and user model with its recipe badge, size, state and fit mark
(the numbers in its tooltip); a search box and filters; actions on the selected row; below the list, why
the selected model failed (a load's error with the engine's last words, a download's). Fed the router's
``ModelView``s by the bridge (each with the one status every front end shows); it only emits intents.

Below them, a group per remote server ("Remote NAME", its state said plainly: reachable, unreachable
since 14:02, key refused) holding its models as ``@NAME/MODEL``: they load (on their remote) and chat
like the others; download, delete, pin and options are the remote's own business."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtCore import QPoint, Qt, Signal
from PySide6.QtGui import QColor, QFontDatabase, QTextCursor
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMenu,
    QPlainTextEdit,
    QPushButton,
    QStyle,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.core.remotes import RemoteModelStatus, RemoteState
from app.core.rpc import describe_placement
from app.core.status import Status
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
    from app.supervisor.remote_views import RemoteModelView, RemoteSnapshot
    from app.supervisor.router import ModelView

NAME_ROLE = Qt.ItemDataRole.UserRole
ALL = ""
ERRORS = (Status.FAILED, Status.DOWNLOAD_FAILED, Status.CRASHED)
BUSY = (Status.DOWNLOADING, Status.INSTALLING, Status.LOADING)  # a one-click load or a download runs
COLUMNS = ["Model", "Recipe", "Size", "State", "Fit"]
FIT_COLUMN = 4
REMOTE_TROUBLE = (RemoteModelStatus.UNREACHABLE, RemoteModelStatus.REFUSED)
LAST_WORDS_LINES = 6  # an engine's last words shown below the list at once; the earlier ones scroll


class ModelManager(QWidget):
    model_selected = Signal(str)
    load_requested = Signal(str)
    unload_requested = Signal(str)
    download_requested = Signal(str)
    cancel_download_requested = Signal(str)
    delete_requested = Signal(str)
    pin_requested = Signal(str, bool)  # model, pinned
    options_requested = Signal(str)
    add_requested = Signal(str)  # a .gguf file or an MLX folder to import
    fit_wanted = Signal(str)  # a selected model's fit is by size alone: read its header
    resume_download_requested = Signal(str)
    load_without_requested = Signal(str, object)  # model, the lost RPC workers to leave out (tuple)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.search = QLineEdit(self)
        self.search.setPlaceholderText("Filter your models and the catalog")
        self.search.setClearButtonEnabled(True)
        add_search_icon(self.search)
        self.recipe = QComboBox(self)
        self.recipe.setToolTip("Show the models of one recipe")
        self.label = QComboBox(self)
        self.label.setToolTip("Show the models with a label")
        self.downloaded_only = QCheckBox("Downloaded", self)
        self.downloaded_only.setToolTip("Show only the models ready to load: on this machine, or on a remote")
        self.tree = QTreeWidget(self)
        self.tree.setHeaderLabels(COLUMNS)
        self.tree.setItemDelegateForColumn(1, BadgeDelegate(self.tree))
        self.tree.setRootIsDecorated(False)
        self.tree.setUniformRowHeights(True)
        self.tree.setAlternatingRowColors(True)
        self.tree.setTextElideMode(Qt.TextElideMode.ElideMiddle)  # names differ at their ends
        header = self.tree.header()
        header.setStretchLastSection(False)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for column in range(1, len(COLUMNS)):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        self.empty = QLabel("", self)  # says what to do when no row is shown
        self.empty.setWordWrap(True)
        self.empty.setStyleSheet(f"color: {muted_colour()}; padding: {SPACING}px;")
        self.empty.hide()
        self.problem = QLabel("", self)  # why the selected model failed
        self.problem.setWordWrap(True)
        self.problem.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.problem.setStyleSheet(f"color: {fit_colour(None)};")
        self.problem.hide()
        self.last_words = QPlainTextEdit(self)  # what its engine said last, as in the Logs tab
        self.last_words.setReadOnly(True)
        self.last_words.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.last_words.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        lines = LAST_WORDS_LINES * self.last_words.fontMetrics().lineSpacing()
        self.last_words.setMaximumHeight(lines + 2 * self.last_words.frameWidth() + 8)
        self.last_words.hide()
        self.tree.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.tree.customContextMenuRequested.connect(self._context_menu)
        self.tree.currentItemChanged.connect(self._current_changed)
        self.tree.itemDoubleClicked.connect(lambda item, _c: self._primary(str(item.data(0, NAME_ROLE))))

        self.load_button = QPushButton("Load", self)
        self.unload_button = QPushButton("Unload", self)
        self.download_button = QPushButton("Download", self)
        self.delete_button = QPushButton("Delete", self)
        for button, name, fallback in (
            (self.load_button, "media-playback-start", QStyle.StandardPixmap.SP_MediaPlay),
            (self.unload_button, "media-playback-stop", QStyle.StandardPixmap.SP_MediaStop),
            (self.download_button, "document-save", QStyle.StandardPixmap.SP_ArrowDown),
            (self.delete_button, "edit-delete", QStyle.StandardPixmap.SP_TrashIcon),
        ):
            button.setIcon(icon(name, fallback))
        self.add_button = QPushButton("Add model…", self)
        self.add_button.setIcon(icon("document-open", QStyle.StandardPixmap.SP_DirOpenIcon))
        self.add_button.setToolTip("Import a local .gguf file or MLX folder")
        add_menu = QMenu(self.add_button)
        add_menu.addAction("GGUF file…", self._choose_file)
        add_menu.addAction("MLX folder…", self._choose_folder)
        self.add_button.setMenu(add_menu)
        self.load_button.clicked.connect(lambda: self._act(self.load_requested.emit))
        self.unload_button.clicked.connect(lambda: self._act(self.unload_requested.emit))
        self.download_button.clicked.connect(lambda: self._act(self._download_or_cancel))
        self.delete_button.clicked.connect(lambda: self._act(self.delete_requested.emit))

        filters = QHBoxLayout()
        filters.addWidget(self.recipe, 1)
        filters.addWidget(self.label, 1)
        filters.addWidget(self.downloaded_only)
        filters.setSpacing(SPACING)
        actions = QHBoxLayout()
        actions.setSpacing(SPACING // 2)
        for button in (self.load_button, self.unload_button, self.download_button, self.delete_button):
            actions.addWidget(button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(SPACING, SPACING, SPACING, SPACING // 2)
        layout.setSpacing(SPACING)
        layout.addWidget(self.search)
        layout.addLayout(filters)
        layout.addWidget(self.tree, 1)
        layout.addWidget(self.empty, 1)
        layout.addWidget(self.problem)
        layout.addWidget(self.last_words)
        layout.addLayout(actions)
        layout.addWidget(self.add_button)
        self.search.textChanged.connect(self._apply_filters)
        self.recipe.currentIndexChanged.connect(self._apply_filters)
        self.label.currentIndexChanged.connect(self._apply_filters)
        self.downloaded_only.toggled.connect(self._apply_filters)
        self._rows: dict[str, ModelView] = {}
        self._remotes: list[RemoteSnapshot] = []
        self._remote_rows: dict[str, RemoteModelView] = {}
        self._set_choices(self.recipe, "All recipes", [])
        self._set_choices(self.label, "All labels", [])
        self._update_buttons()

    # Fed by the bridge

    def set_rows(self, rows: list[ModelView]) -> None:
        self._rows = {row.name: row for row in rows}
        self._fill()

    def set_remotes(self, remotes: list[RemoteSnapshot]) -> None:
        """The remote servers, each with its state and the models it last listed."""
        self._remotes = list(remotes)
        self._remote_rows = {view.name: view for remote in remotes for view in remote.views()}
        self._fill()

    def _fill(self) -> None:
        current = self.selected()
        rows = list(self._rows.values())
        remote_recipes = {v.info.recipe for v in self._remote_rows.values() if v.info.recipe}
        recipes = {r.model.recipe for r in rows if r.model.recipe} | remote_recipes
        self._set_choices(self.recipe, "All recipes", sorted(recipes))
        labels = sorted({label for r in rows for label in r.model.labels})
        self._set_choices(self.label, "All labels", labels)
        self.tree.blockSignals(True)
        self.tree.clear()
        for row in rows:
            size = human_size(row.size_bytes) if row.size_bytes else ""  # a tiny model is not "0.00 GB"
            item = QTreeWidgetItem([row.name, row.model.recipe, size, "", ""])
            item.setData(0, NAME_ROLE, row.name)
            item.setTextAlignment(2, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            self._fill_state(item, row)
            self.tree.addTopLevelItem(item)
        for remote in self._remotes:
            self.tree.addTopLevelItem(self._remote_group(remote))
        self._apply_filters()
        if current:  # the same row again, not a new choice: the options panel keeps what was typed in it
            self.select(current)
        self.tree.blockSignals(False)
        self._update_buttons()
        if current:
            self._want_fit(current)

    def _remote_group(self, remote: RemoteSnapshot) -> QTreeWidgetItem:
        kind = remote.kind.value if remote.kind else ""
        group = QTreeWidgetItem([f"Remote {remote.name}", kind, "", remote.text, ""])
        group.setFlags(Qt.ItemFlag.ItemIsEnabled)  # a heading: not selectable
        font = group.font(0)
        font.setBold(True)
        group.setFont(0, font)
        tip = [f"{remote.name}: {remote.url}", remote.text]
        if remote.message:
            tip.append(remote.message)
        if remote.state is not RemoteState.REACHABLE and not remote.models:
            tip.append("Its models show here once it answers.")
        for column in range(FIT_COLUMN):
            group.setToolTip(column, "\n".join(tip))
        if remote.state in (RemoteState.UNREACHABLE, RemoteState.REFUSED):
            group.setForeground(3, QColor(fit_colour(None)))
        for view in remote.views():
            size = human_size(view.info.size_bytes) if view.info.size_bytes else ""
            item = QTreeWidgetItem([view.name, view.info.recipe, size, view.status.value, ""])
            item.setData(0, NAME_ROLE, view.name)
            item.setTextAlignment(2, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            model_tip = [view.name, f"on the remote {remote.name} ({remote.url})", view.status.value]
            if view.message:
                model_tip.append(view.message)
            for column in range(FIT_COLUMN):
                item.setToolTip(column, "\n".join(model_tip))
            if view.status in REMOTE_TROUBLE:
                item.setForeground(3, QColor(fit_colour(None)))
            group.addChild(item)
        group.setExpanded(True)
        return group

    def row(self, name: str) -> ModelView | None:
        return self._rows.get(name)

    def remote_row(self, name: str) -> RemoteModelView | None:
        return self._remote_rows.get(name)

    def remote_group(self, name: str) -> QTreeWidgetItem | None:
        """The heading of the remote ``name`` (its state in the State column)."""
        groups = (self.tree.topLevelItem(i) for i in range(self.tree.topLevelItemCount()))
        return next((g for g in groups if g is not None and g.text(0) == f"Remote {name}"), None)

    def selected(self) -> str:
        item = self.tree.currentItem()
        name = item.data(0, NAME_ROLE) if item is not None else None
        return str(name) if name else ""

    def _items(self) -> list[QTreeWidgetItem]:
        """Every model's row: the top-level ones and those inside the remote groups (not the groups)."""
        out: list[QTreeWidgetItem] = []
        for i in range(self.tree.topLevelItemCount()):
            item = self.tree.topLevelItem(i)
            if item is None:
                continue
            if item.data(0, NAME_ROLE):
                out.append(item)
            out += [c for c in (item.child(j) for j in range(item.childCount())) if c is not None]
        return out

    def select(self, name: str) -> None:
        for item in self._items():
            if item.data(0, NAME_ROLE) == name:
                self.tree.setCurrentItem(item)
                return

    def visible_names(self) -> list[str]:
        return [str(item.data(0, NAME_ROLE)) for item in self._items() if not item.isHidden()]

    def add(self, path: str) -> None:
        if path:
            self.add_requested.emit(path)

    # Inside

    @staticmethod
    def _fill_state(item: QTreeWidgetItem, row: ModelView) -> None:
        status = row.status
        item.setText(3, ("● " if status.status is Status.LOADED else "") + status.text)
        tip = [row.name, f"recipe: {row.model.recipe or 'unknown until downloaded'}"]
        if row.model.labels:
            tip.append(f"labels: {', '.join(row.model.labels)}")
        if row.model.user:
            tip.append("added by you")
        if status.message:
            tip.append(status.message)
        workers = [device for device in row.memory if device != "CPU"]
        if status.status is Status.LOADED and workers:
            item.setText(3, f"{item.text(3)} · on {len(workers)} worker{'s' if len(workers) > 1 else ''}")
            tip.append(f"memory: {describe_placement(row.memory)}")
        for column in range(FIT_COLUMN):
            item.setToolTip(column, "\n".join(tip))
        if status.status in ERRORS:
            item.setForeground(3, QColor(fit_colour(None)))
        item.setText(FIT_COLUMN, fit_text(row.fit, row.fit_exact))
        item.setToolTip(FIT_COLUMN, fit_tip(row.fit, row.fit_exact, row.fit_note))
        if row.fit is not None:
            item.setForeground(FIT_COLUMN, QColor(fit_colour(row.fit.verdict)))

    @staticmethod
    def _set_choices(box: QComboBox, everything: str, values: list[str]) -> None:
        current = box.currentData()
        box.blockSignals(True)
        box.clear()
        box.addItem(everything, ALL)
        for value in values:
            box.addItem(value, value)
        box.setCurrentIndex(max(0, box.findData(current)))
        box.blockSignals(False)

    def _apply_filters(self) -> None:
        words = self.search.text().lower().split()
        recipe, label = self.recipe.currentData(), self.label.currentData()
        for item in self._items():
            name = str(item.data(0, NAME_ROLE))
            row = self._rows.get(name)
            if row is None:  # a remote's: ready to load there, whatever "Downloaded" says
                remote = self._remote_rows[name]
                on_disk, model_recipe, model_labels = True, remote.info.recipe, remote.info.labels
            else:
                on_disk, model_recipe, model_labels = row.on_disk, row.model.recipe, row.model.labels
            text = " ".join((name, model_recipe, *model_labels)).lower()
            shown = (
                all(word in text for word in words)
                and (not recipe or model_recipe == recipe)
                and (not label or label in model_labels)
                and (not self.downloaded_only.isChecked() or on_disk)
            )
            item.setHidden(not shown)
        filtering = bool(words or recipe or label)
        for i in range(self.tree.topLevelItemCount()):
            group = self.tree.topLevelItem(i)
            if group is not None and not group.data(0, NAME_ROLE):
                children = [group.child(j) for j in range(group.childCount())]
                any_shown = any(c is not None and not c.isHidden() for c in children)
                group.setHidden(filtering and not any_shown)
        self._show_empty()

    def _show_empty(self) -> None:
        if self.visible_names():
            self.empty.hide()
            self.tree.show()
            return
        if not self._rows:
            text = "Finding your models…"
        elif self.downloaded_only.isChecked() and not any(r.on_disk for r in self._rows.values()):
            text = (
                "No model is on this machine yet. Clear “Downloaded” to see the catalog and press Load "
                "(it downloads first), search Hugging Face, or add a GGUF file or MLX folder you have."
            )
        else:
            text = "No model matches these filters. Clear the search box or choose “All recipes”."
        self.empty.setText(text)
        self.tree.hide()
        self.empty.show()

    def _update_buttons(self) -> None:
        remote = self._remote_rows.get(self.selected())
        if remote is not None:
            self._update_remote_buttons(remote)
            return
        row = self._rows.get(self.selected())
        state = row.status.status if row else None
        self._show_problem(row.status.message if row is not None and state in ERRORS else "")
        # Load is one click: it downloads the model and installs its backend first when needed.
        self.load_button.setEnabled(row is not None and state not in BUSY)
        self.load_button.setText("Reload" if state is Status.LOADED else "Load")
        self.unload_button.setEnabled(state in (Status.LOADED, Status.LOADING, Status.CRASHED))
        downloading = state is Status.DOWNLOADING
        paused = state is Status.PAUSED
        self.download_button.setText(
            "Cancel download" if downloading else "Resume download" if paused else "Download"
        )
        self.download_button.setEnabled(row is not None and (downloading or not row.on_disk))
        self.delete_button.setEnabled(row is not None and (row.on_disk or row.model.user) and not downloading)

    def _show_problem(self, why: str) -> None:
        """Why the selected model failed: what happened (its first line), then the engine's last words
        scrolled to their end, where the cause is; the selected row stays in sight above them."""
        head, _, words = why.partition("\n")
        if (head, words) == (self.problem.text(), self.last_words.toPlainText()):
            return  # unchanged: a selection in the text is kept
        self.problem.setText(head)
        self.problem.setVisible(bool(head))
        self.last_words.setPlainText(words)
        self.last_words.setVisible(bool(words))
        layout = self.layout()
        if layout is not None:
            layout.activate()  # the list's new height, for the two scrolls below
        self.last_words.moveCursor(QTextCursor.MoveOperation.End)
        current = self.tree.currentItem()
        if current is not None:
            self.tree.scrollToItem(current)

    def _update_remote_buttons(self, view: RemoteModelView) -> None:
        """A remote's model loads and unloads on its remote; its files are the remote's."""
        self._show_problem("")
        self.load_button.setText("Load")
        self.load_button.setEnabled(view.status is RemoteModelStatus.AVAILABLE)
        self.unload_button.setEnabled(view.status is RemoteModelStatus.LOADED)
        self.download_button.setText("Download")
        for button in (self.download_button, self.delete_button):
            button.setEnabled(False)

    def _current_changed(self, current: QTreeWidgetItem | None, _previous: QTreeWidgetItem | None) -> None:
        self._update_buttons()
        if current is not None and current.data(0, NAME_ROLE):
            name = str(current.data(0, NAME_ROLE))
            self.model_selected.emit(name)
            self._want_fit(name)

    def _want_fit(self, name: str) -> None:
        row = self._rows.get(name)
        if row is not None and row.fit is not None and not row.fit_exact and not row.fit_note:
            self.fit_wanted.emit(name)

    def _act(self, action: Callable[[str], object]) -> None:
        if name := self.selected():
            action(name)

    def _download_or_cancel(self, name: str) -> None:
        row = self._rows.get(name)
        if row is not None and row.status.status is Status.DOWNLOADING:
            self.cancel_download_requested.emit(name)
        elif row is not None and row.status.status is Status.PAUSED:
            self.resume_download_requested.emit(name)
        else:
            self.download_requested.emit(name)

    def _primary(self, name: str) -> None:
        remote = self._remote_rows.get(name)
        if remote is not None:
            if remote.status is RemoteModelStatus.AVAILABLE:
                self.load_requested.emit(name)
            return
        row = self._rows.get(name)
        if row is not None and row.status.status not in (Status.LOADED, *BUSY):
            self.load_requested.emit(name)

    def _context_menu(self, pos: QPoint) -> None:
        item = self.tree.itemAt(pos)
        if item is None or not item.data(0, NAME_ROLE):  # nothing, or a remote's heading
            return
        self.tree.setCurrentItem(item)
        name = str(item.data(0, NAME_ROLE))
        menu = QMenu(self)
        for button in (self.load_button, self.unload_button, self.download_button, self.delete_button):
            action = menu.addAction(button.text(), button.click)
            action.setEnabled(button.isEnabled())
        row = self._rows.get(name)
        if row is not None and row.lost_workers and row.status.status not in (Status.LOADED, *BUSY):
            lost = row.lost_workers
            without = menu.addAction(
                f"Load without {', '.join(lost)}", lambda: self.load_without_requested.emit(name, lost)
            )
            without.setToolTip("Load it here and on its other workers, leaving out the ones that went away")
        if row is None:  # a remote's model: nothing to pin or set here
            menu.popup(self.tree.viewport().mapToGlobal(pos))
            return
        menu.addSeparator()
        pinned = row is not None and row.status.pinned
        pin = menu.addAction("Pinned", lambda: self.pin_requested.emit(name, not pinned))
        pin.setCheckable(True)
        pin.setChecked(pinned)
        pin.setToolTip("A pinned model is never unloaded to make room or when idle")
        menu.addAction("Options…", lambda: self.options_requested.emit(name))
        menu.popup(self.tree.viewport().mapToGlobal(pos))

    def _choose_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Add a GGUF model", "", "GGUF models (*.gguf)")
        self.add(path)

    def _choose_folder(self) -> None:
        self.add(QFileDialog.getExistingDirectory(self, "Add an MLX model folder"))
