"""Load the bundled data files: backend pins and the model catalog."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from app.core.backends import BackendVersions, parse_backend_versions
from app.core.errors import ConfigError
from app.store.files import read_json
from app.store.paths import resource

VERSIONS_OVERRIDE = "LEMON_DESK_BACKEND_VERSIONS"  # a test's own pins (a release mirror's, a bumped one)


def _load_json(path: Path, name: str, hint: str = "") -> Any:
    """The file's JSON; ``name`` is how messages call it ("the model catalog file PATH")."""
    try:
        return read_json(path)
    except OSError as err:
        raise ConfigError(f"Cannot read {name}: {err.strerror}.", hint) from None
    except ValueError as err:  # not UTF-8, not JSON, or nested too deeply
        raise ConfigError(f"Cannot read {name}: it is not valid JSON ({err}).", hint) from None


def backend_versions_path() -> Path:
    override = os.environ.get(VERSIONS_OVERRIDE)
    return Path(override) if override else resource("backend_versions.json")


def load_backend_versions() -> BackendVersions:
    """The pins: ``LEMON_DESK_BACKEND_VERSIONS`` if set (for tests), else the bundled file."""
    path = backend_versions_path()
    if os.environ.get(VERSIONS_OVERRIDE):
        name = f"the backend versions file {path} ({VERSIONS_OVERRIDE})"
        hint = f"Point {VERSIONS_OVERRIDE} at a valid file, or unset it to use the bundled pins."
    else:
        name, hint = f"the backend versions file {path}", ""
    data = _load_json(path, name, hint)
    try:
        return parse_backend_versions(data)
    except ConfigError as err:
        raise ConfigError(f"Cannot use {name}: {err.message}.", hint) from None


def load_catalog_json() -> dict[str, Any]:
    path = resource("server_models.json")
    data = _load_json(path, f"the model catalog file {path}")
    if not isinstance(data, dict):
        raise ConfigError("The model catalog must be a JSON object keyed by model name.")
    return data
