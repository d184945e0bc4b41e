"""Making a router does nothing to the machine: the engines an earlier run left are stopped by
``Router.start()`` (or the first launch), not by the constructor that every CLI command runs, and the
keychain is not read until a secret is needed."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from app.store.model_options import ModelOptions
from app.store.run_records import load_run_records, write_run_record
from app.store.settings import Settings
from app.supervisor.router import Router
from tests.conftest import profile_path
from tests.support.standin import make_standin_model
from tests.unit.test_orphans import ROOT, dead_pid, record_of, standin


def test_a_new_router_leaves_an_orphan_alone_and_its_start_stops_it(
    standin_settings: Settings, tmp_path: Path
) -> None:
    model = make_standin_model(tmp_path, "tiny")
    with standin(standin_settings, model) as (orphan, _):
        write_run_record(record_of(orphan, dead_pid()))
        router = Router(standin_settings)
        assert orphan.poll() is None, "making a router stopped an engine"
        assert [r.pid for r in load_run_records()] == [orphan.pid]

        async def start_twice() -> None:
            await asyncio.gather(router.start(), router.start())
            await router.shutdown()

        asyncio.run(start_twice())
        assert orphan.wait(timeout=5) == 0  # the stand-in's answer to SIGTERM
        assert load_run_records() == []


def test_the_first_load_stops_an_orphan_before_it_launches(
    standin_settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path("cpu_only_x86")))
    model = make_standin_model(tmp_path, "tiny")
    with standin(standin_settings, model) as (orphan, _):
        write_run_record(record_of(orphan, dead_pid()))

        async def load() -> tuple[int | None, int | None]:
            async with Router(standin_settings) as router:
                engine = await router.load(router.catalog.find(str(model)), ModelOptions(backend="system"))
                return orphan.poll(), engine.pid

        stopped, pid = asyncio.run(load())
        assert stopped == 0, "the orphan was stopped (SIGTERM) by the time the engine was ready"
        assert pid is not None and pid != orphan.pid


def test_making_a_router_reads_no_secret() -> None:
    probe = (
        "import sys\n"
        "from app.store.settings import Settings\n"
        "from app.supervisor.router import Router\n"
        "Router(Settings()).statuses()\n"
        "print('keyring' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False"], "the keychain was opened by a router that needs no secret"


def test_the_windows_start_reads_no_secret_until_the_hub_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The window's start-up opens the download manager (to resume what the last run left); the token
    is read only when a request to the Hub needs it (a fresh D-Bus session asked to make a keyring)."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    probe = (
        "import asyncio, sys\n"
        "from app.store.settings import Settings\n"
        "from app.supervisor.router import Router\n"
        "async def go():\n"
        "    async with Router(Settings()) as router:\n"
        "        await router.start()\n"
        "        await router.open_downloads()\n"
        "        print('keyring' in sys.modules)\n"
        "        await (await router.hub()).token()\n"
        "        print('keyring' in sys.modules)\n"
        "asyncio.run(go())\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]


def test_the_download_manager_needs_no_hub_call_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_from_the_environment")  # the keychain is not asked

    async def go() -> None:
        async with Router(Settings()) as router:
            manager = router.downloads()  # was an AssertionError ("hub() comes first")
            assert await router.hub() is manager.hub, "one Hub client, made with the manager"
            assert await manager.hub.token() == "hf_from_the_environment"
            assert router.downloads() is manager

    asyncio.run(go())
