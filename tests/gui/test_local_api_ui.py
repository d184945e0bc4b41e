"""The window runs the local API: on by default, its URL in the tray (with a copy action), a port already
taken said plainly with the app going on without it, and another app's request on the Telemetry charts;
the second listener on Ollama's port started and stopped from Settings, and its port taken said."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QDialogButtonBox
from pytestqt.qtbot import QtBot

from app.core.net import OLLAMA_PORT
from app.store.settings import Settings, load_settings, save_settings
from app.ui.desktop import DesktopApp
from app.ui.settings_dialog import SettingsDialog
from tests.support.standin import make_standin_model

Desktop = Callable[[], DesktopApp]


def test_the_local_api_is_on_by_default_and_the_tray_shows_its_url(qtbot: QtBot, desktop: Desktop) -> None:
    assert Settings().api_enabled and Settings().api_port == 13305  # what a user gets
    save_settings(Settings(api_port=0))  # on, on any free port: tests must not collide
    app = desktop()
    qtbot.waitUntil(lambda: app.tray.api_url != "", timeout=30_000)
    url = app.tray.api_url
    assert url.startswith("http://127.0.0.1:") and app.tray.api_action.isEnabled()
    assert app.tray.api_action.text() == f"Local API: {url}/v1 (copy)"
    app.tray.api_action.trigger()
    assert QGuiApplication.clipboard().text() == f"{url}/v1"
    answer: list[httpx.Response] = []

    async def ask() -> None:
        async with httpx.AsyncClient() as client:
            answer.append(await client.get(f"{url}/v1/models"))

    task = asyncio.ensure_future(ask())
    qtbot.waitUntil(task.done, timeout=30_000)
    assert answer[0].status_code == 200 and answer[0].json()["object"] == "list"


def test_a_port_taken_is_said_and_the_window_runs_without_the_api(qtbot: QtBot, desktop: Desktop) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        save_settings(dataclasses.replace(load_settings().settings, api_port=port))
        told: list[str] = []
        original = DesktopApp._warn
        DesktopApp._warn = lambda self, message: told.append(message)  # type: ignore[method-assign]
        try:
            app = desktop()
            qtbot.waitUntil(lambda: bool(told), timeout=30_000)
        finally:
            DesktopApp._warn = original  # type: ignore[method-assign]
    assert f"could not listen on 127.0.0.1:{port}" in told[0] and "choose another port in Settings" in told[0]
    assert app.tray.api_url == "" and not app.tray.api_action.isEnabled()
    assert app.window.isVisible(), "the window goes on without the API"


def test_a_request_through_the_api_shows_on_the_windows_telemetry(
    qtbot: QtBot, desktop: Desktop, standin_settings: Settings, tmp_path: Path
) -> None:
    save_settings(dataclasses.replace(standin_settings, api_port=0))
    app = desktop()
    model = app.bridge.router.library.import_path(make_standin_model(tmp_path, "api", tokens=12))
    options = dataclasses.replace(app.bridge.options(model.name), backend="system")
    app.bridge.router.save_options(model.name, options)
    qtbot.waitUntil(lambda: app.tray.api_url != "", timeout=30_000)
    app.window.side.setCurrentWidget(app.window.telemetry)
    qtbot.waitUntil(lambda: app._telemetry_loaded, timeout=30_000)
    before = app.window.telemetry.requests
    answer: list[httpx.Response] = []

    async def ask() -> None:
        async with httpx.AsyncClient(timeout=60) as client:
            body = {"model": model.name, "messages": [{"role": "user", "content": "hi"}]}
            answer.append(await client.post(f"{app.tray.api_url}/v1/chat/completions", json=body))

    task = asyncio.ensure_future(ask())
    qtbot.waitUntil(task.done, timeout=60_000)
    assert answer[0].status_code == 200, answer[0].text
    qtbot.waitUntil(lambda: app.window.telemetry.requests == before + 1)


def test_the_ollama_port_setting_starts_and_stops_the_second_listener(
    qtbot: QtBot, desktop: Desktop, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_from_the_environment")  # the keychain is not asked
    save_settings(Settings(api_port=0))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    app = desktop()
    qtbot.waitUntil(lambda: app.tray.api_url != "", timeout=30_000)
    root = f"http://127.0.0.1:{port}/"

    def answered() -> list[int | str]:
        seen: list[int | str] = []

        async def ask() -> None:
            try:
                async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
                    seen.append((await client.get(f"{root}api/version")).status_code)
            except httpx.ConnectError:
                seen.append("refused")

        task = asyncio.ensure_future(ask())
        qtbot.waitUntil(task.done, timeout=30_000)
        return seen

    assert answered() == ["refused"]  # off by default
    for on in (True, False):
        app.open_settings()
        dialog = app.dialog
        assert isinstance(dialog, SettingsDialog)
        qtbot.waitExposed(dialog)
        assert dialog.ollama_enabled.isChecked() is not on and dialog.ollama_port.value() == (
            OLLAMA_PORT if on else port
        )
        dialog.ollama_enabled.setChecked(on)
        dialog.ollama_port.setValue(port)
        save = dialog.buttons.button(QDialogButtonBox.StandardButton.Save)
        with qtbot.waitSignal(dialog.finished):
            qtbot.mouseClick(save, Qt.MouseButton.LeftButton)
        assert load_settings().settings.ollama_port == (port if on else 0)
        qtbot.waitUntil(lambda on=on: answered() == ([200] if on else ["refused"]), timeout=30_000)


def test_an_ollama_port_taken_is_said_and_the_api_goes_on(qtbot: QtBot, desktop: Desktop) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        save_settings(Settings(api_port=0, ollama_port=port))
        told: list[str] = []
        original = DesktopApp._warn
        DesktopApp._warn = lambda self, message: told.append(message)  # type: ignore[method-assign]
        try:
            app = desktop()
            qtbot.waitUntil(lambda: bool(told), timeout=30_000)
        finally:
            DesktopApp._warn = original  # type: ignore[method-assign]
    assert f"Ollama's port 127.0.0.1:{port}: the port is taken" in told[0] and "Settings" in told[0]
    assert app.tray.api_url.startswith("http://127.0.0.1:"), "the API goes on on its own port"


def test_a_request_in_each_dialect_shows_on_the_telemetry_with_its_dialect(
    qtbot: QtBot, desktop: Desktop, standin_settings: Settings, tmp_path: Path
) -> None:
    save_settings(dataclasses.replace(standin_settings, api_port=0))
    app = desktop()
    model = app.bridge.router.library.import_path(make_standin_model(tmp_path, "api", tokens=6))
    options = dataclasses.replace(app.bridge.options(model.name), backend="system")
    app.bridge.router.save_options(model.name, options)
    qtbot.waitUntil(lambda: app.tray.api_url != "", timeout=30_000)
    view = app.window.telemetry
    app.window.side.setCurrentWidget(view)
    qtbot.waitUntil(lambda: app._telemetry_loaded, timeout=30_000)
    hi = [{"role": "user", "content": "hi"}]
    asked = [
        ("/v1/chat/completions", {"model": model.name, "messages": hi, "stream": True}),
        ("/api/v1/chat/completions", {"model": model.name, "messages": hi}),
        ("/v1/messages", {"model": model.name, "messages": hi, "max_tokens": 8}),
        ("/api/chat", {"model": model.name, "messages": hi}),
    ]
    answers: list[httpx.Response] = []

    async def ask() -> None:
        async with httpx.AsyncClient(base_url=app.tray.api_url, timeout=60) as client:
            for path, body in asked:  # one after another: the run cards come in this order
                answers.append(await client.post(path, json=body))

    task = asyncio.ensure_future(ask())
    qtbot.waitUntil(task.done, timeout=60_000)
    assert [a.status_code for a in answers] == [200] * 4, [a.text for a in answers]
    labels = ["OpenAI API", "Lemonade API", "Anthropic API", "Ollama API"]
    qtbot.waitUntil(lambda: len(view.api_replies) == 4, timeout=30_000)
    assert [card.dialect for _, card in reversed(view.api_replies)] == [
        "openai",
        "lemonade",
        "anthropic",
        "ollama",
    ]
    assert set(view.charts["ttft"].series) == set(labels)  # a line per dialect
    listed = view.last_api.text()
    assert view.last_api.isVisible() and all(f"<b>{label}</b>" in listed for label in labels)
    assert "Asked through: Ollama API" in view.last_api.toolTip()  # the last reply's run card
    qtbot.waitUntil(lambda: all(label in view._titles["ttft"].legend.text() for label in labels))
