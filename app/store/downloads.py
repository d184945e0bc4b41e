"""Downloads survive a restart: their records live in ``<home>/downloads.json``."""

from __future__ import annotations

from pathlib import Path

from app.core.downloads import DownloadRecord, record_from_json
from app.store.paths import home
from app.store.records import Loaded, load_records, save_records

KEY = "downloads"


def downloads_path() -> Path:
    return home() / "downloads.json"


def load_downloads(path: Path | None = None) -> Loaded[DownloadRecord]:
    return load_records(path or downloads_path(), KEY, record_from_json, "downloads")


def save_downloads(records: dict[str, DownloadRecord], path: Path | None = None) -> None:
    save_records(path or downloads_path(), KEY, {rid: r.to_json() for rid, r in records.items()})
