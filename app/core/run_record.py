"""A running engine's record, and the pure decision about records left by an earlier run.

While an engine runs, the app keeps a small record of it (``app.store.run_records``). A record whose app
is gone names an engine that nothing stops any more, unless its process is gone too or its pid now
belongs to another process. A pid is the same process only with the same start time and executable,
so a reused pid is never killed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

# Start times are compared with this slack: on Linux psutil derives them from the boot time, which a
# process reads once and which can differ by a second between processes. A reused pid that also runs
# the same executable and started within this second of the original is not a case worth a kill.
SAME_START_S = 1.0


@dataclass(frozen=True)
class ProcessFacts:
    """What the operating system says about a live process."""

    started: float  # its start time, seconds since the epoch (psutil's create_time)
    exe: str  # its executable, as the OS reports it ("" when it would not say)


@dataclass(frozen=True)
class RunRecord:
    engine_id: str
    binary: str  # what the app launched (for messages)
    pid: int
    started: float
    exe: str  # the executable the OS reported at launch: an interpreter, for a script
    app_pid: int
    app_started: float

    @property
    def engine(self) -> ProcessFacts:
        return ProcessFacts(self.started, self.exe)

    @property
    def app(self) -> ProcessFacts:
        return ProcessFacts(self.app_started, "")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> RunRecord:
        """Raises ValueError when ``data`` is not a record."""
        try:
            record = cls(
                engine_id=str(data["engine_id"]),
                binary=str(data["binary"]),
                pid=int(data["pid"]),
                started=float(data["started"]),
                exe=str(data["exe"]),
                app_pid=int(data["app_pid"]),
                app_started=float(data["app_started"]),
            )
        # OverflowError: int() of a pid that JSON wrote as Infinity (or 1e999)
        except (KeyError, TypeError, ValueError, OverflowError) as err:
            raise ValueError(f"not an engine run record: {err}") from None
        # psutil refuses a pid below 1 with ValueError, and 0 or less would mean a group to signal
        if record.pid < 1 or record.app_pid < 1:
            raise ValueError(f"not an engine run record: pid {record.pid}, app pid {record.app_pid}")
        return record


class Verdict(Enum):
    KEEP = "keep"  # its app still runs: that app's engine, not ours to touch
    STOP = "stop"  # its app is gone and its engine still runs: an orphan
    FORGET = "forget"  # its app is gone and so is its engine (its pid may be another process's now)


def same_process(recorded: ProcessFacts, now: ProcessFacts | None, *, check_exe: bool = True) -> bool:
    """True when the live process ``now`` is the recorded one, not a later one with its pid."""
    if now is None or abs(recorded.started - now.started) > SAME_START_S:
        return False
    return not check_exe or (recorded.exe != "" and recorded.exe == now.exe)


def judge(record: RunRecord, app_now: ProcessFacts | None, engine_now: ProcessFacts | None) -> Verdict:
    """``app_now`` and ``engine_now``: what runs now under the record's app and engine pids (None: none)."""
    if same_process(record.app, app_now, check_exe=False):
        return Verdict.KEEP
    return Verdict.STOP if same_process(record.engine, engine_now) else Verdict.FORGET
