"""The settings dialog. It never holds a stored token: only whether one exists, and a new one if typed."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.store.settings import Settings

MAX_LOADED_MODELS = 16


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


class SettingsDialog(QDialog):
    applied = Signal(object, object)  # Settings, TokenChange

    def __init__(self, settings: Settings, has_token: bool, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.setMinimumWidth(520)
        self._settings = settings
        self._delete_token = False

        self.token = QLineEdit(self)
        self.token.setEchoMode(QLineEdit.EchoMode.Password)
        self.token.setPlaceholderText(
            "Stored in the system keychain (type to replace)" if has_token else "hf_… (for gated models)"
        )
        self.token.textEdited.connect(self._token_typed)
        self.remove_token = QPushButton("Remove", self)
        self.remove_token.setToolTip("Remove the stored token from the keychain")
        self.remove_token.setEnabled(has_token)
        self.remove_token.clicked.connect(self._remove_token)
        token_row = QHBoxLayout()
        token_row.addWidget(self.token, 1)
        token_row.addWidget(self.remove_token)

        self.mirror = QLineEdit(settings.release_mirror, self)
        self.mirror.setPlaceholderText("https://github.com")
        self.mirror.textChanged.connect(self._validate)
        self.models_dir = QLineEdit(settings.models_dir, self)
        self.models_dir.setPlaceholderText("The Hugging Face cache (HF_HUB_CACHE, HF_HOME or the default)")
        browse = QPushButton("Browse…", self)
        browse.clicked.connect(self._browse)
        models_row = QHBoxLayout()
        models_row.addWidget(self.models_dir, 1)
        models_row.addWidget(browse)
        self.max_loaded = QSpinBox(self)
        self.max_loaded.setRange(1, MAX_LOADED_MODELS)
        self.max_loaded.setValue(settings.max_loaded_models)
        self.keep_in_tray = QCheckBox("Keep running in the tray when the window is closed", self)
        self.keep_in_tray.setChecked(settings.keep_in_tray)

        form = QFormLayout()
        form.addRow("Hugging Face token", token_row)
        form.addRow("Release mirror", self.mirror)
        form.addRow("Models folder", models_row)
        form.addRow("Max loaded models", self.max_loaded)
        form.addRow("", self.keep_in_tray)
        self.problem = QLabel(self)
        self.problem.setStyleSheet("color: #c0392b;")
        self.problem.hide()
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel, self
        )
        self.buttons.accepted.connect(self._save)
        self.buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.problem)
        layout.addWidget(self.buttons)
        self.folder_dialog: QFileDialog | None = None

    def _token_typed(self, text: str) -> None:
        if text:
            self._delete_token = False

    def _remove_token(self) -> None:
        self._delete_token = True
        self.token.clear()
        self.token.setPlaceholderText("The token will be removed when you save")
        self.remove_token.setEnabled(False)

    def _browse(self) -> None:
        dialog = QFileDialog(self, "Models folder", self.models_dir.text())
        dialog.setFileMode(QFileDialog.FileMode.Directory)
        dialog.setOption(QFileDialog.Option.ShowDirsOnly)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.fileSelected.connect(self.models_dir.setText)
        self.folder_dialog = dialog
        dialog.open()

    def _validate(self) -> bool:
        problem = mirror_problem(self.mirror.text().strip())
        self.problem.setText(problem)
        self.problem.setVisible(bool(problem))
        self.buttons.button(QDialogButtonBox.StandardButton.Save).setEnabled(not problem)
        return not problem

    def _save(self) -> None:
        if not self._validate():
            return
        settings = dataclasses.replace(
            self._settings,
            release_mirror=self.mirror.text().strip(),
            models_dir=self.models_dir.text().strip(),
            max_loaded_models=self.max_loaded.value(),
            keep_in_tray=self.keep_in_tray.isChecked(),
        )
        typed = self.token.text().strip()
        if typed:
            change = TokenChange(TokenAction.SET, typed)
        elif self._delete_token:
            change = TokenChange(TokenAction.DELETE)
        else:
            change = TokenChange(TokenAction.KEEP)
        self.token.clear()
        self.applied.emit(settings, change)
        self.accept()
