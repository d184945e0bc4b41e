"""System and engine figures now: CPU %, RAM, GPU % and VRAM for the machine and for each engine.

One ``Sampler`` serves the Telemetry view (``Router.watch_system``: a ``SystemSample`` event a second,
only while someone watches) and the local API's ``GET system-stats`` (``Router.system_stats``). A sample
blocks for a few milliseconds (``nvidia-smi`` for tens), so callers on the loop run it in a thread; a
lock keeps two callers from interleaving. CPU % is over the time since the previous sample, as psutil
measures it. GPU figures the machine does not give are None ("not available"), never zero. On Apple
Silicon memory is unified: an engine's VRAM is its resident memory.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psutil

from app.core.units import GB
from app.platform.gpu import GpuReader


@dataclass(frozen=True)
class EngineNow:
    model: str
    cpu_percent: float | None  # of one core: 200 is two cores busy; None the first time it is seen
    rss_bytes: int
    vram_bytes: int | None  # None: the driver does not say per process


@dataclass(frozen=True)
class SystemSample:
    """The machine and every running engine at ``at`` (seconds since the epoch)."""

    at: float
    cpu_percent: float  # of the whole machine: 100 is every core busy
    memory_used: int
    memory_total: int
    gpu_percent: float | None
    vram_used: int | None
    vram_total: int | None
    unified_memory: bool  # Apple Silicon: VRAM figures are the engines' resident memory
    engines: tuple[EngineNow, ...] = ()

    def stats(self) -> dict[str, Any]:
        """The local API's ``system-stats``: ``cpu_percent``, ``memory_gb``, ``gpu_percent``, ``vram_gb``
        (null where the machine does not say)."""
        return {
            "cpu_percent": round(self.cpu_percent, 1),
            "memory_gb": round(self.memory_used / GB, 3),
            "gpu_percent": round(self.gpu_percent, 1) if self.gpu_percent is not None else None,
            "vram_gb": round(self.vram_used / GB, 3) if self.vram_used is not None else None,
        }


class Sampler:
    """Takes the machine's and the engines' figures now (``sample``), thread-safe."""

    def __init__(self, unified_memory: bool = False) -> None:
        self.unified_memory = unified_memory
        self._gpu: GpuReader | None = None
        self._processes: dict[int, psutil.Process] = {}
        self._lock = threading.Lock()
        self._cpu_times = psutil.cpu_times()
        self._cpu_percent = 0.0

    def _machine_cpu(self) -> float:
        """Busy share of all cores since the last call, from our own previous reading (psutil's
        ``cpu_percent(None)`` keeps one global reading that any other caller would move)."""
        now = psutil.cpu_times()
        busy = sum(now) - now.idle - getattr(now, "iowait", 0.0)
        busy_before = sum(self._cpu_times) - self._cpu_times.idle - getattr(self._cpu_times, "iowait", 0.0)
        total = sum(now) - sum(self._cpu_times)
        if total > 0:
            self._cpu_percent = max(0.0, min(100.0, 100 * (busy - busy_before) / total))
            self._cpu_times = now
        return self._cpu_percent

    def sample(self, engines: Mapping[str, int]) -> SystemSample:
        """The figures now for the machine and for ``engines`` (model name -> pid). Blocking."""
        with self._lock:
            if self._gpu is None:
                self._gpu = GpuReader()
            gpu = self._gpu.read()
            memory = psutil.virtual_memory()
            now: list[EngineNow] = []
            for name, pid in engines.items():
                try:
                    first = pid not in self._processes
                    proc = self._processes.get(pid) or self._processes.setdefault(pid, psutil.Process(pid))
                    with proc.oneshot():
                        percent, rss = proc.cpu_percent(None), int(proc.memory_info().rss)
                    cpu = None if first else percent  # the first reading has nothing to compare with
                except psutil.Error:
                    self._processes.pop(pid, None)
                    continue
                vram = rss if self.unified_memory else (gpu.per_process_vram.get(pid) if gpu else None)
                now.append(EngineNow(name, cpu, rss, vram))
            live = set(engines.values())
            for pid in [p for p in self._processes if p not in live]:
                del self._processes[pid]
            vram_used = gpu.vram_used if gpu else None
            vram_total = gpu.vram_total if gpu else None
            if self.unified_memory:
                vram_used, vram_total = sum(e.rss_bytes for e in now), int(memory.total)
            return SystemSample(
                at=time.time(),
                cpu_percent=self._machine_cpu(),
                memory_used=int(memory.total - memory.available),
                memory_total=int(memory.total),
                gpu_percent=gpu.busy_percent if gpu else None,
                vram_used=vram_used,
                vram_total=vram_total,
                unified_memory=self.unified_memory,
                engines=tuple(now),
            )
