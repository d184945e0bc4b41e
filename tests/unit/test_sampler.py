"""The system sampler behind the Telemetry view and the local API's system-stats: real figures for this
machine and a real child process; GPU figures from a fake sysfs tree (this machine has no GPU)."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import cast

from app.core.engine_state import EngineState
from app.platform.gpu import GpuReader
from app.store.settings import Settings
from app.supervisor.router import EngineUsage, Router
from app.supervisor.router.usage import SYSTEM_INTERVAL_S, USAGE_INTERVAL_S, Usage
from app.supervisor.sampler import Sampler, SystemSample
from app.supervisor.supervisor import Supervisor
from tests.support.waiting import until


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


def test_while_the_telemetry_view_watches_its_samples_carry_the_status_bars_figures() -> None:
    """Both asked for, one sampler runs: the status bar's engine figures come with a system sample, at
    their own pace (about USAGE_INTERVAL_S apart, not each second: a new text lays the bar out), and
    its own 2 s timer is back once the view stops watching."""
    child = _running_python()

    async def until_seen(events: list[object], count: int) -> None:
        await until(lambda: sum(isinstance(e, EngineUsage) for e in events) >= count, timeout_s=10.0)

    async def go() -> None:
        engine = SimpleNamespace(state=EngineState.READY, pid=child.pid)
        supervisor = SimpleNamespace(engines={"engine": engine}, known_hardware=None)
        events: list[object] = []
        usage_times: list[float] = []

        def emit(event: object) -> None:
            events.append(event)
            if isinstance(event, EngineUsage):
                usage_times.append(time.monotonic())

        usage = Usage(cast(Supervisor, supervisor), emit, lambda: False)
        usage.sample_usage(True)
        usage.watch_system(True)
        try:
            await until_seen(events, 2)
            assert usage.sampler is not None
            await asyncio.wait_for(usage.sampler, 5)  # the status bar's timer ended: one sampler
            events.clear()
            usage_times.clear()
            await until_seen(events, 3)
            kinds = [type(e) for e in events]
            gaps = [later - earlier for earlier, later in itertools.pairwise(usage_times)]
            assert min(gaps) >= USAGE_INTERVAL_S - SYSTEM_INTERVAL_S / 2 - 0.05, gaps
            assert all(kinds[i - 1] is SystemSample for i, k in enumerate(kinds) if k is EngineUsage)
            (figures,) = {(e.model, e.rss_bytes > 1_000_000) for e in events if isinstance(e, EngineUsage)}
            assert figures == ("engine", True)
            usage.watch_system(False)
            assert usage.watcher is not None
            await asyncio.wait_for(usage.watcher, 5)
            events.clear()
            await until_seen(events, 1)  # from the status bar's own timer again
            assert not any(isinstance(e, SystemSample) for e in events)
        finally:
            tasks = usage.stop()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    try:
        asyncio.run(go())
    finally:
        child.kill()
        child.communicate()
