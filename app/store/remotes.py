"""Remote servers, in ``<home>/remotes.json``: each one's name and server root, and whether a key was
stored for it. The key itself is only in the OS keychain (``app.store.secrets``).

Read carefully and written atomically (``app.store.records``): an unreadable file is set aside, never
deleted; an entry whose name or address does not pass the checks the CLI applies is refused with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core.errors import ConfigError
from app.core.remotes import check_remote_name, normalise_url
from app.store.paths import home
from app.store.records import Loaded, load_records, save_records

KEY = "remotes"


@dataclass(frozen=True)
class RemoteRecord:
    name: str
    url: str  # the server root, normalised (no /v1 or /api/v1)
    has_key: bool = False  # a key was stored in the keychain for it

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "key": self.has_key}


def _parse(name: str, raw: Any) -> RemoteRecord:
    if not isinstance(raw, dict) or not isinstance(raw.get("url"), str):
        raise ConfigError(f"the remote {name!r} has no address")
    url = normalise_url(raw["url"])
    if url != raw["url"]:
        raise ConfigError(f"the remote {name!r} has an address that is not a server root")
    return RemoteRecord(check_remote_name(name), url, raw.get("key") is True)


def remotes_path() -> Path:
    return home() / "remotes.json"


def load_remotes(path: Path | None = None) -> Loaded[RemoteRecord]:
    return load_records(path or remotes_path(), KEY, _parse, "remotes")


def save_remotes(records: dict[str, RemoteRecord], path: Path | None = None) -> None:
    save_records(path or remotes_path(), KEY, {name: r.to_json() for name, r in records.items()})
