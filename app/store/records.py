"""Small JSON files the app owns (user models, downloads): read carefully, written atomically.

A file that cannot be read is set aside as a backup (never deleted) and reported; the app goes on
with nothing in its place, and the next write starts a fresh file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from app.core.errors import ConfigError
from app.store.files import atomic_write_json, read_json, set_aside

SCHEMA = 1
T = TypeVar("T")


@dataclass(frozen=True)
class Loaded(Generic[T]):
    items: dict[str, T]
    warning: str = ""  # what went wrong reading the file, for the user


def load_records(path: Path, key: str, parse: Callable[[str, Any], T | None], what: str) -> Loaded[T]:
    """``{"schema": 1, key: {name: raw}}`` parsed item by item with ``parse(name, raw)``; an item it
    returns None for is left out (``parse`` says why in the log), one it raises for sets the file aside."""
    if not path.exists():
        return Loaded({})
    try:
        data = read_json(path)
        if not isinstance(data, dict) or not isinstance(data.get(key), dict):
            raise ValueError(f"no '{key}' object")
        parsed = {name: parse(name, raw) for name, raw in data[key].items()}
        return Loaded({name: item for name, item in parsed.items() if item is not None})
    except (OSError, ValueError, ConfigError) as err:
        backup = set_aside(path)
        return Loaded(
            {}, f"The {what} file was unreadable ({err}); kept it as {backup.name} and started an empty one."
        )


def save_records(path: Path, key: str, items: dict[str, Any]) -> None:
    atomic_write_json(path, {"schema": SCHEMA, key: items})
