"""A local .gguf file or MLX folder that a user names on the command line, as a model; a local GGUF's
metadata.

Names, references and what the Hugging Face cache holds are the library's (``app.store.library``).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from app.core.errors import ModelError
from app.core.fit import ModelShape, shape_from_config, shape_from_gguf
from app.core.gguf import HEADER_FIRST, HEADER_MAX, HeaderCutShort, gguf_metadata, header_too_big
from app.core.models import Model
from app.core.refs import GGUF_RECIPE


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


def local_gguf_metadata(path: Path) -> dict[str, Any]:
    """The metadata of a GGUF file on disk, read as the Hub's are: the first megabyte, then more."""
    want = HEADER_FIRST
    with path.open("rb") as f:
        while True:
            f.seek(0)
            data = f.read(want)
            try:
                return gguf_metadata(data)
            except HeaderCutShort:
                if len(data) < want or want >= HEADER_MAX:
                    raise header_too_big(str(path)) from None
                want *= 2


def local_shape(recipe: str, main: Path) -> ModelShape:
    """A downloaded or imported model's shape: its GGUF header, or its MLX folder's config.json."""
    if recipe != GGUF_RECIPE:
        try:
            return shape_from_config(json.loads((main / "config.json").read_text()))
        except (OSError, ValueError) as err:
            raise ModelError(f"{main / 'config.json'} is unreadable ({err}).") from None
    stat = main.stat()
    return _gguf_shape(main, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _gguf_shape(path: Path, size: int, mtime_ns: int) -> ModelShape:
    """Walking a header takes tens of milliseconds (a vocabulary to skip); every load's fit check asks
    again, so the shape is kept for as long as the file is unchanged (same size and modification time)."""
    return shape_from_gguf(local_gguf_metadata(path))
