"""The mlx-lm backend installed for real from the package index into its app-managed venv, through the
same installer as release backends (staging, manifest last, swap, cancel)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from pathlib import Path

import psutil
import pytest

from app.core.backends import BackendKey, BackendState, parse_backend_versions
from app.core.errors import InstallError
from app.core.matrix import support_matrix
from app.platform import detect_hardware
from app.store.catalog import backend_versions_path, load_backend_versions
from app.store.installs import InstallManifest, install_dir, installed_versions, read_manifest, write_manifest
from app.store.paths import staging_dir
from app.supervisor.installer import InstallPhase, InstallUpdate, installed_binary
from app.supervisor.mlx_lm import venv_python
from tests.integration.mlx.conftest import Installed, install

pytestmark = pytest.mark.integration


def test_cli_install_shows_pip_progress_and_writes_the_manifest_last(
    installed_once: Installed, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEMON_DESK_HOME", str(installed_once.home))
    assert json.loads(installed_once.stdout) == {
        "backend": "lemon-mlx:mlx-lm",
        "version": "0.32.2",
        "sha256": "",
    }
    drawn = installed_once.terminal
    # pip's steps, redrawn in place while it runs, in order.
    shown = ("Creating the virtual", "Found mlx", r"Installing \d+ packages", "Checking")
    steps = [m.start() if (m := re.search(f"lemon-mlx:mlx-lm: {step}", drawn)) else -1 for step in shown]
    assert -1 not in steps and steps == sorted(steps), drawn[-2000:]

    folder = installed_once.folder
    assert folder == install_dir("lemon-mlx", "mlx-lm")
    assert not (folder / "left-by-the-old-install").exists()  # the old install was replaced whole
    assert read_manifest(folder) == InstallManifest("0.32.2", "mlx[cpu]==0.32.4 mlx-lm==0.32.2", "")
    assert installed_versions() == {BackendKey("lemon-mlx", "mlx-lm"): "0.32.2"}
    assert not staging_dir().exists()
    assert installed_binary("lemon-mlx", "mlx-lm") == venv_python(folder)
    # The moved venv still runs: mlx computes on the CPU and mlx-lm imports.
    out = subprocess.run(
        [
            str(venv_python(folder)),
            "-c",
            "import mlx.core as mx, mlx_lm; print(mx.array([1, 2]).sum().item())",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "3"


def test_matrix_shows_installed_then_update_required_when_the_pin_moves(
    installed_once: Installed, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LEMON_DESK_HOME", str(installed_once.home))
    hw = detect_hardware()
    status = support_matrix(hw, load_backend_versions(), installed=installed_versions())["lemon-mlx"]
    assert status.backends["mlx-lm"].state is BackendState.INSTALLED

    raw = json.loads(backend_versions_path().read_text())
    raw["recipes"]["lemon-mlx"]["mlx-lm"]["version"] = "0.33.0"
    moved = support_matrix(hw, parse_backend_versions(raw), installed=installed_versions())["lemon-mlx"]
    assert moved.backends["mlx-lm"].state is BackendState.UPDATE_REQUIRED


def _pip_children(staging_root: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if any(str(staging_root) in part for part in proc.cmdline()):
                found.append(proc)
        except psutil.NoSuchProcess:
            continue
    return found


def test_cancel_kills_pip_and_removes_the_half_made_venv() -> None:
    spec = load_backend_versions().spec("lemon-mlx", "mlx-lm")
    staging_root = staging_dir()
    seen: list[InstallUpdate] = []

    async def scenario() -> None:
        pip_running = asyncio.Event()

        def on_update(u: InstallUpdate) -> None:
            seen.append(u)
            if u.detail.startswith("Found "):
                pip_running.set()

        task = asyncio.create_task(install(spec, on_update))
        await pip_running.wait()
        assert _pip_children(staging_root)  # pip really is running in the staging venv
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert _pip_children(staging_root) == []
    assert not staging_root.exists()
    assert not install_dir("lemon-mlx", "mlx-lm").exists()
    assert installed_versions() == {}
    assert InstallPhase.CHECKING not in [u.phase for u in seen]


def test_failed_pip_install_says_why_and_keeps_the_previous_install() -> None:
    raw = json.loads(backend_versions_path().read_text())
    raw["recipes"]["lemon-mlx"]["mlx-lm"]["packages"]["linux"] = ["mlx-lm==0.0.0.404"]
    spec = parse_backend_versions(raw).spec("lemon-mlx", "mlx-lm")
    previous = install_dir("lemon-mlx", "mlx-lm")
    previous.mkdir(parents=True)
    write_manifest(previous, InstallManifest("0.32.1", "mlx-lm==0.32.1", ""))

    with pytest.raises(InstallError) as err:
        asyncio.run(install(spec, lambda _: None))
    assert "Installing mlx-lm==0.0.0.404 failed" in err.value.message
    assert "mlx-lm==0.0.0.404" in str(err.value) and "package index" in err.value.hint
    assert installed_versions() == {BackendKey("lemon-mlx", "mlx-lm"): "0.32.1"}
    assert not staging_dir().exists()
