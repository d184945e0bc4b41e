"""The MCP host against real MCP servers written with the ``mcp`` SDK (tests/support/mcp_server.py):
over stdio as child processes of the app, and over Streamable HTTP on loopback with a bearer token from a
real keychain. States as the user sees them: starting, ready with N tools, restarted with backoff,
failed with its last words; enable and disable; no orphan process after the app is killed."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from app.core.mcp import McpServerSpec, McpState, McpTransport, parse_mcp_json
from app.store.mcp_servers import mcp_servers_path
from app.store.run_records import load_run_records, write_run_record
from app.store.settings import Settings
from app.supervisor.mcp import McpHost, McpServerChanged
from app.supervisor.mcp.transport import MAX_MESSAGE_BYTES, split_messages
from app.supervisor.router import Router
from tests.support.keychain import private_keychain
from tests.support.mcp_servers import SERVER, http_server, stdio_spec
from tests.unit.test_orphans import dead_pid, record_of

FAST = (0.05, 0.1)  # backoff steps for tests


def alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_stdio_server_is_ready_with_its_tools_answers_calls_and_is_stopped_when_disabled() -> None:
    async def go() -> tuple[list[McpServerChanged], str, bool, bool]:
        seen: list[McpServerChanged] = []
        host = McpHost(seen.append, backoff_s=FAST)
        await host.put(stdio_spec("test"))
        host.start()
        [view] = await host.wait_ready(["test"], 60)
        assert view.state is McpState.READY and view.message == "7 tools"
        assert {t.name for t in view.tools} == {"echo", "add", "hang", "crash", "huge", "fail", "get_weather"}
        server = host.server("test")
        pid = server.child.pid if server.child else None
        answer = (await server.call("echo", {"text": "hello"})).text
        running = alive(pid)
        await host.set_enabled("test", False)
        stopped = not alive(pid)
        await host.shutdown()
        return seen, answer, running, stopped

    seen, answer, running, stopped = asyncio.run(go())
    assert answer == "echo: hello"
    assert running and stopped
    assert [e.state for e in seen] == [McpState.STARTING, McpState.READY, McpState.OFF]
    assert json.loads(mcp_servers_path().read_text())["servers"]["test"]["enabled"] is False


def test_offered_tools_are_named_server__tool_with_their_schema() -> None:
    async def go() -> list[dict[str, object]]:
        host = McpHost(backoff_s=FAST)
        await host.put(stdio_spec("files"))
        host.start()
        await host.wait_ready(["files"], 60)
        try:
            return [t.to_openai() for t in host.offered()]
        finally:
            await host.shutdown()

    offered = {t["function"]["name"]: t["function"] for t in go_run(go)}  # type: ignore[index]
    assert set(offered) == {
        f"files__{n}" for n in ("echo", "add", "hang", "crash", "huge", "fail", "get_weather")
    }
    assert offered["files__add"]["parameters"]["required"] == ["a", "b"]  # type: ignore[index]


def go_run(go):  # type: ignore[no-untyped-def]
    return asyncio.run(go())


def test_a_server_that_dies_is_restarted_with_backoff_and_ready_again() -> None:
    async def go() -> tuple[list[McpServerChanged], bool]:
        seen: list[McpServerChanged] = []
        host = McpHost(seen.append, backoff_s=FAST)
        await host.put(stdio_spec("flaky"))
        host.start()
        await host.wait_ready(["flaky"], 60)
        server = host.server("flaky")
        first = server.child.pid if server.child else None
        assert (await server.call("crash", {})).is_error  # the call's connection closed under it
        while not (server.state is McpState.READY and server.child and server.child.pid != first):
            await asyncio.sleep(0.02)
        works = (await server.call("add", {"a": 2, "b": 3})).text == "5.0"
        await host.shutdown()
        return seen, works

    seen, works = asyncio.run(go())
    assert works
    states = [e.state for e in seen]
    assert states[:5] == [
        McpState.STARTING,
        McpState.READY,
        McpState.BACKOFF,
        McpState.STARTING,
        McpState.READY,
    ]
    backoff = seen[2].message
    assert "exited (code 3)" in backoff and "fatal: crashing on purpose" in backoff
    assert "Starting it again in 0.05 s" in backoff


def test_a_server_that_cannot_start_fails_after_its_restarts_with_its_last_words() -> None:
    async def go() -> list[McpServerChanged]:
        seen: list[McpServerChanged] = []
        host = McpHost(seen.append, backoff_s=FAST)
        await host.put(stdio_spec("broken", "--crash-at-start"))
        host.start()
        while host.server("broken").state is not McpState.FAILED:
            await asyncio.sleep(0.02)
        await host.shutdown()
        return seen

    seen = asyncio.run(go())
    states = [e.state for e in seen]
    assert states.count(McpState.BACKOFF) == 3 and states[-2] is McpState.FAILED
    failed = seen[-2].message
    assert "fatal: bad config" in failed and "failed 4 times in a row" in failed
    assert failed.startswith("broken exited (code 2) before it listed its tools.")


def test_a_command_that_does_not_exist_is_a_failure_that_says_so() -> None:
    async def go() -> str:
        host = McpHost(backoff_s=FAST)
        await host.put(McpServerSpec("nothere", McpTransport.STDIO, command="/no/such/mcp-server"))
        host.start()
        while host.server("nothere").state is not McpState.FAILED:
            await asyncio.sleep(0.02)
        message = host.server("nothere").message
        await host.shutdown()
        return message

    assert "No such file or directory" in asyncio.run(go())


def test_an_http_server_is_reached_with_its_bearer_token_from_the_keychain(tmp_path: Path) -> None:
    async def go(url: str, token: str | None) -> McpState:
        host = McpHost(backoff_s=FAST)
        await host.put(McpServerSpec("web", McpTransport.HTTP, url=url, headers={"X-Test": "1"}), token=token)
        host.start()
        server = host.server("web")
        try:
            while server.state not in (McpState.READY, McpState.BACKOFF):
                await asyncio.sleep(0.02)
            if server.state is McpState.READY:
                assert (await server.call("echo", {"text": "over http"})).text == "echo: over http"
            return server.state
        finally:
            await host.shutdown()

    with private_keychain(tmp_path / "keyrings"), http_server(token="s3cret") as url:
        assert asyncio.run(go(url, "s3cret")) is McpState.READY
        assert "s3cret" not in mcp_servers_path().read_text()
        assert asyncio.run(go(url, "")) is McpState.BACKOFF  # the token removed: refused


def test_an_imported_mcp_json_adds_its_servers_and_says_what_it_refused() -> None:
    data = {"mcpServers": {"one": {"command": sys.executable, "args": [str(SERVER)]}, "bad": {"args": []}}}

    async def go() -> tuple[list[str], list[str]]:
        host = McpHost(backoff_s=FAST)
        refused = await host.import_json(parse_mcp_json(data))
        names = [v.spec.name for v in host.servers()]
        await host.shutdown()
        return refused, names

    refused, names = asyncio.run(go())
    assert names == ["one"] and len(refused) == 1 and "'bad'" in refused[0]
    assert list(json.loads(mcp_servers_path().read_text())["servers"]) == ["one"]


def test_a_message_longer_than_the_limit_is_dropped_not_held() -> None:
    big = b"x" * (MAX_MESSAGE_BYTES + 1)
    lines, rest, skipping = split_messages(b"", big[: MAX_MESSAGE_BYTES // 2], False)
    assert lines == [] and not skipping
    lines, rest, skipping = split_messages(rest, big[MAX_MESSAGE_BYTES // 2 :], False)
    assert lines == [None] and rest == b"" and skipping
    lines, rest, skipping = split_messages(rest, b'tail\n{"a": 1}\n', skipping)
    assert lines == [b'{"a": 1}'] and rest == b"" and not skipping


APP = """
import asyncio, sys
from app.supervisor.mcp import McpHost
async def main():
    host = McpHost()
    host.start()
    await host.wait_ready(["kept"], 60)
    print(host.server("kept").child.pid, flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


def test_no_mcp_server_outlives_the_app_killed_with_sigkill(tmp_path: Path) -> None:
    script = tmp_path / "own-mcp-server.py"  # a path of its own, to find its processes by
    script.write_text(SERVER.read_text())

    async def configure() -> None:
        await McpHost().put(stdio_spec("kept", script=script))

    asyncio.run(configure())
    app = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(APP)],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
        env=os.environ,
        start_new_session=True,
    )
    assert app.stdout is not None
    with app.stdout:
        pid = int(app.stdout.readline())
    assert alive(pid)
    app.send_signal(signal.SIGKILL)
    app.wait()
    deadline = time.monotonic() + 30
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not alive(pid)
    assert not [
        p for p in psutil.process_iter(["cmdline"]) if str(script) in " ".join(p.info["cmdline"] or [])
    ]


def test_a_stdio_server_has_a_run_record_while_it_runs_and_one_left_by_a_dead_app_is_stopped_at_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def running_record() -> tuple[list[str], list[str]]:
        host = McpHost(backoff_s=FAST)
        await host.put(stdio_spec("kept"))
        host.start()
        await host.wait_ready(["kept"], 60)
        during = [r.engine_id for r in load_run_records()]
        await host.shutdown()
        return during, [r.engine_id for r in load_run_records()]

    assert asyncio.run(running_record()) == (["mcp-kept"], [])

    # An MCP server whose app died unseen (neither PDEATHSIG nor a reaper acted): the next start stops it.
    # Its stdin stays open (a server ends at the end of its input), as its dead app's pipe would not.
    orphan = subprocess.Popen(
        [sys.executable, str(SERVER)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        write_run_record(record_of(orphan, dead_pid(), engine_id="mcp-kept", binary=sys.executable))  # type: ignore[arg-type]
        assert orphan.poll() is None

        async def start() -> None:
            async with Router(Settings()) as router:
                await router.start()

        asyncio.run(start())
        orphan.wait(timeout=30)  # it ended: alive, it would read its open stdin for ever
        assert "Stopped mcp-kept" in caplog.text and "left running by an earlier run" in caplog.text
        assert load_run_records() == []
    finally:
        orphan.kill()
        orphan.wait()
        assert orphan.stdin is not None
        orphan.stdin.close()


def test_tool_names_that_clash_once_named_server__tool_are_made_unique_and_the_servers_say_so() -> None:
    """``t``'s ``_echo`` and ``t_``'s ``echo`` would both be offered as ``t___echo``."""

    async def go() -> tuple[list[dict[str, object]], dict[str, str], str]:
        host = McpHost(backoff_s=FAST)
        await host.put(stdio_spec("t", "--echo-as", "_echo"))
        await host.put(stdio_spec("t_"))
        host.start()
        await host.wait_ready(["t", "t_"], 60)
        try:
            offered = host.offered()
            by_name = {o.name: o for o in offered}
            clashing = [o for o in offered if o.name.startswith("t___echo")]
            answers = {
                o.name: (await host.server(o.server).call(o.tool.name, {"text": o.server})).text
                for o in clashing
            }
            messages = {v.spec.name: v.message for v in host.servers()}
            assert len(by_name) == len(offered)  # no two alike
            return (
                [o.to_openai() for o in host.offered(["t_"])],
                answers,
                messages["t"] + " | " + messages["t_"],
            )
        finally:
            await host.shutdown()

    only_t_, answers, messages = go_run(go)
    assert len(answers) == 2 and sorted(answers.values()) == ["echo: t", "echo: t_"]
    # Each clashing name ends in 8 hex digits of a hash, and is the same whichever servers a chat chose.
    assert all(len(name) == len("t___echo") + 9 and name[-9] == "_" for name in answers)
    renamed_t_ = next(name for name, answer in answers.items() if answer == "echo: t_")
    assert renamed_t_ in {t["function"]["name"] for t in only_t_}  # type: ignore[index]
    assert "t___add" in {t["function"]["name"] for t in only_t_}  # t_'s others keep their plain names
    assert f"offered as {renamed_t_}: another server's tool would have had the same name" in messages


def test_concurrent_changes_of_one_server_never_start_one_the_host_no_longer_keeps() -> None:
    """Enabled and replaced at once: the enable waits for the save, and the replacement must not slip
    in between and leave the enable starting the server it replaced."""

    async def go() -> tuple[bool, McpState, McpState]:
        host = McpHost(backoff_s=FAST)
        await host.put(dataclasses.replace(stdio_spec("t"), enabled=False))
        old = host.server("t")
        await asyncio.gather(host.set_enabled("t", True), host.put(stdio_spec("t", "--echo-as", "again")))
        kept = host.server("t") is not old
        states = old.state, host.server("t").state
        await host.shutdown()
        await old.stop()  # when it ran unkept, the test cleans up after it
        return kept, *states

    kept, old_state, new_state = go_run(go)
    assert kept and old_state is McpState.OFF
    assert new_state in (McpState.STARTING, McpState.READY)  # it replaced a running server: started
