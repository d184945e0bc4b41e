"""Turning what a user names into a model on disk: a .gguf file, an MLX folder, or a catalog name.

Catalog and Hugging Face models are found here only when their checkpoint is a local path; finding
downloaded ones in the Hugging Face cache belongs to the model manager.
"""

from __future__ import annotations

from pathlib import Path

from app.core.errors import ModelError
from app.core.models import Model, catalog_from_json
from app.store.catalog import load_catalog_json


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


def find_model(name: str) -> Model:
    """A model by path, else by catalog name."""
    looks_like_path = name.endswith(".gguf") or "/" in name or name.startswith(("~", "."))
    if looks_like_path or Path(name).exists():
        return model_for_path(Path(name))
    catalog = catalog_from_json(load_catalog_json())
    if name in catalog:
        return catalog[name]
    raise ModelError(
        f"No model called {name!r}: it is not a file, a folder or a catalog name.",
        "Pass a .gguf file, an MLX folder, or a name from the catalog.",
    )


def model_location(model: Model) -> Path:
    """Where the model's files are; ModelError when they are not on this machine."""
    if model.repo_id is not None:
        raise ModelError(
            f"{model.name} comes from Hugging Face ({model.checkpoint}) and is not on this machine as a "
            "local file.",
            "Pass a local .gguf file or MLX folder instead.",
        )
    path = Path(model.checkpoint).expanduser()
    if not path.exists():
        raise ModelError(f"The files of {model.name} are missing: {path}.")
    return path


def cached_snapshot(hub: Path, repo_id: str) -> Path | None:
    """The snapshot ``refs/main`` names in the HF cache, when it holds a model (``config.json``)."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    try:
        revision = (repo / "refs" / "main").read_text().strip()
    except OSError:
        return None
    snapshot = repo / "snapshots" / revision
    return snapshot if revision and (snapshot / "config.json").is_file() else None
