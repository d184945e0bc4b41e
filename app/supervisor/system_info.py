"""The machine and its support matrix, gathered from probe, pins, installs and settings."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from app.core.backends import GITHUB, BackendKind, BackendVersions
from app.core.hardware import Hardware
from app.core.matrix import RecipeSupport, SystemBinary, support_matrix
from app.platform import detect_hardware, find_system_llama_server
from app.store.catalog import load_backend_versions
from app.store.installs import installed_manifests, installed_versions
from app.store.settings import Settings


@dataclass(frozen=True)
class SystemInfo:
    hardware: Hardware
    versions: BackendVersions
    recipes: dict[str, RecipeSupport]
    system_binary: SystemBinary | None = None  # the user's own llama-server, for the `system` backend

    def to_json(self) -> dict[str, Any]:
        return {
            "hardware": self.hardware.to_json(),
            "recipes": {name: support.to_json() for name, support in self.recipes.items()},
        }


def release_base(settings: Settings) -> str:
    """``LEMON_DESK_RELEASE_MIRROR``, else the mirror in settings, else GitHub."""
    return os.environ.get("LEMON_DESK_RELEASE_MIRROR") or settings.release_mirror or GITHUB


def gather(settings: Settings, hardware: Hardware | None = None) -> SystemInfo:
    """Everything about backends here; pass ``hardware`` to skip probing it again."""
    hardware = hardware or detect_hardware()
    versions = load_backend_versions()
    system_binary = find_system_llama_server(settings.llama_server_path or None)
    recipes = support_matrix(
        hardware,
        versions,
        installed=installed_versions(),
        system_binary=system_binary,
        release_base=release_base(settings),
    )
    manifests = installed_manifests()
    for support in recipes.values():
        for name, status in support.backends.items():
            spec = versions.spec(support.recipe, name)
            if spec.kind is not BackendKind.RELEASE:
                continue
            manifest = manifests.get(spec.key)
            if manifest is not None and manifest.version == spec.version:
                digest: str | None = manifest.verified_by or "unverified"
            else:
                digest = "pin" if status.asset and spec.sha256.get(status.asset) else None
            support.backends[name] = dataclasses.replace(status, digest=digest)
    return SystemInfo(hardware, versions, recipes, system_binary)
