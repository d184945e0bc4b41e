"""The user's own models (Hugging Face references and imported files), in ``<home>/user_models.json``."""

from __future__ import annotations

from pathlib import Path

from app.core.models import Model, model_from_json
from app.store.paths import home
from app.store.records import Loaded, load_records, save_records

KEY = "models"


def user_models_path() -> Path:
    return home() / "user_models.json"


def load_user_models(path: Path | None = None) -> Loaded[Model]:
    return load_records(
        path or user_models_path(),
        KEY,
        lambda name, raw: model_from_json(name, raw, user=True),
        "user models",
    )


def save_user_models(models: dict[str, Model], path: Path | None = None) -> None:
    entries = {}
    for name, model in models.items():
        data = model.to_json()
        for derived in ("name", "user"):
            data.pop(derived)
        entries[name] = data
    save_records(path or user_models_path(), KEY, entries)
