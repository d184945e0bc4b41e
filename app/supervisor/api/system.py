"""``GET system-info`` in Lemonade's shape, over ours: the app's own ``hardware`` and ``recipes`` (as
``lemon-desk system-info --json`` prints them) with Lemonade's keys beside them: ``OS Version``,
``Processor``, ``Physical Memory``, ``model_storage`` (the drive that holds the Hugging Face cache),
``devices`` (no support information) and, per backend, the ``devices`` here it runs on and the
``action`` that installs or updates it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from app.core.backends import BackendState
from app.core.hardware import Hardware
from app.core.matrix import BackendStatus
from app.supervisor.system_info import SystemInfo

OS_NAMES = {"linux": "Linux", "macos": "macOS"}
# Which kinds of device each backend computes on (``system``: a llama-server of unknown build).
BACKEND_DEVICES = {
    "cpu": ("cpu",),
    "system": ("cpu",),
    "mlx-lm": ("cpu", "metal"),
    "metal": ("metal",),
    "rocm": ("amd_gpu",),
    "cuda": ("nvidia_gpu",),
    "vulkan": ("amd_gpu", "nvidia_gpu"),
}


def devices(hw: Hardware) -> dict[str, Any]:
    out: dict[str, Any] = {
        "cpu": {
            "name": hw.cpu.name,
            "cores": hw.cpu.cores,
            "threads": hw.cpu.threads,
            "available": True,
            "family": hw.arch,
        }
    }
    if hw.amd_gpu:
        out["amd_gpu"] = [
            {
                "name": g.name,
                "vram_gb": g.vram_gb,
                "available": True,
                "family": g.gfx,
                "integrated": g.integrated,
            }
            for g in hw.amd_gpu
        ]
    if hw.nvidia_gpu:
        out["nvidia_gpu"] = [
            {"name": g.name, "vram_gb": g.vram_gb, "available": True, "family": f"sm_{g.compute_capability}"}
            for g in hw.nvidia_gpu
        ]
    if hw.metal.available:
        out["metal"] = {"name": hw.metal.name, "available": True, "family": "metal"}
    return out


def _backend(recipe: str, status: BackendStatus, present: set[str]) -> dict[str, Any]:
    kinds = BACKEND_DEVICES.get(status.backend, ())
    runs_on = [] if status.state is BackendState.UNSUPPORTED else [k for k in kinds if k in present]
    updatable = status.state in (BackendState.INSTALLABLE, BackendState.UPDATE_REQUIRED)
    return {
        **status.to_json(),
        "devices": runs_on,
        "action": f"lemon-desk backends install {recipe}:{status.backend}" if updatable else "",
    }


def model_storage(path: Path) -> dict[str, Any]:
    """The drive that holds ``path`` (or would, once made): its size, used and free bytes."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        usage = shutil.disk_usage(probe)
    except OSError:
        return {"path": str(path), "used_bytes": None, "total_bytes": None, "free_bytes": None}
    return {"path": str(path), "used_bytes": usage.used, "total_bytes": usage.total, "free_bytes": usage.free}


def system_info_json(info: SystemInfo, storage: dict[str, Any]) -> dict[str, Any]:
    hw = info.hardware
    found = devices(hw)
    present = {kind for kind, device in found.items() if device}
    recipes = {}
    for name, support in info.recipes.items():
        recipes[name] = {
            **support.to_json(),
            "backends": {b: _backend(name, s, present) for b, s in support.backends.items()},
        }
    return {
        "OS Version": f"{OS_NAMES.get(hw.os, hw.os)} {hw.arch}",
        "Processor": hw.cpu.name,
        "Physical Memory": f"{hw.memory_gb:.1f} GB",
        "model_storage": storage,
        "devices": found,
        "hardware": hw.to_json(),
        "recipes": recipes,
    }
