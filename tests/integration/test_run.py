"""``lemon-desk run`` as a user runs it, with the installed real llama-server: crashes, bad models,
a killed app, and the terminal chat."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from app.store.library import location_on_demand
from app.store.settings import Settings
from app.supervisor.supervisor import Supervisor
from tests.integration.conftest import Mirror, engines_of, lemon_desk

pytestmark = pytest.mark.integration

FRANCE = "What is the capital of France? Answer in one word."
ENDLESS = "--temp 0 --ignore-eos -n 4000"  # a reply that lasts long enough to be interrupted


@pytest.fixture
def installed(mirror: Mirror) -> None:
    async def go() -> None:
        async with Supervisor(Settings(), resolve_model=location_on_demand(Settings())) as supervisor:
            await supervisor.install("llamacpp", "cpu")

    asyncio.run(go())


STARTED: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def commands_reaped() -> Iterator[None]:
    """A command a test started and left running (the test failed before it ended) is killed with its
    pipes closed, so that it neither outlives the test nor fails a later one as an unclosed file."""
    yield
    while STARTED:
        cli = STARTED.pop()
        if cli.poll() is None:
            cli.kill()
            cli.wait(timeout=30)
        for pipe in (cli.stdin, cli.stdout, cli.stderr):
            if pipe is not None:
                pipe.close()


def start(*args: str, stdin: int | None = subprocess.DEVNULL) -> subprocess.Popen[str]:
    cli = subprocess.Popen(
        [sys.executable, "-m", "app", *args],
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    STARTED.append(cli)
    return cli


def engine_of(cli: subprocess.Popen[str]) -> psutil.Process:
    """The llama-server the command started, once its reply has begun streaming."""
    assert cli.stdout is not None
    cli.stdout.read(1)  # blocks until the first byte of the reply
    children = [c for c in psutil.Process(cli.pid).children() if c.name() == "llama-server"]
    assert len(children) == 1
    return children[0]


def test_engine_killed_mid_stream_is_one_clear_error(
    installed: None, smol_gguf: Path, lemon_home: Path
) -> None:
    cli = start("run", str(smol_gguf), "--prompt", "Count to a thousand.", "--args", ENDLESS)
    engine = engine_of(cli)
    engine.kill()
    _, err = cli.communicate(timeout=60)
    assert cli.returncode == 1
    assert after_phases(err).startswith(
        "error: llama-server stopped unexpectedly (killed by signal SIGKILL). Load the model"
    )
    assert "--- engine output ---" in err and "Traceback" not in err
    assert not psutil.pid_exists(engine.pid)  # reaped, not a zombie
    assert engines_of(lemon_home) == []


def test_kill_9_of_the_app_leaves_no_engine(installed: None, smol_gguf: Path, lemon_home: Path) -> None:
    cli = start("run", str(smol_gguf), "--prompt", "Count to a thousand.", "--args", ENDLESS)
    engine = engine_of(cli)
    cli.kill()
    cli.communicate(timeout=60)
    gone, alive = psutil.wait_procs([engine], timeout=30)
    assert gone and not alive
    assert engines_of(lemon_home) == []


def test_corrupt_gguf_gives_the_engines_own_reason(installed: None, tmp_path: Path, lemon_home: Path) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(4096))  # the right magic, then garbage
    done = lemon_desk("run", str(bad), "--prompt", "hi")
    assert done.returncode == 1
    assert after_phases(done.stderr).startswith("error: llama-server exited while loading broken.gguf")
    assert "failed to load model" in done.stderr and "Traceback" not in done.stderr
    assert engines_of(lemon_home) == []


def test_a_backend_not_installed_is_installed_first(
    mirror: Mirror, smol_gguf: Path, lemon_home: Path
) -> None:
    done = lemon_desk("run", str(smol_gguf), "--prompt", "Say hi.", "--json")
    assert done.returncode == 0, done.stderr
    name = smol_gguf.stem
    assert done.stderr.splitlines()[:2] == [f"{name}: installing llamacpp:cpu", f"{name}: loading"]
    assert json.loads(done.stdout)["backend"] == "llamacpp:cpu"
    listed = json.loads(lemon_desk("backends", "--json").stdout)
    assert listed["recipes"]["llamacpp"]["backends"]["cpu"]["state"] == "installed"
    assert engines_of(lemon_home) == []


def after_phases(err: str) -> str:
    """stderr without the one-click progress lines (``<model>: loading``) that come first."""
    lines = err.splitlines(keepends=True)
    while lines and re.match(r"\S+: (downloading|installing|loading)", lines[0]):
        lines.pop(0)
    return "".join(lines)


def telemetry_lines(err: str) -> list[tuple[int, int]]:
    """(prompt tokens, reply tokens) of each finished reply, from the chat's telemetry lines."""
    return [(int(p), int(r)) for p, r in re.findall(r"prompt (\d+) tokens .* reply (\d+) tokens", err)]


def test_terminal_chat_is_multi_turn(installed: None, smol_gguf: Path, lemon_home: Path) -> None:
    chat = lemon_desk_with_input(smol_gguf, f"My name is Ada.\n{FRANCE}\n")
    assert chat.returncode == 0, chat.stderr
    (prompt1, reply1), (prompt2, _) = telemetry_lines(chat.stderr)
    assert prompt2 > prompt1 + reply1  # the second request carried the first question and answer
    assert "Paris" in chat.stdout
    assert engines_of(lemon_home) == []


def lemon_desk_with_input(model: Path, text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", "run", str(model), "--args", "--temp 0 -n 48"],
        input=text,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_ctrl_c_in_the_chat_stops_only_the_reply(installed: None, smol_gguf: Path, lemon_home: Path) -> None:
    cli = start("run", str(smol_gguf), "--args", "--temp 0 -n 600", stdin=subprocess.PIPE)
    assert cli.stdin is not None and cli.stdout is not None
    cli.stdin.write("Write a long story about a dragon.\n")
    cli.stdin.flush()
    cli.stdout.read(1)  # the first reply is streaming
    os.kill(cli.pid, signal.SIGINT)  # stops that reply, not the chat
    out, err = cli.communicate(f"{FRANCE}\n", timeout=120)  # then end of input: Ctrl-D
    assert cli.returncode == 0, err
    assert "[stopped]" in err and "interrupted" not in err
    assert len(telemetry_lines(err)) == 1  # only the second reply finished
    assert out.rstrip("\n").rsplit("\n", 1)[-1].strip()  # and it was written out
    assert engines_of(lemon_home) == []


def test_crash_while_idle_in_the_chat_ends_it_with_the_reason(
    installed: None, smol_gguf: Path, lemon_home: Path
) -> None:
    cli = start("run", str(smol_gguf), "--args", "--temp 0 -n 16", stdin=subprocess.PIPE)
    assert cli.stdin is not None and cli.stdout is not None and cli.stderr is not None
    cli.stdin.write(f"{FRANCE}\n")
    cli.stdin.flush()
    cli.stdout.read(1)
    engine = next(c for c in psutil.Process(cli.pid).children() if c.name() == "llama-server")
    while "time to first token" not in cli.stderr.readline():  # the reply finished: the chat waits for input
        pass
    engine.kill()
    assert cli.wait(timeout=60) == 1  # with its input still open: the crash, not Ctrl-D, ended it
    assert "error: llama-server stopped unexpectedly (killed by signal SIGKILL)" in cli.stderr.read()
    cli.stdin.close()
    cli.stdout.close()
    cli.stderr.close()


def test_ctrl_c_during_a_one_shot_reply_stops_the_engine(
    installed: None, smol_gguf: Path, lemon_home: Path
) -> None:
    cli = start("run", str(smol_gguf), "--prompt", "Count to a thousand.", "--args", ENDLESS)
    engine = engine_of(cli)
    os.kill(cli.pid, signal.SIGINT)
    _, err = cli.communicate(timeout=60)
    assert cli.returncode == 130
    assert after_phases(err).strip() == "interrupted"
    assert not psutil.pid_exists(engine.pid)
    assert engines_of(lemon_home) == []
