"""The machine and its support matrix, gathered from probe, pins, installs and settings."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from app.core.backends import GITHUB, BackendVersions
from app.core.hardware import Hardware
from app.core.matrix import RecipeSupport, SystemBinary, support_matrix
from app.platform import detect_hardware, find_system_llama_server
from app.store.catalog import load_backend_versions
from app.store.installs import installed_versions
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
    return SystemInfo(hardware, versions, recipes, system_binary)
