"""Saved KV caches: one llama-server slot's state per conversation, kept on disk so that the next turn
after an unload (or a restart of the app) restores it instead of processing the whole prompt again.

Each saved slot is two files in ``<home>/kvcache``, both named by the app (a hash of the key, never a
name from the network or the engine):

- ``<digest>.bin``: what llama-server wrote (``POST /slots/{id}?action=save``). The engine writes it under
  a temporary name (``<digest>.part-<random>``); the app renames it into place once the save answered and
  its size and checksum are taken, so a ``.bin`` is never half written.
- ``<digest>.json``: the sidecar (written atomically) saying what the state is for: the whole ``SlotKey``
  (model file, its size and time, context size, backend, engine arguments, conversation), the token
  count, the file's size and SHA-256, and when it was saved.

A file is used only when its sidecar's key equals the key asked for and its size and checksum match: a
file for another model, context or backend is never restored, and a damaged or truncated one is dropped
(a cache: nothing is lost but time) with a log line saying why. The folder is held under a disk budget,
the oldest saved going first.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from app.store.files import atomic_write_json, inside, read_json
from app.store.paths import home

log = logging.getLogger(__name__)

SCHEMA = 1
DEFAULT_BUDGET_GB = 4.0
_CHUNK = 1 << 20
STALE_PART_S = 3600.0


def slot_cache_dir(make: bool = True) -> Path:
    """Where llama-server saves slots (``--slot-save-path``): made here, since it must exist before the
    engine starts (``make=False``: only named, for a dry run)."""
    path = home() / "kvcache"
    if make:
        path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass(frozen=True)
class SlotKey:
    """Everything a saved slot depends on: a state saved under another key is not restored."""

    model: str  # the model file's resolved path
    model_size: int  # its size and modification time: a file replaced in place is another model
    model_mtime_ns: int
    ctx_size: int  # the context the engine was started with
    backend: str  # "llamacpp:cpu", say: another build may lay the cache out otherwise
    engine_args: tuple[str, ...]  # the user's extra arguments (a KV cache type changes the format)
    conversation: str  # the chat's id

    @property
    def digest(self) -> str:
        """The files' name: a hash of the whole key."""
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:40]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "engine_args": list(self.engine_args)}


def model_identity(path: str) -> tuple[str, int, int]:
    """A model file's resolved path, size and modification time (for a ``SlotKey``)."""
    resolved = Path(path).resolve()
    stat = resolved.stat()
    return str(resolved), stat.st_size, stat.st_mtime_ns


@dataclass(frozen=True)
class SavedSlot:
    """A saved slot that passed its checks."""

    key: SlotKey
    filename: str  # the ``.bin``'s name inside the folder, as llama-server's restore takes it
    tokens: int  # the tokens it holds
    size: int  # bytes
    saved_at: float  # Unix time


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class SlotFiles:
    """The saved slots in one folder. Blocking file work: call its methods in a thread."""

    def __init__(self, root: Path, clock: Callable[[], float] = time.time) -> None:
        self.root = root
        self._clock = clock  # what a save's time is read from (the budget drops the oldest first)

    def _path(self, name: str) -> Path:
        return inside(self.root, self.root / name)

    def temporary_name(self, key: SlotKey) -> str:
        """A fresh name for the engine to save ``key``'s slot under, before ``commit``."""
        return f"{key.digest}.part-{secrets.token_hex(4)}"

    def commit(self, key: SlotKey, temporary: str, tokens: int, written: int) -> SavedSlot | None:
        """Take the engine's file saved as ``temporary`` as ``key``'s (replacing an older one) and write
        its sidecar; ``enforce`` keeps the budget. None, and the file gone, when what is on disk is not
        the ``written`` bytes the engine reported."""
        part = self._path(temporary)
        size = part.stat().st_size
        if size != written:
            log.warning(
                "a saved slot for %s is %d bytes, not the %d written: dropped", key.digest, size, written
            )
            part.unlink(missing_ok=True)
            return None
        checksum = file_sha256(part)
        saved = SavedSlot(key, f"{key.digest}.bin", tokens, size, self._clock())
        os.replace(part, self._path(saved.filename))
        sidecar = {
            "schema": SCHEMA,
            "key": key.to_json(),
            "tokens": tokens,
            "bytes": size,
            "sha256": checksum,
            "saved_at": saved.saved_at,
        }
        atomic_write_json(self._path(f"{key.digest}.json"), sidecar)
        return saved

    def lookup(self, key: SlotKey) -> SavedSlot | None:
        """``key``'s saved slot once its sidecar, size and checksum agree; None (saying why in the log,
        and dropping what is damaged) otherwise."""
        sidecar_path = self._path(f"{key.digest}.json")
        if not sidecar_path.exists():
            return None
        problem, saved = self._check(key, sidecar_path)
        if problem:
            log.warning(
                "not restoring the saved slot %s: %s; the prompt is processed again", key.digest, problem
            )
            self.drop(key.digest)
            return None
        return saved

    def _check(self, key: SlotKey, sidecar_path: Path) -> tuple[str, SavedSlot | None]:
        try:
            sidecar = read_json(sidecar_path)
            tokens, size, checksum = sidecar["tokens"], sidecar["bytes"], sidecar["sha256"]
            saved_key, saved_at = sidecar["key"], float(sidecar["saved_at"])
        except (OSError, ValueError, KeyError, TypeError) as err:
            return f"its sidecar is unreadable ({err})", None
        if sidecar.get("schema") != SCHEMA or saved_key != key.to_json():
            return "it was saved for another model, context, backend or conversation", None
        data = self._path(f"{key.digest}.bin")
        try:
            on_disk = data.stat().st_size
        except OSError as err:
            return f"its file cannot be read ({err.strerror})", None
        if on_disk != size:
            return f"its file is {on_disk} bytes, not the {size} saved (truncated or damaged)", None
        if file_sha256(data) != checksum:
            return "its file does not match its checksum (damaged)", None
        return "", SavedSlot(key, data.name, int(tokens), size, saved_at)

    def drop(self, digest: str) -> None:
        """Delete a saved slot's files (a cache: nothing but time is lost)."""
        for name in (f"{digest}.bin", f"{digest}.json"):
            self._path(name).unlink(missing_ok=True)

    def saved(self) -> list[tuple[float, str, int]]:
        """Every saved slot as (saved at, digest, bytes of both files), oldest first; a ``.bin`` whose
        sidecar is missing or unreadable counts as the oldest."""
        found: list[tuple[float, str, int]] = []
        for data in self.root.glob("*.bin"):
            digest = data.stem
            sidecar = data.with_suffix(".json")
            size = _size(data) + _size(sidecar)
            try:
                saved_at = float(read_json(sidecar)["saved_at"])
            except (OSError, ValueError, KeyError, TypeError):
                saved_at = 0.0
            found.append((saved_at, digest, size))
        return sorted(found)

    def enforce(self, budget_bytes: int) -> list[str]:
        """Delete the oldest saved slots until the rest fit in ``budget_bytes``; returns their digests."""
        saved = self.saved()
        total = sum(size for _, _, size in saved)
        dropped = []
        for _, digest, size in saved:
            if total <= budget_bytes:
                break
            self.drop(digest)
            total -= size
            dropped.append(digest)
        if dropped:
            log.info(
                "dropped %d saved slot(s), the oldest, to keep the KV cache folder in its budget",
                len(dropped),
            )
        return dropped

    def sweep(self) -> None:
        """Delete what interrupted saves left: ``.part-`` files older than an hour (a younger one may be
        another process's save under way) and sidecars without their file."""
        stale = time.time() - STALE_PART_S
        for path in self.root.glob("*.part-*"):
            with contextlib.suppress(OSError):
                if path.stat().st_mtime < stale:
                    path.unlink()
        for sidecar in self.root.glob("*.json"):
            if not sidecar.with_suffix(".bin").exists():
                sidecar.unlink(missing_ok=True)


def _size(path: Path) -> int:
    with contextlib.suppress(OSError):
        return path.stat().st_size
    return 0
