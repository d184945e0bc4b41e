"""One child program of the app (an engine, an RPC worker, an MCP server): started, watched, stopped,
never orphaned.

A child leads its own session (a Ctrl-C in a terminal reaches the app, which stops it), gets SIGKILL when
the app dies (PDEATHSIG on Linux, a reaper process elsewhere: ``reaper.py``), and is named in a run record
while it runs, so that the next start stops it if both failed (``orphans.py``). Its output (stdout and
stderr together; stderr alone for a child that speaks a protocol on its stdin and stdout) is kept: the
last lines in memory, all of it in a rotating log, each line to listeners.
Stopping is SIGTERM to its process group, a grace period, SIGKILL; every path reaps it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from app.store.run_records import remove_run_record
from app.supervisor.listeners import Listeners
from app.supervisor.orphans import record_engine
from app.supervisor.process import RotatingLog, describe_exit, die_with_parent, signal_group
from app.supervisor.reaper import reaper_command

log = logging.getLogger(__name__)

OUTPUT_LINES = 2000
LAST_WORDS = 20  # output lines quoted in an error

OutputListener = Callable[[str], None]

MAX_LINE = 1 << 16  # bytes of output held waiting for its line's end (a child can print without one)


class ChildProcess:
    """A child program's process, output and stop. Use it from the app's event loop."""

    def __init__(self, child_id: str, log_path: Path) -> None:
        self.id = child_id
        self.log_path = log_path
        self.output: deque[str] = deque(maxlen=OUTPUT_LINES)  # newest last
        self.pid: int | None = None
        self.exited: asyncio.Task[int] | None = None  # its exit code, once it has been reaped
        self._listeners: Listeners[str] = Listeners(f"{child_id}'s output")
        self._proc: asyncio.subprocess.Process | None = None
        self.stdin: asyncio.StreamWriter | None = None  # a protocol child's (``spawn(protocol=True)``)
        self.stdout: asyncio.StreamReader | None = None
        self._reaper: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._log: RotatingLog | None = None

    def add_output_listener(self, listener: OutputListener) -> Callable[[], None]:
        """Call ``listener(line)`` for each line the child prints; returns a function that removes it."""
        return self._listeners.add(listener)

    def last_output(self, lines: int = LAST_WORDS) -> str:
        return "\n".join(list(self.output)[-lines:])

    @property
    def running(self) -> bool:
        return self.exited is not None and not self.exited.done()

    async def spawn(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        ignore_sigpipe: bool = False,
        protocol: bool = False,
    ) -> None:
        """Start ``argv`` with exactly ``env``. Raises OSError when it cannot be run.

        ``ignore_sigpipe``: the child inherits Python's ignored SIGPIPE, for a server that writes to
        sockets without guarding against a peer that left (llama.cpp's RPC worker dies of it otherwise).
        ``protocol``: the child speaks on its stdin and stdout (an MCP server), which are left to the
        caller as ``stdin`` and ``stdout``; its stderr is the output kept.
        """
        self.output.clear()
        self._log = RotatingLog(self.log_path)
        self.emit([f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(argv)}"])
        die_with_app = die_with_parent()
        self._proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if protocol else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE if protocol else asyncio.subprocess.STDOUT,
            env=dict(env),
            start_new_session=True,
            preexec_fn=die_with_app,
            restore_signals=not ignore_sigpipe,
        )
        self.pid = self._proc.pid
        output = self._proc.stderr if protocol else self._proc.stdout
        assert output is not None
        if protocol:
            self.stdin, self.stdout = self._proc.stdin, self._proc.stdout
        self._reader = asyncio.create_task(self._read_output(output))
        self.exited = asyncio.create_task(self._wait_exit(self._proc))
        await self._guard(argv[0], die_with_app is not None)

    def emit(self, lines: list[str]) -> None:
        """Lines into the output, the log and the listeners (the child's own, or the app's ``===`` notes)."""
        self.output.extend(lines)
        if self._log is not None:
            self._log.write_lines(lines)
        for line in lines:
            self._listeners.emit(line)

    async def _read_output(self, stream: asyncio.StreamReader) -> None:
        rest = b""
        while chunk := await stream.read(1 << 16):
            *lines, rest = (rest + chunk).split(b"\n")
            if len(rest) >= MAX_LINE:  # output that never ends a line is taken a piece at a time
                lines.append(rest)
                rest = b""
            if lines:
                self.emit([line.decode("utf-8", "replace").rstrip("\r") for line in lines])
        if rest:
            self.emit([rest.decode("utf-8", "replace").rstrip("\r")])

    async def _guard(self, binary: str, dies_with_app: bool) -> None:
        """Leave a run record (so a later start finds the child if the app dies unseen), and start a
        reaper where the child does not die with the app by itself. Neither failing stops the child."""
        assert self._proc is not None
        try:
            record_engine(self.id, binary, self._proc.pid)
        except OSError as err:
            log.warning("%s: could not write its run record: %s", self.id, err)
        if dies_with_app:
            return
        try:
            self._reaper = await asyncio.create_subprocess_exec(
                *reaper_command(self._proc.pid),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C meant for the app must not end it
            )
        except OSError as err:
            log.warning("%s: could not start its reaper: %s", self.id, err)
        if self._proc.returncode is not None:  # it ended while its reaper started: _wait_exit is past it
            await self._end_reaper()

    async def _end_reaper(self) -> None:
        """Once the child has been reaped: its reaper would notice within its poll; no need to wait."""
        reaper, self._reaper = self._reaper, None
        if reaper is not None:
            with contextlib.suppress(ProcessLookupError):
                reaper.terminate()
            await reaper.wait()

    async def _wait_exit(self, proc: asyncio.subprocess.Process) -> int:
        returncode = await proc.wait()
        remove_run_record(proc.pid)
        await self._end_reaper()
        if self._reader is not None:
            # The last lines may still be in the pipe; a grandchild holding it open must not block us.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._reader), 2.0)
        return returncode

    def kill(self) -> None:
        """SIGKILL to the child's process group (a hung child); wait on ``exited`` for the reaping."""
        if self._proc is not None and self._proc.returncode is None:
            signal_group(self._proc.pid, signal.SIGKILL)

    async def terminate(self, grace_s: float) -> None:
        """SIGTERM, ``grace_s``, SIGKILL; returns once reaped. Safe when never started or already gone."""
        proc, exited = self._proc, self.exited
        if proc is None or exited is None:
            return
        if proc.returncode is None:
            signal_group(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.shield(exited), grace_s)
            except TimeoutError:
                signal_group(proc.pid, signal.SIGKILL)
            except asyncio.CancelledError:
                signal_group(proc.pid, signal.SIGKILL)  # asyncio's child watcher still reaps it
                raise
        await asyncio.shield(exited)

    def close_log(self) -> None:
        """After the child is gone: its last line in the log, then the log closed."""
        if self._log is None:
            return
        if self.exited is not None and self.exited.done():
            self.emit([f"=== stopped ({describe_exit(self.exited.result())})"])
        self._log.close()
        self._log = None
