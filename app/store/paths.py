"""Where the app keeps its state: ``LEMON_DESK_HOME``, else the platform's user folders."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

import platformdirs

APP_NAME = "lemon-desk"


def home() -> Path:
    """One folder for all of the app's own state (config, engines, history, logs)."""
    override = os.environ.get("LEMON_DESK_HOME")
    path = Path(override).expanduser() if override else Path(platformdirs.user_data_dir(APP_NAME))
    path.mkdir(parents=True, exist_ok=True)
    return path


def engines_dir() -> Path:
    return home() / "engines"


def logs_dir() -> Path:
    path = home() / "logs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def run_dir() -> Path:
    """Per-launch secrets (engine API key files): a folder only the user can enter."""
    path = home() / "run"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def staging_dir() -> Path:
    """Downloads and unpacked archives on their way into ``engines_dir()`` (same file system)."""
    return home() / "staging"


def resource(name: str) -> Path:
    """A bundled file from resources/."""
    return Path(str(resources.files("app.resources").joinpath(name)))
