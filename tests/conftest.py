"""Shared fixtures: every test gets its own LEMON_DESK_HOME and a clean environment."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.core.launch import ENGINE_THREADS
from app.store.settings import Settings
from tests.support.leaks import LeakWatch, check
from tests.support.standin import standin_binary

PROFILES = Path(__file__).parent / "profiles"

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# Never the user's keychain: a test that needs one starts its own (tests/support/keychain.py), and every
# other test, and the commands it starts, find none.
os.environ["PYTHON_KEYRING_BACKEND"] = "keyring.backends.fail.Keyring"
# A run started in the background of a shell without job control (`nohup sh tests/run &`, some CI
# runners) inherits SIGINT ignored, and so would every command the Ctrl-C tests start: they would go on
# as an app in such a job rightly does. The tests' commands are started as from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def lemon_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path / "lemon-home"
    monkeypatch.setenv("LEMON_DESK_HOME", str(home))
    for var in ("LEMON_DESK_MOCK_HARDWARE", "LEMON_DESK_RELEASE_MIRROR", "LEMON_DESK_BACKEND_VERSIONS"):
        monkeypatch.delenv(var, raising=False)
    # One thread per llama-server: with a thread per core, llama.cpp's spinning threads fall to almost
    # nothing when other work keeps the cores busy (app/core/launch.py), and the suite must pass on a
    # busy machine. Tests check what engines do, not how fast; the benches run them as users do.
    monkeypatch.setenv(ENGINE_THREADS, "1")
    yield home


@pytest.fixture(autouse=True)
def nothing_left_running(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fail a test that leaves an asyncio task, a Qt timer or a thread running (tests/support/leaks.py).
    A test that must, says why with ``@pytest.mark.leaves_running("why")``."""
    exempt = request.node.get_closest_marker("leaves_running")
    with LeakWatch().watching(monkeypatch) as watch:
        yield
    if exempt is None:
        check(watch, pytest.fail)


def profile_path(name: str) -> Path:
    return PROFILES / f"{name}.json"


@pytest.fixture
def standin_settings(tmp_path: Path) -> Settings:
    """Settings whose `system` llama.cpp backend is the stand-in engine (tests/support/standin.py)."""
    return Settings(llama_server_path=str(standin_binary(tmp_path / "standin-bin")))
