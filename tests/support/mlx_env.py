"""A real MLX engine for tests: a cached venv with the pinned ``mlx[cpu]`` + ``mlx-lm``, the tiny
model of ``mlx_model.py`` and the Qwen3-shaped one of ``qwen3_model.py``, all kept under
``platformdirs.user_cache_dir("lemon-desk-tests")``.

The first run pays a pip install (seconds from a warm pip cache); later runs reuse the folders. Each
is built beside its final place and renamed into it, so an interrupted build is never reused.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import platformdirs

from app.store.catalog import load_backend_versions

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


def mlx_venv() -> Path:
    """A venv holding mlx[cpu] and mlx-lm at the app's pins; returns its folder."""
    reqs = pinned_requirements()
    key = hashlib.sha256(" ".join(reqs).encode()).hexdigest()[:12]

    def build(folder: Path) -> None:
        subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
        subprocess.run(
            [str(folder / "bin" / "python"), "-m", "pip", "install", "-q", "--progress-bar", "off", *reqs],
            check=True,
        )

    return _build_once(cache_root() / f"mlx-venv-{key}", build)


def mlx_python() -> Path:
    return mlx_venv() / "bin" / "python"


def tiny_mlx_model() -> Path:
    """The tiny llama model folder (config, tokenizer, random float32 weights)."""
    python = mlx_python()

    def build(folder: Path) -> None:
        subprocess.run([str(python), str(HERE / "mlx_model.py"), str(folder)], check=True)

    return _build_once(cache_root() / f"tiny-mlx-model-v{MODEL_VERSION}", build)


def qwen3_mlx_model(endless: bool = False) -> Path:
    """The tiny Qwen3-shaped model folder whose reply is known (its ``reply.json``); ``endless``: the
    variant whose reply goes on until the token limit."""
    python = mlx_python()
    flags = ["--endless"] if endless else []

    def build(folder: Path) -> None:
        subprocess.run([str(python), str(HERE / "qwen3_model.py"), str(folder), *flags], check=True)

    kind = "-endless" if endless else ""
    return _build_once(cache_root() / f"qwen3{kind}-mlx-model-v{QWEN3_MODEL_VERSION}", build)
