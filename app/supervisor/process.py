"""Child-process plumbing for engines: free ports, dying with the app, signals, exit words, logs."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path

PR_SET_PDEATHSIG = 1
TEST_NO_PDEATHSIG = "LEMON_DESK_TEST_NO_PDEATHSIG"
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def free_port() -> int:
    """A port nobody listens on right now, on the loopback interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when the app dies, even by kill -9 (Linux).

    The signal follows the thread that forked the child: the asyncio loop's thread, which lives as
    long as the app. Between fork and prctl the app may already have died: then the child exits.

    None where there is no such thing (a reaper watches the engine then: ``app.supervisor.reaper``), and
    when ``LEMON_DESK_TEST_NO_PDEATHSIG`` is set: a switch for tests only, to prove the reaper alone.
    """
    if _libc is None or os.environ.get(TEST_NO_PDEATHSIG):
        return None
    libc = _libc
    parent = os.getpid()

    def preexec() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return preexec


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Signal an engine and anything it started (it leads its own session)."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        return
    except PermissionError:
        os.kill(pid, sig)


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


class RotatingLog:
    """An append-only text log that starts a new file past ``max_bytes``, keeping ``backups`` old ones."""

    def __init__(self, path: Path, max_bytes: int = 2 << 20, backups: int = 2) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", encoding="utf-8")

    def write_lines(self, lines: list[str]) -> None:
        self._file.write("".join(f"{line}\n" for line in lines))
        self._file.flush()
        if self._file.tell() > self.max_bytes:
            self._rotate()

    def _rotate(self) -> None:
        self._file.close()
        for n in range(self.backups, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{n}")
            newer = self.path.with_name(f"{self.path.name}.{n - 1}") if n > 1 else self.path
            if newer.exists():
                os.replace(newer, older)
        self._file = self.path.open("a", encoding="utf-8")

    def close(self) -> None:
        self._file.close()
