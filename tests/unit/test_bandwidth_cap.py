"""The seed's download bandwidth cap on unified memory: the rule (pure), the throttle measured on a
loopback download (a smaller cap than the seed's 50 MB/s, through the same parameter), and the
progress line that says so."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import httpx
import pytest

from app.core.fit import DOWNLOAD_CAP_BPS, BandwidthCap, MemoryKind, download_cap
from app.core.refs import FileSet, parse_ref, select
from app.store.hfcache import hub_cache_dir
from app.store.settings import Settings
from app.supervisor.downloads import DownloadManager, DownloadProgress
from app.supervisor.fetch import fetch
from app.supervisor.hub import HubClient
from app.supervisor.router import Router
from app.supervisor.router import pulls as router_module
from tests.conftest import profile_path
from tests.support.fileserver import Served, serve
from tests.support.hubserver import LoopbackHub
from tests.support.testrepos import BIG

GB = 10**9
TEST_CAP = 1e6  # bytes a second: the seed's 50 MB/s would finish a loopback test file too soon to measure
MANAGER_CAP = 2e6  # the test repo's 3.3 MB: about 1.7 s, so per-file set-up is small beside it
# A capped download takes at least its bytes / the cap (the throttle waits the last piece out too), and
# beyond that about what the same download takes uncapped, its set-up and its transfer, measured in the
# same run: twice that, plus half a second, lets a machine ten times slower (or a busy one) pass and still
# finds a throttle that waits twice too long.
SLACK_S = 0.5


def within_the_cap(size: int, cap: float, capped_s: float, free_s: float) -> None:
    rate = size / capped_s
    assert rate <= 1.1 * cap, f"{rate / 1e6:.3f} MB/s over a cap of {cap / 1e6:g} MB/s"
    assert capped_s <= size / cap + 2 * free_s + SLACK_S, f"{capped_s:.2f} s; uncapped {free_s:.2f} s"


def test_the_cap_applies_only_on_unified_memory_when_the_download_exceeds_half_of_what_is_free() -> None:
    cap = download_cap(MemoryKind.UNIFIED, 9 * GB, 16 * GB)
    assert cap is not None and cap.bps == DOWNLOAD_CAP_BPS == 50e6
    assert cap.label().startswith("capped at 50 MB/s: 9.00 GB to fetch is more than half of the 16.00 GB")
    assert download_cap(MemoryKind.UNIFIED, 8 * GB, 16 * GB) is None  # exactly half: not over it
    assert download_cap(MemoryKind.RAM, 90 * GB, 16 * GB) is None
    assert download_cap(MemoryKind.VRAM, 90 * GB, 16 * GB) is None
    assert download_cap(MemoryKind.UNIFIED, 90 * GB, None) is None  # unknown: no cap


def test_a_capped_fetch_keeps_to_the_cap(tmp_path: Path) -> None:
    body = os.urandom(2 * 10**6)
    with serve(Served(files={"/f.bin": body})) as base:

        async def timed(max_bps: float | None, dest: Path) -> float:
            with httpx.Client() as client:
                start = time.monotonic()
                await fetch(client, f"{base}/f.bin", dest, max_bps=max_bps)
                return time.monotonic() - start

        capped = asyncio.run(timed(TEST_CAP, tmp_path / "capped.bin"))
        free = asyncio.run(timed(None, tmp_path / "free.bin"))
    rate = len(body) / capped
    uncapped = len(body) / free / 1e6
    print(f"capped at {TEST_CAP / 1e6:g} MB/s: measured {rate / 1e6:.3f} MB/s; uncapped {uncapped:.0f} MB/s")
    within_the_cap(len(body), TEST_CAP, capped, free)
    # The cap is a parameter of one download, not a slower path for all: 2 MB uncapped takes well under
    # the 2 s capped, even on a machine ten times slower (5 MB/s here on a busy machine would do).
    assert free < capped / 2
    assert (tmp_path / "capped.bin").read_bytes() == body


def test_the_download_manager_caps_and_reports_it(hub: LoopbackHub, tmp_path: Path) -> None:
    events: list[DownloadProgress] = []

    async def go(cap_bps: float | None, cache: Path) -> tuple[float, FileSet]:
        async with httpx.AsyncClient() as client:
            hub_client = HubClient(client)
            files = select(await hub_client.listing(BIG), parse_ref(f"{BIG}:Q8_0"))

            def policy(recipe: str, remaining: int) -> BandwidthCap | None:
                assert (recipe, remaining) == ("llamacpp", files.size)
                if cap_bps is None:
                    return None
                return download_cap(MemoryKind.UNIFIED, remaining, remaining, cap_bps=cap_bps)

            manager = DownloadManager(cache, hub_client, cap_policy=policy)
            if cap_bps is not None:
                manager.subscribe(lambda e: events.append(e) if isinstance(e, DownloadProgress) else None)
            start = time.monotonic()
            manager.submit("q8", "q8", files)
            await manager.wait("q8")
            elapsed = time.monotonic() - start
            await manager.close()
            return elapsed, files

    free, _ = asyncio.run(go(None, tmp_path / "uncapped-cache"))  # the same download, uncapped
    elapsed, files = asyncio.run(go(MANAGER_CAP, hub_cache_dir()))
    rate = files.size / elapsed
    print(
        f"manager capped at {MANAGER_CAP / 1e6:g} MB/s: {rate / 1e6:.3f} MB/s over {files.size:,} bytes;"
        f" uncapped {free:.2f} s"
    )
    within_the_cap(files.size, MANAGER_CAP, elapsed, free)
    assert events and all(e.cap is not None and e.cap.bps == MANAGER_CAP for e in events)
    assert events[-1].cap is not None and events[-1].cap.label().startswith("capped at 2 MB/s: ")


def test_the_router_caps_big_downloads_on_unified_memory_only(
    hub: LoopbackHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(router_module, "free_memory", lambda kind, hw: 1000)  # almost nothing free

    def cap_for(profile: str) -> BandwidthCap | None:
        monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path(profile)))
        return Router(Settings())._cap("llamacpp", 10**6)

    mac = cap_for("apple_silicon")
    assert mac is not None and mac.bps == 50e6
    halo = cap_for("strix_halo")  # an AMD APU: unified memory too
    assert halo is not None
    assert cap_for("cpu_only_x86") is None and cap_for("nvidia") is None
