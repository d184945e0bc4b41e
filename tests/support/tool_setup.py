"""The set-up of the tests where a model is offered MCP tools, in one place: the settings saved, the test
MCP server (tests/support/mcp_server.py over stdio) saved as the one configured server, so that the
window and a ``Router`` both start it from the app's folder, and the model imported with its options
(the tool-call template's arguments, for SmolLM2 on the real llama-server: tests/support/tool_calls.py).
Used by tests/gui/test_tool_calls_ui.py (stand-in engine) and tests/integration/test_tool_loop_real.py
(real engine)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from app.store.library import Library
from app.store.mcp_servers import save_mcp_servers
from app.store.model_options import ModelOptions, save_model_options
from app.store.settings import Settings, save_settings
from tests.conftest import profile_path
from tests.support.mcp_servers import stdio_spec


@dataclass(frozen=True)
class ToolHome:
    model: str  # the imported model's name
    server: str  # the configured MCP server's name
    calls: Path  # the server's log of the calls it ran (absent until one runs)


def tool_home(
    settings: Settings,
    model: Path,
    folder: Path,
    *,
    name: str | None = None,
    server: str = "files",
    args: str = "",
    ctx_size: int | None = None,
) -> ToolHome:
    """``settings`` saved, the test MCP server saved as ``server`` (its call log in ``folder``), and
    ``model`` imported (as ``name``) with the system backend, ``args`` and ``ctx_size``."""
    save_settings(settings)
    calls = folder / "calls.jsonl"
    save_mcp_servers({server: stdio_spec(server, calls=calls)})
    imported = Library(settings).import_path(model, name=name).name
    save_model_options({imported: ModelOptions(backend="system", ctx_size=ctx_size, args=args)})
    return ToolHome(imported, server, calls)


def real_engine_settings(llama_dir: Path, monkeypatch: pytest.MonkeyPatch, **fields: object) -> Settings:
    """Settings that run the real llama-server of the test cache (on the CPU-only profile)."""
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path("cpu_only_x86")))
    monkeypatch.setenv("LD_LIBRARY_PATH", str(llama_dir))
    return Settings(llama_server_path=str(llama_dir / "llama-server"), **fields)  # type: ignore[arg-type]
