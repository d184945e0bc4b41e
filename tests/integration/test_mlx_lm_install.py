"""The mlx-lm backend installed for real from the package index into its app-managed venv."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from app.core.backends import BackendState, parse_backend_versions
from app.core.errors import InstallError
from app.core.matrix import support_matrix
from app.platform import detect_hardware
from app.store.catalog import backend_versions_path, load_backend_versions
from app.store.installs import InstallManifest, install_dir, installed_versions, read_manifest, write_manifest
from app.supervisor.mlx_lm import PipPhase, PipProgress, install_pip_backend, staging_dir, venv_python

pytestmark = pytest.mark.integration


@dataclass
class Installed:
    home: Path
    folder: Path
    events: list[PipProgress]


@pytest.fixture(scope="session")
def installed_once(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """One real install per session, over an older install (so the swap path runs too)."""
    home = tmp_path_factory.mktemp("mlx-lm-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LEMON_DESK_HOME", str(home))
        spec = load_backend_versions().spec("lemon-mlx", "mlx-lm")
        old = install_dir("lemon-mlx", "mlx-lm")
        old.mkdir(parents=True)
        (old / "left-by-the-old-install").write_text("x")
        write_manifest(old, InstallManifest("0.1.0", "mlx-lm==0.1.0", ""))
        events: list[PipProgress] = []
        folder = asyncio.run(install_pip_backend(spec, "linux", events.append))
    yield Installed(home, folder, events)


def use_home(mp: pytest.MonkeyPatch, installed: Installed) -> None:
    mp.setenv("LEMON_DESK_HOME", str(installed.home))


def test_install_shows_progress_and_writes_the_manifest_last(
    installed_once: Installed, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_home(monkeypatch, installed_once)
    phases = [e.phase for e in installed_once.events]
    assert phases[0] is PipPhase.VENV and phases[-1] is PipPhase.DONE
    seen = list(dict.fromkeys(phases))
    assert seen.index(PipPhase.RESOLVE) < seen.index(PipPhase.INSTALL) < seen.index(PipPhase.VERIFY)
    assert installed_once.events[-1].packages >= 3  # mlx, mlx-cpu, mlx-lm at least
    assert any(e.message.startswith("Installing ") and "packages" in e.message for e in installed_once.events)

    folder = installed_once.folder
    assert folder == install_dir("lemon-mlx", "mlx-lm")
    assert not (folder / "left-by-the-old-install").exists()  # the old install was replaced whole
    assert read_manifest(folder) == InstallManifest("0.32.2", "mlx[cpu]==0.32.4 mlx-lm==0.32.2", "")
    assert installed_versions() == {"lemon-mlx:mlx-lm": "0.32.2"}
    assert not any(staging_dir("lemon-mlx", "mlx-lm").parent.iterdir())
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
    use_home(monkeypatch, installed_once)
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
    staging_root = staging_dir("lemon-mlx", "mlx-lm").parent
    seen: list[PipProgress] = []

    async def scenario() -> None:
        pip_running = asyncio.Event()

        def on_progress(p: PipProgress) -> None:
            seen.append(p)
            if p.phase is PipPhase.RESOLVE and p.packages > 0:
                pip_running.set()

        task = asyncio.create_task(install_pip_backend(spec, "linux", on_progress))
        await pip_running.wait()
        assert _pip_children(staging_root)  # pip really is running in the staging venv
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert _pip_children(staging_root) == []
    assert not any(staging_root.iterdir())
    assert not install_dir("lemon-mlx", "mlx-lm").exists()
    assert installed_versions() == {}
    assert PipPhase.DONE not in [p.phase for p in seen]


def test_failed_pip_install_says_why_and_keeps_the_previous_install() -> None:
    raw = json.loads(backend_versions_path().read_text())
    raw["recipes"]["lemon-mlx"]["mlx-lm"]["packages"]["linux"] = ["mlx-lm==0.0.0.404"]
    spec = parse_backend_versions(raw).spec("lemon-mlx", "mlx-lm")
    previous = install_dir("lemon-mlx", "mlx-lm")
    previous.mkdir(parents=True)
    write_manifest(previous, InstallManifest("0.32.2", "mlx-lm==0.32.2", ""))

    with pytest.raises(InstallError) as err:
        asyncio.run(install_pip_backend(spec, "linux", lambda _: None))
    assert "Installing mlx-lm==0.0.0.404 failed" in err.value.message
    assert "mlx-lm==0.0.0.404" in str(err.value) and "package index" in err.value.hint
    assert installed_versions() == {"lemon-mlx:mlx-lm": "0.32.2"}
    assert not any(staging_dir("lemon-mlx", "mlx-lm").parent.iterdir())
