"""Fixtures for the lemon-mlx recipe with real MLX inference: the mlx-lm backend installed once per
session by the app's installer, the cached test venv and the tiny MLX model (tests/support/mlx_env.py)."""

from __future__ import annotations

import contextlib
import os
import pty
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from app.core.backends import BackendSpec
from app.core.matrix import support_matrix
from app.platform import detect_hardware
from app.store.catalog import load_backend_versions
from app.store.installs import InstallManifest, install_dir, write_manifest
from app.supervisor.installer import InstallUpdate, install_backend
from tests.support.mlx_env import mlx_python, tiny_mlx_model

# Linux only (x86_64 and arm64: mlx[cpu] has wheels for both); tests/integration/conftest.py skips
# these elsewhere, saying why.


@dataclass
class Installed:
    home: Path  # a LEMON_DESK_HOME holding the installed backend
    folder: Path
    stdout: str  # of ``lemon-desk backends install lemon-mlx:mlx-lm --json``
    terminal: str  # what its progress display drew on the terminal (stderr on a pty)


async def install(spec: BackendSpec, on_update: Callable[[InstallUpdate], None]) -> InstallManifest:
    """The app's installer, as ``lemon-desk backends install`` runs it."""
    status = support_matrix(detect_hardware(), load_backend_versions())[spec.recipe].backends[spec.name]
    with httpx.Client() as client:
        return await install_backend(spec, status, client, on_update)


def _on_a_terminal(argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """Run with stderr on a pseudo-terminal (so progress is drawn live); returns code, stdout, terminal."""
    master, slave = pty.openpty()
    drawn: list[bytes] = []

    def drain() -> None:
        with contextlib.suppress(OSError):  # EIO once the child has closed the terminal
            while chunk := os.read(master, 1 << 16):
                drawn.append(chunk)

    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=slave, env=env, text=True) as proc:
        os.close(slave)
        reader = threading.Thread(target=drain)
        reader.start()
        out, _ = proc.communicate(timeout=600)
    reader.join()
    os.close(master)
    return proc.returncode, out, b"".join(drawn).decode(errors="replace")


@pytest.fixture(scope="session")
def installed_once(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """``lemon-desk backends install lemon-mlx:mlx-lm`` once per session, for real from the package
    index, over an older install (so the swap runs too)."""
    home = tmp_path_factory.mktemp("mlx-lm-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LEMON_DESK_HOME", str(home))
        old = install_dir("lemon-mlx", "mlx-lm")
        old.mkdir(parents=True)
        (old / "left-by-the-old-install").write_text("x")
        write_manifest(old, InstallManifest("0.1.0", "mlx-lm==0.1.0", ""))
        env = {**os.environ, "LEMON_DESK_HOME": str(home)}
        argv = [sys.executable, "-m", "app", "backends", "install", "lemon-mlx:mlx-lm", "--json"]
        code, out, terminal = _on_a_terminal(argv, env)
        assert code == 0, terminal
        folder = install_dir("lemon-mlx", "mlx-lm")
    yield Installed(home, folder, out, terminal)


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """A tiny real MLX model folder (llama, random weights), cached across runs."""
    return tiny_mlx_model()


@pytest.fixture(scope="session")
def test_mlx_python() -> Path:
    """The cached test venv's python (mlx[cpu] + mlx-lm at the app's pins), for stand-ins."""
    return mlx_python()
