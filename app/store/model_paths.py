"""A local .gguf file or MLX folder that a user names on the command line, as a model.

Names, references and what the Hugging Face cache holds are the library's (``app.library``).
"""

from __future__ import annotations

from pathlib import Path

from app.core.errors import ModelError
from app.core.models import Model


def model_for_path(path: Path) -> Model:
    """A local .gguf file (llamacpp) or MLX folder (lemon-mlx) as a model."""
    path = path.expanduser().resolve()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"{path} is a folder without config.json, so it is not an MLX model.")
        return Model(name=path.name, recipe="lemon-mlx", checkpoint=str(path), user=True)
    if not path.exists():
        raise ModelError(f"No such model file: {path}.")
    if path.suffix.lower() != ".gguf":
        raise ModelError(
            f"{path.name} is not a .gguf file.", "llama.cpp runs GGUF files; MLX models are folders."
        )
    return Model(name=path.stem, recipe="llamacpp", checkpoint=str(path), user=True)
