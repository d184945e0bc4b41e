"""Atomic writes and careful reads for every file the app owns."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from app.core.errors import UnsafePathError


def inside(root: Path, path: Path) -> Path:
    """``path``, once sure that writing it lands inside ``root``; else an UnsafePathError.

    The last guard behind the checks on names from the network (``app.core.names``): the folders on
    the way are resolved, symlinks included, and the final name must be a plain one, since a write
    replaces it rather than following it.
    """
    landed = path.parent.resolve() / path.name
    if path.name in ("", ".", "..") or not landed.is_relative_to(root.resolve()):
        raise UnsafePathError(
            f"Refused to use {path}: it lies outside {root}.",
            "A name from the network or a damaged file led there; nothing was written. Report this.",
        )
    return path


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary file beside ``path``, fsync, then rename over it: all or nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_bytes(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())


def read_json(path: Path) -> Any:
    """A JSON file's value. Anything that is not JSON is a ValueError, a nesting too deep for the
    parser (which would be a RecursionError) included."""
    text = path.read_text()
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("it is nested too deeply to read") from None


def set_aside(path: Path) -> Path:
    """Move a corrupt file out of the way (kept, never deleted) and return where it went."""
    stamp = f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}"
    backup = path.with_name(stamp)
    n = 1
    while backup.exists():  # a second one within the same second must not replace the first
        n += 1
        backup = path.with_name(f"{stamp}-{n}")
    os.replace(path, backup)
    return backup
