"""The Model Manager and the options panel, driven through their widgets (no engine needed here).

The hardware is the cpu_only_x86 profile (a stand-in for this machine's probe, so that which backends
are unsupported does not depend on the machine the tests run on)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox
from pytestqt.qtbot import QtBot

from app.core.status import Status
from app.store.model_options import ModelOptions
from app.ui.desktop import DesktopApp
from app.ui.options_panel import ctx_from_slider, slider_from_ctx
from tests.conftest import profile_path
from tests.gui.conftest import quit_and_wait
from tests.support.modelfiles import gguf_files

MODEL = "Qwen3-0.6B-GGUF"


@pytest.fixture(autouse=True)
def cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path("cpu_only_x86")))


def select(app: DesktopApp, name: str) -> None:
    app.window.models.select(name)
    assert app.window.options.model == name


def test_every_catalog_model_is_listed_and_the_filters_narrow_the_list(
    qtbot: QtBot, desktop: Callable[[], DesktopApp], tmp_path: Path
) -> None:
    app = desktop()
    models = app.window.models
    names = models.visible_names()
    assert {"Qwen3-0.6B-MLX", MODEL, "SmolLM2-135M-Instruct-GGUF"} <= set(names)
    assert {models.row(n).status.status for n in names} == {Status.NOT_DOWNLOADED}
    qtbot.keyClicks(models.search, "smollm2 135")
    assert models.visible_names() == ["SmolLM2-135M-Instruct-GGUF"]
    models.search.clear()
    models.recipe.setCurrentIndex(models.recipe.findData("lemon-mlx"))
    assert models.visible_names() == ["Qwen3-0.6B-MLX", "Qwen3-4B-MLX"]
    models.recipe.setCurrentIndex(0)
    models.label.setCurrentIndex(models.label.findData("tiny"))
    assert models.visible_names() == ["SmolLM2-135M-Instruct-GGUF", "SmolLM2-360M-Instruct-GGUF"]
    models.label.setCurrentIndex(0)

    models.downloaded_only.setChecked(True)
    assert models.visible_names() == []
    gguf = tmp_path / "tiny-llama.gguf"
    gguf.write_bytes(gguf_files("tiny-llama")["tiny-llama.gguf"])
    with qtbot.waitSignal(app.bridge.model_added):
        models.add(str(gguf))
    assert models.visible_names() == ["user.tiny-llama"]
    row = models.row("user.tiny-llama")
    assert row.status.status is Status.DOWNLOADED and row.model.recipe == "llamacpp" and row.model.user
    assert models.selected() == "user.tiny-llama" and models.load_button.isEnabled()
    assert app.tray.load_actions().keys() == {"user.tiny-llama"}


def test_adding_a_file_that_is_not_a_model_says_why(
    qtbot: QtBot, desktop: Callable[[], DesktopApp], tmp_path: Path
) -> None:
    app = desktop()
    fake = tmp_path / "notes.gguf"
    fake.write_text("not a model")
    with qtbot.waitSignal(app.bridge.error) as error:
        app.window.models.add(str(fake))
    assert error.args[0] == "The file is not a GGUF model (no GGUF magic at its start)."
    assert "user.notes" not in app.window.models.visible_names()


def test_a_reserved_flag_is_flagged_as_it_is_typed(qtbot: QtBot, desktop: Callable[[], DesktopApp]) -> None:
    app = desktop()
    select(app, MODEL)
    options = app.window.options
    qtbot.keyClicks(options.args, "--threads 2 --po")
    assert options.args_message.isHidden() and options.save_button.isEnabled()
    qtbot.keyClicks(options.args, "rt 9000")
    assert options.args_message.isVisibleTo(options)
    assert options.args_message.text() == (
        "The extra engine argument --port is set by Lemon Desk. Remove it from the extra arguments."
    )
    assert not options.save_button.isEnabled() and not options.load_button.isEnabled()
    options.args.setText("--threads 2 -c 8192")
    assert "Use the context size option instead." in options.args_message.text()
    options.args.setText("--threads 2")
    assert options.args_message.isHidden() and options.save_button.isEnabled()


def test_unsupported_backends_are_disabled_with_their_reason(
    qtbot: QtBot, desktop: Callable[[], DesktopApp]
) -> None:
    app = desktop()
    select(app, MODEL)
    combo = app.window.options.backend
    assert app.bridge.info is not None
    statuses = app.bridge.info.recipes["llamacpp"].backends
    assert combo.itemData(0) == "" and combo.itemText(0).startswith("Auto")
    for name, status in statuses.items():
        index = combo.findData(name)
        item = combo.model().item(index)
        assert item.isEnabled() == (status.state.value != "unsupported"), name
        if not item.isEnabled():
            assert item.toolTip() == status.message
    assert combo.model().item(combo.findData("cuda")).toolTip().startswith("CUDA builds need an NVIDIA GPU")
    assert combo.model().item(combo.findData("cpu")).isEnabled()


def test_saved_options_come_back_after_a_restart(qtbot: QtBot, desktop: Callable[[], DesktopApp]) -> None:
    app = desktop()
    select(app, MODEL)
    options = app.window.options
    options.backend.setCurrentIndex(options.backend.findData("cpu"))
    options.ctx_auto.setChecked(False)
    options.ctx_slider.setValue(slider_from_ctx(16384))
    assert options.ctx_value.text() == "16,384"
    options.args.setText("--threads 2")
    options.temperature.setValue(0.2)
    options.max_tokens.setValue(512)
    qtbot.mouseClick(options.save_button, Qt.MouseButton.LeftButton)
    saved = ModelOptions("cpu", 16384, "--threads 2", 0.2, options.top_p.value(), 512)
    assert options.current() == saved
    assert app.window.chat.temperature.value() == 0.2  # the sampling defaults apply to the chat
    quit_and_wait(qtbot, app)

    again = desktop()
    select(again, MODEL)
    assert again.window.options.current() == saved
    assert again.window.chat.max_tokens.value() == 512
    select(again, "Qwen3-1.7B-GGUF")
    assert again.window.options.current().ctx_size is None  # options are per model


def test_the_context_slider_is_logarithmic() -> None:
    assert [ctx_from_slider(slider_from_ctx(n)) for n in (512, 4096, 32768, 262144)] == [
        512,
        4096,
        32768,
        262144,
    ]
    assert ctx_from_slider(1) - ctx_from_slider(0) < ctx_from_slider(33) - ctx_from_slider(32)


def test_delete_asks_first_then_takes_an_imported_model_off_the_list(
    qtbot: QtBot, desktop: Callable[[], DesktopApp], tmp_path: Path
) -> None:
    app = desktop()
    models = app.window.models
    gguf = tmp_path / "tiny-llama.gguf"
    gguf.write_bytes(gguf_files("tiny-llama")["tiny-llama.gguf"])
    with qtbot.waitSignal(app.bridge.model_added):
        models.add(str(gguf))
    models.delete_button.click()
    box = app.window.findChild(QMessageBox)
    assert box is not None and "Delete user.tiny-llama?" in box.text()
    box.button(QMessageBox.StandardButton.Cancel).click()
    assert models.row("user.tiny-llama") is not None
    models.delete_button.click()
    box = next(b for b in app.window.findChildren(QMessageBox) if b.isVisible())
    with qtbot.waitSignal(app.tray.notified) as notified:
        box.button(QMessageBox.StandardButton.Yes).click()
    assert notified.args[0] == "Removed" and "files at" in notified.args[1]
    qtbot.waitUntil(lambda: models.row("user.tiny-llama") is None)
    assert gguf.exists(), "an imported model's file is left where it is"


def test_the_options_row_action_shows_the_options_tab(
    qtbot: QtBot, desktop: Callable[[], DesktopApp]
) -> None:
    app = desktop()
    app.window.side.setCurrentWidget(app.window.logs)
    app.window.models.options_requested.emit(MODEL)
    assert app.window.side.currentWidget() is app.window.options
    assert app.window.options.model == MODEL and app.window.models.selected() == MODEL


def test_the_options_offer_what_the_recipe_s_engine_knows_and_sizes_read_whole(
    qtbot: QtBot, desktop: Callable[[], DesktopApp]
) -> None:
    app = desktop()
    options = app.window.options
    select(app, "Qwen3-0.6B-MLX")
    # lemon-mlx ignores flags it does not know: llama.cpp's would mislead; workers serve llama.cpp alone
    assert (
        "--kv-bits" in options.args.placeholderText() and "--flash-attn" not in options.args.placeholderText()
    )
    assert options.rpc.isHidden()
    select(app, MODEL)
    assert "--flash-attn" in options.args.placeholderText()
    assert not options.rpc.isHidden()
    item = app.window.models.tree.currentItem()
    assert item.text(2).endswith(" MB") and not item.text(2).startswith("0"), item.text(2)


def test_saving_in_the_panel_keeps_the_options_it_does_not_show(
    qtbot: QtBot, desktop: Callable[[], DesktopApp]
) -> None:
    app = desktop()
    app.bridge.router.save_options(MODEL, ModelOptions(reasoning_format="hidden"))  # set by the local API
    select(app, "SmolLM2-135M-Instruct-GGUF")
    select(app, MODEL)
    options = app.window.options
    options.args.setText("--threads 2")
    qtbot.mouseClick(options.save_button, Qt.MouseButton.LeftButton)
    saved = app.bridge.router.options(MODEL)
    assert (saved.args, saved.reasoning_format) == ("--threads 2", "hidden")
