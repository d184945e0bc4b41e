"""GPU load and VRAM now, where the machine tells without root: NVIDIA through NVML (``nvidia-ml-py``,
when installed) or ``nvidia-smi``, AMD through sysfs (``gpu_busy_percent``, ``mem_info_vram_used``,
``mem_info_vram_total``). Anything unknown is None, never zero: a chart says "not available" for it.
Apple Silicon has unified memory: the engine's resident memory is its share, so there is nothing here.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.platform.probe import DRM, decimal, read_quietly, run_quietly, whole_number

MIB = 1 << 20


@dataclass(frozen=True)
class GpuNow:
    """The machine's GPUs together: busy % (mean over the GPUs that report it) and VRAM."""

    busy_percent: float | None
    vram_used: int | None  # bytes
    vram_total: int | None
    per_process_vram: dict[int, int]  # pid -> bytes, where the driver reports it (NVIDIA)


def _amd(drm: Path = DRM) -> GpuNow | None:
    busy, used, total = [], 0, 0
    found = False
    for device in sorted(drm.glob("card*/device")):
        if "-" in device.parent.name:
            continue  # card0-DP-1 and such are connectors, not GPUs
        percent = whole_number(read_quietly(device / "gpu_busy_percent"))
        vram_used = whole_number(read_quietly(device / "mem_info_vram_used"))
        vram_total = whole_number(read_quietly(device / "mem_info_vram_total"))
        if percent is None and vram_total is None:
            continue
        found = True
        if percent is not None:
            busy.append(percent)
        if vram_used is not None and vram_total is not None:
            used, total = used + vram_used, total + vram_total
    if not found:
        return None
    return GpuNow(sum(busy) / len(busy) if busy else None, used if total else None, total or None, {})


def _nvml() -> Any | None:
    try:
        import pynvml  # nvidia-ml-py, optional

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # not installed, or no driver
        return None


def _nvidia_nvml(nvml: Any) -> GpuNow | None:
    try:
        busy: list[float] = []
        used, total, per_process = 0, 0, dict[int, int]()
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            busy.append(float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu))
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            used, total = used + int(memory.used), total + int(memory.total)
            for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.usedGpuMemory:
                    per_process[int(proc.pid)] = per_process.get(int(proc.pid), 0) + int(proc.usedGpuMemory)
    except Exception:
        return None
    return GpuNow(sum(busy) / len(busy) if busy else None, used, total or None, per_process)


def _nvidia_smi() -> GpuNow | None:
    out = run_quietly(
        [
            "nvidia-smi",
            "--query-gpu=utilization.gpu,memory.used,memory.total",
            "--format=csv,noheader,nounits",
        ]
    )
    if not out:
        return None
    busy, used, total = [], 0.0, 0.0
    for line in out.strip().splitlines():
        match [decimal(v) for v in line.split(",")]:
            case [float() as percent, float() as mem_used, float() as mem_total]:
                busy.append(percent)
                used, total = used + mem_used, total + mem_total
            # else a GPU that says "[N/A]" (or anything that is no number): not counted
    if not busy:
        return None
    per_process: dict[int, int] = {}
    apps = run_quietly(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
    )
    for line in (apps or "").strip().splitlines():
        pid_text, _, mib_text = line.partition(",")
        pid, mib = whole_number(pid_text), whole_number(mib_text)
        if pid is not None and mib is not None:
            per_process[pid] = per_process.get(pid, 0) + mib * MIB
    return GpuNow(sum(busy) / len(busy), int(used * MIB), int(total * MIB), per_process)


class GpuReader:
    """Chooses once how this machine reports its GPUs, then reads them on each call (in a thread:
    ``nvidia-smi`` takes tens of milliseconds)."""

    def __init__(self, drm: Path = DRM) -> None:
        self._drm = drm
        self._nvml = _nvml()
        self._smi = self._nvml is None and shutil.which("nvidia-smi") is not None
        self._amd = _amd(drm) is not None

    @property
    def available(self) -> bool:
        return self._amd or self._nvml is not None or self._smi

    def read(self) -> GpuNow | None:
        if self._amd:
            return _amd(self._drm)
        if self._nvml is not None:
            return _nvidia_nvml(self._nvml)
        return _nvidia_smi() if self._smi else None
