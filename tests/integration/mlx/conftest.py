"""Fixtures for the lemon-mlx recipe with real MLX inference: the mlx-lm backend installed once per
session by the app's installer, the cached test venv and the tiny MLX model (tests/support/mlx_env.py)."""

from __future__ import annotations

import asyncio
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


@dataclass
class Installed:
    home: Path  # a LEMON_DESK_HOME holding the installed backend
    folder: Path
    events: list[InstallUpdate]


async def install(spec: BackendSpec, on_update: Callable[[InstallUpdate], None]) -> InstallManifest:
    """The app's installer, as ``lemon-desk backends install`` runs it."""
    status = support_matrix(detect_hardware(), load_backend_versions())[spec.recipe].backends[spec.name]
    async with httpx.AsyncClient() as client:
        return await install_backend(spec, status, client, on_update)


@pytest.fixture(scope="session")
def installed_once(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """One real install from the package index per session, over an older install (so the swap runs)."""
    home = tmp_path_factory.mktemp("mlx-lm-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LEMON_DESK_HOME", str(home))
        spec = load_backend_versions().spec("lemon-mlx", "mlx-lm")
        old = install_dir("lemon-mlx", "mlx-lm")
        old.mkdir(parents=True)
        (old / "left-by-the-old-install").write_text("x")
        write_manifest(old, InstallManifest("0.1.0", "mlx-lm==0.1.0", ""))
        events: list[InstallUpdate] = []
        asyncio.run(install(spec, events.append))
        folder = install_dir("lemon-mlx", "mlx-lm")
    yield Installed(home, folder, events)


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """A tiny real MLX model folder (llama, random weights), cached across runs."""
    return tiny_mlx_model()


@pytest.fixture(scope="session")
def test_mlx_python() -> Path:
    """The cached test venv's python (mlx[cpu] + mlx-lm at the app's pins), for stand-ins."""
    return mlx_python()
