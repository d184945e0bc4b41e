"""The settings dialog. It never holds a stored token: only whether one exists, and a new one if typed.

Every setting an error message points to ("raise the load timeout in Settings", "set its path in
Settings"...) is here, under the same name the message uses.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.core.errors import ConfigError
from app.core.net import OLLAMA_PORT
from app.core.policy import parse_caps
from app.core.rpc import DEFAULT_WORKER_PORT, exposure_warning, parse_workers, worker_endpoint
from app.store.settings import (
    LOAD_TIMEOUT_RANGE_S,
    REQUEST_TIMEOUT_RANGE_S,
    TOOL_TIMEOUT_RANGE_S,
    Settings,
    llama_server_problem,
)
from app.ui.mcp_editor import McpEditor
from app.ui.remotes_editor import RemotesEditor

MAX_IDLE_MINUTES = 24 * 60
MAX_TOOL_ROUNDS = 64


class TokenAction(enum.Enum):
    KEEP = "keep"  # leave the keychain as it is
    SET = "set"  # store the typed token
    DELETE = "delete"  # remove the stored token


@dataclass(frozen=True)
class TokenChange:
    action: TokenAction
    token: str = ""  # SET: the new token

    def __repr__(self) -> str:  # never show a token in a log or a traceback
        return f"TokenChange({self.action.name})"


def mirror_problem(url: str) -> str:
    """What is wrong with a release mirror URL, or "" (empty means GitHub)."""
    if url and not url.startswith(("http://", "https://")):
        return "The release mirror must be an http:// or https:// address."
    return ""


def workers_problem(text: str) -> str:
    try:
        parse_workers(text.strip())
    except ConfigError as err:
        return str(err)
    return ""


def worker_problem(host: str, port: int, allow_network: bool) -> str:
    """What stops this machine's worker from listening on ``host:port``, or ""."""
    try:
        exposure_warning(worker_endpoint(host, port), allow_network)
    except ConfigError as err:
        return f"Worker: {err}"
    return ""


def caps_problem(text: str) -> str:
    try:
        parse_caps(text.strip())
    except ConfigError as err:
        return str(err)
    return ""


def _seconds(value: float, limits: tuple[int, int], parent: QWidget) -> QSpinBox:
    box = QSpinBox(parent)
    box.setRange(*limits)
    box.setSuffix(" s")
    box.setSingleStep(10)
    box.setValue(round(value))
    return box


def _form(title: str, parent: QWidget) -> tuple[QGroupBox, QFormLayout]:
    group = QGroupBox(title, parent)
    form = QFormLayout(group)
    # Text fields take the width; spin boxes keep their natural size instead of stretching across.
    form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.ExpandingFieldsGrow)
    return group, form


def _page(parent: QWidget, *sections: QWidget) -> QWidget:
    page = QWidget(parent)
    layout = QVBoxLayout(page)
    for section in sections:
        layout.addWidget(section)
    layout.addStretch(1)
    return page


class SettingsDialog(QDialog):
    """Save emits ``applied``; the app closes the dialog (``accept()``) once it has saved them."""

    applied = Signal(object, object)  # Settings, TokenChange

    def __init__(self, settings: Settings, has_token: bool, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.setMinimumWidth(600)
        self._settings = settings
        self._delete_token = False

        self.token = QLineEdit(self)
        self.token.setEchoMode(QLineEdit.EchoMode.Password)
        self.token.textEdited.connect(self._token_typed)
        self.remove_token = QPushButton("Remove", self)
        self.remove_token.setToolTip("Remove the stored token from the keychain")
        self.remove_token.clicked.connect(self._remove_token)
        self.set_has_token(has_token)
        token_row = QHBoxLayout()
        token_row.addWidget(self.token, 1)
        token_row.addWidget(self.remove_token)

        self.mirror = QLineEdit(settings.release_mirror, self)
        self.mirror.setPlaceholderText("https://github.com")
        self.mirror.textChanged.connect(self._validate)
        self.models_dir = QLineEdit(settings.models_dir, self)
        self.models_dir.setPlaceholderText("The Hugging Face cache when empty")
        self.models_dir.setToolTip("Empty: HF_HUB_CACHE, else the hub folder in HF_HOME, else the default")
        browse = QPushButton("Browse…", self)
        browse.clicked.connect(self._browse)
        models_row = QHBoxLayout()
        models_row.addWidget(self.models_dir, 1)
        models_row.addWidget(browse)

        self.llama_server = QLineEdit(settings.llama_server_path, self)
        self.llama_server.setPlaceholderText("Found on PATH when empty")
        self.llama_server.setToolTip("Your own llama-server binary, run by the llama.cpp “system” backend")
        self.llama_server.textChanged.connect(self._validate)
        browse_server = QPushButton("Browse…", self)
        browse_server.clicked.connect(self._browse_llama_server)
        server_row = QHBoxLayout()
        server_row.addWidget(self.llama_server, 1)
        server_row.addWidget(browse_server)
        caps = settings.max_loaded_models
        self.max_loaded = QLineEdit(str(caps) if isinstance(caps, int) else json.dumps(caps), self)
        self.max_loaded.setPlaceholderText('2, or {"gpu": 1, "cpu": 2}')
        self.max_loaded.setToolTip(
            "How many models may be loaded at once: a number, or per-device caps such as "
            '{"gpu": 1, "cpu": 2, "total": 3}. The least recently used model makes room; pinned ones '
            "never do."
        )
        self.max_loaded.textChanged.connect(self._validate)
        self.idle_unload = QSpinBox(self)
        self.idle_unload.setRange(0, MAX_IDLE_MINUTES)
        self.idle_unload.setSuffix(" min")
        self.idle_unload.setSpecialValueText("never")
        self.idle_unload.setValue(settings.idle_unload_minutes)
        self.idle_unload.setToolTip("Unload a model (unless pinned) after this long without a request")
        self.load_timeout = _seconds(settings.load_timeout_s, LOAD_TIMEOUT_RANGE_S, self)
        self.load_timeout.setToolTip("How long a model may take to load before the load fails")
        self.request_timeout = _seconds(settings.request_timeout_s, REQUEST_TIMEOUT_RANGE_S, self)
        self.request_timeout.setToolTip(
            "How long a reply that is not streamed may take (streamed replies have no limit)"
        )
        self.keep_in_tray = QCheckBox("Keep running in the tray when the window is closed", self)
        self.keep_in_tray.setChecked(settings.keep_in_tray)
        self.api_enabled = QCheckBox("Serve the local API on 127.0.0.1 for other apps", self)
        self.api_enabled.setToolTip("OpenAI-compatible under /v1, Lemonade-compatible under /api/v1")
        self.api_enabled.setChecked(settings.api_enabled)
        self.api_port = QSpinBox(self)
        self.api_port.setRange(0, 65535)
        self.api_port.setSpecialValueText("any free port")
        self.api_port.setValue(settings.api_port)
        self.api_enabled.toggled.connect(self.api_port.setEnabled)
        self.api_port.setEnabled(settings.api_enabled)
        self.ollama_enabled = QCheckBox("Also answer on Ollama's port, for Ollama's clients", self)
        self.ollama_enabled.setToolTip(
            "Ollama's API (/api/tags, /api/chat, ...) and the rest, on the port Ollama's clients use by "
            f"default ({OLLAMA_PORT}). Stop Ollama first if it runs here."
        )
        self.ollama_enabled.setChecked(settings.ollama_port != 0)
        self.ollama_port = QSpinBox(self)
        self.ollama_port.setRange(1, 65535)
        self.ollama_port.setValue(settings.ollama_port or OLLAMA_PORT)
        self.ollama_enabled.toggled.connect(lambda _on: self._enable_ollama())
        self.api_enabled.toggled.connect(lambda _on: self._enable_ollama())
        self._enable_ollama()

        self.rpc_workers = QLineEdit(settings.rpc_workers, self)
        self.rpc_workers.setPlaceholderText("192.168.1.20:50052, 192.168.1.21:50052")
        self.rpc_workers.setToolTip(
            "llama.cpp models are spread over these RPC workers (`lemon-desk worker` on each machine): "
            "layers and KV cache go where the memory is. A model's own rpc option overrides this list."
        )
        self.rpc_workers.textChanged.connect(self._validate)
        self.worker_enabled = QCheckBox("Run an RPC worker here, for models loaded on other machines", self)
        self.worker_enabled.setChecked(settings.worker_enabled)
        self.worker_host = QLineEdit(settings.worker_host, self)
        self.worker_host.setToolTip("127.0.0.1 keeps it to this machine (reach it through an SSH tunnel)")
        self.worker_port = QSpinBox(self)
        self.worker_port.setRange(1, 65535)
        self.worker_port.setValue(settings.worker_port or DEFAULT_WORKER_PORT)
        self.worker_network = QCheckBox("Allow other machines to use it (no password, no encryption)", self)
        self.worker_network.setChecked(settings.worker_allow_network)
        self.worker_network.setToolTip(
            "llama.cpp's RPC protocol has no authentication: anyone who reaches the address can use it. "
            "Only on a private network you trust."
        )
        for widget in (self.worker_host, self.worker_port, self.worker_network):
            self.worker_enabled.toggled.connect(widget.setEnabled)
            widget.setEnabled(settings.worker_enabled)
        for signal in (self.worker_enabled.toggled, self.worker_network.toggled):
            signal.connect(self._validate)
        self.worker_host.textChanged.connect(self._validate)
        self.worker_port.valueChanged.connect(self._validate)
        worker_row = QHBoxLayout()
        worker_row.addWidget(self.worker_host, 1)
        worker_row.addWidget(self.worker_port)

        downloads, form = _form("Downloads", self)
        form.addRow("Hugging Face token", token_row)
        form.addRow("Models folder", models_row)
        form.addRow("Release mirror", self.mirror)
        engines, form = _form("Engines", self)
        form.addRow("llama-server path", server_row)
        form.addRow("Max loaded models", self.max_loaded)
        form.addRow("Unload when idle for", self.idle_unload)
        form.addRow("Load timeout", self.load_timeout)
        form.addRow("Request timeout", self.request_timeout)
        api, form = _form("Local API", self)
        form.addRow(self.api_enabled)
        form.addRow("Port", self.api_port)
        form.addRow(self.ollama_enabled)
        form.addRow("Ollama's port", self.ollama_port)
        cluster, form = _form("Other machines (llama.cpp RPC)", self)
        form.addRow("Workers", self.rpc_workers)
        form.addRow(self.worker_enabled)
        form.addRow("Worker address", worker_row)
        form.addRow(self.worker_network)
        boxes = (self.idle_unload, self.load_timeout, self.request_timeout, self.api_port, self.ollama_port)
        width = max(box.sizeHint().width() for box in boxes)
        for box in boxes:
            box.setMinimumWidth(width)  # one column of equal boxes
        groups = (downloads, engines, api, cluster)
        labels = [label for group in groups for label in group.findChildren(QLabel)]
        label_width = max(label.sizeHint().width() for label in labels)
        for label in labels:
            label.setMinimumWidth(label_width)  # both groups' fields start at the same x
        remotes, form = _form("Remotes", self)
        self.remotes = RemotesEditor(self)  # applies at once, not on Save
        form.addRow(self.remotes)
        mcp, form = _form("MCP servers", self)
        self.mcp = McpEditor(self)  # applies at once, not on Save
        form.addRow(self.mcp)
        self.tool_rounds = QSpinBox(self)
        self.tool_rounds.setRange(1, MAX_TOOL_ROUNDS)
        self.tool_rounds.setValue(settings.tool_rounds)
        self.tool_rounds.setToolTip("Tool rounds one reply may take; past them the calls are not run")
        self.tool_timeout = _seconds(settings.tool_timeout_s, TOOL_TIMEOUT_RANGE_S, self)
        self.tool_timeout.setToolTip("A call that takes longer goes back to the model as an error")
        calls, form = _form("Tool calls", self)
        form.addRow("Rounds per reply", self.tool_rounds)
        form.addRow("Time limit per call", self.tool_timeout)
        self.problem = QLabel(self)
        self.problem.setStyleSheet("color: #c0392b;")
        self.problem.setWordWrap(True)
        self.problem.hide()
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel, self
        )
        self.buttons.accepted.connect(self._save)
        self.buttons.rejected.connect(self.reject)
        # Two pages, so the dialog fits a 768-pixel-high laptop screen: this machine's models and
        # engines, and what connects to other apps and machines.
        self.pages = QTabWidget(self)
        self.pages.addTab(_page(self, downloads, engines, self.keep_in_tray), "&General")
        self.pages.addTab(_page(self, api, cluster, remotes), "&Connections")
        self.pages.addTab(_page(self, mcp, calls), "&Tools")
        layout = QVBoxLayout(self)
        layout.addWidget(self.pages, 1)
        layout.addWidget(self.problem)
        layout.addWidget(self.buttons)
        self.folder_dialog: QFileDialog | None = None
        self._validate()

    def set_has_token(self, has_token: bool) -> None:
        """Whether the keychain holds a token (read in a worker thread, so perhaps after opening)."""
        if self._delete_token:
            return
        self.token.setPlaceholderText(
            "Stored in the system keychain (type to replace)" if has_token else "hf_… (for gated models)"
        )
        self.remove_token.setEnabled(has_token)

    def _token_typed(self, text: str) -> None:
        if text:
            self._delete_token = False

    def _remove_token(self) -> None:
        self._delete_token = True
        self.token.clear()
        self.token.setPlaceholderText("The token will be removed when you save")
        self.remove_token.setEnabled(False)

    def _browse(self) -> None:
        self._choose("Models folder", self.models_dir, QFileDialog.FileMode.Directory)

    def _browse_llama_server(self) -> None:
        self._choose("llama-server", self.llama_server, QFileDialog.FileMode.ExistingFile)

    def _choose(self, title: str, field: QLineEdit, mode: QFileDialog.FileMode) -> None:
        dialog = QFileDialog(self, title, field.text() or str(Path.home()))
        dialog.setFileMode(mode)
        if mode is QFileDialog.FileMode.Directory:
            dialog.setOption(QFileDialog.Option.ShowDirsOnly)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.fileSelected.connect(field.setText)
        self.folder_dialog = dialog
        dialog.open()

    def _llama_server_path(self) -> str:
        text = self.llama_server.text().strip()
        return str(Path(text).expanduser()) if text else ""

    def _enable_ollama(self) -> None:
        self.ollama_enabled.setEnabled(self.api_enabled.isChecked())
        self.ollama_port.setEnabled(self.api_enabled.isChecked() and self.ollama_enabled.isChecked())

    def _validate(self) -> bool:
        mirror = self.mirror.text().strip()
        problem = (
            mirror_problem(mirror)
            or llama_server_problem(self._llama_server_path())
            or caps_problem(self.max_loaded.text())
            or workers_problem(self.rpc_workers.text())
            or (self._worker_problem() if self.worker_enabled.isChecked() else "")
        )
        self.problem.setText(problem)
        self.problem.setVisible(bool(problem))
        self.buttons.button(QDialogButtonBox.StandardButton.Save).setEnabled(not problem)
        return not problem

    def _worker_problem(self) -> str:
        return worker_problem(
            self.worker_host.text(), self.worker_port.value(), self.worker_network.isChecked()
        )

    def _save(self) -> None:
        if not self._validate():
            return
        settings = dataclasses.replace(
            self._settings,
            release_mirror=self.mirror.text().strip(),
            models_dir=self.models_dir.text().strip(),
            llama_server_path=self._llama_server_path(),
            max_loaded_models=parse_caps(self.max_loaded.text().strip()).to_json(),
            idle_unload_minutes=self.idle_unload.value(),
            load_timeout_s=float(self.load_timeout.value()),
            request_timeout_s=float(self.request_timeout.value()),
            keep_in_tray=self.keep_in_tray.isChecked(),
            api_enabled=self.api_enabled.isChecked(),
            api_port=self.api_port.value(),
            ollama_port=self.ollama_port.value() if self.ollama_enabled.isChecked() else 0,
            rpc_workers=self.rpc_workers.text().strip(),
            worker_enabled=self.worker_enabled.isChecked(),
            worker_host=self.worker_host.text().strip(),
            worker_port=self.worker_port.value(),
            worker_allow_network=self.worker_network.isChecked(),
            tool_rounds=self.tool_rounds.value(),
            tool_timeout_s=float(self.tool_timeout.value()),
        )
        typed = self.token.text().strip()
        if typed:
            change = TokenChange(TokenAction.SET, typed)
        elif self._delete_token:
            change = TokenChange(TokenAction.DELETE)
        else:
            change = TokenChange(TokenAction.KEEP)
        self.token.clear()
        self.buttons.setEnabled(False)  # until the app has saved them and closes the dialog
        self.applied.emit(settings, change)
