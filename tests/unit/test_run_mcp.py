"""``lemon-desk run --mcp NAME`` as a script runs it: the stand-in engine (a real child process that
streams a tool call as llama-server does) and a real MCP server over stdio (written with the SDK).
Permission is asked on the terminal (the answer is a line of stdin; end of input denies), and
``--allow-tools`` asks nothing. SIGKILL of the command mid-call leaves neither engine nor MCP server."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from app.core.mcp import McpServerSpec, McpTransport
from app.store.mcp_servers import load_always_allowed
from app.store.settings import Settings, save_settings
from app.supervisor.mcp import McpHost
from tests.support.mcp_servers import SERVER, stdio_spec
from tests.support.standin import make_standin_model, set_behaviour

ROOT = Path(__file__).resolve().parents[2]


def setup(
    tmp_path: Path, settings: Settings, tool: str, arguments: dict[str, Any], script: Path = SERVER
) -> Path:
    """Settings with the stand-in as the system llama-server, the MCP server ``t``, and a model that calls
    ``t__TOOL`` once; returns the model's file."""
    save_settings(settings)

    async def configure() -> None:
        await McpHost().put(stdio_spec("t", calls=tmp_path / "calls.jsonl", script=script))

    asyncio.run(configure())
    call = {"name": f"t__{tool}", "arguments": json.dumps(arguments)}
    return make_standin_model(tmp_path, "caller", tokens=2, tool_call=call, tool_rounds=1)


def lemon_desk(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", "run", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )


def calls_made(tmp_path: Path) -> list[dict[str, Any]]:
    log = tmp_path / "calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_a_call_allowed_on_the_terminal_runs_and_the_reply_uses_its_result(
    tmp_path: Path, standin_settings: Settings
) -> None:
    model = setup(tmp_path, standin_settings, "echo", {"text": "from the cli"})
    done = lemon_desk(str(model), "--backend", "llamacpp:system", "--mcp", "t", "--prompt", "go", stdin="o\n")
    assert done.returncode == 0, done.stderr
    assert "t wants to run echo" in done.stderr and "[o]nce" in done.stderr
    assert "[tool] t/echo: ok" in done.stderr
    assert done.stdout.strip().endswith("tool said: echo: from the cli")
    assert calls_made(tmp_path) == [{"tool": "echo", "arguments": {"text": "from the cli"}}]


def test_a_model_that_takes_no_tools_gets_none_and_the_terminal_says_why(
    tmp_path: Path, standin_settings: Settings
) -> None:
    model = setup(tmp_path, standin_settings, "echo", {"text": "from the cli"})
    set_behaviour(
        model,
        tokens=2,
        tool_call={"name": "t__echo", "arguments": "{}"},
        template_caps={"supports_tools": False, "supports_tool_calls": True},
    )
    args = (str(model), "--backend", "llamacpp:system", "--mcp", "t", "--allow-tools", "--prompt", "go")
    done = lemon_desk(*args, "--json")
    assert done.returncode == 0, done.stderr
    assert "[tools] No tools for " in done.stderr and "its chat template does not take tools" in done.stderr
    assert json.loads(done.stdout)  # the answer on stdout stays whole
    assert calls_made(tmp_path) == []


def test_always_is_saved_and_end_of_input_denies(tmp_path: Path, standin_settings: Settings) -> None:
    model = setup(tmp_path, standin_settings, "add", {"a": 1, "b": 2})
    args = (str(model), "--backend", "llamacpp:system", "--mcp", "t", "--prompt", "go")
    denied = lemon_desk(*args, stdin="")
    assert denied.returncode == 0, denied.stderr
    assert "[tool] t/add: denied" in denied.stderr and calls_made(tmp_path) == []
    always = lemon_desk(*args, stdin="a\n")
    assert "[tool] t/add: ok" in always.stderr
    assert load_always_allowed().items == {"t": frozenset({"add"})}
    again = lemon_desk(*args, stdin="")  # allowed always: not asked, though no answer could be read
    assert "wants to run" not in again.stderr and "[tool] t/add: ok" in again.stderr


def test_the_chat_ends_at_end_of_input_after_a_tool_question(
    tmp_path: Path, standin_settings: Settings
) -> None:
    """The interactive chat: input ends at the question (denied), and the chat ends there too, as at
    its prompt (it once waited for a line that could never come)."""
    model = setup(tmp_path, standin_settings, "add", {"a": 1, "b": 2})
    done = subprocess.run(
        [sys.executable, "-m", "app", "run", str(model), "--backend", "llamacpp:system", "--mcp", "t"],
        input="go\n",
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "t wants to run add" in done.stderr and "[tool] t/add: denied" in done.stderr
    assert calls_made(tmp_path) == []


def test_allow_tools_asks_nothing_for_scripts(tmp_path: Path, standin_settings: Settings) -> None:
    model = setup(tmp_path, standin_settings, "echo", {"text": "scripted"})
    done = lemon_desk(
        str(model), "--backend", "llamacpp:system", "--mcp", "t", "--allow-tools", "--prompt", "go", "--json"
    )
    assert done.returncode == 0, done.stderr
    assert "wants to run" not in done.stderr
    assert json.loads(done.stdout)["reply"].endswith("tool said: echo: scripted")


def test_an_unknown_or_failing_server_is_one_clear_error(tmp_path: Path, standin_settings: Settings) -> None:
    model = setup(tmp_path, standin_settings, "echo", {})
    unknown = lemon_desk(str(model), "--backend", "llamacpp:system", "--mcp", "nope", "--prompt", "go")
    assert unknown.returncode != 0 and "no MCP server named 'nope'" in unknown.stderr

    async def broken() -> None:
        await McpHost().put(
            McpServerSpec(
                "bad", McpTransport.STDIO, command=sys.executable, args=(str(SERVER), "--crash-at-start")
            )
        )

    asyncio.run(broken())
    started = time.monotonic()
    failed = lemon_desk(str(model), "--backend", "llamacpp:system", "--mcp", "bad", "--prompt", "go")
    took = time.monotonic() - started
    assert failed.returncode != 0 and "The MCP server bad is not ready (failed)" in failed.stderr
    assert "fatal: bad config" in failed.stderr and "Starting it again" not in failed.stderr
    # At its first failure: waiting out the window's starts again (1 + 5 + 30 s) took 36 s and more.
    assert took < 30, took
    assert "Traceback" not in failed.stderr


def live(marker: str) -> list[int]:
    return [
        p.pid
        for p in psutil.process_iter(["cmdline", "status"])
        if marker in " ".join(p.info["cmdline"] or []) and p.info["status"] != psutil.STATUS_ZOMBIE
    ]


def test_sigkill_of_run_mid_call_leaves_no_engine_and_no_mcp_server(
    tmp_path: Path, standin_settings: Settings
) -> None:
    script = tmp_path / "own-mcp-server.py"  # paths of their own, to find the processes by
    script.write_text(SERVER.read_text())
    model = setup(tmp_path, standin_settings, "hang", {}, script=script)
    cli = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app",
            "run",
            str(model),
            "--backend",
            "llamacpp:system",
            "--mcp",
            "t",
            "--allow-tools",
            "--prompt",
            "go",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while not calls_made(tmp_path):  # the hanging call reached the server
        assert cli.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    assert live(str(script)) and live(str(model))
    cli.send_signal(signal.SIGKILL)
    cli.wait()
    deadline = time.monotonic() + 30
    while (live(str(script)) or live(str(model))) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live(str(script)) == [] and live(str(model)) == []
