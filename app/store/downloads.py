"""Downloads survive a restart: their records live in ``<home>/downloads.json``.

A process downloading a model holds an OS file lock named after it; the OS drops the lock when the
process dies, however it dies, so a record that says "running" with no lock held was interrupted.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path

from app.core.downloads import INTERRUPTED, DownloadRecord, DownloadState, record_from_json
from app.store.hfcache import RepoCache
from app.store.paths import home
from app.store.records import Loaded, load_records, save_records

KEY = "downloads"


def downloads_path() -> Path:
    return home() / "downloads.json"


def load_downloads(path: Path | None = None) -> Loaded[DownloadRecord]:
    return load_records(path or downloads_path(), KEY, record_from_json, "downloads")


def save_downloads(records: dict[str, DownloadRecord], path: Path | None = None) -> None:
    save_records(path or downloads_path(), KEY, {rid: r.to_json() for rid, r in records.items()})


class DownloadLock:
    """Held while this process downloads ``rid``."""

    def __init__(self, rid: str) -> None:
        self.path = home() / "locks" / f"download-{hashlib.sha1(rid.encode()).hexdigest()}.lock"
        self.fd: int | None = None

    def acquire(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self.fd = fd
        return True

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def download_in_progress(rid: str) -> bool:
    """Some live process (this one included) is downloading ``rid``."""
    lock = DownloadLock(rid)
    if lock.acquire():
        lock.release()
        return False
    return True


def recovered(record: DownloadRecord, cache_root: Path) -> DownloadRecord:
    """A record left active by a process that is gone comes back paused, with what it left on disk."""
    if record.state.active and not download_in_progress(record.id):
        on_disk = RepoCache(cache_root, record.files.repo_id).bytes_on_disk(record.files.files)
        return record.with_state(DownloadState.PAUSED, INTERRUPTED, on_disk)
    return record
