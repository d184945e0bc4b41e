"""A local .gguf file or MLX folder that a user names on the command line, as a model; a local GGUF's
metadata.

Names, references and what the Hugging Face cache holds are the library's (``app.store.library``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from app.core.errors import ModelError
from app.core.fit import ModelShape, shape_from_config, shape_from_gguf
from app.core.gguf import GrowingRead, gguf_metadata, gguf_parameter_count
from app.core.models import Model
from app.core.params import safetensors_header_length, safetensors_parameter_count
from app.core.refs import GGUF_RECIPE, shard_names
from app.store.files import read_json

T = TypeVar("T")


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
    return _local_gguf(path, gguf_metadata)


def _local_gguf(path: Path, parse: Callable[[bytes], T]) -> T:
    read = GrowingRead(parse, str(path))
    with path.open("rb") as f:
        while True:
            f.seek(0)
            found = read.take(f.read(read.want))
            if found is not None:
                return found


def local_parameter_count(recipe: str, main: Path) -> int:
    """A downloaded or imported model's parameters: its GGUF's tensor infos (every shard of a split
    model), or the headers of every safetensors file in its MLX folder."""
    try:
        stat = main.stat()
        return _local_params(recipe, main, stat.st_size, stat.st_mtime_ns)
    except OSError as err:
        raise ModelError(f"Cannot read {main}: {err.strerror}.") from None


@functools.lru_cache(maxsize=256)
def _local_params(recipe: str, main: Path, size: int, mtime_ns: int) -> int:
    if recipe != GGUF_RECIPE:
        total = 0
        for weights in sorted(main.glob("*.safetensors")):
            with weights.open("rb") as f:
                length = safetensors_header_length(f.read(8), weights.stat().st_size)
                total += safetensors_parameter_count(f.read(length))
        if not total:
            raise ModelError(f"{main} holds no safetensors weights.")
        return total
    return sum(_local_gguf(main.with_name(name), gguf_parameter_count) for name in shard_names(main.name))


def local_shape(recipe: str, main: Path) -> ModelShape:
    """A downloaded or imported model's shape: its GGUF header, or its MLX folder's config.json."""
    if recipe != GGUF_RECIPE:
        try:
            # read_json: a nesting too deep for the parser is a ValueError, not a RecursionError
            return shape_from_config(read_json(main / "config.json"))
        except (OSError, ValueError) as err:
            raise ModelError(f"{main / 'config.json'} is unreadable ({err}).") from None
    stat = main.stat()
    return _gguf_shape(main, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _gguf_shape(path: Path, size: int, mtime_ns: int) -> ModelShape:
    """Walking a header takes tens of milliseconds (a vocabulary to skip); every load's fit check asks
    again, so the shape is kept for as long as the file is unchanged (same size and modification time)."""
    return shape_from_gguf(local_gguf_metadata(path))


def gguf_architecture(path: Path) -> str:
    """A GGUF file's ``general.architecture``, or "" when the file is missing or unreadable."""
    try:
        return local_shape(GGUF_RECIPE, path).architecture
    except (OSError, ModelError):
        return ""
