"""``lemon-desk downloads``: listing, pause, resume and cancel through the router, against a loopback Hub
and real child processes (a pull that Ctrl-C pauses, one that is killed and comes back paused)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from app.cli import main
from app.core.downloads import INTERRUPTED
from app.store.hfcache import RepoCache, hub_cache_dir
from tests.support.fileserver import Fault
from tests.support.hubserver import LoopbackHub
from tests.support.testrepos import BIG, big_files
from tests.unit.test_cli_models import child_env, wait_until

Q8 = f"{BIG}:Q8_0"
NAME = "user.Big-GGUF-Q8_0"
Q8_FILE = "Big-Q8_0.gguf"
HELD_FILE = "mmproj-Big-f16.gguf"  # fetched after Q8_FILE; not read for the fit (a fault would go there)
HELD = 1000  # the server goes silent after this many bytes of it


FIRST = len(big_files()[Q8_FILE])


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def listed(capsys: pytest.CaptureFixture[str]) -> dict[str, dict[str, Any]]:
    code, out, err = cli(capsys, "downloads", "--json")
    assert code == 0, err
    return {d["model"]: d for d in json.loads(out)["downloads"]}


def part_of(hub: LoopbackHub, path: str) -> Path:
    return RepoCache(hub_cache_dir(), BIG).blob(hub.repos[BIG].sha256(path) + ".part")


def start_pull(ref: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "app", "pull", ref, "--json"], env=child_env(), stdout=out, stderr=out
        )


def test_ctrl_c_pauses_then_downloads_lists_and_resumes_it(
    hub: LoopbackHub, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, _ = cli(capsys, "downloads")
    assert code == 0 and "No downloads" in out
    hub.arm(BIG, HELD_FILE, Fault(hold_after=HELD))
    part = part_of(hub, HELD_FILE)
    child = start_pull(Q8, tmp_path / "pull.log")
    try:
        wait_until(lambda: part.exists() and part.stat().st_size >= HELD)
        running = listed(capsys)[NAME]
        assert running["state"] == "running" and running["done_bytes"] == FIRST + HELD
        assert running["speed_bps"] is None  # another process runs it: its speed is not known here
        # Only the process that runs a download can pause it; this one says which.
        code, out, err = cli(capsys, "downloads", "pause", NAME)
        assert code == 1 and "being downloaded by another Lemon Desk process" in err, (out, err)
        assert code == 1 and "being downloaded by another Lemon Desk process" in err
        # Only the process that runs a download can pause it; this one says which.
        code, out, err = cli(capsys, "downloads", "pause", NAME)
        assert code == 1 and "being downloaded by another Lemon Desk process" in err, (out, err)
        child.send_signal(signal.SIGINT)  # Ctrl-C
        assert child.wait(timeout=60) == 130
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert "Download paused" in (tmp_path / "pull.log").read_text()
    paused = listed(capsys)[NAME]
    total = len(big_files()[Q8_FILE]) + len(big_files()["mmproj-Big-f16.gguf"])
    assert (paused["state"], paused["total_bytes"]) == ("paused", total)
    assert paused["done_bytes"] == FIRST + part.stat().st_size == FIRST + HELD
    assert paused["percent"] == round(100 * (FIRST + HELD) / total, 1)
    code, out, _ = cli(capsys, "downloads")
    assert code == 0 and NAME in out and "paused" in out

    code, out, err = cli(capsys, "downloads", "resume", NAME, "--json")
    assert code == 0, err
    done = json.loads(out)
    assert (done["state"], done["done_bytes"], done["percent"]) == ("done", total, 100.0)
    assert hub.requests_for(BIG, HELD_FILE)[-1] == f"bytes={HELD}-"  # resumed, not started over
    code, _, err = cli(capsys, "downloads", "pause", "no-such-model")
    assert code == 1 and "There is no model named" in err


def test_a_killed_pull_comes_back_paused_and_cancel_keeps_or_deletes_the_partial_file(
    hub: LoopbackHub, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    hub.arm(BIG, HELD_FILE, Fault(hold_after=HELD))
    part = part_of(hub, HELD_FILE)
    child = start_pull(Q8, tmp_path / "pull.log")
    try:
        wait_until(lambda: part.exists() and part.stat().st_size >= HELD)
    finally:
        child.send_signal(signal.SIGKILL)  # no cleanup runs
        child.wait()
    interrupted = listed(capsys)[NAME]
    assert (interrupted["state"], interrupted["message"]) == ("paused", INTERRUPTED)
    assert interrupted["done_bytes"] == FIRST + HELD

    code, out, err = cli(capsys, "downloads", "cancel", NAME, "--keep-partial", "--json")
    assert code == 0, err
    kept = json.loads(out)
    assert kept["state"] == "cancelled" and "kept" in kept["message"]
    assert part.stat().st_size == HELD and kept["done_bytes"] == FIRST + HELD

    code, out, err = cli(capsys, "downloads", "cancel", NAME)
    assert code == 0, err
    assert "cancelled" in out and "deleted" in out and not part.exists()
    assert listed(capsys)[NAME]["done_bytes"] == 0

    code, _, err = cli(capsys, "downloads", "cancel")
    assert code == 1 and "needs the model" in err
