"""The disk fills up: a small tmpfs (a real file system that really runs out of room) as the Hugging Face
cache during a download, as LEMON_DESK_HOME during an install, and under the chat history while it is
written. Each time: a clear error (no traceback), nothing corrupt, and it works once space is back."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.core.downloads import DownloadRecord, DownloadState
from app.core.errors import StorageError
from app.core.refs import parse_ref, select
from app.store.hfcache import hub_cache_dir
from app.store.history import History
from app.store.installs import MANIFEST, install_dir
from app.supervisor.downloads import DownloadChanged, DownloadEvent, DownloadManager
from app.supervisor.hub import HubClient
from tests.chaos.conftest import Row
from tests.chaos.test_app_kill import ROOT, archive_files, complete_or_absent
from tests.integration.conftest import Mirror
from tests.support.hubserver import HubRepo, LoopbackHub
from tests.support.modelfiles import gguf_files
from tests.support.testrepos import TINY_MLX, loopback_hub

REPO, FILE = "chaos-org/Full-GGUF", "Full-Q4_K_M.gguf"
RATE_BPS = 8 << 20


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of 96 MiB, unmounted after the test."""
    where = tmp_path / "small-disk"
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=96m", "tmpfs", str(where)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}): the disk-full cases need root")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path, leave: int) -> Path:
    """A file that takes all of ``disk`` but ``leave`` bytes."""
    ballast = disk / "ballast"
    stat = os.statvfs(disk)
    want = max(0, stat.f_bavail * stat.f_frsize - leave)
    block = b"\0" * (1 << 20)
    with ballast.open("ab") as f:
        while want > 0:
            try:
                f.write(block[: min(len(block), want)])
            except OSError as err:  # something else took the rest meanwhile: full all the same
                if err.errno != errno.ENOSPC:
                    raise
                break
            want -= min(len(block), want)
    return ballast


def lemon_desk(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=180
    )


def clear_error(err: str) -> bool:
    """One ``error:`` line that speaks of disk space, after any progress lines; no traceback."""
    last = err.strip().splitlines()[-1] if err.strip() else ""
    return "Traceback" not in err and last.startswith("error: ") and "space" in last.lower()


@pytest.mark.chaos("disk full during a download")
def test_a_download_that_fills_the_disk_fails_clearly_and_resumes_with_space(
    chaos_row: Row, small_disk: Path, tmp_path: Path
) -> None:
    data = gguf_files("Full-Q4_K_M", layers=4, tensor_kib=3072)["Full-Q4_K_M.gguf"]  # about 12 MiB
    hub = LoopbackHub()
    repo = hub.add(HubRepo(REPO, {FILE: data}, tags=("gguf",)))
    cache = small_disk / "hub"
    with hub.running() as base:
        env = {**os.environ, "HF_ENDPOINT": base, "HF_HUB_CACHE": str(cache)}
        # Room at the start (the pre-check passes), then something else takes it mid-file.
        urls = {hub.file_path(REPO, FILE, revision) for revision in ("main", repo.commit)}
        hub.served.throttle.update(dict.fromkeys(urls, RATE_BPS))
        proc = subprocess.Popen(
            [sys.executable, "-m", "app", "pull", f"{REPO}:Q4_K_M"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=env,
        )
        part = cache / "models--chaos-org--Full-GGUF" / "blobs" / f"{repo.sha256(FILE)}.part"
        deadline = time.monotonic() + 60
        while not (part.exists() and part.stat().st_size > 1 << 20):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.01)
        ballast = fill(small_disk, leave=256 << 10)
        _, err = proc.communicate(timeout=120)
        chaos_row.add(
            "failed clearly" if proc.returncode == 1 and clear_error(err) else f"said: {err[-200:]}"
        )
        assert proc.returncode == 1 and clear_error(err), err
        assert part.exists(), "the partial file is kept, to resume from"
        ballast.unlink()  # space is back
        hub.served.throttle.clear()
        again = lemon_desk("pull", f"{REPO}:Q4_K_M", env=env)
        assert again.returncode == 0, again.stderr
    blob = cache / "models--chaos-org--Full-GGUF" / "blobs" / repo.sha256(FILE)
    assert hashlib.sha256(blob.read_bytes()).hexdigest() == repo.sha256(FILE)
    chaos_row.add("resumed once space was back")
    chaos_row.lost = "nothing: the partial file was kept and finished"


@pytest.mark.chaos("disk full under the download list")
def test_a_download_whose_record_cannot_be_saved_fails_clearly_and_resumes_with_space(
    chaos_row: Row, small_disk: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The app's folder is full (the model's own cache is not): the download ends failed with the
    reason, said to its listeners, rather than dying with an OSError nobody sees; then it resumes."""
    monkeypatch.setenv("LEMON_DESK_HOME", str(small_disk / "home"))
    events: list[DownloadEvent] = []

    async def go() -> tuple[DownloadRecord, DownloadRecord]:
        with loopback_hub(tmp_path / "hf-cache", monkeypatch):
            async with httpx.AsyncClient() as client:
                hub = HubClient(client)
                files = select(await hub.listing(TINY_MLX), parse_ref(TINY_MLX))
                manager = DownloadManager(hub_cache_dir(), hub, backoff_s=0.01)
                manager.subscribe(events.append)
                manager.submit("tiny", "tiny", files)  # queued, and saved: there is room yet
                ballast = fill(small_disk, leave=0)
                failed = await manager.wait("tiny")
                ballast.unlink()
                manager.resume("tiny")
                done = await manager.wait("tiny")
                await manager.close()
                return failed, done

    failed, done = asyncio.run(go())
    said = [e.state for e in events if isinstance(e, DownloadChanged)]
    clear = failed.state is DownloadState.FAILED and "Could not save the download list" in failed.message
    chaos_row.add("failed clearly" if clear and DownloadState.FAILED in said else f"said: {failed}")
    assert clear and "writable" in failed.message and DownloadState.FAILED in said, (failed, said)
    assert done.state is DownloadState.DONE
    chaos_row.add("finished once space was back")
    chaos_row.lost = "nothing: the download resumed"


@pytest.mark.chaos("disk full during an install")
def test_an_install_onto_a_full_disk_fails_clearly_and_leaves_nothing_half_made(
    chaos_row: Row, mirror: Mirror, small_disk: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = small_disk / "home"
    monkeypatch.setenv("LEMON_DESK_HOME", str(home))
    env = dict(os.environ)
    files = archive_files(mirror.tarball)
    folder = install_dir("llamacpp", "cpu")
    # Room for the download (the free-space check passes), not for unpacking it.
    ballast = fill(small_disk, leave=len(mirror.tarball) + (1 << 20))
    done = lemon_desk("backends", "install", "llamacpp:cpu", env=env)
    clear = done.returncode == 1 and clear_error(done.stderr)
    chaos_row.add("failed clearly" if clear else "unclear")
    assert done.returncode == 1 and clear_error(done.stderr), done.stderr
    assert complete_or_absent(folder, files) == "absent"
    assert not (folder / MANIFEST).exists()
    ballast.unlink()
    again = lemon_desk("backends", "install", "llamacpp:cpu", env=env)
    assert again.returncode == 0, again.stderr
    assert complete_or_absent(folder, files) == "complete"
    chaos_row.add("installed once space was back")
    chaos_row.lost = "nothing: never half installed"


@pytest.mark.chaos("disk full during a history write")
def test_history_writes_on_a_full_disk_fail_clearly_and_keep_the_database(
    chaos_row: Row, small_disk: Path
) -> None:
    path = small_disk / "history.sqlite3"
    history = History(path)
    try:
        conversation = history.create_conversation("c1", "kept").id
        history.append_message(conversation, "user", "a question that was saved")
        ballast = fill(small_disk, leave=0)
        refused = 0
        for i in range(20):
            try:
                history.append_message(conversation, "assistant", "x" * 200_000 + str(i))
            except StorageError as err:
                assert "disk" in str(err).lower() or "space" in str(err).lower(), err
                refused += 1
        chaos_row.add(f"write refused clearly {refused} of 20")
        assert refused > 0
        ballast.unlink()
        history.append_message(conversation, "assistant", "an answer once space was back")
        stored = history.conversation(conversation)
        assert stored is not None
        contents = [m.content for m in stored.messages]
        assert contents[0] == "a question that was saved" and contents[-1] == "an answer once space was back"
    finally:
        history.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    chaos_row.add("intact, writes again")
    chaos_row.lost = "only the writes refused while the disk was full"
