"""The options panel for the selected model: backend, context size, extra engine arguments (checked as
they are typed), sampling defaults, "Save for this model" and Load/Reload. It only emits intents."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QStandardItemModel
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSlider,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.core.backends import BackendState
from app.core.errors import ConfigError, LemonDeskError
from app.core.launch import check_user_args, split_args
from app.core.rpc import workers_for
from app.core.status import Status
from app.store.model_options import ModelOptions
from app.ui.chat.markdown_view import current_theme
from app.ui.chat.pane import DEFAULT_TEMPERATURE, DEFAULT_TOP_P

if TYPE_CHECKING:
    from app.supervisor.router import ModelView
    from app.supervisor.system_info import SystemInfo

CTX_MIN_LOG2, CTX_MAX_LOG2, CTX_STEPS_PER_DOUBLING = 9, 18, 4  # 512 to 262,144 tokens
STATE_WORDS = {
    BackendState.INSTALLED: "installed",
    BackendState.INSTALLABLE: "installable",
    BackendState.UPDATE_REQUIRED: "update required",
    BackendState.UNSUPPORTED: "unsupported",
}


# Extra engine arguments a recipe's engine knows, as the field's placeholder: lemon-mlx ignores flags it
# does not know, so llama.cpp's there would mislead.
ARGS_EXAMPLES = {
    "llamacpp": "e.g. --threads 4 --flash-attn on",
    "lemon-mlx": "e.g. --kv-bits 8 --no-think",
}


def ctx_from_slider(position: int) -> int:
    return int(round(2 ** (CTX_MIN_LOG2 + position / CTX_STEPS_PER_DOUBLING) / 256) * 256)


def slider_from_ctx(ctx: int) -> int:
    return round((math.log2(max(ctx, 2**CTX_MIN_LOG2)) - CTX_MIN_LOG2) * CTX_STEPS_PER_DOUBLING)


def rpc_problem(recipe: str, text: str) -> str:
    """What is wrong with a model's RPC workers option, or ""."""
    if not text.strip():
        return ""
    if recipe != "llamacpp":
        return "RPC workers serve llama.cpp models only: leave the workers empty."
    try:
        workers_for(None, text, "")
    except ConfigError as err:
        return str(err)
    return ""


def args_problem(recipe: str, backend: str, text: str) -> str:
    """What is wrong with extra engine arguments as typed ("" when nothing)."""
    try:
        check_user_args(recipe, backend, split_args(text))
    except LemonDeskError as err:
        return str(err)
    return ""


class OptionsPanel(QWidget):
    save_requested = Signal(str, object)  # model name, ModelOptions
    load_requested = Signal(str, object)  # model name, ModelOptions
    backends_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        muted = current_theme().muted
        self.model = ""
        self._shown = ModelOptions()  # the model's saved options, as shown
        self.recipe = ""
        self.info: SystemInfo | None = None
        self.heading = QLabel("Select a model to see how it loads.", self)
        self.heading.setWordWrap(True)
        self.heading.setStyleSheet(f"color: {muted};")

        self.backend = QComboBox(self)
        self.backend.currentIndexChanged.connect(self._backend_chosen)
        self._wanted_backend: str | None = None  # kept while the backends are not known yet
        self.manage_backends = QPushButton("Backends…", self)
        self.manage_backends.setToolTip("Install, update or remove engines")
        self.manage_backends.clicked.connect(self.backends_requested)
        backend_row = QHBoxLayout()
        backend_row.addWidget(self.backend, 1)
        backend_row.addWidget(self.manage_backends)

        self.ctx_auto = QCheckBox("Auto", self)
        self.ctx_auto.setToolTip("The engine's default context size (llama.cpp: 4,096 tokens)")
        self.ctx_slider = QSlider(Qt.Orientation.Horizontal, self)
        self.ctx_slider.setRange(0, (CTX_MAX_LOG2 - CTX_MIN_LOG2) * CTX_STEPS_PER_DOUBLING)
        self.ctx_slider.setValue(slider_from_ctx(4096))
        self.ctx_value = QLabel(self)
        self.ctx_value.setMinimumWidth(self.fontMetrics().horizontalAdvance("262,144"))
        self.ctx_slider.valueChanged.connect(self._ctx_changed)
        self.ctx_auto.toggled.connect(self._ctx_changed)
        ctx_row = QHBoxLayout()
        ctx_row.addWidget(self.ctx_slider, 1)
        ctx_row.addWidget(self.ctx_value)
        ctx_row.addWidget(self.ctx_auto)

        self.args = QLineEdit(self)
        self.args.setPlaceholderText(ARGS_EXAMPLES["llamacpp"])
        self.args.textChanged.connect(self._validate)
        self.rpc = QLineEdit(self)
        self.rpc.setPlaceholderText("the Settings' workers (local: none)")
        self.rpc.setToolTip(
            "llama.cpp RPC workers (host:port, comma separated) that hold this model's layers and KV cache; "
            "empty: the workers in Settings; local: this machine alone"
        )
        self.rpc.textChanged.connect(self._validate)
        self.args_message = QLabel(self)
        self.args_message.setWordWrap(True)
        self.args_message.setStyleSheet("color: #c0392b;")
        self.args_message.hide()

        self.temperature = QDoubleSpinBox(self)
        self.temperature.setRange(0.0, 2.0)
        self.temperature.setSingleStep(0.05)
        self.top_p = QDoubleSpinBox(self)
        self.top_p.setRange(0.0, 1.0)
        self.top_p.setSingleStep(0.05)
        self.max_tokens = QSpinBox(self)
        self.max_tokens.setRange(0, 262_144)
        self.max_tokens.setSingleStep(256)
        self.max_tokens.setSpecialValueText("no limit")

        self.save_button = QPushButton("Save for this model", self)
        self.save_button.clicked.connect(lambda: self.save_requested.emit(self.model, self.current()))
        self.load_button = QPushButton("Load", self)
        self.load_button.setDefault(True)
        self.load_button.clicked.connect(lambda: self.load_requested.emit(self.model, self.current()))
        buttons = QHBoxLayout()
        buttons.addWidget(self.save_button)
        buttons.addWidget(self.load_button)

        self.form = QWidget(self)
        form = QFormLayout(self.form)
        form.setContentsMargins(0, 0, 0, 0)
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapAllRows)
        form.addRow("Backend", backend_row)
        form.addRow("Context size", ctx_row)
        form.addRow("Extra engine arguments", self.args)
        form.addRow("RPC workers", self.rpc)
        self._form = form
        form.addRow(self.args_message)
        sampling = QHBoxLayout()
        self.max_tokens.setToolTip("Longest reply, in tokens")
        for label, box in (("Temp", self.temperature), ("Top-p", self.top_p)):
            sampling.addWidget(QLabel(label, self))
            sampling.addWidget(box, 1)
        form.addRow("Chat defaults for this model", sampling)
        longest = QHBoxLayout()
        longest.addWidget(QLabel("Max tokens", self))
        longest.addWidget(self.max_tokens, 1)
        form.addRow(longest)
        form.addRow(buttons)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 4, 8, 8)
        layout.addWidget(self.heading)
        layout.addWidget(self.form)
        layout.addStretch(1)
        self.form.setEnabled(False)
        self._ctx_changed()

    # Fed by the window

    def set_backends(self, info: SystemInfo) -> None:
        self.info = info
        if self.model:
            self._fill_backends(self._wanted_backend)

    def show_model(self, row: ModelView, options: ModelOptions) -> None:
        self.model, self.recipe = row.name, row.model.recipe
        self._shown = options
        recipe = row.model.recipe or "recipe unknown until downloaded"
        self.heading.setText(f"<b>{row.name}</b><br>{recipe}")
        self.form.setEnabled(True)
        self._fill_backends(options.backend)
        self.ctx_auto.setChecked(options.ctx_size is None)
        self.ctx_slider.setValue(slider_from_ctx(options.ctx_size or 4096))
        self.args.setText(options.args)
        self.rpc.setText(options.rpc)
        self.args.setPlaceholderText(ARGS_EXAMPLES.get(row.model.recipe, ARGS_EXAMPLES["llamacpp"]))
        # Workers serve llama.cpp alone: for another recipe the row would only be a field to leave empty.
        self._form.setRowVisible(self.rpc, row.model.recipe in ("llamacpp", "") or bool(options.rpc))
        self.temperature.setValue(DEFAULT_TEMPERATURE if options.temperature is None else options.temperature)
        self.top_p.setValue(DEFAULT_TOP_P if options.top_p is None else options.top_p)
        self.max_tokens.setValue(options.max_tokens or 0)
        self.set_row(row)

    def set_row(self, row: ModelView) -> None:
        """The selected model's state changed: Load becomes Reload once it is loaded."""
        if row.name != self.model:
            return
        state = row.status.status
        busy = state in (Status.DOWNLOADING, Status.INSTALLING, Status.LOADING)
        self.load_button.setText("Reload" if state is Status.LOADED else "Load")
        self.load_button.setEnabled(not busy and self._args_ok())
        self.load_button.setToolTip("" if row.on_disk else "Downloads the model first, then loads it")

    def propose_context(self, tokens: int) -> int:
        """Set the context to the smallest power of two of at least ``tokens`` (within the slider's
        range); returns it. Nothing is saved or loaded until the user says so."""
        context = 2 ** max(CTX_MIN_LOG2, min(CTX_MAX_LOG2, math.ceil(math.log2(max(tokens, 1)))))
        self.ctx_auto.setChecked(False)
        self.ctx_slider.setValue(slider_from_ctx(context))
        return ctx_from_slider(self.ctx_slider.value())

    def current(self) -> ModelOptions:
        """The options as shown; those the panel does not show (the local API's ``reasoning_format``)
        stay as they were saved."""
        return dataclasses.replace(
            self._shown,
            backend=self.backend.currentData() or None,
            ctx_size=None if self.ctx_auto.isChecked() else ctx_from_slider(self.ctx_slider.value()),
            args=self.args.text().strip(),
            rpc=self.rpc.text().strip(),
            temperature=self.temperature.value(),
            top_p=self.top_p.value(),
            max_tokens=self.max_tokens.value() or None,
        )

    # Inside

    def _backend_chosen(self) -> None:
        self._wanted_backend = self.backend.currentData() or None
        self._validate()

    def _fill_backends(self, chosen: str | None) -> None:
        self._wanted_backend = chosen
        self.backend.blockSignals(True)
        self.backend.clear()
        support = self.info.recipes.get(self.recipe) if self.info else None
        default = support.default_backend if support else None
        self.backend.addItem(f"Auto ({default})" if default else "Auto", "")
        model = self.backend.model()
        assert isinstance(model, QStandardItemModel)
        for name, status in (support.backends if support else {}).items():
            self.backend.addItem(f"{name} — {STATE_WORDS[status.state]}", name)
            item = model.item(self.backend.count() - 1)
            item.setToolTip(status.message or f"{self.recipe}:{name} {status.version}")
            if status.state is BackendState.UNSUPPORTED:
                item.setEnabled(False)
        self.backend.setCurrentIndex(max(0, self.backend.findData(chosen or "")))
        self.backend.blockSignals(False)
        self._validate()

    def _backend_name(self) -> str:
        chosen = self.backend.currentData()
        if chosen:
            return str(chosen)
        support = self.info.recipes.get(self.recipe) if self.info else None
        return (support.default_backend or "") if support else ""

    def _args_ok(self) -> bool:
        return not self._problem()

    def _problem(self) -> str:
        return args_problem(self.recipe, self._backend_name(), self.args.text()) or rpc_problem(
            self.recipe, self.rpc.text()
        )

    def _validate(self) -> None:
        problem = self._problem()
        self.args_message.setText(problem)
        self.args_message.setVisible(bool(problem))
        args_bad = bool(args_problem(self.recipe, self._backend_name(), self.args.text()))
        self.args.setStyleSheet("border: 1px solid #c0392b;" if args_bad else "")
        self.rpc.setStyleSheet("" if args_bad or not problem else "border: 1px solid #c0392b;")
        self.save_button.setEnabled(not problem)
        if problem:
            self.load_button.setEnabled(False)

    def _ctx_changed(self) -> None:
        auto = self.ctx_auto.isChecked()
        self.ctx_slider.setEnabled(not auto)
        self.ctx_value.setText("" if auto else f"{ctx_from_slider(self.ctx_slider.value()):,}")
