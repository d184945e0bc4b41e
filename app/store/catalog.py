"""Load the bundled data files: backend pins and the model catalog."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from app.core.backends import BackendVersions, parse_backend_versions
from app.core.errors import ConfigError
from app.store.paths import resource


def _load_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except OSError as err:
        raise ConfigError(f"Cannot read the {what} file {path}: {err.strerror}.") from None
    except json.JSONDecodeError as err:
        raise ConfigError(f"The {what} file {path} is not valid JSON (line {err.lineno}).") from None


def backend_versions_path() -> Path:
    override = os.environ.get("LEMON_DESK_BACKEND_VERSIONS")
    return Path(override) if override else resource("backend_versions.json")


def load_backend_versions() -> BackendVersions:
    """The pins: ``LEMON_DESK_BACKEND_VERSIONS`` if set, else the bundled file."""
    return parse_backend_versions(_load_json(backend_versions_path(), "backend versions"))


def load_catalog_json() -> dict[str, Any]:
    data = _load_json(resource("server_models.json"), "model catalog")
    if not isinstance(data, dict):
        raise ConfigError("The model catalog must be a JSON object keyed by model name.")
    return data
