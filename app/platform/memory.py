"""Memory free now, where a model would go: for the fit check at load time (not the probe's totals)."""

from __future__ import annotations

import psutil

from app.core.fit import MemoryKind
from app.core.hardware import Hardware
from app.platform.probe import DRM, decimal, read_quietly, run_quietly, whole_number

MIB = 1 << 20


def _amd_vram_free() -> int | None:
    free = []
    for total_file in DRM.glob("card*/device/mem_info_vram_total"):
        total = whole_number(read_quietly(total_file))
        used = whole_number(read_quietly(total_file.with_name("mem_info_vram_used")))
        if total is not None and used is not None:
            free.append(total - used)
    return max(free) if free else None


def _nvidia_vram_free() -> int | None:
    out = run_quietly(["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits"])
    values = [value for v in (out or "").split() if (value := decimal(v)) is not None]
    return int(max(values) * MIB) if values else None


def free_memory(kind: MemoryKind, hardware: Hardware) -> int | None:
    """Bytes free now in system RAM or unified memory, or in the biggest GPU's VRAM; None: unknown."""
    if kind is not MemoryKind.VRAM:
        return int(psutil.virtual_memory().available)
    if hardware.amd_gpu:
        return _amd_vram_free()
    return _nvidia_vram_free() if hardware.nvidia_gpu else None
