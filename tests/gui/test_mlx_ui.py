"""The window on the lemon-mlx recipe: a real MLX model (tests/support/mlx_model.py: tiny, random
weights) imported, its backend set to ``lemon-mlx:mlx-lm`` in the options, loaded with the Model
Manager's Load button and chatted with through mlx-lm's real server (real tokens, real SSE).

The mlx-lm backend is the test venv (tests/support/mlx_env.py: the app's pinned mlx[cpu] and mlx-lm),
laid out as the app's install of it (its folders linked, the app's manifest beside them): the install
itself, from the package index, is tested in tests/integration/mlx/test_mlx_lm_install.py."""

from __future__ import annotations

import platform
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from app.core.chat import MessageState
from app.core.status import Status
from app.store.catalog import load_backend_versions
from app.store.installs import InstallManifest, install_dir, write_manifest
from app.ui.desktop import DesktopApp
from tests.conftest import profile_path
from tests.support.mlx_env import mlx_venv, tiny_mlx_model

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        sys.platform != "linux" or platform.machine() != "x86_64",
        reason="the test venv holds mlx[cpu]'s Linux x86_64 wheels",
    ),
]
LOAD_MS = 180_000
REPLY_MS = 120_000


def link_mlx_lm_install(venv: Path) -> Path:
    """The test venv as the app's ``lemon-mlx:mlx-lm`` install: a venv's python finds its packages
    through the ``pyvenv.cfg`` beside the folder it is started from, so linking the folders will do."""
    folder = install_dir("lemon-mlx", "mlx-lm")
    folder.mkdir(parents=True)
    for entry in venv.iterdir():
        if entry.name == "pyvenv.cfg":
            shutil.copy(entry, folder / entry.name)
        else:
            (folder / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    spec = load_backend_versions().spec("lemon-mlx", "mlx-lm")
    write_manifest(folder, InstallManifest(spec.version, " ".join(spec.packages["linux"]), ""))
    return folder


def test_an_mlx_model_loads_on_mlx_lm_from_the_model_manager_and_answers(
    qtbot: QtBot, desktop: Callable[[], DesktopApp], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path("cpu_only_x86")))
    model_dir = tiny_mlx_model()
    link_mlx_lm_install(mlx_venv())
    app = desktop()
    window, models, options = app.window, app.window.models, app.window.options
    with qtbot.waitSignal(app.bridge.model_added, timeout=30_000) as added:
        models.add(str(model_dir))  # what "Add model… > MLX folder…" does with a folder
    name = added.args[0]
    assert models.selected() == name and options.model == name
    row = models.row(name)
    assert row is not None and row.model.recipe == "lemon-mlx"
    item = models.tree.currentItem()
    assert item.text(1) == "lemon-mlx", (row.size_bytes, row.fit, row.fit_exact, row.fit_note)
    assert item.text(4) == "● fits", (row.size_bytes, row.fit, row.fit_exact, row.fit_note)
    assert "KV cache" in item.toolTip(4)
    assert window.center.currentWidget() is window.chat, "a model is here: no welcome"

    index = options.backend.findData("mlx-lm")
    assert index >= 0 and "installed" in options.backend.itemText(index)
    options.backend.setCurrentIndex(index)
    options.save_button.click()
    assert app.bridge.options(name).backend == "mlx-lm"
    models.load_button.click()
    qtbot.waitUntil(lambda: models.row(name).status.status is Status.LOADED, timeout=LOAD_MS)
    engine = app.bridge.router.supervisor.engine(name)
    assert (engine.request.recipe, engine.request.backend) == ("lemon-mlx", "mlx-lm")
    assert window.logs.shown_lines(), "mlx-lm's output shows in the Logs tab"

    chat = window.chat
    chat.max_tokens.setValue(16)
    chat.composer.setPlainText("Hello there")
    chat.submit()
    qtbot.waitUntil(
        lambda: len(chat.messages()) == 2 and chat.messages()[-1].state is not MessageState.STREAMING,
        timeout=REPLY_MS,
    )
    reply = chat.messages()[-1]
    assert reply.state is MessageState.COMPLETE, reply.error
    assert reply.content  # gibberish from random weights, but real tokens streamed by mlx-lm
    assert reply.telemetry and reply.telemetry.get("completion_tokens")
