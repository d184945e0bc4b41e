"""A real MLX engine for tests: a cached venv with the pinned ``mlx[cpu]`` + ``mlx-lm``, the tiny
model of ``mlx_model.py`` and the Qwen3-shaped one of ``qwen3_model.py``, all kept under
``platformdirs.user_cache_dir("lemon-desk-tests")``.

``python -m tests.support.prepare`` makes them (a pip install: seconds from a warm pip cache, about a
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
QWEN3_MODEL_VERSION = "1"  # bump when qwen3_model.py changes


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


def _qwen3_folder(endless: bool) -> Path:
    return cache_root() / f"qwen3{'-endless' if endless else ''}-mlx-model-v{QWEN3_MODEL_VERSION}"


def qwen3_mlx_model(endless: bool = False) -> Path:
    """The tiny Qwen3-shaped model folder whose reply is known (its ``reply.json``; made by ``build_mlx``);
    ``endless``: the variant whose reply goes on until the token limit."""
    return _found(_qwen3_folder(endless), "the tiny Qwen3-shaped MLX model")


def build_mlx(say: Say) -> Path:
    """Make the venv (the app's pinned ``mlx[cpu]`` and ``mlx-lm``) and, with it, the tiny models."""

    def venv(folder: Path) -> None:
        say(f"installing {' '.join(pinned_requirements())} into {folder.name}")
        _run([sys.executable, "-m", "venv", str(folder)], say)
        pip = [str(folder / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        _run([*pip, "--progress-bar", "off", *pinned_requirements()], say)

    def script(name: str, *flags: str) -> Callable[[Path], None]:
        python = str(_venv_folder() / "bin" / "python")
        return lambda folder: _run([python, str(HERE / name), str(folder), *flags], say)

    _build_once(_venv_folder(), venv)
    for endless in (False, True):
        _build_once(_qwen3_folder(endless), script("qwen3_model.py", *(["--endless"] if endless else [])))
    return _build_once(_model_folder(), script("mlx_model.py"))
