"""The system sampler behind the Telemetry view and the local API's system-stats: real figures for this
machine and a real child process; GPU figures from a fake sysfs tree (this machine has no GPU)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from app.platform.gpu import GpuReader
from app.store.settings import Settings
from app.supervisor.router import Router
from app.supervisor.sampler import Sampler


def _running_python() -> subprocess.Popen[bytes]:
    """A child Python that has started: sampled between its fork and exec (a busy machine), it would
    show well under a megabyte resident and fail the figure checks for a reason of the test's own."""
    code = "import sys, time; print('up', flush=True); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline() == b"up\n"
    return child


def test_sample_has_the_machine_and_each_engine_and_no_made_up_gpu() -> None:
    child = _running_python()
    try:
        sampler = Sampler()
        sampler.sample({"engine": child.pid})
        sample = sampler.sample({"engine": child.pid, "gone": 999_999_999})
    finally:
        child.kill()
        child.communicate()
    assert 0 <= sample.cpu_percent <= 100 and 0 < sample.memory_used < sample.memory_total
    (engine,) = sample.engines
    assert engine.model == "engine" and engine.rss_bytes > 1_000_000 and engine.vram_bytes is None
    if not GpuReader().available:
        assert sample.gpu_percent is None and sample.vram_used is None
        assert sample.stats()["gpu_percent"] is None and sample.stats()["vram_gb"] is None
    assert set(sample.stats()) == {"cpu_percent", "memory_gb", "gpu_percent", "vram_gb"}


def test_unified_memory_reports_the_engines_resident_memory_as_vram() -> None:
    child = _running_python()
    try:
        sample = Sampler(unified_memory=True).sample({"engine": child.pid})
    finally:
        child.kill()
        child.communicate()
    assert sample.engines[0].vram_bytes == sample.engines[0].rss_bytes == sample.vram_used


def test_amd_figures_from_sysfs(tmp_path: Path) -> None:
    device = tmp_path / "card1" / "device"  # a fake of /sys/class/drm/card1/device
    device.mkdir(parents=True)
    (device / "gpu_busy_percent").write_text("37\n")
    (device / "mem_info_vram_used").write_text(str(2 * 1024**3))
    (device / "mem_info_vram_total").write_text(str(16 * 1024**3))
    (tmp_path / "card1-DP-1").mkdir()
    reader = GpuReader(drm=tmp_path)
    assert reader.available
    now = reader.read()
    assert now is not None and now.busy_percent == 37 and now.vram_used == 2 * 1024**3
    assert now.vram_total == 16 * 1024**3


def test_router_system_stats_and_watching_start_and_stop() -> None:
    async def go() -> None:
        async with Router(Settings()) as router:
            stats = await router.system_stats()
            assert stats["memory_gb"] > 0
            seen = []
            router.subscribe(seen.append)
            router.watch_system(True)
            while not seen:
                await asyncio.sleep(0.05)
            router.watch_system(False)
            assert router._watcher is not None
            await router._watcher
            assert not router.watching_system

    asyncio.run(go())
