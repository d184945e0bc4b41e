"""Engines left running by an earlier run of the app that ended without stopping them (a crash, a kill
where neither PDEATHSIG nor the reaper acted): found from their run records and stopped at start.

What to do with a record is decided in ``app.core.run_record.judge``; this module asks the OS and acts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal

import psutil

from app.core.run_record import ProcessFacts, RunRecord, Verdict, judge
from app.store.run_records import load_run_records, remove_run_record, write_run_record
from app.supervisor.process import signal_group

log = logging.getLogger(__name__)

STOP_GRACE_S = 3.0  # after SIGTERM, before SIGKILL: the app's start waits this long at most


def process_facts(pid: int) -> ProcessFacts | None:
    """The live process with this pid now, or None (a zombie counts as gone: it runs nothing)."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        started = proc.create_time()
    except psutil.Error:
        return None
    try:
        exe = proc.exe()
    except psutil.Error:
        exe = ""
    return ProcessFacts(started, exe)


def record_engine(engine_id: str, binary: str, pid: int) -> None:
    """Note a just-launched engine; a process already gone is not noted."""
    engine, app = process_facts(pid), process_facts(os.getpid())
    if engine is None or app is None:
        return
    write_run_record(RunRecord(engine_id, binary, pid, engine.started, engine.exe, os.getpid(), app.started))


def stop_orphans(grace_s: float = STOP_GRACE_S) -> list[RunRecord]:
    """Stop the engines of earlier runs whose app is gone (process group: SIGTERM, a grace, SIGKILL),
    forget records of engines that are gone, and return the records of the engines stopped."""
    stopping: dict[psutil.Process, RunRecord] = {}
    for record in load_run_records():
        verdict = judge(record, process_facts(record.app_pid), process_facts(record.pid))
        if verdict is Verdict.KEEP:
            continue
        if verdict is Verdict.STOP:
            with contextlib.suppress(psutil.NoSuchProcess):
                stopping[psutil.Process(record.pid)] = record
                signal_group(record.pid, signal.SIGTERM)
        remove_run_record(record.pid)
    if not stopping:
        return []
    _, alive = psutil.wait_procs(list(stopping), timeout=grace_s)
    for proc in alive:
        if proc.is_running():  # the same process still: its pid was not reused meanwhile
            signal_group(proc.pid, signal.SIGKILL)
    for record in stopping.values():
        log.warning(
            "Stopped %s (pid %d, %s) left running by an earlier run of Lemon Desk (pid %d) that ended "
            "without stopping it.",
            record.engine_id,
            record.pid,
            record.binary,
            record.app_pid,
        )
    return list(stopping.values())
