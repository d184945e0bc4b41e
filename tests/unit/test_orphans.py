"""No orphan engine on any path: the app killed with SIGKILL leaves no engine (through PDEATHSIG, and
through the reaper alone), and engines of an earlier run that crashed are found from their run records
and stopped at the next start, while a pid that now belongs to another process is left alone.

The reaper watches with kqueue where there is one (macOS): there, both cases of
``test_killing_the_app_leaves_no_engine`` run through it, since PDEATHSIG does not exist. Here they run
through PDEATHSIG and through the reaper's polling path."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psutil
import pytest

from app.core.run_record import SAME_START_S, ProcessFacts, RunRecord, Verdict, judge
from app.store.library import Library
from app.store.model_options import ModelOptions
from app.store.run_records import load_run_records, record_path, write_run_record
from app.store.settings import Settings, save_settings
from app.supervisor.orphans import process_facts, stop_orphans
from app.supervisor.process import TEST_NO_PDEATHSIG, free_port
from app.supervisor.reaper import FLAG, reaper_command
from app.supervisor.reaper import main as reaper_main
from app.supervisor.router import Router
from app.supervisor.supervisor import Supervisor
from tests.conftest import profile_path
from tests.support.standin import control, make_standin_model

ROOT = Path(__file__).resolve().parents[2]


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what}")
        time.sleep(0.05)


def gone(pid: int, started: float) -> bool:
    """No process runs as ``pid`` any more that is the one started at ``started`` (a zombie is gone)."""
    now = process_facts(pid)
    return now is None or abs(now.started - started) > SAME_START_S


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@contextmanager
def detached(argv: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    """A process in its own session, as an engine runs; killed and reaped at the end whatever happens."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextmanager
def standin(settings: Settings, model: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A stand-in engine started detached, as an earlier run of the app left it, once it is ready."""
    port = free_port()
    with detached([settings.llama_server_path, "-m", str(model), "--port", str(port)]) as proc:
        base_url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            try:
                return httpx.get(f"{base_url}/health", trust_env=False).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(ready, 10, "the stand-in answers /health")
        yield proc, base_url


def record_of(proc: subprocess.Popen[bytes], app_pid: int, **changes: float | str) -> RunRecord:
    """A record of ``proc`` as the app writes it, for an app ``app_pid``, with ``changes``."""
    now = process_facts(proc.pid)
    assert now is not None
    record = RunRecord("user.tiny", "llama-server", proc.pid, now.started, now.exe, app_pid, 1.0)
    return dataclasses.replace(record, **changes)  # type: ignore[arg-type]


# --- the decision -----------------------------------------------------------------------------------

RECORD = RunRecord("m", "/e/llama-server", 100, 1000.0, "/e/llama-server", 50, 900.0)
ENGINE = ProcessFacts(1000.0, "/e/llama-server")


@pytest.mark.parametrize(
    ("app_now", "engine_now", "verdict"),
    [
        (ProcessFacts(900.0, "/usr/bin/python3"), ENGINE, Verdict.KEEP),  # its app still runs
        (None, ENGINE, Verdict.STOP),  # its app is gone: an orphan
        (ProcessFacts(5000.0, "/bin/sh"), ENGINE, Verdict.STOP),  # the app's pid is another process now
        (None, ProcessFacts(1000.3, "/e/llama-server"), Verdict.STOP),  # start times read a tick apart
        (None, None, Verdict.FORGET),  # the engine is gone too
        (None, ProcessFacts(1500.0, "/e/llama-server"), Verdict.FORGET),  # its pid was reused
        (None, ProcessFacts(1000.0, "/usr/bin/vim"), Verdict.FORGET),  # same start, another program
        (None, ProcessFacts(1000.0, ""), Verdict.FORGET),  # the OS would not say: never guess
    ],
)
def test_which_records_name_an_orphan(
    app_now: ProcessFacts | None, engine_now: ProcessFacts | None, verdict: Verdict
) -> None:
    assert judge(RECORD, app_now, engine_now) is verdict


def test_a_record_round_trips_and_an_unreadable_one_is_set_aside(caplog: pytest.LogCaptureFixture) -> None:
    write_run_record(RECORD)
    assert load_run_records() == [RECORD]
    broken = record_path(7)
    broken.write_text('{"pid": "seven"}')
    assert load_run_records() == [RECORD]
    assert not broken.exists() and list(broken.parent.glob("engine-7.json.corrupt-*"))
    assert "Unreadable engine run record" in caplog.text


# --- engines of an earlier run that crashed -----------------------------------------------------------


def test_an_engine_left_by_a_crashed_run_is_stopped_at_the_next_start(
    standin_settings: Settings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = make_standin_model(tmp_path, "tiny")
    with standin(standin_settings, model) as (orphan, _), standin(standin_settings, model) as (ours, _):
        write_run_record(record_of(orphan, dead_pid()))
        write_run_record(record_of(ours, os.getpid(), app_started=psutil.Process().create_time()))
        Supervisor(standin_settings, resolve_model=Library(standin_settings).location)
        assert orphan.wait(timeout=30) == 0  # the stand-in's answer to SIGTERM
        assert ours.poll() is None, "the engine of a running app was touched"
        assert [r.pid for r in load_run_records()] == [ours.pid]
    assert f"pid {orphan.pid}" in caplog.text and "left running by an earlier run" in caplog.text


def test_an_orphan_that_ignores_sigterm_gets_sigkill_after_the_grace(
    standin_settings: Settings, tmp_path: Path
) -> None:
    model = make_standin_model(tmp_path, "tiny")
    with standin(standin_settings, model) as (orphan, base_url):
        asyncio.run(control(base_url, "ignore_sigterm"))
        write_run_record(record_of(orphan, dead_pid()))
        stopped = stop_orphans(grace_s=0.5)
        assert [r.pid for r in stopped] == [orphan.pid]
        assert orphan.wait(timeout=30) == -signal.SIGKILL


@pytest.mark.parametrize("reused", ["started", "exe"])
def test_a_pid_that_now_belongs_to_another_process_is_not_killed(
    standin_settings: Settings, reused: str
) -> None:
    with detached([sys.executable, "-c", "import time; time.sleep(60)"]) as other:
        # The record of an engine that had this pid before: it started earlier, or ran something else.
        change = {"started": time.time() - 3600} if reused == "started" else {"exe": "/opt/llama-server"}
        write_run_record(record_of(other, dead_pid(), **change))
        Supervisor(standin_settings, resolve_model=Library(standin_settings).location)
        with pytest.raises(subprocess.TimeoutExpired):
            other.wait(timeout=0.5)
        assert load_run_records() == [], "a record of a process that is gone is forgotten"


# --- the reaper ----------------------------------------------------------------------------------------


def test_the_reaper_exits_by_itself_when_its_engine_ends() -> None:
    with detached([sys.executable, "-c", "import time; time.sleep(60)"]) as engine:
        reaper = subprocess.Popen(reaper_command(engine.pid), cwd=ROOT)
        try:
            with pytest.raises(subprocess.TimeoutExpired):
                reaper.wait(timeout=0.7)  # it watches while both live
            engine.kill()
            engine.wait()
            assert reaper.wait(timeout=30) == 0
        finally:
            reaper.kill()
            reaper.wait()


def test_the_reaper_refuses_a_bad_command_line() -> None:
    done = subprocess.run([sys.executable, "-P", "-m", "app", FLAG, "x"], capture_output=True, text=True)
    assert done.returncode == 2 and "usage" in done.stderr


# --- the app killed with SIGKILL --------------------------------------------------------------------------


def reapers_of(app_pid: int) -> list[tuple[int, float]]:
    """The pid and start time of each reaper the app started."""
    children = psutil.Process(app_pid).children()
    return [(p.pid, p.create_time()) for p in children if FLAG in p.cmdline()]


@pytest.mark.parametrize("pdeathsig", [True, False], ids=["pdeathsig", "reaper-alone"])
def test_killing_the_app_leaves_no_engine(
    standin_settings: Settings, tmp_path: Path, pdeathsig: bool
) -> None:
    save_settings(standin_settings)
    model = make_standin_model(tmp_path, "tiny")
    env = {**os.environ, "LEMON_DESK_MOCK_HARDWARE": str(profile_path("cpu_only_x86"))}
    if not pdeathsig:
        env[TEST_NO_PDEATHSIG] = "1"
    said = tmp_path / "app.stderr"
    with said.open("w") as stderr:
        app = subprocess.Popen(
            [sys.executable, "-m", "app", "run", str(model), "--backend", "system"],
            stdin=subprocess.PIPE,  # an interactive chat, waiting for a line
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=env,
            cwd=ROOT,
        )
    engine: RunRecord | None = None
    try:
        wait_until(lambda: "Chatting with" in said.read_text(), 30, "the app says the engine is ready")
        [engine] = load_run_records()
        assert engine.app_pid == app.pid
        reapers = reapers_of(app.pid)
        assert len(reapers) == (0 if pdeathsig else 1)
        app.kill()
        app.wait()
        wait_until(lambda: gone(engine.pid, engine.started), 30, "the engine is gone")
        wait_until(lambda: all(gone(*reaper) for reaper in reapers), 30, "the reaper is gone")
    finally:
        app.kill()
        app.wait()
        assert app.stdin is not None
        app.stdin.close()
        if engine is not None and not gone(engine.pid, engine.started):  # the test failed: clean up
            os.killpg(engine.pid, signal.SIGKILL)
    # The killed app could not remove its record: the next start finds it, with nothing to stop.
    assert stop_orphans() == [] and load_run_records() == []


def test_a_running_engine_has_a_record_until_it_is_reaped(
    standin_settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path("cpu_only_x86")))
    model = make_standin_model(tmp_path, "tiny")

    async def go() -> tuple[int | None, list[RunRecord], list[RunRecord]]:
        async with Router(standin_settings) as router:
            engine = await router.load(router.library.find(str(model)), ModelOptions(backend="system"))
            running = load_run_records()
        return engine.pid, running, load_run_records()

    pid, running, after = asyncio.run(go())
    [record] = running
    assert record.pid == pid and record.app_pid == os.getpid()
    assert record.binary == standin_settings.llama_server_path
    assert after == []


def test_the_reapers_helper_mode_refuses_pids_in_other_digits(capsys: pytest.CaptureFixture[str]) -> None:
    """str.isdigit() takes "²", which int() refuses: the usage line, not a traceback."""
    assert reaper_main(["²", "1"]) == 2
    assert f"usage: {FLAG}" in capsys.readouterr().err
