"""Settings > Tools in the window, against real MCP servers (tests/support/mcp_server.py over stdio):
each server's state (ready with N tools, restarting with its last words), one added from the form and
started at once, one disabled and stopped, an mcp.json imported with its bad entry refused, and the tool
settings saved. Saved as PNGs in light and dark (``LEMON_DESK_SCREENSHOTS`` when set)."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.core.mcp import McpState
from app.store.mcp_servers import load_mcp_servers, save_mcp_servers
from app.store.settings import load_settings
from app.ui.desktop import DesktopApp
from tests.gui.test_look import save, scheme
from tests.support.mcp_servers import SERVER, stdio_spec

__all__ = ["scheme"]
WAIT_MS = 60_000


def states(app: DesktopApp) -> dict[str, McpState]:
    return {view.spec.name: view.state for view in app.bridge.mcp_servers()}


def rows(app: DesktopApp) -> dict[str, tuple[str, str]]:
    """What the list shows: name -> (state, tooltip)."""
    assert app.dialog is not None
    tree = app.dialog.mcp.list
    items = [tree.topLevelItem(i) for i in range(tree.topLevelItemCount())]
    return {item.text(0): (item.text(2), item.toolTip(2)) for item in items if item is not None}


def test_mcp_servers_are_shown_added_disabled_and_imported_in_light_and_dark(
    qtbot: QtBot, desktop: Callable[[], DesktopApp], scheme: str, tmp_path: Path
) -> None:
    save_mcp_servers({"files": stdio_spec("files"), "broken": stdio_spec("broken", "--crash-at-start")})
    app = desktop()
    qtbot.waitUntil(
        lambda: states(app) == {"files": McpState.READY, "broken": McpState.FAILED}, timeout=WAIT_MS
    )
    app.open_settings()
    dialog = app.dialog
    assert dialog is not None
    dialog.resize(760, 560)
    dialog.pages.setCurrentIndex(2)
    editor = dialog.mcp
    qtbot.waitUntil(lambda: rows(app).get("files", ("",))[0] == "ready · 7 tools")
    state, tip = rows(app)["broken"]
    assert (state, "fatal: bad config" in tip) in (("restarting…", True), ("failed", True))
    editor.list.setCurrentItem(editor.list.findItems("broken", Qt.MatchFlag.MatchExactly)[0])
    assert "fatal: bad config" in editor.detail.text() and editor.name.text() == "broken"
    save(dialog, "settings-mcp", scheme, tmp_path)

    # Added from the form: started at once, as the app runs the enabled servers.
    editor.name.setText("more")
    editor.target.setText(shlex.join([sys.executable, str(SERVER)]))
    editor.pairs.setText("MODE=test")
    assert editor.save_button.text() == "Add" and editor.save_button.isEnabled()
    editor.save_button.click()
    qtbot.waitUntil(lambda: rows(app).get("more", ("",))[0] == "ready · 7 tools", timeout=WAIT_MS)
    assert load_mcp_servers().items["more"].env == {"MODE": "test"}

    # A bad line is refused before anything is sent.
    editor.name.setText("x")
    editor.target.setText("https://example.com/mcp")
    editor.pairs.setText("Authorization=secret")
    assert not editor.save_button.isEnabled() and "keychain" in editor.problem.text()
    for field in (editor.name, editor.target, editor.pairs):
        field.clear()

    # Disabled from its check box: stopped, and kept so.
    item = editor.list.findItems("files", Qt.MatchFlag.MatchExactly)[0]
    item.setCheckState(0, Qt.CheckState.Unchecked)
    qtbot.waitUntil(lambda: states(app)["files"] is McpState.OFF, timeout=WAIT_MS)
    assert load_mcp_servers().items["files"].enabled is False

    # Imported: the good entry kept, the bad one refused, saying why.
    mcp_json = tmp_path / "mcp.json"
    mcp_json.write_text(
        json.dumps(
            {"mcpServers": {"imported": {"command": sys.executable, "args": [str(SERVER)]}, "bad": {}}}
        )
    )
    with qtbot.waitSignal(app.bridge.mcp_failed, timeout=WAIT_MS):
        editor.import_requested.emit(str(mcp_json))
    assert "'bad'" in editor.problem.text() and "neither a command nor a url" in editor.problem.text()
    qtbot.waitUntil(lambda: rows(app).get("imported", ("",))[0] == "ready · 7 tools", timeout=WAIT_MS)

    dialog.tool_rounds.setValue(3)
    dialog.tool_timeout.setValue(20)
    dialog.buttons.accepted.emit()
    qtbot.waitUntil(lambda: app.dialog is None, timeout=WAIT_MS)
    saved = load_settings().settings
    assert (saved.tool_rounds, saved.tool_timeout_s) == (3, 20.0)
