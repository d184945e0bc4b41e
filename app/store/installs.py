"""What is installed under ``<home>/engines/<recipe>/<backend>/``: each install's manifest."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from app.core.backends import BackendKey
from app.store.files import atomic_write_json, read_json
from app.store.paths import engines_dir

MANIFEST = "lemon-desk-install.json"


@dataclass(frozen=True)
class InstallManifest:
    version: str
    asset: str
    sha256: str
    verified_by: str = ""  # "pin" or "release": where the expected SHA-256 came from; "": unchecked


def install_dir(recipe: str, backend: str) -> Path:
    return engines_dir() / recipe / backend


def read_manifest(folder: Path) -> InstallManifest | None:
    """The manifest of a complete install, or None (missing or unreadable means not installed)."""
    try:
        data = read_json(folder / MANIFEST)
        return InstallManifest(
            str(data["version"]), str(data["asset"]), str(data["sha256"]), str(data.get("verified_by", ""))
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_manifest(folder: Path, manifest: InstallManifest) -> None:
    atomic_write_json(folder / MANIFEST, asdict(manifest))


def installed_versions() -> dict[BackendKey, str]:
    """The version of every complete install."""
    root = engines_dir()
    found = {}
    for folder in sorted(root.glob("*/*")) if root.is_dir() else []:
        manifest = read_manifest(folder)
        if manifest is not None:
            found[BackendKey(folder.parent.name, folder.name)] = manifest.version
    return found


def installed_manifests() -> dict[BackendKey, InstallManifest]:
    """The manifest of every complete install."""
    root = engines_dir()
    found = {}
    for folder in sorted(root.glob("*/*")) if root.is_dir() else []:
        manifest = read_manifest(folder)
        if manifest is not None:
            found[BackendKey(folder.parent.name, folder.name)] = manifest
    return found
