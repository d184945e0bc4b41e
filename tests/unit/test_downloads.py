"""Model downloads against a loopback Hub that cuts, stalls, corrupts, gates and over-promises."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
from huggingface_hub import hf_hub_download, try_to_load_from_cache

from app.core.downloads import INTERRUPTED, DownloadRecord, DownloadState
from app.core.refs import FileSet, parse_ref, select
from app.store.downloads import DownloadLock, downloads_path, load_downloads, save_downloads
from app.store.hfcache import RepoCache, hub_cache_dir
from app.supervisor.downloads import (
    DownloadChanged,
    DownloadEvent,
    DownloadManager,
    DownloadProgress,
)
from app.supervisor.fetch import CHUNK
from app.supervisor.hub import HubClient
from tests.support.fileserver import Fault
from tests.support.hubserver import HubRepo, LoopbackHub
from tests.support.testrepos import BIG, SHARDS, TINY_MLX, big_files, tiny_mlx_files

BIG_FILES = big_files()
MLX_FILES = tiny_mlx_files()


def cache() -> Path:
    return hub_cache_dir()


async def listing_files(ref: str, token: str | None = None) -> FileSet:
    async with httpx.AsyncClient() as client:
        return select(await HubClient(client, token=token).listing(parse_ref(ref).repo_id), parse_ref(ref))


def files_for(ref: str) -> FileSet:
    return asyncio.run(listing_files(ref))


def run_downloads(
    *jobs: tuple[str, FileSet], token: str | None = None, script: Any = None, **kw: Any
) -> tuple[dict[str, DownloadRecord], list[DownloadEvent]]:
    """Submit every job to one manager, run ``script(manager, events)`` if given, wait for all."""
    events: list[DownloadEvent] = []

    async def go() -> dict[str, DownloadRecord]:
        async with httpx.AsyncClient() as client:
            # The app's own stall timeout: a loopback server on a busy machine can be silent for a
            # second or two, and a stall taken for real would cost a test an armed fault. The one test
            # of a stall shortens it, for a stall three times as long.
            options = {"backoff_s": 0.01, "stall_timeout_s": 30.0, **kw}
            manager = DownloadManager(cache(), HubClient(client, token=token), **options)
            manager.subscribe(events.append)
            for rid, files in jobs:
                manager.submit(rid, rid, files)
            if script is not None:
                await script(manager, events)
            records = {rid: await manager.wait(rid) for rid, _ in jobs}
            await manager.close()
            return records

    return asyncio.run(go()), events


def states(events: list[DownloadEvent], rid: str) -> list[DownloadState]:
    return [e.state for e in events if isinstance(e, DownloadChanged) and e.id == rid]


def assert_in_cache(repo: str, files: FileSet, contents: dict[str, bytes]) -> None:
    repo_cache = RepoCache(cache(), repo)
    assert repo_cache.ref() == files.revision
    for f in files.files:
        link = repo_cache.snapshot(files.revision) / f.path
        assert link.is_symlink() and not os.path.isabs(os.readlink(link))
        assert link.resolve() == repo_cache.blob(f.oid)
        assert link.read_bytes() == contents[f.path]
        # The shared cache layout: huggingface_hub finds what the app downloaded.
        assert try_to_load_from_cache(repo, f.path, cache_dir=cache()) == str(link)
    assert not list((repo_cache.folder / "blobs").glob("*.part"))


def test_sharded_gguf_downloads_whole_through_cuts_stalls_and_server_errors(hub: LoopbackHub) -> None:
    files = files_for(f"{BIG}:Q4_K_M")
    assert [f.path for f in files.files] == [*SHARDS, "mmproj-Big-f16.gguf"]
    hub.arm(BIG, SHARDS[0], Fault(status=503))
    hub.arm(BIG, SHARDS[1], Fault(cut_after=CHUNK + 10))
    hub.arm(BIG, SHARDS[2], Fault(stall_s=3.0))
    records, events = run_downloads(("big", files), stall_timeout_s=1.0)
    assert records["big"].state is DownloadState.DONE, records["big"].message
    assert_in_cache(BIG, files, BIG_FILES)
    assert states(events, "big") == [DownloadState.QUEUED, DownloadState.RUNNING, DownloadState.DONE]
    # The cut file resumed where it stopped rather than starting over.
    ranges = hub.requests_for(BIG, SHARDS[1])
    assert ranges[0] is None and ranges[1] is not None and int(ranges[1][6:-1]) >= CHUNK
    progress = [e for e in events if isinstance(e, DownloadProgress)]
    assert [p.done for p in progress] == sorted(p.done for p in progress)
    assert progress[-1].done == progress[-1].total == files.size
    # Files nobody asked for stayed on the Hub.
    assert not any("Q8_0" in p or "README" in p for p in hub.byte_requests())
    assert load_downloads().items["big"].state is DownloadState.DONE


def test_mlx_repo_downloads_whole_and_verified(hub: LoopbackHub) -> None:
    files = files_for(TINY_MLX)
    assert files.recipe == "lemon-mlx"
    assert {f.path for f in files.files} == set(MLX_FILES) - {"README.md", "figure.png"}
    # A small file outside LFS arrives damaged once: its git blob id catches it, and it is fetched again.
    hub.arm(TINY_MLX, "config.json", Fault(corrupt=True))
    records, _ = run_downloads(("mlx", files))
    assert records["mlx"].state is DownloadState.DONE, records["mlx"].message
    assert_in_cache(TINY_MLX, files, MLX_FILES)
    assert len(hub.requests_for(TINY_MLX, "config.json")) == 2
    assert hub.requests_for(TINY_MLX, "README.md") == hub.requests_for(TINY_MLX, "figure.png") == []


def test_wrong_bytes_are_deleted_and_fetched_once_more_then_fail_clearly(hub: LoopbackHub) -> None:
    files = files_for(f"{BIG}:Q8_0")
    hub.arm(BIG, "Big-Q8_0.gguf", Fault(corrupt=True))
    records, _ = run_downloads(("once", files))
    assert records["once"].state is DownloadState.DONE
    assert hub.requests_for(BIG, "Big-Q8_0.gguf") == [None, None]

    shutil.rmtree(cache())
    hub.arm(BIG, "Big-Q8_0.gguf", Fault(corrupt=True))
    hub.arm(BIG, "Big-Q8_0.gguf", Fault(corrupt=True))
    records, _ = run_downloads(("twice", files))
    assert records["twice"].state is DownloadState.FAILED
    assert "Big-Q8_0.gguf" in records["twice"].message and "arrived damaged twice" in records["twice"].message
    blobs = RepoCache(cache(), BIG).folder / "blobs"
    assert [p.name for p in blobs.iterdir() if "Q8" in p.name or p.stat().st_size > 1 << 20] == []


def test_gated_repo_needs_an_accepted_licence_and_a_token(hub: LoopbackHub) -> None:
    hub.add(HubRepo("gated-org/Secret-GGUF", {"Secret-Q4_0.gguf": BIG_FILES["Big-Q8_0.gguf"]}, gated=True))
    files = files_for("gated-org/Secret-GGUF:Q4_0")
    for token in (None, "hf_wrong"):
        records, _ = run_downloads(("gated", files), token=token)
        message = records["gated"].message
        assert records["gated"].state is DownloadState.FAILED
        assert "gated-org/Secret-GGUF is gated" in message and "Accept its licence" in message
        assert "token" in message
    assert [s for s in hub.served.log if "Secret-Q4_0" in s[0]]  # it did ask, and was refused
    records, _ = run_downloads(("gated", files), token=hub.token)
    assert records["gated"].state is DownloadState.DONE


def test_a_download_larger_than_the_free_disk_space_is_refused_up_front(hub: LoopbackHub) -> None:
    cache().mkdir(parents=True)
    free = shutil.disk_usage(cache()).free
    huge = free + 50 * 10**9  # the Hub says the file is 50 GB more than the disk has free
    hub.add(
        HubRepo("big-org/Huge-GGUF", {"Huge-Q8_0.gguf": b"GGUF"}, declared_sizes={"Huge-Q8_0.gguf": huge})
    )
    files = files_for("big-org/Huge-GGUF:Q8_0")
    records, _ = run_downloads(("huge", files))
    record = records["huge"]
    assert record.state is DownloadState.FAILED
    assert "Not enough disk space" in record.message and "Free up" in record.message
    shortfall = float(record.message.split("Free up ")[1].split(" GB")[0])
    assert 49.0 <= shortfall <= 51.0
    assert not [p for p in hub.byte_requests() if "Huge" in p]


async def until_held(files: FileSet) -> None:
    """Wait until every byte the server sends before its hold (CHUNK + 5) is in the partial file."""
    part = RepoCache(cache(), files.repo_id).blob(files.files[0].oid + ".part")
    while not (part.exists() and part.stat().st_size == CHUNK + 5):
        await asyncio.sleep(0.01)


def test_pause_resume_cancel_with_a_bounded_number_at_once(hub: LoopbackHub) -> None:
    q8 = files_for(f"{BIG}:Q8_0")
    mlx = files_for(TINY_MLX)
    hub.arm(BIG, "Big-Q8_0.gguf", Fault(hold_after=CHUNK + 5))
    held: dict[str, int] = {}

    async def script(manager: DownloadManager, events: list[DownloadEvent]) -> None:
        await until_held(q8)
        assert manager.records["mlx"].state is DownloadState.QUEUED  # one slot, taken by q8
        # The connection is silent, not closed: pausing must not wait for the 60 s stall timeout.
        paused = await asyncio.wait_for(manager.pause("q8"), 20)
        assert paused.state is DownloadState.PAUSED
        part = RepoCache(cache(), BIG).blob(q8.files[0].oid + ".part")
        held["part"] = part.stat().st_size
        assert paused.done_bytes >= held["part"]
        done = await manager.wait("mlx")  # the slot went to the next download
        assert done.state is DownloadState.DONE
        manager.resume("q8")

    records, events = run_downloads(
        ("q8", q8), ("mlx", mlx), script=script, max_parallel=1, stall_timeout_s=60
    )
    assert records["q8"].state is DownloadState.DONE
    assert states(events, "q8") == [
        DownloadState.QUEUED,
        DownloadState.RUNNING,
        DownloadState.PAUSED,
        DownloadState.QUEUED,
        DownloadState.RUNNING,
        DownloadState.DONE,
    ]
    assert hub.requests_for(BIG, "Big-Q8_0.gguf")[-1] == f"bytes={held['part']}-"
    assert held["part"] == CHUNK + 5  # every byte that arrived before the hold

    shutil.rmtree(cache())
    hub.arm(BIG, "Big-Q8_0.gguf", Fault(hold_after=CHUNK + 5))

    async def cancel(manager: DownloadManager, events: list[DownloadEvent]) -> None:
        await until_held(q8)
        assert (await manager.cancel("c")).state is DownloadState.CANCELLED

    records, _ = run_downloads(("c", q8), script=cancel, stall_timeout_s=60)
    assert records["c"].state is DownloadState.CANCELLED
    assert not list((RepoCache(cache(), BIG).folder / "blobs").glob("*.part"))


def test_download_state_survives_a_restart_and_resumes(hub: LoopbackHub) -> None:
    files = files_for(f"{BIG}:Q8_0")
    hub.arm(BIG, "Big-Q8_0.gguf", Fault(hold_after=CHUNK + 5))

    async def quit_app(manager: DownloadManager, events: list[DownloadEvent]) -> None:
        await until_held(files)
        await manager.close()

    records, _ = run_downloads(("q8", files), script=quit_app, stall_timeout_s=60)
    assert records["q8"].state is DownloadState.PAUSED
    assert records["q8"].message == "", "a pull stopped with Ctrl-C stays paused: no one resumes it"
    # A record a dead process left "running" comes back paused, with its bytes counted from disk.
    raw = json.loads(downloads_path().read_text())
    raw["downloads"]["q8"]["state"] = "running"
    downloads_path().write_text(json.dumps(raw))

    async def restart() -> DownloadRecord:
        async with httpx.AsyncClient() as client:
            manager = DownloadManager(cache(), HubClient(client), backoff_s=0.01)
            record = manager.records["q8"]
            assert (record.state, record.message) == (DownloadState.PAUSED, INTERRUPTED)
            assert record.done_bytes >= CHUNK
            manager.resume("q8")
            record = await manager.wait("q8")
            await manager.close()
            return record

    assert asyncio.run(restart()).state is DownloadState.DONE
    assert hub.requests_for(BIG, "Big-Q8_0.gguf")[-1] == f"bytes={CHUNK + 5}-"


def test_the_window_quitting_marks_its_downloads_for_its_next_start(hub: LoopbackHub) -> None:
    files = files_for(f"{BIG}:Q8_0")
    hub.arm(BIG, "Big-Q8_0.gguf", Fault(hold_after=CHUNK + 5))

    async def quit_window(manager: DownloadManager, events: list[DownloadEvent]) -> None:
        await until_held(files)
        await manager.close(resume_later=True)

    records, _ = run_downloads(("q8", files), script=quit_window, stall_timeout_s=60)
    assert (records["q8"].state, records["q8"].message) == (DownloadState.PAUSED, INTERRUPTED)


def test_a_corrupt_downloads_file_is_set_aside_and_reported(hub: LoopbackHub) -> None:
    downloads_path().write_text("{ not json")
    records, _ = run_downloads(("q8", files_for(f"{BIG}:Q8_0")))
    assert records["q8"].state is DownloadState.DONE
    backups = list(downloads_path().parent.glob("downloads.json.corrupt-*"))
    assert len(backups) == 1 and backups[0].read_text() == "{ not json"
    assert load_downloads().items["q8"].state is DownloadState.DONE


@pytest.mark.leaves_running(
    "huggingface_hub keeps its keep-alive connection to the loopback Hub open after the test, so the "
    "server's handler thread waits on it; the fix is a Hub server that closes idle connections at exit"
)
def test_files_another_tool_put_in_the_cache_are_not_fetched_again(hub: LoopbackHub) -> None:
    endpoint = os.environ["HF_ENDPOINT"]
    hf_hub_download(BIG, "Big-Q8_0.gguf", cache_dir=cache(), endpoint=endpoint)
    hf_hub_download(BIG, "mmproj-Big-f16.gguf", cache_dir=cache(), endpoint=endpoint)
    asked_before = len(hub.byte_requests())
    files = files_for(f"{BIG}:Q8_0")
    records, events = run_downloads(("q8", files))
    assert records["q8"].state is DownloadState.DONE
    assert len(hub.byte_requests()) == asked_before  # not one byte fetched
    assert not [e for e in events if isinstance(e, DownloadProgress)]
    assert_in_cache(BIG, files, BIG_FILES)


def test_a_download_another_process_runs_is_left_to_it(hub: LoopbackHub) -> None:
    files = files_for(f"{BIG}:Q8_0")
    save_downloads({"q8": DownloadRecord("q8", "q8", files, DownloadState.RUNNING)})
    other = DownloadLock("q8")  # what a live `lemon-desk pull` of the same model holds
    assert other.acquire()
    try:
        records, _ = run_downloads(("q8", files))
        assert records["q8"].state is DownloadState.FAILED
        assert "being downloaded by another Lemon Desk process" in records["q8"].message
        assert full_gets(hub.requests_for(BIG, "Big-Q8_0.gguf")) == []

        save_downloads({"q8": DownloadRecord("q8", "q8", files, DownloadState.RUNNING)})

        async def look() -> DownloadRecord:
            async with httpx.AsyncClient() as client:
                return DownloadManager(cache(), HubClient(client)).records["q8"]

        assert asyncio.run(look()).state is DownloadState.RUNNING  # alive elsewhere: not "interrupted"
    finally:
        other.release()
    assert asyncio.run(look()).state is DownloadState.PAUSED


def full_gets(ranges: list[str | None]) -> list[str | None]:
    return [r for r in ranges if r is None or r.endswith("-")]


@pytest.mark.parametrize(
    "field,value",
    [
        ("path", "../../../../outside/x.gguf"),
        ("sha256", "../../../outside"),
        ("revision", "../../../outside"),
        ("repo_id", "../outside"),
    ],
)
def test_a_tampered_download_record_is_set_aside_not_resumed(
    hub: LoopbackHub, tmp_path: Path, field: str, value: str
) -> None:
    """downloads.json is read back at start; a name in it that leads out of the cache is not trusted."""
    record = DownloadRecord("q8", "q8", files_for(f"{BIG}:Q8_0"), DownloadState.PAUSED)
    save_downloads({"q8": record})
    raw = json.loads(downloads_path().read_text())
    entry = raw["downloads"]["q8"]
    (entry["files"][0] if field in ("path", "sha256") else entry)[field] = value
    tampered = json.dumps(raw)
    downloads_path().write_text(tampered)

    async def start() -> DownloadManager:
        async with httpx.AsyncClient() as client:
            return DownloadManager(cache(), HubClient(client))

    manager = asyncio.run(start())
    assert manager.records == {}
    assert manager.warning.startswith("The downloads file was unreadable (Download 'q8' is not safe")
    [backup] = downloads_path().parent.glob("downloads.json.corrupt-*")
    assert backup.read_text() == tampered  # kept for the user, never deleted
    assert {p.name for p in tmp_path.iterdir()} <= {"lemon-home", "hf-cache"}
