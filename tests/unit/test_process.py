"""Engine process plumbing: rotating logs, exit descriptions, free ports."""

from __future__ import annotations

import signal
import socket
from pathlib import Path

from app.supervisor.process import RotatingLog, describe_exit, free_port


def test_log_rotates_and_keeps_a_bounded_number_of_files(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "engine-smol.log"
    log = RotatingLog(path, max_bytes=1000, backups=2)
    for n in range(100):
        log.write_lines([f"line {n:03d} " + "x" * 40])
    log.close()
    files = sorted(p.name for p in path.parent.iterdir())
    assert files == ["engine-smol.log", "engine-smol.log.1", "engine-smol.log.2"]
    assert all(p.stat().st_size <= 1100 for p in path.parent.iterdir())
    assert path.read_text().splitlines()[-1].startswith("line 099")
    newest_backup = (path.parent / "engine-smol.log.1").read_text().splitlines()
    oldest_backup = (path.parent / "engine-smol.log.2").read_text().splitlines()
    assert oldest_backup[-1] < newest_backup[0] < path.read_text()  # oldest to newest


def test_exit_descriptions() -> None:
    assert describe_exit(1) == "exit code 1"
    assert describe_exit(-signal.SIGKILL) == "killed by signal SIGKILL"
    assert describe_exit(-signal.SIGSEGV) == "killed by signal SIGSEGV"


def test_free_port_is_bindable_on_loopback() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
