"""A real MLX engine for tests: a cached venv with the pinned ``mlx[cpu]`` + ``mlx-lm``, and the tiny
model of ``mlx_model.py``, both kept under ``platformdirs.user_cache_dir("lemon-desk-tests")``.

``python -m tests.support.prepare`` makes both (a pip install: seconds from a warm pip cache, about a
minute cold); tests only find them. Each is built beside its final place and renamed into it, so an
interrupted build is never reused.
"""

from __future__ import annotations

import hashlib
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import platformdirs

from app.store.catalog import load_backend_versions
from tests.support.llama import NotBuilt, Say, _run

HERE = Path(__file__).parent
MODEL_VERSION = "1"  # bump when mlx_model.py changes


def cache_root() -> Path:
    root = Path(platformdirs.user_cache_dir("lemon-desk-tests"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def pinned_requirements() -> list[str]:
    """The Linux requirements pinned for the app's mlx-lm backend: tests run what users get."""
    return list(load_backend_versions().spec("lemon-mlx", "mlx-lm").packages["linux"])


def _build_once(final: Path, build: Callable[[Path], None]) -> Path:
    if final.is_dir():
        return final
    partial = final.with_name(final.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    build(partial)
    partial.rename(final)
    return final


def _venv_folder() -> Path:
    reqs = pinned_requirements()
    return cache_root() / f"mlx-venv-{hashlib.sha256(' '.join(reqs).encode()).hexdigest()[:12]}"


def _model_folder() -> Path:
    return cache_root() / f"tiny-mlx-model-v{MODEL_VERSION}"


def _found(folder: Path, what: str) -> Path:
    if not folder.is_dir():
        raise NotBuilt(f"{what} is not in {folder}")
    return folder


def mlx_venv() -> Path:
    """The venv holding mlx[cpu] and mlx-lm at the app's pins (made by ``build_mlx``)."""
    return _found(_venv_folder(), "the mlx-lm test venv")


def mlx_python() -> Path:
    return mlx_venv() / "bin" / "python"


def tiny_mlx_model() -> Path:
    """The tiny llama model folder (config, tokenizer, random float32 weights; made by ``build_mlx``)."""
    return _found(_model_folder(), "the tiny MLX model")


def build_mlx(say: Say) -> Path:
    """Make the venv (the app's pinned ``mlx[cpu]`` and ``mlx-lm``) and, with it, the tiny model."""

    def venv(folder: Path) -> None:
        say(f"installing {' '.join(pinned_requirements())} into {folder.name}")
        _run([sys.executable, "-m", "venv", str(folder)], say)
        pip = [str(folder / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        _run([*pip, "--progress-bar", "off", *pinned_requirements()], say)

    def model(folder: Path) -> None:
        _run([str(_venv_folder() / "bin" / "python"), str(HERE / "mlx_model.py"), str(folder)], say)

    _build_once(_venv_folder(), venv)
    return _build_once(_model_folder(), model)
