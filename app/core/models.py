"""Models: catalog entries and the user's own, with recipe, checkpoint, labels and size."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.core.backends import RECIPES
from app.core.errors import ConfigError
from app.core.names import path_problem


@dataclass(frozen=True)
class Model:
    name: str
    recipe: str  # "llamacpp" or "lemon-mlx"
    checkpoint: str  # "org/repo:VARIANT", "org/repo", or a local path for imported models
    labels: tuple[str, ...] = ()
    size_gb: float = 0.0
    suggested: bool = False
    user: bool = False  # added by the user rather than shipped in the catalog
    mmproj: str | None = None  # GGUF: the vision projector's file in the checkpoint's repo, when named

    @property
    def repo_id(self) -> str | None:
        """The Hugging Face repo id, or None for a local file or folder."""
        if self.checkpoint.startswith(("/", "~", ".")):
            return None
        return self.checkpoint.split(":", 1)[0]

    @property
    def variant(self) -> str | None:
        if self.repo_id is None:
            return None
        return self.checkpoint.partition(":")[2] or None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "recipe": self.recipe,
            "checkpoint": self.checkpoint,
            "labels": list(self.labels),
            "size_gb": self.size_gb,
            "suggested": self.suggested,
            "user": self.user,
            **({"mmproj": self.mmproj} if self.mmproj else {}),
        }


def model_from_json(name: str, raw: Any, user: bool = False) -> Model:
    if not isinstance(raw, dict):
        raise ConfigError(f"Model '{name}' must be an object.")
    recipe = raw.get("recipe")
    if recipe not in RECIPES:
        raise ConfigError(f"Model '{name}' has an unknown recipe {recipe!r} (known: {', '.join(RECIPES)}).")
    checkpoint = raw.get("checkpoint")
    if not isinstance(checkpoint, str) or not checkpoint:
        raise ConfigError(f"Model '{name}' has no checkpoint.")
    labels = raw.get("labels", [])
    if not isinstance(labels, list):
        raise ConfigError(f"Model '{name}' has labels that are not a list.")
    size_gb = raw.get("size_gb", 0.0)
    # bool is an int; inf and nan are floats: none of them is a size.
    if isinstance(size_gb, bool) or not isinstance(size_gb, int | float) or not 0 <= size_gb < 1e6:
        raise ConfigError(f"Model '{name}' has a size that is not a number of GB: {size_gb!r}.")
    mmproj = raw.get("mmproj")
    if mmproj is not None and path_problem(mmproj) is not None:
        raise ConfigError(f"Model '{name}' has a projector that is not a file in its repo: {mmproj!r}.")
    return Model(
        name=name,
        recipe=recipe,
        checkpoint=checkpoint,
        labels=tuple(str(label) for label in labels),
        size_gb=float(size_gb),
        suggested=bool(raw.get("suggested", False)),
        user=user,
        mmproj=mmproj,
    )


def catalog_from_json(data: dict[str, Any]) -> dict[str, Model]:
    return {name: model_from_json(name, raw) for name, raw in data.items()}
