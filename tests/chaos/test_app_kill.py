"""The app killed (SIGKILL) at random moments during a download (``lemon-desk pull`` against the loopback
Hub), an install (``lemon-desk backends install llamacpp:cpu`` against the release mirror) and a
streaming chat (a front end writing history through ``app.store.history``): no orphan engine, an intact
history, at most the reply in flight lost, a download that resumes re-fetching at most one chunk, and no
half-installed backend."""

from __future__ import annotations

import hashlib
import io
import itertools
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from app.store.history import History, history_path
from app.store.installs import MANIFEST, install_dir
from app.supervisor.fetch import CHUNK
from tests.chaos.conftest import Row, rng
from tests.integration.conftest import Mirror
from tests.support.hubserver import HubRepo, LoopbackHub
from tests.support.modelfiles import gguf_files
from tests.support.standin import make_standin_model

ROOT = Path(__file__).resolve().parents[2]
DOWNLOAD_KILLS, INSTALL_KILLS, CHAT_KILLS = 7, 6, 7
REPO, FILE = "chaos-org/Resume-GGUF", "Resume-Q4_K_M.gguf"
DRIVER = "tests.chaos.chat_driver"
RATE_BPS = 12 << 20  # slow enough that a kill lands inside a file, fast enough for CI


def start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, *args], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True
        )


def wait_until(test: Callable[[], bool], proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> bool:
    """True once ``test()`` holds; False if the process ended first."""
    deadline = time.monotonic() + timeout_s
    while not test():
        if proc.poll() is not None:
            return False
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise AssertionError(f"timed out waiting on {proc.args}")
        time.sleep(0.005)
    return True


def kill(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def engines_under(path: Path) -> list[int]:
    """Live, not zombie, processes whose command line names ``path`` (engines started from a test)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        with_path = any(str(path) in part for part in proc.info["cmdline"] or [])
        if with_path and proc.info["status"] != psutil.STATUS_ZOMBIE and proc.pid != os.getpid():
            found.append(proc.pid)
    return found


# --- download ---------------------------------------------------------------------------------------


@pytest.mark.chaos("app SIGKILL during a download (pull)")
def test_app_killed_during_a_download_resumes_losing_at_most_a_chunk(
    chaos_row: Row, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    random = rng("app-kill-download")
    data = gguf_files("Resume-Q4_K_M", layers=6, tensor_kib=4096)["Resume-Q4_K_M.gguf"]
    hub = LoopbackHub()
    repo = hub.add(HubRepo(REPO, {FILE: data}, tags=("gguf",)))
    urls = {hub.file_path(REPO, FILE, revision) for revision in ("main", repo.commit)}
    targets = sorted(random.uniform(0.05, 0.95) * len(data) for _ in range(DOWNLOAD_KILLS))
    cache = tmp_path / "hub-cache"
    log = tmp_path / "pull.log"
    refetched: list[int] = []
    with hub.running() as base:
        monkeypatch.setenv("HF_ENDPOINT", base)
        monkeypatch.setenv("HF_HUB_CACHE", str(cache))
        hub.served.throttle.update(dict.fromkeys(urls, RATE_BPS))
        for target in targets:
            before = len(hub.served.sent)
            proc = start(["-m", "app", "pull", f"{REPO}:Q4_K_M"], log)

            def reached(target: float = target, before: int = before) -> bool:
                sent = hub.served.sent[before:]
                return bool(sent) and int(sent[-1][1]) + int(sent[-1][2]) >= target  # type: ignore[call-overload]

            if not wait_until(reached, proc):
                chaos_row.add("finished before the kill")
                continue
            kill(proc)
            chaos_row.add("killed mid-file")
        hub.served.throttle.clear()
        proc = start(["-m", "app", "pull", f"{REPO}:Q4_K_M"], log)
        assert proc.wait(timeout=120) == 0, log.read_text()
    chaos_row.add("resumed to the end")
    # Each run also reads the first MiB (bytes=0-1048575) for the fit estimate: not part of the resume.
    sent = [s for s in hub.served.sent if s[0] in urls and (s[3] is None or str(s[3]).endswith("-"))]
    header_reads = sum(1 for s in hub.served.sent if s[0] in urls) - len(sent)
    for previous, following in itertools.pairwise(sent):
        end = int(previous[1]) + int(previous[2])  # type: ignore[call-overload]
        refetched.append(max(0, end - int(following[1])))  # type: ignore[call-overload]
    blobs = list((cache / "models--chaos-org--Resume-GGUF" / "blobs").iterdir())
    assert [hashlib.sha256(b.read_bytes()).hexdigest() for b in blobs] == [repo.sha256(FILE)]
    worst = max(refetched, default=0)
    chaos_row.worst = f"re-fetched {worst / 1024:.0f} KiB"
    chaos_row.lost = (
        f"at most {worst / 1024:.0f} KiB re-fetched per kill (chunk {CHUNK >> 10} KiB); "
        f"plus {header_reads} header reads of 1 MiB for the fit"
    )
    assert worst <= CHUNK, f"a resume re-fetched {refetched} bytes; sent {sent}"


# --- install ----------------------------------------------------------------------------------------


def archive_files(tarball: bytes) -> int:
    with tarfile.open(fileobj=io.BytesIO(tarball)) as archive:
        return sum(1 for member in archive.getmembers() if not member.isdir())


def complete_or_absent(folder: Path, files: int) -> str:
    """The installed folder holds every file of the archive and its manifest, or is not there."""
    if not folder.exists():
        return "absent"
    assert (folder / MANIFEST).is_file(), f"{folder} exists without its manifest"
    present = sum(1 for p in folder.rglob("*") if not p.is_dir() or p.is_symlink())
    assert present == files + 1, f"{folder} holds {present} files, the archive {files} and the manifest"
    return "complete"


@pytest.mark.chaos("app SIGKILL during an install")
def test_app_killed_during_an_install_leaves_it_complete_or_absent(
    chaos_row: Row, mirror: Mirror, tmp_path: Path
) -> None:
    random = rng("app-kill-install")
    asset = mirror.publish(mirror.tarball)
    folder = install_dir("llamacpp", "cpu")
    files = archive_files(mirror.tarball)
    log = tmp_path / "install.log"
    mirror.served.throttle[asset] = RATE_BPS // 2
    for _ in range(INSTALL_KILLS):
        before = len(mirror.served.sent)
        proc = start(["-m", "app", "backends", "install", "llamacpp:cpu"], log)
        if not wait_until(lambda before=before: len(mirror.served.sent) > before, proc):
            chaos_row.add("finished before the kill")
            continue
        time.sleep(random.uniform(0.0, 1.6))  # the download takes ~1.2 s, then unpacking
        kill(proc)
        found = complete_or_absent(folder, files)
        chaos_row.add(f"killed: {found}")
        if found == "complete":
            shutil.rmtree(folder)  # so that the next trial installs again
    proc = start(["-m", "app", "backends", "install", "llamacpp:cpu"], log)
    assert proc.wait(timeout=120) == 0, log.read_text()
    assert complete_or_absent(folder, files) == "complete"
    chaos_row.add("installed on the next run")
    chaos_row.lost = "nothing: never half installed"


# --- streaming chat ---------------------------------------------------------------------------------


def messages(conversation: str) -> list[tuple[str, str, str]]:
    with sqlite3.connect(history_path()) as db:
        rows = db.execute(
            "SELECT role, content, state FROM messages WHERE conversation_id = ? ORDER BY position",
            (conversation,),
        ).fetchall()
    return [tuple(r) for r in rows]


@pytest.mark.chaos("app SIGKILL during a streaming chat")
def test_app_killed_mid_chat_loses_at_most_the_reply_in_flight(
    chaos_row: Row, standin_settings: object, tmp_path: Path
) -> None:
    random = rng("app-kill-chat")
    binary = Path(standin_settings.llama_server_path)  # type: ignore[attr-defined]
    model = make_standin_model(tmp_path, "chatty", tokens=60, token_delay_s=0.01)
    log = tmp_path / "chat.log"
    lost_replies = 0
    for trial in range(CHAT_KILLS):
        conversation = f"trial-{trial}"
        out = tmp_path / f"chat-{trial}.out"
        with out.open("wb") as stdout, log.open("ab") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-m", DRIVER, str(binary), str(model), conversation, "50"],
                stdout=stdout,
                stderr=stderr,
                cwd=ROOT,
                start_new_session=True,
            )
        assert wait_until(lambda out=out: out.read_text().startswith("engine "), proc), log.read_text()
        engine = int(out.read_text().split()[1])
        time.sleep(random.uniform(0.05, 2.0))
        kill(proc)
        # The reaper looks every 0.5 s; 10 s leaves a machine ten times slower room (the engine outliving
        # the app, the fault, would outlive any deadline).
        deadline = time.monotonic() + 10.0
        while psutil.pid_exists(engine) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not psutil.pid_exists(engine), f"engine {engine} outlived the killed app"
        assert engines_under(binary.parent) == []
        with sqlite3.connect(history_path()) as db:
            assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        done = out.read_text().count("done ")
        stored = messages(conversation)
        finished = [m for m in stored if m[2] == "complete"]
        assert len(finished) >= 2 * done, "a finished turn was lost"
        streaming = [i for i, m in enumerate(stored) if m[2] == "streaming"]
        assert streaming in ([], [len(stored) - 1]), "only the last reply may be in flight"
        lost_replies += len(streaming)
        chaos_row.add(f"{done} turns kept" if not streaming else "turns kept, 1 reply in flight")
    history = History()
    try:
        assert not history.warning and len(history.list_conversations()) == CHAT_KILLS
    finally:
        history.close()
    chaos_row.outcomes = type(chaos_row.outcomes)(
        {"killed: integrity ok, no orphan, turns kept": CHAT_KILLS, "in-flight reply cut": lost_replies}
    )
    chaos_row.lost = f"{lost_replies} in-flight replies (partial text kept), 0 finished turns"
